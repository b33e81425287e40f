"""Editing gpuctk's config.toml: `gpuctk config --set` and `gpuctk migrate` write through here.

The one text of the defaults is hook/config.toml (gpuctk.hook's package data): the deb ships it as
/etc/gpuctk/config.toml with every key commented out, `gpuctk config default` prints it with
the keys in force. A file is edited with tomlkit, so comments and layout stay; a key that is
only commented out (`#key = ...`, as shipped) is set where that line stands. Every result is
checked by the runtime's own parser and validator (gpuctk.hook.config.parse) before anything
is written; files are written atomically, mode 0644, keeping the owner of the file replaced.
Not on the container-create path: the shim and the hook never import this module.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from pathlib import Path
from typing import Any

from gpuctk.errors import InputError, UsageError, ValidationError
from gpuctk.hook import config

# package data of gpuctk.hook, beside the reader (gpuctk.hook.config) whose keys it documents
TEMPLATE = Path(config.__file__).with_name("config.toml")
# the tables that mark NVIDIA's /etc/nvidia-container-runtime/config.toml
NVIDIA_TABLES = ("nvidia-container-runtime", "nvidia-container-cli")
LIST_KEYS = tuple(k for k, v in config.DEFAULTS.items() if isinstance(v, list))
BOOL_KEYS = tuple(k for k, v in config.DEFAULTS.items() if isinstance(v, bool))
# strconv.ParseBool's spellings, as nvidia-ctk config --set reads them
TRUE = ("1", "t", "T", "TRUE", "true", "True")
FALSE = ("0", "f", "F", "FALSE", "false", "False")
_COMMENTED = re.compile(r"(?m)^#(?=([a-z-]+) = )")


def template() -> str:
    """The shipped file: every key commented out at its default, with what it does."""
    return TEMPLATE.read_text(encoding="utf-8")


def default_text() -> str:
    """`gpuctk config default`: the shipped file with every key in force."""
    return _COMMENTED.sub("", template())


def migrate_hint(path: str) -> str:
    return f"{path} is nvidia-ctk's config; carry it over with: gpuctk migrate --from {path}"


def refuse_nvidia(table: Any, path: str) -> None:
    """An InputError when `table` (a parsed file) is NVIDIA's config.toml."""
    if any(isinstance(table.get(name), dict) for name in NVIDIA_TABLES):
        raise InputError(migrate_hint(path))


def read_text(path: str) -> str | None:
    """The text of the file at `path` (None when it does not exist), at most config.MAX_BYTES.
    Only a regular file is opened (a FIFO would wait for a writer, a device such as /dev/zero
    or a watchdog acts on open), without blocking; one whose size reads 0 is not read (an
    empty file; /proc's, where /proc/kmsg would wait for, and take, the kernel's messages)."""
    from gpuctk.fs import read_limited

    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            fd = -1
        else:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd) if fd >= 0 else os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise InputError(f"{path}: is a directory, not a config file")
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{path}: not a regular file (a FIFO, device or socket is not read)")
        data = read_limited(fd, config.MAX_BYTES) if st.st_size else b""
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > config.MAX_BYTES:
        raise InputError(f"{path}: larger than {config.MAX_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError(f"{path}: not UTF-8 (byte {exc.start})") from None


def _document(text: str, path: str) -> Any:
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    try:
        return tomlkit.parse(text)
    except TOMLKitError as exc:
        raise ValidationError(f"{path}: invalid TOML: {exc}") from None


def load_for_edit(path: str) -> str:
    """The gpuctk config at `path` to edit: its text, or the shipped text when it is missing;
    NVIDIA's config.toml is refused with the migrate command."""
    text = read_text(path)
    if text is None:
        return template()
    refuse_nvidia(_document(text, path), path)
    return text


def _unknown(key: str) -> str:
    from difflib import get_close_matches

    close = get_close_matches(key, list(config.DEFAULTS), n=1, cutoff=0.75)
    hint = f"did you mean {close[0]}? " if close else ""
    return f"--set {key}: unknown key ({hint}known: {', '.join(config.DEFAULTS)})"


def _bool(key: str, raw: str) -> bool:
    if raw in TRUE:
        return True
    if raw in FALSE:
        return False
    raise UsageError(f"--set {key}={raw}: {key} must be true or false")


def parse_set(spec: str, separator: str = ",") -> tuple[str, Any]:
    """(key, value) of one `--set KEY[=VALUE]`: a bool key alone is true, a list key's value is
    split on `separator` (an empty value is the empty list)."""
    key, sep, raw = spec.partition("=")
    key = key.strip()
    if key not in config.DEFAULTS:
        raise UsageError(_unknown(key))
    if key == "accept-envvar-unprivileged":
        if not sep:
            return key, True
        return key, config.AUTO if raw == config.AUTO else _bool(key, raw)
    if key in BOOL_KEYS:
        return key, True if not sep else _bool(key, raw)
    if not sep:
        raise UsageError(f"--set {key}: expected {key}=VALUE ({key} is not true or false)")
    if key in LIST_KEYS:
        return key, raw.split(separator) if raw else []
    return key, raw


def parse_sets(specs: tuple[str, ...] | list[str], separator: str) -> dict[str, Any]:
    """Every `--set`, in order: the last value of a key wins (as nvidia-ctk's)."""
    if not separator:
        raise UsageError("--set-list-separator: must not be empty")
    return dict(parse_set(s, separator) for s in specs)


def _uncomment(text: str, key: str, line: str) -> str | None:
    """`text` with the first top-level `#key = ...` line replaced by `line`, else None."""
    pattern = re.compile(rf"(?m)^[ \t]*#[ \t]?{re.escape(key)}[ \t]*=.*$")
    for m in pattern.finditer(text):
        if re.search(r"(?m)^[ \t]*\[", text[: m.start()]):
            return None  # inside a table: not a top-level key
        return text[: m.start()] + line + text[m.end() :]
    return None


def apply_sets(text: str, updates: dict[str, Any], path: str, given: str = "--set ") -> str:
    """`text` (the file at `path`) with `updates` set, checked as the runtime checks it: a bad
    value of `updates` is a UsageError after `given`, any other problem a ValidationError."""
    import tomlkit

    doc = _document(text, path)
    refuse_nvidia(doc, path)
    rest: dict[str, Any] = {}
    for key, value in updates.items():
        if key in doc:
            doc[key] = value
        else:
            rest[key] = value
    out: str = doc.as_string()
    for key, value in rest.items():
        line = f"{key} = {tomlkit.item(value).as_string()}"
        edited = _uncomment(out, key, line)
        if edited is None:
            edited = (out if not out or out.endswith("\n") else out + "\n") + line + "\n"
        out = edited
    table = config.parse_table(out, path)
    problems = config.check(table)
    mine = [p for p in problems if p.split(":", 1)[0] in updates]
    if mine:
        more = f" (and {len(mine) - 1} more)" if mine[1:] else ""
        raise UsageError(f"{given}{mine[0]}{more}")
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ValidationError(f"{path}: {problems[0]}{more}", problems)
    return out


MAX_LINKS = 40


def _resolve(path: str) -> str:
    """`path` with its links followed, as os.path.realpath, but only links root (or this
    euid) owns: a link another account made (in /tmp, in its own folder) could point root's
    write at any file. What does not exist yet is kept as named. OutputError naming the link."""
    from gpuctk.errors import OutputError

    if not path.startswith("/"):  # not abspath: "a/../b" is not "b" if a is a link
        path = f"{os.getcwd()}/{path}"
    todo = [p for p in reversed(path.split("/")) if p and p != "."]
    done, links = "/", 0
    while todo:
        name = todo.pop()
        if name == "..":
            done = os.path.dirname(done)
            continue
        here = os.path.join(done, name)
        try:
            st = os.lstat(here)
        except OSError:  # missing (made, or refused, by the write)
            return os.path.join(here, *reversed(todo))
        if not stat.S_ISLNK(st.st_mode):
            done = here
            continue
        if st.st_uid not in (0, os.geteuid()):
            raise OutputError(
                f"refusing to write {path}: {here} is a symlink owned by uid {st.st_uid}; "
                "fix: name the file it leads to"
            )
        links += 1
        if links > MAX_LINKS:
            raise OutputError(f"cannot write {path}: too many levels of symbolic links")
        dest = os.readlink(here)
        todo += [p for p in reversed(dest.split("/")) if p and p != "."]
        if dest.startswith("/"):
            done = "/"
    return done


def write(path: str, text: str) -> None:
    """Write `text` to `path` atomically, mode 0644, keeping the owner of the file it replaces;
    a missing folder is made (0755), as nvidia-ctk does. A link that root (or this euid) owns
    is followed: its target is written; one another account made is refused (_resolve).
    NVIDIA's config.toml is never written over."""
    from gpuctk.errors import OutputError
    from gpuctk.writes import atomic_write

    target = _resolve(path)
    uid = gid = -1
    if os.path.isfile(target):
        old = read_text(target) or ""
        with contextlib.suppress(ValidationError):  # not TOML: ours to replace
            refuse_nvidia(_document(old, path), path)
        st = os.stat(target)
        uid, gid = st.st_uid, st.st_gid
    elif not os.path.lexists(target):
        try:
            os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    atomic_write(target, text.encode("utf-8"), 0o644, uid=uid, gid=gid)
