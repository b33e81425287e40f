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
refuse it: that is where a trust policy (owner, mode) plugs in without a second open (no race
between the check and the read). `follow_symlinks=False` refuses a symlink as the last path
component (O_NOFOLLOW). Messages never quote file content beyond key names and short values.

Errors: InputError (exit 4) when the file cannot be read as a file (missing, not a regular file,
too big, refused by `check_stat`); ValidationError (exit 7) when its bytes are not a spec
document. Both name the file.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable
from typing import Any

import yaml

from gpuctk.errors import InputError, ValidationError

MAX_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 32
SPEC_EXTENSIONS = (".json", ".yaml", ".yml")

StatCheck = Callable[[os.stat_result], "str | None"]


class _DocumentError(Exception):
    """Raised inside the decoders; becomes a ValidationError naming the file."""


def read_bytes(
    path: str,
    *,
    max_bytes: int = MAX_BYTES,
    check_stat: StatCheck | None = None,
    follow_symlinks: bool = True,
) -> bytes:
    """The content of the regular file at `path`, at most `max_bytes` long."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
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
        chunks = []
        total = 0
        while total <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            raise InputError(f"{path}: too large (more than {max_bytes} bytes)")
        return b"".join(chunks)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
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
        return json.loads(text, object_pairs_hook=_json_pairs, parse_constant=_json_constant)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"
        raise _DocumentError(f"invalid JSON: {exc.msg} ({where})") from None
    except RecursionError:
        raise _DocumentError("nested too deeply") from None


_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_STR_TAG = "tag:yaml.org,2002:str"


class _StrictLoader(_BaseLoader):  # type: ignore[misc,valid-type]
    """A safe loader that refuses duplicate keys, aliases, merge keys and non-string keys."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        if node in self.constructed_objects or node in self.recursive_objects:
            raise _DocumentError(f"YAML anchors and aliases are not allowed{_where(node)}")
        return super().construct_object(node, deep=deep)

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> Any:
        if not isinstance(node, yaml.MappingNode):
            raise _DocumentError(f"expected a mapping{_where(node)}")
        seen: set[str] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _STR_TAG:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    raise _DocumentError(f"YAML merge keys (<<) are not allowed{_where(key_node)}")
                shown = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                raise _DocumentError(f"mapping key {shown!r} is not a string{_where(key_node)}")
            if key_node.value in seen:
                raise _DocumentError(f"duplicate key {key_node.value!r}{_where(key_node)}")
            seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


def _where(node: yaml.Node) -> str:
    mark = getattr(node, "start_mark", None)
    if mark is None:
        return ""
    return f" (line {mark.line + 1}, column {mark.column + 1})"


def decode_yaml(text: str) -> Any:
    loader = _StrictLoader(text)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        raise _DocumentError(f"invalid YAML: {_yaml_message(exc)}") from None
    except yaml.YAMLError as exc:
        raise _DocumentError(f"invalid YAML: {exc}") from None
    finally:
        loader.dispose()


def _yaml_message(exc: yaml.MarkedYAMLError) -> str:
    text = " ".join(p for p in (exc.context, exc.problem) if p)
    mark = exc.problem_mark or exc.context_mark
    if mark is not None:
        text += f" (line {mark.line + 1}, column {mark.column + 1})"
    return text or str(exc)


def depth_exceeds(value: Any, max_depth: int) -> bool:
    """True when `value` nests lists/dicts deeper than `max_depth` (iterative, no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > max_depth:
            return True
        stack.extend((child, depth + 1) for child in children)
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
) -> dict[str, Any]:
    """The spec document at `path` as a plain dict (not yet validated beyond decoding)."""
    name = os.fspath(path)
    data = read_bytes(
        name, max_bytes=max_bytes, check_stat=check_stat, follow_symlinks=follow_symlinks
    )
    return decode_spec(data, name, is_json=is_json_path(name), max_depth=max_depth)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {list: "a list", str: "a string", bool: "a boolean", int: "a number"}.get(
        type(value), type(value).__name__
    )
