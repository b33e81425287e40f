"""Enter a container's mount namespace, then add device nodes and bind mounts through descriptors.

A prestart / createRuntime hook runs in the runtime's namespaces while the container's init
waits before pivot_root: its mount namespace holds the prepared root at config.json's root.path.
`Container.open` pins the init process with a pidfd, opens its mount namespace and checks that
the pid is still that process afterwards (no pid reuse), that it lives in a mount namespace other
than ours and has not pivoted yet. `enter` joins that namespace and checks that root.path there
is the very directory the host sees there, and a mount of its own (the runtime's bind).

Bind mounts use the new mount API: `open_tree(OPEN_TREE_CLONE)` on the trusted host path, in the
host's namespace, gives a detached copy; `mount_setattr` makes it read-only, nosuid, ... while
still detached (so it is never writable inside the container); after `enter`, `move_mount`
attaches it onto a descriptor of the target resolved inside the root (RESOLVE_IN_ROOT): no path
is resolved twice, so a symlink swapped in by the image cannot redirect it. Kernels older than
5.12 get a fallback: a bind through /proc/self/fd paths of both descriptors, then a remount of
the new mount, checked to be the one just made.
"""

from __future__ import annotations

import ctypes
import errno
import os
import posixpath
import signal
import stat

from gpuctk import rootfs
from gpuctk.errors import GpuctkError
from gpuctk.hook.verbs import mounts
from gpuctk.hook.verbs.mknod import mkdirs

CLONE_NEWNS = 0x00020000
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442  # all architectures
OPEN_TREE_CLONE, AT_RECURSIVE, AT_EMPTY_PATH = 1, 0x8000, 0x1000
MOVE_MOUNT_F_EMPTY_PATH, MOVE_MOUNT_T_EMPTY_PATH = 0x4, 0x40
MS_PRIVATE, MS_SLAVE, MS_SHARED, MS_UNBINDABLE = 1 << 18, 1 << 19, 1 << 20, 1 << 17
# OCI mount option -> (MOUNT_ATTR_* set, MOUNT_ATTR_* cleared); atime options replace each other
_ATTR = {
    "ro": (0x1, 0),
    "rw": (0, 0x1),
    "nosuid": (0x2, 0),
    "suid": (0, 0x2),
    "nodev": (0x4, 0),
    "dev": (0, 0x4),
    "noexec": (0x8, 0),
    "exec": (0, 0x8),
    "noatime": (0x10, 0x70),
    "strictatime": (0x20, 0x70),
    "relatime": (0, 0x70),
    "nodiratime": (0x80, 0),
}
_PROPAGATION = {
    "private": MS_PRIVATE, "rprivate": MS_PRIVATE, "slave": MS_SLAVE, "rslave": MS_SLAVE,
    "shared": MS_SHARED, "rshared": MS_SHARED, "unbindable": MS_UNBINDABLE,
    "runbindable": MS_UNBINDABLE,
}  # fmt: skip
_MS_FLAGS = {"ro": 1, "nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048}
_FDS = os.O_CLOEXEC

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_new_api: bool | None = None  # None: probe on first use (kernels before 5.2 lack it)


class NamespaceError(GpuctkError):
    """The container's process or mount namespace cannot be used."""


class MountAttr(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("attr_set", "attr_clr", "propagation", "userns")]


def _sys(number: int, *args: object) -> int:
    rc = _libc.syscall(ctypes.c_long(number), *args)
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(rc)


def options_attr(options: list[str]) -> tuple[MountAttr, bool]:
    """(mount_setattr attributes, recursive) for OCI bind mount options; ValueError if unknown."""
    attr, recursive = MountAttr(), False
    for opt in options:
        if opt in _ATTR:
            on, off = _ATTR[opt]
            attr.attr_clr |= off
            attr.attr_set = (attr.attr_set & ~off) | on
        elif opt in _PROPAGATION:
            attr.propagation = _PROPAGATION[opt]
        elif opt in ("bind", "rbind"):
            recursive = recursive or opt == "rbind"
        elif opt not in ("defaults", "atime", "diratime"):
            raise ValueError(f"unsupported bind mount option {opt!r}")
    if attr.attr_clr & 0x70 and not attr.attr_set & 0x70:
        attr.attr_clr |= 0x70  # relatime: MOUNT_ATTR__ATIME cleared, RELATIME (0) set
    return attr, recursive


class Source:
    """A bind-mount source: a detached mount (new API) or a host path (fallback)."""

    __slots__ = ("fd", "host_path", "options", "recursive")

    def __init__(self, host_path: str, options: list[str]) -> None:
        global _new_api
        self.host_path, self.options, self.fd = host_path, options, -1
        try:
            attr, self.recursive = options_attr(options)
        except ValueError as exc:
            raise NamespaceError(f"cannot mount {host_path}: {exc}") from exc
        if _new_api is False:
            return
        flags = OPEN_TREE_CLONE | _FDS | (AT_RECURSIVE if self.recursive else 0)
        try:
            self.fd = _sys(_SYS_OPEN_TREE, -100, host_path.encode(), ctypes.c_uint(flags))
        except OSError as exc:
            if exc.errno != errno.ENOSYS:
                raise NamespaceError(f"cannot open mount source {host_path}: {exc}") from exc
            _new_api = False
            return
        try:
            at = AT_EMPTY_PATH | (AT_RECURSIVE if self.recursive else 0)
            _sys(_SYS_MOUNT_SETATTR, self.fd, b"", at, ctypes.byref(attr), ctypes.c_size_t(32))
            _new_api = True
        except OSError as exc:
            os.close(self.fd)
            self.fd = -1
            if exc.errno != errno.ENOSYS:
                raise NamespaceError(f"cannot set mount options on {host_path}: {exc}") from exc
            _new_api = False

    def is_dir(self) -> bool:
        st = os.fstat(self.fd) if self.fd >= 0 else os.stat(self.host_path)
        return stat.S_ISDIR(st.st_mode)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _mount_id(fd: int) -> int:
    try:
        return rootfs.mount_id(fd)
    except rootfs.InRootError:
        raise OSError(errno.ENOSYS, "no mnt_id in fdinfo") from None


def _create(root_fd: int, path: str, directory: bool) -> None:
    parent = mkdirs(root_fd, posixpath.dirname(path))
    name = posixpath.basename(path)
    try:
        if directory:
            os.mkdir(name, 0o755, dir_fd=parent)
        else:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _FDS
            os.close(os.open(name, flags, 0o644, dir_fd=parent))
    except FileExistsError:
        pass  # a dangling symlink or a race: the open below resolves whatever is there
    finally:
        os.close(parent)


def bind(root_fd: int, source: Source, target: str) -> None:
    """Mount `source` at container path `target` (created when missing, inside the root)."""
    target = posixpath.normpath("/" + target.lstrip("/"))
    try:
        fd = rootfs.open_in_root(root_fd, target, os.O_PATH)
    except rootfs.InRootError as exc:
        if exc.errno != errno.ENOENT:
            raise
        _create(root_fd, target, source.is_dir())
        fd = rootfs.open_in_root(root_fd, target, os.O_PATH)
    try:
        if source.fd >= 0:
            flags = MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH
            _sys(_SYS_MOVE_MOUNT, source.fd, b"", fd, b"", ctypes.c_uint(flags))
        else:
            _bind_fallback(root_fd, source, target, fd)
    except OSError as exc:
        raise NamespaceError(f"cannot mount {source.host_path} at {target}: {exc}") from exc
    finally:
        os.close(fd)


def _bind_fallback(root_fd: int, source: Source, target: str, fd: int) -> None:
    src = os.open(source.host_path, os.O_PATH | _FDS)
    try:
        flags = mounts.MS_BIND | (mounts.MS_REC if source.recursive else 0)
        mounts.mount(f"/proc/self/fd/{src}", f"/proc/self/fd/{fd}", None, flags)
        new = rootfs.open_in_root(root_fd, target, os.O_PATH)
        try:
            a, b = os.fstat(new), os.fstat(src)
            if _mount_id(new) == _mount_id(fd) or (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
                raise OSError(errno.EXDEV, "the target changed while it was mounted")
            ms = sum(_MS_FLAGS.get(o, 0) for o in source.options)
            remount = mounts.MS_REMOUNT | mounts.MS_BIND | ms
            mounts.mount(None, f"/proc/self/fd/{new}", None, remount)
            prop = options_attr(source.options)[0].propagation
            if prop:
                mounts.mount(None, f"/proc/self/fd/{new}", None, int(prop))
        finally:
            os.close(new)
    finally:
        os.close(src)


class Container:
    """The waiting init process of a container: pinned, its mount namespace opened."""

    __slots__ = ("ns_fd", "pid", "pidfd")

    def __init__(self, pid: int) -> None:
        self.pid, self.pidfd, self.ns_fd = pid, -1, -1

    def open(self, read_cgroup: bool = True) -> str:
        """Pin the process, open its mount namespace; returns /proc/<pid>/cgroup's text."""
        pid = self.pid
        if pid <= 1:
            raise NamespaceError(f"OCI state pid {pid} names no container process")
        try:
            self.pidfd = os.pidfd_open(pid)
            self.ns_fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | _FDS)
            their_root, our_root = os.stat(f"/proc/{pid}/root"), os.stat("/")
            text = ""
            if read_cgroup:
                with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="surrogateescape") as f:
                    text = f.read()
            signal.pidfd_send_signal(self.pidfd, 0)  # still the process we pinned
        except OSError as exc:
            raise NamespaceError(f"container process {pid}: {exc.strerror or exc}") from exc
        if os.fstat(self.ns_fd).st_ino == os.stat("/proc/self/ns/mnt").st_ino:
            raise NamespaceError(f"container process {pid} shares the runtime's mount namespace")
        if (their_root.st_dev, their_root.st_ino) != (our_root.st_dev, our_root.st_ino):
            raise NamespaceError(f"container process {pid} has already changed its root")
        return text

    def enter(self, root_path: str) -> int:
        """Join the mount namespace; returns a descriptor of the root there (checked)."""
        before = os.stat(root_path)
        if _libc.setns(self.ns_fd, CLONE_NEWNS) != 0:
            err = ctypes.get_errno()
            raise NamespaceError(f"cannot enter the mount namespace: {os.strerror(err)}")
        root_fd = rootfs.open_root(root_path)
        st = os.fstat(root_fd)
        if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino) or not mounts.is_mount_root(
            root_fd
        ):
            os.close(root_fd)
            raise NamespaceError(f"{root_path} is not the prepared root of process {self.pid}")
        return root_fd

    def close(self) -> None:
        for fd in (self.ns_fd, self.pidfd):
            if fd >= 0:
                os.close(fd)
        self.ns_fd = self.pidfd = -1
