"""The edits layer: what each container edit must look like, and edits that contradict.

Rules from the reference Go library (pkg/cdi/container-edits.go, api/validator) plus what the
CDI SPEC.md and OCI runtime spec require and the reference leaves to container start:

- env entries (edits and hooks) are KEY=VALUE with a non-empty KEY;
- paths are absolute: device node path and hostPath, mount containerPath, hook path, and a
  mount hostPath unless the mount has a non-bind type (tmpfs, ...); no NUL in any string;
- device node type is c, b, u or p; major/minor not negative; fileMode a permission
  (0..0o7777); permissions a combination of r, w, m (or "none"). The reference reads type and
  numbers from the host node when type is missing or major is 0: so a minor without a major is
  discarded, type "u" without a major fails at container start (the host node reads as "c"),
  and a fifo (p) has no numbers;
- hook names are the OCI ones; a hook timeout is > 0;
- net devices name both interfaces (Linux names: 1..15 bytes, no '/', ':' or whitespace), each
  at most once; intelRdt.closID is a file name (or "/");
- a device's edits are not empty;
- conflicting edits: within what one device injects (spec-level edits plus the device's), two
  device nodes at one path, two mounts at one containerPath, or one env KEY set twice, with
  different content. The reference would silently keep the last one.

Functions take possibly malformed dicts: values of the wrong type were reported by the strict
layer and are skipped here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpuctk.cdi.specs.apply import BIND_TYPES, NO_PERMISSIONS, NODE_TYPES
from gpuctk.cdi.specs.apply import HOOK_STAGES as HOOK_NAMES

_SPACE = frozenset(" \t\n\r\v\f")


def _items(edits: dict[str, Any], key: str) -> Iterator[tuple[int, Any]]:
    value = edits.get(key)
    if isinstance(value, list):
        yield from enumerate(value)


def _dict_items(edits: dict[str, Any], key: str) -> Iterator[tuple[int, dict[str, Any]]]:
    for i, item in _items(edits, key):
        if isinstance(item, dict):
            yield i, item


def _str(obj: dict[str, Any], key: str) -> str | None:
    value = obj.get(key)
    return value if isinstance(value, str) else None


def _int(obj: dict[str, Any], key: str) -> int | None:
    value = obj.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _path_problem(value: str | None, where: str, out: list[str], *, absolute: bool = True) -> None:
    if value is None:
        return
    if not value:
        out.append(f"{where}: must not be empty")
    elif "\x00" in value:
        out.append(f"{where}: contains a NUL byte")
    elif absolute and not value.startswith("/"):
        out.append(f"{where}: must be absolute, not {value!r}")


def env_problems(edits: dict[str, Any], key: str, where: str, out: list[str]) -> None:
    for i, entry in _items(edits, key):
        if not isinstance(entry, str):
            continue
        if entry.find("=") <= 0:
            out.append(f"{where}.{key}[{i}]: {entry!r} is not KEY=VALUE")
        elif "\x00" in entry:
            out.append(f"{where}.{key}[{i}]: contains a NUL byte")


def _node_problems(node: dict[str, Any], at: str, out: list[str]) -> None:
    _path_problem(_str(node, "path"), f"{at}.path", out)
    host_path = _str(node, "hostPath")
    if host_path:  # "" means "same as path" to the reference
        _path_problem(host_path, f"{at}.hostPath", out)
    type_ = _str(node, "type")
    if type_ is not None and type_ not in NODE_TYPES:
        out.append(f"{at}.type: {type_!r} is not a device type (c, b, u or p)")
    major, minor = _int(node, "major"), _int(node, "minor")
    for key, number in (("major", major), ("minor", minor)):
        if number is not None and number < 0:
            out.append(f"{at}.{key}: must not be negative ({number})")
    if type_ == "p" and (major or minor):
        out.append(f"{at}: a fifo (type p) has no major/minor numbers")
    elif type_ == "u" and not major:
        out.append(
            f"{at}: type u needs a major number (without one the host node is read, and it "
            "reads as c)"
        )
    elif not major and minor:
        out.append(
            f"{at}.minor: ignored without a major number (the host node's numbers are used); "
            "give major too"
        )
    mode = _int(node, "fileMode")
    if mode is not None and not 0 <= mode <= 0o7777:
        out.append(f"{at}.fileMode: {mode} is not a permission mode (0..0o7777)")
    perms = _str(node, "permissions")
    if perms and perms != NO_PERMISSIONS and not set(perms) <= set("rwm"):
        out.append(f"{at}.permissions: {perms!r} must combine r, w and m (or be 'none')")


def _mount_problems(mount: dict[str, Any], at: str, out: list[str]) -> None:
    type_ = _str(mount, "type") or ""
    options = mount.get("options")
    is_bind = type_ in BIND_TYPES or (
        isinstance(options, list) and ("bind" in options or "rbind" in options)
    )
    _path_problem(_str(mount, "hostPath"), f"{at}.hostPath", out, absolute=is_bind)
    _path_problem(_str(mount, "containerPath"), f"{at}.containerPath", out)
    for i, option in _items(mount, "options"):
        if isinstance(option, str) and (not option or "\x00" in option):
            out.append(f"{at}.options[{i}]: must be a non-empty option without NUL bytes")


def _hook_problems(hook: dict[str, Any], at: str, out: list[str]) -> None:
    name = _str(hook, "hookName")
    if name is not None and name not in HOOK_NAMES:
        out.append(f"{at}.hookName: {name!r} is not one of {', '.join(sorted(HOOK_NAMES))}")
    _path_problem(_str(hook, "path"), f"{at}.path", out)
    env_problems(hook, "env", at, out)
    timeout = _int(hook, "timeout")
    if timeout is not None and timeout <= 0:
        out.append(f"{at}.timeout: must be greater than zero")


def _ifname_problem(name: str) -> str | None:
    if not name:
        return "must not be empty"
    if len(name.encode()) > 15 or name in (".", ".."):
        return f"{name!r} is not a Linux interface name (1..15 bytes, not . or ..)"
    if any(c in _SPACE or c in "/:\x00" for c in name):
        return f"{name!r} is not a Linux interface name (no '/', ':' or whitespace)"
    return None


def _net_problems(edits: dict[str, Any], where: str, out: list[str]) -> None:
    seen: dict[str, dict[str, int]] = {"hostInterfaceName": {}, "name": {}}
    for i, dev in _dict_items(edits, "netDevices"):
        at = f"{where}.netDevices[{i}]"
        for key in ("hostInterfaceName", "name"):
            value = _str(dev, key)
            if value is None:
                continue
            problem = _ifname_problem(value)
            if problem:
                out.append(f"{at}.{key}: {problem}")
            elif value in seen[key]:
                out.append(
                    f"{at}.{key}: {value!r} is already used by netDevices[{seen[key][value]}]"
                )
            else:
                seen[key][value] = i


def _rdt_problems(edits: dict[str, Any], where: str, out: list[str]) -> None:
    rdt = edits.get("intelRdt")
    if not isinstance(rdt, dict):
        return
    clos = _str(rdt, "closID")
    if (
        clos is not None
        and clos != "/"
        and (len(clos) >= 4096 or clos in (".", "..") or "/" in clos or "\n" in clos)
    ):
        out.append(f"{where}.intelRdt.closID: {clos[:64]!r} is not a valid file name")


def edits_problems(edits: Any, where: str, *, device: bool) -> list[str]:
    """Problems of one containerEdits mapping at `where` (a device's when `device`)."""
    out: list[str] = []
    if not isinstance(edits, dict):
        return out
    if device and all(v is None or v == [] for v in edits.values()):
        out.append(f"{where}: a device's edits must not be empty")
    env_problems(edits, "env", where, out)
    for i, node in _dict_items(edits, "deviceNodes"):
        _node_problems(node, f"{where}.deviceNodes[{i}]", out)
    for i, mount in _dict_items(edits, "mounts"):
        _mount_problems(mount, f"{where}.mounts[{i}]", out)
    for i, hook in _dict_items(edits, "hooks"):
        _hook_problems(hook, f"{where}.hooks[{i}]", out)
    _net_problems(edits, where, out)
    _rdt_problems(edits, where, out)
    return out


def _entries(edits: Any, where: str) -> Iterator[tuple[str, str, str, Any]]:
    """(category, target, location, content) of each node, mount and env entry of `edits`."""
    if not isinstance(edits, dict):
        return
    for i, node in _dict_items(edits, "deviceNodes"):
        path = _str(node, "path")
        if path:
            content = tuple(node.get(k) for k in ("hostPath", "type", "major", "minor"))
            yield "device node", path, f"{where}.deviceNodes[{i}]", content
    for i, mount in _dict_items(edits, "mounts"):
        target = _str(mount, "containerPath")
        if target:
            content = (mount.get("hostPath"), str(mount.get("options")), mount.get("type"))
            yield "mount", target, f"{where}.mounts[{i}]", content
    for i, entry in _items(edits, "env"):
        if isinstance(entry, str) and entry.find("=") > 0:
            key, _, value = entry.partition("=")
            yield "env", key, f"{where}.env[{i}]", value


def conflict_problems(common: Any, device_edits: Any, device_where: str) -> list[str]:
    """Entries of `device_edits` (or of `common` alone, when device_where is "") that clash."""
    out: list[str] = []
    seen: dict[tuple[str, str], tuple[str, Any]] = {}
    sources = [(common, "containerEdits", device_where == "")]
    if device_where:
        sources.append((device_edits, device_where, True))
    for edits, where, report in sources:
        for category, target, at, content in _entries(edits, where):
            first = seen.get((category, target))
            if first is None:
                seen[(category, target)] = (at, content)
            elif report and first[1] != content:
                out.append(f"{at}: conflicting edits: {category} {target!r} also set by {first[0]}")
    return out
