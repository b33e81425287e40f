"""Allow devices in a running container's device cgroup (what runc does from linux.resources).

The container's cgroup is the one its init process is in (/proc/<pid>/cgroup, read by a hook
that runs in the runtime's cgroup namespace), under the hierarchy the runtime uses: cgroup v2
when /sys/fs/cgroup itself is a cgroup2 mount (runc's test; a hybrid host's
/sys/fs/cgroup/unified does not count), else the cgroup v1 hierarchy with the `devices`
controller.

- v1: one `c MAJ:MIN rwm` line per rule written to the cgroup's devices.allow;
- v2: the eBPF device program(s) attached to the cgroup are replaced by ones that also allow the
  rules (gpuctk.hook.verbs.devbpf).

Rules are OCI `linux.resources.devices` entries as gpuctk.cdi.specs.apply writes them (allow, type
b or
c, major, minor, access); a rule without access allows nothing and is skipped.
"""

from __future__ import annotations

import os
import posixpath

from gpuctk.errors import GpuctkError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

CGROUP_ROOT = "/sys/fs/cgroup"


class CgroupError(GpuctkError):
    """The container's device cgroup could not be found or changed."""


class Mount:
    """One line of /proc/self/mountinfo (the fields this module reads)."""

    __slots__ = ("fstype", "options", "point", "root")

    def __init__(self, root: str, point: str, fstype: str, options: str) -> None:
        self.root, self.point, self.fstype, self.options = root, point, fstype, options


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (\\040 for a space, ...)."""
    if "\\" not in field:
        return field
    raw = field.encode("utf-8", "surrogateescape")
    return raw.decode("unicode_escape").encode("latin-1").decode("utf-8", "surrogateescape")


def parse_mountinfo(text: str) -> list[Mount]:
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(" "), right.split(" ")
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        out.append(Mount(_unescape(fields[3]), _unescape(fields[4]), tail[0], tail[2]))
    return out


def hierarchy(mounts: list[Mount]) -> tuple[int, Mount]:
    """(1 or 2, the mount) of the hierarchy that controls devices here."""
    top = [m for m in mounts if m.point == CGROUP_ROOT]
    if top and top[-1].fstype == "cgroup2":
        return 2, top[-1]
    for mount in reversed(mounts):
        if mount.fstype == "cgroup" and "devices" in mount.options.split(","):
            return 1, mount
    raise CgroupError("no device cgroup found: neither cgroup v2 at /sys/fs/cgroup nor v1 devices")


def cgroup_of(proc_cgroup: str, version: int) -> str:
    """The cgroup path in a /proc/<pid>/cgroup text for the v2 or v1-devices hierarchy."""
    for line in proc_cgroup.splitlines():
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if (version == 2 and line.startswith("0::")) or (
            version == 1 and "devices" in controllers.split(",")
        ):
            return path
    raise CgroupError(f"the container's process is in no cgroup v{version} devices hierarchy")


def cgroup_dir(mount: Mount, path: str) -> str:
    """Host path of cgroup `path` (as /proc/<pid>/cgroup shows it) under `mount`."""
    if not path.startswith("/") or ".." in path.split("/"):
        raise CgroupError(f"unexpected cgroup path {path!r}")
    root = mount.root.rstrip("/")
    if root:
        if path != root and not path.startswith(root + "/"):
            raise CgroupError(f"cgroup {path} is outside the mounted hierarchy {mount.root}")
        path = path[len(root) :] or "/"
    return posixpath.normpath(mount.point + path)


def locate(
    pid: int, mountinfo: str | None = None, proc_cgroup: str | None = None
) -> tuple[int, str]:
    """(version, host directory) of the device cgroup of process `pid`."""
    if mountinfo is None:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            mountinfo = f.read()
    version, mount = hierarchy(parse_mountinfo(mountinfo))
    if proc_cgroup is None:
        try:
            with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="surrogateescape") as f:
                proc_cgroup = f.read()
        except OSError as exc:
            raise CgroupError(f"cannot read /proc/{pid}/cgroup: {exc.strerror}") from exc
    return version, cgroup_dir(mount, cgroup_of(proc_cgroup, version))


def rules_of(entries: Iterable[Mapping[str, Any]]) -> list[tuple[str, int, int, str]]:
    """(type, major, minor, access) of the allow rules among OCI linux.resources.devices entries."""
    out = []
    for entry in entries:
        access = entry.get("access") or ""
        if entry.get("allow") is not True or not access or entry.get("type") not in ("b", "c"):
            continue
        major, minor = entry.get("major"), entry.get("minor")
        if not isinstance(major, int) or not isinstance(minor, int) or major < 0 or minor < 0:
            continue  # a wildcard: never written by CDI edits
        rule = (entry["type"], major, minor, access)
        if rule not in out:
            out.append(rule)
    return out


def v1_lines(rules: Iterable[tuple[str, int, int, str]]) -> list[str]:
    """devices.allow lines for the rules."""
    out = []
    for kind, major, minor, access in rules:
        if kind not in ("b", "c") or not access or access.strip("rwm"):
            raise CgroupError(f"invalid device rule {kind} {major}:{minor} {access}")
        out.append(f"{kind} {major}:{minor} {access}")
    return out


def allow(version: int, directory: str, rules: list[tuple[str, int, int, str]]) -> str:
    """Allow the rules in the cgroup at `directory`; returns what was done, in words."""
    if not rules:
        return "no device rules"
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        dir_fd = os.open(directory, flags)
    except OSError as exc:
        raise CgroupError(f"cannot open cgroup {directory}: {exc.strerror}") from exc
    try:
        if version == 1:
            try:
                fd = os.open("devices.allow", os.O_WRONLY | os.O_CLOEXEC, dir_fd=dir_fd)
                try:
                    for line in v1_lines(rules):
                        os.write(fd, line.encode())
                finally:
                    os.close(fd)
            except OSError as exc:
                raise CgroupError(
                    f"cannot allow devices in {directory}/devices.allow: {exc.strerror}"
                ) from exc
            return f"{len(rules)} rules in {directory}/devices.allow"
        from gpuctk.hook.verbs import devbpf

        try:
            built = [devbpf.rule(*r) for r in rules]
            count = devbpf.allow(dir_fd, built)
        except (OSError, ValueError) as exc:
            raise CgroupError(f"cannot allow devices in cgroup {directory}: {exc}") from exc
        if count == 0:
            return f"no device program on {directory}: nothing filtered"
        return f"{len(rules)} rules in {count} device program(s) of {directory}"
    finally:
        os.close(dir_fd)
