"""Mount-namespace helpers for gpuctk-hook: private namespaces and a writable window on an
ro-mounted container root.

runc mounts a `readonly: true` root read-only only after the createContainer hooks have run;
crun does it before (both checked here: runc 1.1.5, crun 1.8.1). `writable_root` gives the hook
the same view on both: when the root is a read-only bind mount in the container's own mount
namespace, it is remounted read-write for the hook's writes and read-only again after, with its
other flags (nosuid, nodev, noexec, atime) kept. The remount goes through the root's descriptor,
so it hits exactly the root's mount; a root that is not a mount point is never remounted.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os

from gpuctk.errors import OutputError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~3 ms per start
if TYPE_CHECKING:
    from collections.abc import Iterator

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME = 16384, 1 << 18, 1 << 21
MNT_DETACH, UMOUNT_NOFOLLOW = 2, 8

_libc = ctypes.CDLL(None, use_errno=True)
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
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int) -> None:
    """mount(2) with no data."""
    enc = [None if s is None else s.encode() for s in (source, target, fstype)]
    _check(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), None), f"mount {target}")


def unshare_private_mounts() -> None:
    """Enter a new mount namespace in which no mount event propagates back out."""
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    mount(None, "/", None, MS_REC | MS_PRIVATE)


def detach(path: str) -> None:
    """Lazily unmount `path` without following a link there; nothing mounted is fine."""
    if _libc.umount2(path.encode(), MNT_DETACH | UMOUNT_NOFOLLOW) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT, errno.ENOTDIR):
            raise OSError(err, f"umount {path}: {os.strerror(err)}")


def _mount_id(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}", encoding="ascii") as info:
        for line in info:
            if line.startswith("mnt_id:"):
                return int(line.split()[1])
    raise OSError(errno.ENOSYS, "no mnt_id in fdinfo")


def is_mount_root(fd: int) -> bool:
    """Whether the directory behind `fd` is the root of a mount (its parent is elsewhere)."""
    parent = os.open("..", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
    try:
        return _mount_id(parent) != _mount_id(fd)
    finally:
        os.close(parent)


def read_only(fd: int) -> bool:
    """Whether the mount holding `fd` is read-only."""
    return bool(os.fstatvfs(fd).f_flag & os.ST_RDONLY)


@contextlib.contextmanager
def writable_root(root_fd: int, where: str) -> Iterator[bool]:
    """Make an ro-mounted root writable for the block; yields whether it remounted."""
    if not read_only(root_fd):
        yield False
        return
    if not is_mount_root(root_fd):
        raise OutputError(f"container root {where} is on a read-only file system")
    keep = MS_REMOUNT | MS_BIND
    flags = os.fstatvfs(root_fd).f_flag
    for st_flag, ms_flag in _ST_TO_MS:
        keep |= ms_flag if flags & st_flag else 0
    target = f"/proc/self/fd/{root_fd}"
    try:
        mount(None, target, None, keep)
    except OSError as exc:
        raise OutputError(
            f"container root {where} is read-only and cannot be remounted: {exc}"
        ) from exc
    try:
        if read_only(root_fd):
            raise OutputError(f"container root {where} is on a read-only file system")
        yield True
    finally:
        try:
            mount(None, target, None, keep | MS_RDONLY)
        except OSError as exc:
            raise OutputError(f"cannot make container root {where} read-only again: {exc}") from exc
