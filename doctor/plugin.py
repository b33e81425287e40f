"""The running NVIDIA device plugin's device-list strategy, as root's `gpuctk doctor` reads it.

A local user can run a process of any name with any arguments, so a process counts as the
device plugin only where the kernel says root runs it: every uid in its /proc/<pid>/status is 0
and its executable (/proc/<pid>/exe, the file itself) is owned by root. Its /proc files are read
through one descriptor of its /proc/<pid> folder (a pid reused meanwhile reads as gone), never
following a link, never blocking, at most MAX_PROC_BYTES. Its config file is resolved inside
that process's own root (gpuctk.rootfs: RESOLVE_IN_ROOT, no magic links), looked at through an
O_PATH descriptor and read only if a regular file (a FIFO or device is never opened), bounded.

Every such process is read; the strategies are the union of theirs, and unknown if any one's
is: the advice built on them (gpuctk.doctor.policy) drops accept-envvar-unprivileged only when
no plugin hands GPUs out by `envvar`, so one more process can only make it more careful.
"""

from __future__ import annotations

import os
from typing import Any

from gpuctk.doctor.context import Context

PLUGIN_NAMES = ("nvidia-device-plugin",)
MAX_PROC_BYTES = 256 * 1024
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def _read(dir_fd: int, name: str) -> bytes:
    """A /proc/<pid> file, bounded (procfs files are never links, FIFOs or devices)."""
    fd = os.open(name, _FLAGS, dir_fd=dir_fd)
    try:
        return os.read(fd, MAX_PROC_BYTES)
    finally:
        os.close(fd)


def flag(argv: list[str], name: str) -> str | None:
    """The value of `--name=V` / `--name V` / `-name V` in argv (the last wins), or None."""
    value = None
    for i, arg in enumerate(argv):
        for dashes in ("--", "-"):
            if arg == f"{dashes}{name}" and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(f"{dashes}{name}="):
                value = arg.split("=", 1)[1]
    return value


def root_owned(dir_fd: int) -> bool:
    """Whether the process runs as root (real, effective, saved and fs uid) from an executable
    owned by root: no local user can make such a process (a setuid binary keeps the real uid)."""
    try:
        status = _read(dir_fd, "status")
        exe = os.stat("exe", dir_fd=dir_fd)  # follows the link: the executable's inode
    except OSError:
        return False
    for line in status.split(b"\n"):
        if line.startswith(b"Uid:"):
            uids = line.split()[1:]
            return bool(uids) and all(u == b"0" for u in uids) and exe.st_uid == 0
    return False


def _from_config_file(dir_fd: int, path: str) -> str | None:
    """flags.plugin.deviceListStrategy of the plugin's config file (seen in its own root)."""
    import yaml

    from gpuctk import rootfs

    try:
        root_fd = os.open("root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:  # a ConfigMap volume: another mount, links inside the root followed
        data = rootfs.read_file_in_root(root_fd, path, MAX_PROC_BYTES, any_mount=True)
        doc: Any = yaml.safe_load(data) if data is not None else None
    except (rootfs.InRootError, yaml.YAMLError):
        return None
    finally:
        os.close(root_fd)
    plugin = ((doc or {}).get("flags") or {}).get("plugin") if isinstance(doc, dict) else None
    value = plugin.get("deviceListStrategy") if isinstance(plugin, dict) else None
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return value if isinstance(value, str) else None


def _one(dir_fd: int, where: str) -> tuple[set[str] | None, str]:
    """The strategies of the plugin process whose /proc folder is `dir_fd`; its own precedence:
    the command line, then the environment, then the config file."""
    try:
        argv = [a.decode(errors="replace") for a in _read(dir_fd, "cmdline").split(b"\0")]
        raw = _read(dir_fd, "environ").split(b"\0")
    except OSError as exc:
        return None, f"{where}: command line or environment unreadable ({exc.strerror or exc})"
    env: dict[str, str] = {}
    for entry in raw:
        key, sep, val = entry.decode(errors="replace").partition("=")
        if sep:
            env[key] = val
    value, source = flag(argv, "device-list-strategy"), "--device-list-strategy"
    if value is None and "DEVICE_LIST_STRATEGY" in env:
        value, source = env["DEVICE_LIST_STRATEGY"], "DEVICE_LIST_STRATEGY"
    config = flag(argv, "config-file") or env.get("CONFIG_FILE")
    if value is None and config:
        value, source = _from_config_file(dir_fd, config), f"config file {config}"
        if value is None:
            return None, f"{where}: strategy in {config}, unreadable"
    if value is None:
        value, source = "envvar", "the default"
    found = {s.strip() for s in value.split(",") if s.strip()}
    return found, f"{where}: device-list strategy {','.join(sorted(found))} ({source})"


def _named(dir_fd: int) -> bool:
    try:
        argv0 = _read(dir_fd, "cmdline").split(b"\0")[0].decode(errors="replace")
    except OSError:
        return False
    return os.path.basename(argv0) in PLUGIN_NAMES


def plugin_strategy(ctx: Context) -> tuple[set[str] | None, str]:
    """The device-list strategies of the node's device plugins (None: unknown) and whence."""
    try:
        pids = sorted((p for p in os.listdir(ctx.proc_root) if p.isdigit()), key=int)
    except OSError:
        return None, f"{ctx.proc_root}: unreadable"
    union: set[str] | None = set()
    notes: list[str] = []
    for pid in pids:
        try:
            dir_fd = os.open(ctx.proc(pid), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            # first: the command line of a user's process is never read (its memory may be a
            # stalled FUSE mapping that blocks the reader)
            if not root_owned(dir_fd) or not _named(dir_fd):
                continue
            found, note = _one(dir_fd, f"device plugin (pid {pid})")
        finally:
            os.close(dir_fd)
        notes.append(note)
        union = None if found is None or union is None else union | found
    if not notes:
        return None, f"no nvidia-device-plugin process under {ctx.proc_root}"
    return union, "; ".join(notes)
