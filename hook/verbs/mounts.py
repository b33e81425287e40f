"""Mount-namespace helpers for gpuctk-hook: private namespaces and a writable window on an
ro-mounted container root.

runc mounts a `readonly: true` root read-only only after the createContainer hooks have run;
crun does it before (both checked here: runc 1.1.5, crun 1.8.1). `writable_root` gives the hook
the same view on both: when the root is a read-only bind mount in the container's own mount
namespace, it is remounted read-write for the hook's writes and read-only again after, with its
other flags (nosuid, nodev, noexec, atime) kept. The remount goes through the root's descriptor,
so it hits exactly the root's mount; a root that is not a mount point is never remounted.

The hook imports this at every container start, so it stays off `ctypes` (libc calls go through
gpuctk.libc), `re` and `contextlib`: imports every hook process would pay for.
"""

from __future__ import annotations

import errno
import os

from gpuctk import libc, rootfs
from gpuctk.errors import OutputError

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME = 16384, 1 << 18, 1 << 21
MNT_DETACH, UMOUNT_NOFOLLOW = 2, 8

_ST_TO_MS = (
    (os.ST_NOSUID, MS_NOSUID),
    (os.ST_NODEV, MS_NODEV),
    (os.ST_NOEXEC, MS_NOEXEC),
    (os.ST_NOATIME, MS_NOATIME),
    (os.ST_NODIRATIME, MS_NODIRATIME),
    (os.ST_RELATIME, MS_RELATIME),
)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = libc.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int) -> None:
    """mount(2) with no data."""
    enc = [None if s is None else s.encode() for s in (source, target, fstype)]
    rc = libc.function("mount")(enc[0], enc[1], enc[2], libc.long_arg(flags), None)
    _check(rc, f"mount {target}")


def unshare_private_mounts() -> None:
    """Enter a new mount namespace in which no mount event propagates back out."""
    _check(libc.function("unshare")(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    mount(None, "/", None, MS_REC | MS_PRIVATE)


def detach(path: str) -> None:
    """Lazily unmount `path` without following a link there; nothing mounted is fine."""
    if libc.function("umount2")(path.encode(), MNT_DETACH | UMOUNT_NOFOLLOW) != 0:
        err = libc.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT, errno.ENOTDIR):
            raise OSError(err, f"umount {path}: {os.strerror(err)}")


def is_mount_root(fd: int) -> bool:
    """Whether the directory behind `fd` is the root of a mount (its parent is elsewhere)."""
    parent = os.open("..", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
    try:
        return rootfs.mount_id(parent) != rootfs.mount_id(fd)
    finally:
        os.close(parent)


def _flags(fd: int) -> int:
    """The MS_* flags to keep when remounting the mount behind `fd`."""
    have = os.fstatvfs(fd).f_flag
    return sum(ms_flag for st_flag, ms_flag in _ST_TO_MS if have & st_flag)


def unescape_octal(field: bytes) -> bytes:
    """A mountinfo field with the kernel's `\\ooo` escapes (space, tab, newline, backslash)
    undone; anything else is kept as it is."""
    if b"\\" not in field:
        return field
    out, i = bytearray(), 0
    while i < len(field):
        digits = field[i + 1 : i + 4]
        if field[i] == 0x5C and len(digits) == 3 and all(0x30 <= d <= 0x37 for d in digits):
            out.append(int(digits, 8) & 0xFF)
            i += 4
        else:
            out.append(field[i])
            i += 1
    return bytes(out)


def _mount_points() -> list[str]:
    """Mount points of this namespace, from /proc/self/mountinfo (octal escapes undone)."""
    with open("/proc/self/mountinfo", "rb") as info:
        return [os.fsdecode(unescape_octal(line.split(b" ")[4])) for line in info]


def seal_submounts(root_fd: int) -> list[str]:
    """In a private mount namespace: remount read-only every mount below the root that is not the
    root's own file system (driver binds, volumes, /dev ...), so that what runs there next can
    write only to the root itself. Returns warnings for mounts that could not be sealed."""
    prefix = os.readlink(f"/proc/self/fd/{root_fd}").rstrip("/") + "/"
    root_id, warnings = rootfs.mount_id(root_fd), []
    for point in _mount_points():
        if not point.startswith(prefix):
            continue
        rel = point[len(prefix) :]
        try:
            fd = rootfs.open_in_root(root_fd, rel, os.O_PATH | os.O_NOFOLLOW)
        except rootfs.InRootError:
            continue  # over-mounted or gone
        try:
            if rootfs.mount_id(fd) != root_id:
                sealed = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
                mount(None, f"/proc/self/fd/{fd}", None, sealed | _flags(fd))
        except OSError as exc:
            if rel.split("/")[0] not in ("proc", "sys"):  # those are detached anyway
                warnings.append(f"cannot make /{rel} read-only for ldconfig: {exc}")
        finally:
            os.close(fd)
    return warnings


def read_only(fd: int) -> bool:
    """Whether the mount holding `fd` is read-only."""
    return bool(os.fstatvfs(fd).f_flag & os.ST_RDONLY)


class _WritableRoot:
    """The context manager of writable_root."""

    def __init__(self, root_fd: int, where: str) -> None:
        self.root_fd, self.where = root_fd, where
        self.keep = 0
        self.target = ""

    def __enter__(self) -> bool:
        root_fd, where = self.root_fd, self.where
        if not read_only(root_fd):
            return False
        if not is_mount_root(root_fd):
            raise OutputError(f"container root {where} is on a read-only file system")
        keep = MS_REMOUNT | MS_BIND | _flags(root_fd)
        target = f"/proc/self/fd/{root_fd}"
        try:
            mount(None, target, None, keep)
        except OSError as exc:
            raise OutputError(
                f"container root {where} is read-only and cannot be remounted: {exc}"
            ) from exc
        self.keep, self.target = keep, target
        if read_only(root_fd):
            self.__exit__()
            raise OutputError(f"container root {where} is on a read-only file system")
        return True

    def __exit__(self, *_: object) -> None:
        if not self.target:
            return
        target, self.target = self.target, ""
        try:
            mount(None, target, None, self.keep | MS_RDONLY)
        except OSError as exc:
            raise OutputError(
                f"cannot make container root {self.where} read-only again: {exc}"
            ) from exc


def writable_root(root_fd: int, where: str) -> _WritableRoot:
    """Make an ro-mounted root writable for a `with` block (read-only again after it, also on
    an error); the block gets whether it remounted."""
    return _WritableRoot(root_fd, where)
