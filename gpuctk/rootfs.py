"""Paths inside a container rootfs, resolved inside that root.

An image is hostile: any folder in it may be a symlink to `/`, `../..` or a `/proc/1/root` magic
link. Each function takes a descriptor of the root (`open_root`) and a container path resolved with
the root as `/`: openat2 RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS, or where openat2 is missing a
descriptor walk (each component opened O_PATH | O_NOFOLLOW from the previous one; links read and
expanded by hand, `..` clamped at the root, 40 links at most): the kernel never follows one. Writes
use the parent folder's descriptor and one plain name (*at calls): files go to a temp name and are
renamed, modes are set through the inode's own descriptor; a link is made by gpuctk-cdi-hook's link
policy in the folder `parent_in_root` opens (gpuctk.hook.compiled). Files, links and folders are
created only on the root's own mount: a folder that is a bind mount or volume (host storage) is
refused with EXDEV, whatever its path (modes may be set on any mount below the root: device nodes
live on the container's /dev). Files are read only when regular and on the root's own mount (EXDEV
otherwise): an image's link into the container's /proc (/proc/kmsg), /sys, /dev or a volume is
never opened for reading. Failures are InRootError (a GpuctkError) carrying the errno.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
import struct

from gpuctk import libc
from gpuctk.errors import GpuctkError
from gpuctk.writes import lock_temp, sweep_dead_temps

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
MAX_LINKS = 40
_SYS_OPENAT2 = 437  # the same number on x86_64, aarch64 and every other modern arch
_CLOEXEC = os.O_CLOEXEC


class InRootError(GpuctkError):
    """A path inside a container root could not be resolved, read or written."""

    def __init__(self, message: str, err: int = 0) -> None:
        super().__init__(message)
        self.errno = err


_openat2_state: bool | None = None  # None: not probed yet


def _raw_openat2(dirfd: int, path: bytes, flags: int, mode: int, resolve: int) -> int:
    how = struct.pack("=QQQ", flags, mode, resolve)  # struct open_how, passed by address
    syscall, long = libc.function("syscall", "l"), libc.long_arg
    for _ in range(64):  # EAGAIN: a concurrent rename or mount made `..` resolution unsafe
        fd = syscall(long(_SYS_OPENAT2), long(dirfd), path, how, long(len(how)))
        if fd >= 0:
            return int(fd)
        err = libc.get_errno()
        if err not in (errno.EAGAIN, errno.EINTR):
            raise OSError(err, os.strerror(err))
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))


def have_openat2() -> bool:
    """Whether openat2 is usable here (probed once: kernels before 5.6 lack it, and seccomp
    profiles may refuse it)."""
    global _openat2_state
    if _openat2_state is None:
        try:
            os.close(_raw_openat2(-100, b"/", os.O_PATH | _CLOEXEC, 0, 0))
            _openat2_state = True
        except OSError:
            _openat2_state = False
    return _openat2_state


def _fail(action: str, path: str, exc: OSError) -> InRootError:
    err = exc.errno or errno.EIO
    return InRootError(f"cannot {action} {path} in the container root: {os.strerror(err)}", err)


def _parts(path: str) -> list[str]:
    if "\0" in path:
        raise InRootError(f"invalid container path {path!r}: NUL byte", errno.EINVAL)
    return [p for p in path.split("/") if p not in ("", ".")]


def _walk(root_fd: int, path: str, flags: int, mode: int) -> int:
    """openat2(RESOLVE_IN_ROOT) done by hand: no link is ever followed by the kernel."""
    todo = list(reversed(_parts(path)))
    stack: list[int] = []  # descriptors of the directories below the root, outermost first
    links = 0
    try:
        while todo:
            name = todo.pop()
            cur = stack[-1] if stack else root_fd
            if name == "..":
                if stack:
                    os.close(stack.pop())
                continue
            last = not todo
            try:
                if last:
                    fd = os.open(name, flags | os.O_NOFOLLOW | _CLOEXEC, mode, dir_fd=cur)
                    follow = flags & os.O_PATH and not flags & os.O_NOFOLLOW
                    if follow and stat.S_ISLNK(os.fstat(fd).st_mode):  # O_PATH got the link
                        os.close(fd)
                        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
                    return fd
                fd = os.open(
                    name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | _CLOEXEC, dir_fd=cur
                )
                stack.append(fd)
                continue
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                if last and flags & os.O_NOFOLLOW:
                    raise
                if not stat.S_ISLNK(os.stat(name, dir_fd=cur, follow_symlinks=False).st_mode):
                    raise
            links += 1
            if links > MAX_LINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
            target = os.readlink(name, dir_fd=cur)  # a magic link's text is resolved in root
            if target.startswith("/"):
                while stack:
                    os.close(stack.pop())
            todo.extend(reversed(_parts(target)))
        # the path ended in "..", or in a link to "/" or "."
        return os.open(".", flags | _CLOEXEC, mode, dir_fd=stack[-1] if stack else root_fd)
    finally:
        for fd in stack:
            os.close(fd)


def open_root(path: str) -> int:
    """Descriptor (O_PATH, directory) of a container root given by a trusted host path."""
    try:
        return os.open(path, os.O_PATH | os.O_DIRECTORY | _CLOEXEC)
    except OSError as exc:
        err = exc.errno or errno.EIO
        raise InRootError(f"cannot open container root {path}: {os.strerror(err)}", err) from exc


def open_in_root(root_fd: int, path: str, flags: int = os.O_PATH, mode: int = 0) -> int:
    """open(2) of a container path resolved inside the root; the caller closes the result."""
    parts = _parts(path)
    try:
        if have_openat2():
            rel = ("/".join(parts) or ".").encode()
            return _raw_openat2(
                root_fd, rel, flags | _CLOEXEC, mode, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS
            )
        return _walk(root_fd, path, flags, mode)
    except OSError as exc:
        raise _fail("open", path, exc) from exc


def _open_or_none(root_fd: int, path: str, flags: int) -> int | None:
    try:
        return open_in_root(root_fd, path, flags)
    except InRootError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None
        raise


def stat_in_root(root_fd: int, path: str, *, follow: bool = True) -> os.stat_result | None:
    """stat of a container path (lstat with follow=False); None when it does not resolve."""
    fd = _open_or_none(root_fd, path, os.O_PATH | (0 if follow else os.O_NOFOLLOW))
    if fd is None:
        return None
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def split_in_root(path: str) -> tuple[str, str]:
    """(folder, last name) of a container path, normalized; InRootError for a NUL byte or the
    root itself."""
    norm = posixpath.normpath("/" + "/".join(_parts(path)))
    parent, name = posixpath.split(norm)
    if not name:
        raise InRootError(f"invalid container path {path!r}: names the root", errno.EINVAL)
    return parent, name


def _proc_fd(fd: int) -> str:
    """The /proc/self/fd path of a descriptor: opening it reaches that very inode (the host's
    /proc, where the hook runs; the only magic link this module follows, and on purpose)."""
    return f"/proc/self/fd/{fd}"


def read_file_in_root(
    root_fd: int, path: str, limit: int, *, any_mount: bool = False
) -> bytes | None:
    """Contents of a regular file of the root's own mount (at most `limit` bytes, else error);
    None when missing. The file is looked at through an O_PATH descriptor first and read
    through that same inode only once it is known to be a regular file on the root's mount:
    one an image's link leads to on another mount (the container's /proc, such as /proc/kmsg,
    /sys, /dev or a volume) is never opened for reading: InRootError with EXDEV, which callers
    treat as "not served" (their fallback), as hook/cdihook.c does. `any_mount` lifts the mount
    check for a file the runtime itself mounts there (/proc/driver/nvidia/params)."""
    pfd = _open_or_none(root_fd, path, os.O_PATH)
    if pfd is None:
        return None
    try:
        if not any_mount and mount_id(pfd) != mount_id(root_fd):
            raise InRootError(
                f"cannot read {path} in the container root: it leads to another mount "
                "(procfs, sysfs, a device or a volume), not the root's own file system",
                errno.EXDEV,
            )
        st = os.fstat(pfd)
        if not stat.S_ISREG(st.st_mode):
            raise InRootError(f"cannot read {path} in the container root: not a regular file")
        if st.st_size > limit:
            raise InRootError(
                f"cannot read {path} in the container root: larger than {limit} bytes", errno.EFBIG
            )
        fd = os.open(_proc_fd(pfd), os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | _CLOEXEC)
        try:
            data = os.read(fd, limit + 1)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _fail("read", path, exc) from exc
    finally:
        os.close(pfd)
    if len(data) > limit:
        raise InRootError(f"cannot read {path} in the container root: larger than {limit} bytes")
    return data


def listdir_in_root(root_fd: int, path: str) -> list[str]:
    """Names in a container directory; [] when it does not exist."""
    fd = _open_or_none(root_fd, path, os.O_RDONLY | os.O_DIRECTORY)
    if fd is None:
        return []
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def mount_id(fd: int) -> int:
    """The id of the mount a descriptor is on (mnt_id in /proc/self/fdinfo)."""
    info = os.open(f"/proc/self/fdinfo/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(info, 1 << 16)  # bytes: a text open would import a codec per start
    finally:
        os.close(info)
    for line in data.split(b"\n"):
        if line.startswith(b"mnt_id:"):
            return int(line.split()[1])
    raise InRootError("no mnt_id in /proc/self/fdinfo", errno.ENOSYS)


def _own_mount(root_fd: int, pfd: int, path: str) -> int:
    """`pfd` if it is on the root's own mount, else close it and raise (EXDEV)."""
    try:
        other = mount_id(pfd) != mount_id(root_fd)
    except BaseException:
        os.close(pfd)
        raise
    if other:
        os.close(pfd)
        raise InRootError(
            f"cannot write in {path} in the container root: it is on another mount (a bind mount "
            "or volume); gpuctk writes only to the container's own root file system",
            errno.EXDEV,
        )
    return pfd


def mkdir_p_in_root(root_fd: int, path: str, mode: int = 0o755) -> int:
    """Create a container directory and its parents; returns an O_PATH descriptor of it."""
    path = posixpath.normpath("/" + "/".join(_parts(path)))
    try:
        return open_in_root(root_fd, path, os.O_PATH | os.O_DIRECTORY)
    except InRootError as exc:
        if exc.errno != errno.ENOENT:
            raise
    parent, name = split_in_root(path)
    pfd = _own_mount(root_fd, mkdir_p_in_root(root_fd, parent, mode), parent)
    try:
        os.mkdir(name, mode, dir_fd=pfd)
    except FileExistsError:  # raced, or a dangling symlink: the open below says which
        pass
    except OSError as exc:
        raise _fail("create folder", path, exc) from exc
    finally:
        os.close(pfd)
    return open_in_root(root_fd, path, os.O_PATH | os.O_DIRECTORY)


def parent_in_root(root_fd: int, path: str, parents: bool) -> tuple[int, str]:
    """(an O_PATH descriptor of the folder of `path` inside the root, on the root's own mount,
    the last name of `path`); the folder made with its missing parents where `parents`.
    InRootError otherwise (EXDEV: on another mount)."""
    dirname, name = split_in_root(path)
    if parents:
        return _own_mount(root_fd, mkdir_p_in_root(root_fd, dirname), dirname), name
    pfd = open_in_root(root_fd, dirname, os.O_PATH | os.O_DIRECTORY)
    return _own_mount(root_fd, pfd, dirname), name


def _tmpprefix(name: str) -> str:
    return f".{name[:200]}.gpuctk-"


def _tmpname(name: str) -> str:
    return f"{_tmpprefix(name)}{os.getpid()}-{os.urandom(4).hex()}"


def write_file_in_root(
    root_fd: int, path: str, data: bytes, mode: int = 0o644, *, parents: bool = False
) -> None:
    """Atomically replace a container file: temp file in the parent fd, then rename."""
    pfd, name = parent_in_root(root_fd, path, parents)
    tmp = _tmpname(name)
    try:
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, mode, dir_fd=pfd
        )
        try:
            lock_temp(fd)  # so that a later write tells this file from a killed writer's
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.rename(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
        finally:
            os.close(fd)
        sweep_dead_temps(pfd, _tmpprefix(name))  # what a create killed before its rename left
    except OSError as exc:
        try:  # noqa: SIM105 - contextlib would cost the create path an import
            os.unlink(tmp, dir_fd=pfd)
        except OSError:
            pass
        raise _fail("write", path, exc) from exc
    finally:
        os.close(pfd)


def chmod_in_root(root_fd: int, path: str, mode: int) -> None:
    """chmod a container file or directory (never a symlink) through its own descriptor."""
    fd = open_in_root(root_fd, path, os.O_PATH | os.O_NOFOLLOW)
    try:
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            raise InRootError(f"cannot chmod {path} in the container root: it is a symlink")
        os.chmod(_proc_fd(fd), mode)
    except OSError as exc:
        raise _fail("chmod", path, exc) from exc
    finally:
        os.close(fd)
