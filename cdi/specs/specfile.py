"""Fast, strict, hostile-input-safe loading of one CDI spec file into a plain dict.

This is on the container-create path (the shim reads the spec dirs), so it imports only the
standard library and PyYAML's C loader: no jsonschema, no click. What it guarantees:

- the path is opened without blocking (a FIFO planted as `x.json` cannot hang the reader) and
  must be a regular file; at most `max_bytes` (4 MiB by default) are read, whatever the file
  claims its size is;
- the bytes are UTF-8 (no BOM, no NUL);
- `.json` is read with `json` (duplicate keys, NaN and Infinity rejected); anything else
  (`.yaml`, `.yml`) with `yaml.CSafeLoader`, rejecting duplicate keys, anchors/aliases (no
  "billion laughs"), merge keys (`<<`) and non-string mapping keys;
- nesting is at most `max_depth` levels (a CDI spec needs about 6);
- the top level is a mapping.

`check_stat`, when given, sees the opened file's `os.stat_result` and may return a reason to
refuse it, without a second open (no race between the check and the read). `dir_fd` opens the
file through its folder's descriptor with the trust walk of gpuctk.fs.trusted_file (owner,
mode, symlinks followed through trusted folders only): the registry's spec-dir policy
(gpuctk.cdi.specs.spectrust). Without it, `follow_symlinks=False` refuses a symlink as the last path
component (O_NOFOLLOW). Messages never quote file content beyond key names and short values.

Errors: InputError (exit 4) when the file cannot be read as a file (missing, not a regular file,
too big, refused by `check_stat`); ValidationError (exit 7) when its bytes are not a spec
document. Both name the file.
"""

from __future__ import annotations

import errno
import os
import stat

from gpuctk import jsonfast
from gpuctk.errors import InputError, TrustError, ValidationError
from gpuctk.fs import read_limited

TYPE_CHECKING = False  # not typing's: its import is costly on the create path
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpuctk.cdi.specs.speccache import SpecCache

MAX_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 32
SPEC_EXTENSIONS = (".json", ".yaml", ".yml")

if TYPE_CHECKING:
    StatCheck = Callable[[os.stat_result], "str | None"]


class _DocumentError(Exception):
    """Raised inside the decoders; becomes a ValidationError naming the file."""


def _open_checked(
    path: str,
    max_bytes: int,
    check_stat: StatCheck | None,
    follow_symlinks: bool,
    dir_fd: int | None = None,
) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file at `path` that `check_stat` accepts, and its stat; the
    caller closes it. With `dir_fd` (the folder of `path`, from gpuctk.fs.open_trusted_dir),
    the file is opened through it by gpuctk.fs.trusted_file (owner and mode checked, symlinks
    followed only through trusted folders)."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        if dir_fd is None:
            fd = os.open(path, flags)
        else:
            from gpuctk.fs import trusted_file

            folder, _, name = path.rpartition("/")
            fd, _ = trusted_file(dir_fd, name, folder=folder or "/")
    except TrustError as exc:
        raise InputError(f"{path}: refused: {exc.message}") from None
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise InputError(f"{path}: is a symbolic link (refused)") from None
        raise InputError(f"{path}: cannot open: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{path}: not a regular file")
        if check_stat is not None:
            reason = check_stat(st)
            if reason:
                raise InputError(f"{path}: refused: {reason}")
        if st.st_size > max_bytes:
            raise InputError(f"{path}: too large ({st.st_size} bytes; the limit is {max_bytes})")
    except OSError as exc:
        os.close(fd)
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _read_open(fd: int, path: str, max_bytes: int) -> bytes:
    try:
        data = read_limited(fd, max_bytes)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise InputError(f"{path}: too large (more than {max_bytes} bytes)")
    return data


def read_bytes(
    path: str,
    *,
    max_bytes: int = MAX_BYTES,
    check_stat: StatCheck | None = None,
    follow_symlinks: bool = True,
) -> bytes:
    """The content of the regular file at `path`, at most `max_bytes` long."""
    fd, _ = _open_checked(path, max_bytes, check_stat, follow_symlinks)
    try:
        return _read_open(fd, path, max_bytes)
    finally:
        os.close(fd)


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DocumentError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _json_constant(name: str) -> Any:
    raise _DocumentError(f"{name} is not valid JSON")


def decode_json(text: str) -> Any:
    try:
        return jsonfast.loads(text, pairs_hook=_json_pairs, parse_constant=_json_constant)
    except jsonfast.NestingError:
        raise _DocumentError("nested too deeply") from None
    except ValueError as exc:
        raise _DocumentError(f"invalid JSON: {exc}") from None


def decode_yaml(text: str) -> Any:
    """Strict YAML decode; PyYAML is imported only here, so JSON specs never pay for it."""
    from gpuctk.cdi.specs.specyaml import decode_strict_yaml

    return decode_strict_yaml(text)


def depth_exceeds(value: Any, max_depth: int) -> bool:
    """True when `value` nests lists/dicts deeper than `max_depth` (iterative, no recursion:
    one level at a time, the children gathered by C-level `extend`)."""
    level: list[Any] = [value]
    depth = 1
    while level:
        below: list[Any] = []
        for item in level:
            if isinstance(item, dict):
                below.extend(item.values())
            elif isinstance(item, list):
                below.extend(item)
            else:
                continue
            if depth > max_depth:
                return True
        level = below
        depth += 1
    return False


def decode_spec(
    data: bytes, source: str, *, is_json: bool, max_depth: int = MAX_DEPTH
) -> dict[str, Any]:
    """Decode the bytes of a spec document named `source`; ValidationError when they are not one."""
    try:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _DocumentError(f"not UTF-8 (byte {exc.start})") from None
        if text.startswith("\ufeff"):
            raise _DocumentError("starts with a byte-order mark")
        if "\x00" in text:
            raise _DocumentError("contains NUL bytes")
        if not text.strip():
            raise _DocumentError("empty file")
        doc = decode_json(text) if is_json else decode_yaml(text)
        if not isinstance(doc, dict):
            raise _DocumentError(f"top level must be a mapping, not {_type_name(doc)}")
        if depth_exceeds(doc, max_depth):
            raise _DocumentError(f"nested deeper than {max_depth} levels")
    except _DocumentError as exc:
        raise ValidationError(f"{source}: {exc}", [str(exc)]) from None
    return doc


def is_json_path(path: str) -> bool:
    return path.lower().endswith(".json")


def load_spec_file(
    path: str | os.PathLike[str],
    *,
    max_bytes: int = MAX_BYTES,
    max_depth: int = MAX_DEPTH,
    check_stat: StatCheck | None = None,
    follow_symlinks: bool = True,
    cache: SpecCache | None = None,
    dir_fd: int | None = None,
) -> dict[str, Any]:
    """The spec document at `path` as a plain dict (not yet validated beyond decoding).

    With a `cache` (gpuctk.cdi.specs.speccache), a file whose identity (device, inode, size, mtime,
    ctime of the descriptor opened here, after `check_stat` accepted it) is in the cache is not
    read or decoded again; one that was is offered to the cache. `dir_fd`: the trusted folder
    of `path` to open it through (see _open_checked)."""
    name = os.fspath(path)
    fd, st = _open_checked(name, max_bytes, check_stat, follow_symlinks, dir_fd)
    try:
        if cache is not None:
            cached = cache.get(name, st)
            if cached is not None:
                return cached
        data = _read_open(fd, name, max_bytes)
    finally:
        os.close(fd)
    doc = decode_spec(data, name, is_json=is_json_path(name), max_depth=max_depth)
    if cache is not None:
        cache.put(name, st, doc)
    return doc


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {list: "a list", str: "a string", bool: "a boolean", int: "a number"}.get(
        type(value), type(value).__name__
    )
