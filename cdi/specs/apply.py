"""Apply CDI container edits to an OCI runtime spec held as a plain dict.

The semantics are those of the reference library (tags.cncf.io/container-device-interface,
pkg/cdi/container-edits.go, `ContainerEdits.Apply` after `Append`):

- edits are first merged (`merge`): the spec-level edits of a spec once, before the edits of the
  first device requested from it, then each device's own edits, every list concatenated;
- `env`: replaced by key (the last entry with that key in the OCI env: the reference keeps
  their indexes in a map), else appended;
- `deviceNodes`: missing type/major/minor filled from the host node (`hostPath`, else `path`;
  the only I/O here, skipped when the spec carries them); the first `linux.devices` entry with
  the same path is removed, then the node replaces a second one in place or is appended; uid and
  gid default to the process user's when those are not 0; `b`/`c` nodes get a cgroup allow rule
  in `linux.resources.devices` with `permissions` as access (`rwm` when empty, none for "none");
- `mounts`: the first OCI mount with the same destination is removed, the new one appended; then
  ALL mounts are sorted, stably, by the number of `/` in their cleaned destination (one index
  of destinations per call: linear in the OCI mounts, whatever the number of CDI mounts);
- every mount `hostPath` and device-node host path must be one root alone can have made
  (gpuctk.cdi.specs.hostpaths: runc follows links in a mount source, so a folder others can write
  on the way would let them swap in a link to `/`), else the whole apply is refused;
- `hooks`: appended to their stage (each path absolute, its file trusted:
  gpuctk.cdi.specs.hostpaths);
  `additionalGids` (not 0) added once; `intelRdt` set;
  `netDevices` set by host interface name.

Everything else in the OCI dict survives untouched. Pure functions over dicts, importing only
`os`; the host-path checks (gpuctk.cdi.specs.hostpaths) load only for edits that name host paths.
"""

from __future__ import annotations

import os

from gpuctk.errors import TrustError, ValidationError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from typing import Any

    from gpuctk.cdi.specs.shape import DeviceNodeDoc, EditsDoc

    DeviceStat = Callable[[str], tuple[str, int, int]]

# The edit rules' words, here for the create path and read by gpuctk.cdi.specs.validate_edits and
# gpuctk.cdi.specs.hostpaths. CDI hookName -> OCI `hooks` key (the same words).
HOOK_STAGES = frozenset(
    ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
)
NO_PERMISSIONS = "none"
NODE_TYPES = frozenset(("", "b", "c", "u", "p"))
BIND_TYPES = frozenset(("", "bind", "rbind", "none"))  # a mount type whose source is a path
_LIST_KEYS = ("env", "deviceNodes", "netDevices", "hooks", "mounts", "additionalGids")


def merge(parts: Iterable[Mapping[str, Any] | None]) -> EditsDoc:
    """The reference `ContainerEdits.Append` folded over `parts`: lists concatenated in order,
    `intelRdt` taken from the last part that has one."""
    merged: Any = {}  # EditsDoc: each key of _LIST_KEYS a list of its shape's items
    for part in parts:
        if not part:
            continue
        for key in _LIST_KEYS:
            items = part.get(key)
            if items:
                merged.setdefault(key, []).extend(items)
        if part.get("intelRdt") is not None:
            merged["intelRdt"] = part["intelRdt"]
    edits: EditsDoc = merged
    return edits


def _env_problem(what: str, env: Any) -> str | None:
    if env is None:
        return None
    if not isinstance(env, list):
        return f"{what}: env must be a list of strings"
    for item in env:
        if not isinstance(item, str) or item.find("=") <= 0:
            return f"{what}: invalid environment variable {item!r}"
    return None


def _is_uint(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def problems(edits: Mapping[str, Any]) -> list[str]:
    """Every reason `edits` cannot be applied, as the reference `Validate` finds them."""
    found = [f"{k} must be a list" for k in _LIST_KEYS if not isinstance(edits.get(k) or [], list)]
    if edits.get("intelRdt") is not None and not isinstance(edits["intelRdt"], dict):
        found.append("intelRdt must be a mapping")
    if found:
        return found
    problem = _env_problem("container edits", edits.get("env"))
    if problem:
        found.append(problem)
    for node in edits.get("deviceNodes") or ():
        if not isinstance(node, dict) or not isinstance(node.get("path"), str) or not node["path"]:
            found.append(f"invalid device node {node!r}: empty or missing path")
            continue
        path = node["path"]
        if node.get("type", "") not in NODE_TYPES:
            found.append(f"device {path!r}: invalid type {node.get('type')!r}")
        for key in ("major", "minor", "fileMode", "uid", "gid"):
            if key in node and node[key] is not None and not _is_uint(node[key]):
                found.append(f"device {path!r}: invalid {key} {node[key]!r}")
        perms = node.get("permissions") or ""
        if not isinstance(perms, str) or (perms != NO_PERMISSIONS and perms.strip("rwm")):
            found.append(f"device {path!r}: invalid permissions {perms!r}")
        host = node.get("hostPath")
        if host is not None and not isinstance(host, str):
            found.append(f"device {path!r}: invalid hostPath {host!r}")
    for hook in edits.get("hooks") or ():
        if not isinstance(hook, dict) or hook.get("hookName") not in HOOK_STAGES:
            name = hook.get("hookName") if isinstance(hook, dict) else hook
            found.append(f"invalid hook name {name!r}")
            continue
        if not isinstance(hook.get("path"), str) or not hook["path"]:
            found.append(f"invalid hook {hook['hookName']!r} with empty path")
        elif not hook["path"].startswith("/"):  # runc would look in its own working folder
            found.append(
                f"invalid hook {hook['hookName']!r}: path {hook['path']!r} is not absolute"
            )
        args = hook.get("args")
        if args is not None and not (
            isinstance(args, list) and all(isinstance(a, str) for a in args)
        ):
            found.append(f"invalid hook {hook['hookName']!r}: args must be a list of strings")
        problem = _env_problem(f"invalid hook {hook['hookName']!r}", hook.get("env"))
        if problem:
            found.append(problem)
    for mount in edits.get("mounts") or ():
        if not isinstance(mount, dict):
            found.append(f"invalid mount {mount!r}")
        elif not isinstance(mount.get("hostPath"), str) or not mount["hostPath"]:
            found.append("invalid mount, empty host path")
        elif not isinstance(mount.get("containerPath"), str) or not mount["containerPath"]:
            found.append("invalid mount, empty container path")
        elif mount.get("options") is not None and not (
            isinstance(mount["options"], list) and all(isinstance(o, str) for o in mount["options"])
        ):
            found.append(f"mount {mount['containerPath']!r}: options must be a list of strings")
    for dev in edits.get("netDevices") or ():
        if not isinstance(dev, dict) or not dev.get("hostInterfaceName") or not dev.get("name"):
            found.append(f"invalid linux net device {dev!r}")
    for gid in edits.get("additionalGids") or ():
        if not _is_uint(gid):
            found.append(f"invalid additional GID {gid!r}")
    return found


def _oci_device(node: Mapping[str, Any], stat_device: DeviceStat) -> dict[str, Any]:
    """The OCI `linux.devices` entry for a CDI device node (the reference `fillMissingInfo`)."""
    path = node["path"]
    kind = node.get("type") or ""
    major = node.get("major") or 0
    minor = node.get("minor") or 0
    if not kind or (major == 0 and kind != "p"):
        host = node.get("hostPath") or path
        try:
            host_kind, host_major, host_minor = stat_device(host)
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            raise ValidationError(f"failed to stat CDI host device {host!r}: {reason}") from None
        if not kind:
            kind = host_kind
        elif kind != host_kind:
            raise ValidationError(
                f"CDI device ({path!r}, {host!r}), host type mismatch ({kind}, {host_kind})"
            )
        if major == 0 and kind != "p":
            major, minor = host_major, host_minor
    dev: dict[str, Any] = {"path": path, "type": kind, "major": major, "minor": minor}
    for key in ("fileMode", "uid", "gid"):
        if node.get(key) is not None:
            dev[key] = node[key]
    return dev


def _child(parent: dict[str, Any], key: str, default: Any) -> Any:
    value = parent.get(key)
    if value is None:
        value = parent[key] = default
    return value


# Where apply() writes: (path, type) pairs that must hold (or be absent/null) beforehand.
_SHAPE = (
    (("process",), dict),
    (("process", "env"), list),
    (("process", "user"), dict),
    (("process", "user", "additionalGids"), list),
    (("linux",), dict),
    (("linux", "devices"), list),
    (("linux", "netDevices"), dict),
    (("linux", "resources"), dict),
    (("linux", "resources", "devices"), list),
    (("mounts",), list),
    (("hooks",), dict),
)


def shape_problems(oci: Mapping[str, Any]) -> list[str]:
    """Fields of `oci` that apply() would edit but that have the wrong JSON type."""
    found = []
    for path, expected in _SHAPE:
        value: Any = oci
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None and not isinstance(value, expected):
            what = "an object" if expected is dict else "a list"
            found.append(f"OCI spec field {'.'.join(path)} must be {what}")
    hooks = oci.get("hooks")
    if isinstance(hooks, dict):
        for stage in HOOK_STAGES:
            if hooks.get(stage) is not None and not isinstance(hooks[stage], list):
                found.append(f"OCI spec field hooks.{stage} must be a list")
    return found


def clean_depth(destination: str) -> int:
    """The number of `/` in Go's `filepath.Clean(destination)`: the mount sort key."""
    d = destination
    if "//" in d or "/." in d or d.endswith("/") or d.startswith("."):
        cleaned = os.path.normpath(destination) if destination else "."
        if cleaned.startswith("//"):
            cleaned = "/" + cleaned.lstrip("/")
        return cleaned.count("/")
    return destination.count("/")


def apply(oci: dict[str, Any], edits: EditsDoc, *, stat_device: DeviceStat | None = None) -> None:
    """Apply merged CDI `edits` to the OCI spec dict `oci` in place.

    ValidationError (nothing changed) when the edits are invalid or a device node's missing
    type/major/minor cannot be read from the host; TrustError when a hook's file, a mount
    source or a device host path (or a folder above it) could be written or swapped by
    someone other than root (gpuctk.cdi.specs.spectrust, gpuctk.cdi.specs.hostpaths).
    """
    found = problems(edits)
    if found:
        raise ValidationError(f"invalid CDI container edits: {found[0]}", found)
    found = shape_problems(oci)
    if found:
        raise ValidationError(f"invalid OCI spec: {found[0]}", found)
    if edits.get("hooks") or edits.get("mounts") or edits.get("deviceNodes"):
        _refuse_untrusted_host_paths(edits)
    devices = []  # read before any edit: a node that cannot be read changes nothing
    if edits.get("deviceNodes"):
        from gpuctk.cdi.specs.hostpaths import host_device_info

        stat_fn = stat_device or host_device_info
        devices = [(node, _oci_device(node, stat_fn)) for node in edits["deviceNodes"]]

    if edits.get("env"):
        _apply_env(_child(oci, "process", {}), edits["env"])
    if devices:
        _apply_devices(oci, devices)
    if edits.get("netDevices"):
        net = _child(_child(oci, "linux", {}), "netDevices", {})
        for dev in edits["netDevices"]:
            net[dev["hostInterfaceName"]] = {"name": dev["name"]}
    if edits.get("mounts"):
        _apply_mounts(oci, edits["mounts"])
    for hook in edits.get("hooks") or ():
        entry: dict[str, Any] = {"path": hook["path"]}
        for key in ("args", "env"):
            if hook.get(key):
                entry[key] = list(hook[key])
        if hook.get("timeout") is not None:
            entry["timeout"] = hook["timeout"]
        _child(_child(oci, "hooks", {}), hook["hookName"], []).append(entry)
    rdt: Mapping[str, Any] | None = edits.get("intelRdt")
    if rdt is not None:
        keys = ("closID", "l3CacheSchema", "memBwSchema", "schemata", "enableMonitoring")
        _child(oci, "linux", {})["intelRdt"] = {k: rdt[k] for k in keys if rdt.get(k)}
    gids = [g for g in edits.get("additionalGids") or () if g != 0]
    if gids:
        user = _child(_child(oci, "process", {}), "user", {})
        have = _child(user, "additionalGids", [])
        for gid in gids:
            if gid not in have:
                have.append(gid)


def _refuse_untrusted_host_paths(edits: Mapping[str, Any]) -> None:
    """TrustError for the first hook file (run as root), else the first mount source or
    device host path (runc follows links in one) that someone other than root could have
    written or swapped, with the count of the others."""
    from gpuctk.cdi.specs.hostpaths import hook_problems, source_problems

    found = hook_problems(edits["hooks"]) if edits.get("hooks") else []
    if not found and (edits.get("mounts") or edits.get("deviceNodes")):
        found = source_problems(edits)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise TrustError(f"{found[0]}{more}")


def _apply_env(process: dict[str, Any], env: Iterable[str]) -> None:
    current = _child(process, "env", [])
    index: dict[str, int] = {}
    for i, item in enumerate(current):
        if isinstance(item, str):
            index[item.partition("=")[0]] = i  # the reference's map: the last index wins
    for item in env:
        key = item.partition("=")[0]
        at = index.get(key)
        if at is None:
            index[key] = len(current)
            current.append(item)
        else:
            current[at] = item


def _apply_devices(
    oci: dict[str, Any], devices: list[tuple[DeviceNodeDoc, dict[str, Any]]]
) -> None:
    process = oci.get("process")
    user = process.get("user") if isinstance(process, dict) else None
    uid = user.get("uid", 0) if isinstance(user, dict) else 0
    gid = user.get("gid", 0) if isinstance(user, dict) else 0
    linux = _child(oci, "linux", {})
    oci_devices = _child(linux, "devices", [])
    where, heads = _positions(oci_devices, "path", {dev["path"] for _, dev in devices})
    gone: set[int] = set()
    for node, dev in devices:
        if "uid" not in dev and isinstance(uid, int) and uid > 0:
            dev["uid"] = uid
        if "gid" not in dev and isinstance(gid, int) and gid > 0:
            dev["gid"] = gid
        live = where[dev["path"]]
        if heads[dev["path"]] < len(live):  # RemoveDevice: the first match
            gone.add(live[heads[dev["path"]]])
            heads[dev["path"]] += 1
        if heads[dev["path"]] < len(live):  # AddDevice: replace the next one, else append
            oci_devices[live[heads[dev["path"]]]] = dev
        else:
            live.append(len(oci_devices))
            oci_devices.append(dev)
        if dev["type"] in ("b", "c"):
            access = node.get("permissions") or "rwm"
            if access == NO_PERMISSIONS:
                access = ""
            rule: dict[str, Any] = {
                "allow": True,
                "type": dev["type"],
                "major": dev["major"],
                "minor": dev["minor"],
            }
            if access:
                rule["access"] = access
            _child(_child(linux, "resources", {}), "devices", []).append(rule)
    if gone:
        oci_devices[:] = [d for i, d in enumerate(oci_devices) if i not in gone]


def _positions(
    items: list[Any], key: str, wanted: set[str]
) -> tuple[dict[str, list[int]], dict[str, int]]:
    """For each value in `wanted`: the indices in `items` of the dicts whose `key` has it, in
    order, and where the first one not yet removed is (0): one scan, however many edits."""
    where: dict[str, list[int]] = {value: [] for value in wanted}
    for i, item in enumerate(items):
        if isinstance(item, dict):
            value = item.get(key)
            if isinstance(value, str) and value in where:
                where[value].append(i)
    return where, dict.fromkeys(where, 0)


def _apply_mounts(oci: dict[str, Any], mounts: Iterable[Mapping[str, Any]]) -> None:
    current = _child(oci, "mounts", [])
    mounts = list(mounts)
    where, heads = _positions(current, "destination", {m["containerPath"] for m in mounts})
    gone: set[int] = set()
    for mount in mounts:
        destination = mount["containerPath"]
        live = where[destination]
        if heads[destination] < len(live):  # RemoveMount: the first match
            gone.add(live[heads[destination]])
            heads[destination] += 1
        live.append(len(current))
        entry: dict[str, Any] = {"destination": destination}
        if mount.get("type"):
            entry["type"] = mount["type"]
        entry["source"] = mount["hostPath"]
        if mount.get("options"):
            entry["options"] = list(mount["options"])
        current.append(entry)
    if gone:
        current[:] = [m for i, m in enumerate(current) if i not in gone]
    current.sort(key=_mount_depth)


def _mount_depth(mount: Any) -> int:
    destination = mount.get("destination") if isinstance(mount, dict) else None
    return clean_depth(destination) if isinstance(destination, str) else 0
