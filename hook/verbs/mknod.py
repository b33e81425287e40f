"""Device nodes and folders inside a container root (the runtime's /dev tmpfs included).

gpuctk.rootfs writes only to the root's own file system (a createContainer hook has no business
in volumes). A prestart hook does the runtime's work instead: device nodes in the /dev tmpfs the
runtime mounted, mount targets wherever the spec puts them, so these helpers create folders on
any mount below the root, still resolving every path inside it (rootfs.open_in_root) and
creating each entry by name in its parent's descriptor.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat

from gpuctk import rootfs
from gpuctk.errors import GpuctkError

_TYPES = {"c": stat.S_IFCHR, "b": stat.S_IFBLK, "p": stat.S_IFIFO}


class NodeError(GpuctkError):
    """A device node could not be created inside the container root."""


def mkdirs(root_fd: int, path: str, mode: int = 0o755) -> int:
    """O_PATH descriptor of container folder `path`, created with its parents when missing."""
    path = posixpath.normpath("/" + path.lstrip("/"))
    try:
        return rootfs.open_in_root(root_fd, path, os.O_PATH | os.O_DIRECTORY)
    except rootfs.InRootError as exc:
        if exc.errno != errno.ENOENT or path == "/":
            raise
    parent = mkdirs(root_fd, posixpath.dirname(path), mode)
    try:
        os.mkdir(posixpath.basename(path), mode, dir_fd=parent)
    except FileExistsError:
        pass  # raced, or a dangling symlink: the open below resolves whatever is there
    except OSError as exc:
        raise rootfs.InRootError(
            f"cannot create folder {path} in the container root: {exc.strerror}", exc.errno or 0
        ) from exc
    finally:
        os.close(parent)
    return rootfs.open_in_root(root_fd, path, os.O_PATH | os.O_DIRECTORY)


def _numbers(dev: dict[str, object]) -> tuple[int, int, int]:
    """(S_IF* format, rdev, mode) of an OCI linux.devices entry."""
    fmt = _TYPES.get(str(dev.get("type")))
    major, minor, mode = dev.get("major", 0), dev.get("minor", 0), dev.get("fileMode", 0o666)
    if (
        fmt is None
        or not isinstance(major, int)
        or not isinstance(minor, int)
        or not isinstance(mode, int)
        or min(major, minor, mode) < 0
    ):
        raise NodeError(f"cannot create device {dev.get('path')}: invalid type/major/minor/mode")
    return fmt, (os.makedev(major, minor) if fmt != stat.S_IFIFO else 0), mode & 0o7777


def mknod(root_fd: int, dev: dict[str, object]) -> bool:
    """Create the OCI linux.devices entry `dev` inside the root, replacing a different node at
    its path. True when created, False when that very node was already there."""
    path = str(dev["path"])
    fmt, rdev, mode = _numbers(dev)
    parent = mkdirs(root_fd, posixpath.dirname(path))
    name, created = posixpath.basename(path), True
    try:
        try:
            st: os.stat_result | None = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_IFMT(st.st_mode) == fmt and st.st_rdev == rdev:
            created = False
        elif st is not None and stat.S_ISDIR(st.st_mode):
            raise NodeError(f"cannot create device {path}: a folder is there")
        elif st is not None:
            os.unlink(name, dir_fd=parent)
        if created:
            os.mknod(name, fmt | 0o600, rdev, dir_fd=parent)
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        try:
            st = os.fstat(fd)
            if stat.S_IFMT(st.st_mode) != fmt or st.st_rdev != rdev:
                raise NodeError(f"device {path} changed while it was created")
            os.chmod(f"/proc/self/fd/{fd}", mode)
            uid, gid = dev.get("uid", 0), dev.get("gid", 0)
            if isinstance(uid, int) and isinstance(gid, int) and (uid, gid) != (0, 0):
                os.chown(f"/proc/self/fd/{fd}", uid, gid)
        finally:
            os.close(fd)
    except OSError as exc:
        raise NodeError(f"cannot create device {path}: {exc.strerror or exc}") from exc
    finally:
        os.close(parent)
    return created
