"""Keep a container from making device nodes for GPUs it was not given.

The NVIDIA driver's `/proc/driver/nvidia/params` says `ModifyDeviceFiles: 1` by default: NVML
in a container then mknods /dev/nvidia<N> for every GPU of the machine. `protect` (the hook's
`disable-device-node-modification` action, also part of `createContainer`) mounts over the
container's params file a read-only copy of it that says `ModifyDeviceFiles: 0`, as the
reference toolkit's hook of that name does. runc refuses config.json mounts inside /proc, so
this runs as a createContainer hook: in the container's mount namespace, after the runtime
mounted the container's /proc and before the container runs anything.

- The copy is made of the container's own params file (resolved inside the root: the procfs the
  runtime mounted there, which the image cannot reach before it starts), at most MAX_BYTES.
  No such file (no driver loaded), or one that says anything but `ModifyDeviceFiles: 1`: nothing
  is done.
- The copy is a new file in the container's own /dev (the tmpfs the runtime mounts there: on
  another mount than the root's, not the host's /dev; a folder a user namespace's root can
  write), bound from the descriptor it was written through (never
  by its name) and removed once bound, as gpuctk-cdi-hook makes it. Where the root has no
  such /dev, or it is full or read-only, the copy lies on a tmpfs of its own, mounted on an
  empty folder made for it in /run of the hook's root and detached again (the folder
  removed) once the copy is bound. Either way the container sees the one file, read-only,
  nosuid, nodev, noexec.
- The bind goes through descriptors. With the new mount API (5.12 and later) the copy is
  cloned into a detached mount made read-only, nosuid, nodev, noexec before it is attached
  onto the target opened inside the root (open_tree, mount_setattr, move_mount): where the
  request made the root's propagation shared, the copies the kernel propagates to the host are
  read-only too. Older kernels get a bind through /proc/self/fd of both descriptors and then a
  read-only remount of the new mount, checked to be the copy. System calls go through
  gpuctk.libc: no ctypes on the hook's path.

gpuctk-runtime adds the action's hook entry to a GPU container whose spec's own gpuctk hook
does not run (gpuctk.hook.verbs.nodeguard); where no driver is loaded, or the container's file
says `ModifyDeviceFiles: 0`, the action does nothing.
"""

from __future__ import annotations

import errno
import os

from gpuctk import libc, rootfs
from gpuctk.cdi.node.facts import GUARD_ACTION
from gpuctk.log import hook as hooklog

NAME = GUARD_ACTION
PARAMS = "/proc/driver/nvidia/params"
MAX_BYTES = 64 * 1024
KEY = b"ModifyDeviceFiles: "
SCRATCH = "/run"
SCRATCH_PREFIX = ".gpuctk-params-"  # + 12 random hex digits: the copy in /dev, a folder in SCRATCH

_OPEN_TREE, _MOVE_MOUNT, _MOUNT_SETATTR = 428, 429, 442  # every architecture
OPEN_TREE_CLONE, AT_EMPTY_PATH = 1, 0x1000
MOVE_MOUNT_F_EMPTY_PATH, MOVE_MOUNT_T_EMPTY_PATH = 0x4, 0x40
ATTR_RO_NOSUID_NODEV_NOEXEC = 0x1 | 0x2 | 0x4 | 0x8


def syscall(number: int, *args: object) -> int:
    """syscall(2), each int passed as a C long (bytes and buffers as pointers, None as NULL)."""
    wide = [libc.long_arg(a) if isinstance(a, int) else a for a in args]
    rc = libc.function("syscall", "l")(libc.long_arg(number), *wide)
    if rc < 0:
        err = libc.get_errno()
        raise OSError(err, os.strerror(err))
    return int(rc)


def _readonly_clone(fd: int) -> int:
    """A detached mount of the file `fd` is open on, made read-only, nosuid, nodev, noexec
    before anything can see it; OSError ENOSYS before kernel 5.12."""
    clone = syscall(_OPEN_TREE, fd, b"", OPEN_TREE_CLONE | os.O_CLOEXEC | AT_EMPTY_PATH)
    try:
        attr = libc.buffer(ATTR_RO_NOSUID_NODEV_NOEXEC.to_bytes(8, "little") + bytes(24))
        syscall(_MOUNT_SETATTR, clone, b"", AT_EMPTY_PATH, attr, 32)
    except BaseException:
        os.close(clone)
        raise
    return clone


def _move_mount(clone: int, target: int) -> None:
    """Attach the detached mount `clone` onto the file or folder `target` (descriptors)."""
    flags = MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH
    syscall(_MOVE_MOUNT, clone, b"", target, b"", flags)


def modified(text: bytes) -> bytes | None:
    """`text` (a params file) with `ModifyDeviceFiles: 1` made 0; None when no line says 1 or
    one says 0 (nothing to hide), as the reference reads it."""
    out, changed = [], False
    for line in text.splitlines():
        if line.startswith(KEY):
            if line == KEY + b"0":
                return None
            if line == KEY + b"1":
                line, changed = KEY + b"0", True
        out.append(line + b"\n")
    return b"".join(out) if changed else None


def protect(root_fd: int) -> str:
    """Mount the `ModifyDeviceFiles: 0` copy over the container's params file (see the module
    docstring); returns what was done, in words. GpuctkError when the mount fails."""
    try:
        text = rootfs.read_file_in_root(root_fd, PARAMS, MAX_BYTES, any_mount=True)
    except rootfs.InRootError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            text = None
        else:
            raise
    if text is None:
        return f"no {PARAMS} in the container: device nodes left as they are"
    if not _proc_mounted(root_fd):
        return f"no procfs at /proc in the root (not a container's): {PARAMS} left as it is"
    copy = modified(text)
    if copy is None:
        return f"{PARAMS} does not let the container make device nodes"
    dev = _own_dev(root_fd)
    if dev is not None:
        name = f"{SCRATCH_PREFIX}{os.urandom(6).hex()}"
        try:
            src = _new_file(dev, name, copy)
        except OSError as exc:  # a full or read-only /dev: the folder in /run instead
            hooklog.log("debug", f"no copy in the container's /dev ({exc}): a tmpfs in /run",
                        to_stderr=False)  # fmt: skip
            src = -1
        try:
            if src >= 0:
                _bind(root_fd, src)
                return f"{PARAMS} shows ModifyDeviceFiles: 0 (read-only copy)"
        finally:
            if src >= 0:
                _unlink_copy(dev, name, src)  # the mount keeps the copy
                os.close(src)
            os.close(dev)
    from gpuctk.hook.verbs import mounts

    folder = _scratch()
    try:
        mounts.mount(
            "tmpfs", folder, "tmpfs", mounts.MS_NOSUID | mounts.MS_NODEV | mounts.MS_NOEXEC
        )
        try:
            mounts.mount(None, folder, None, mounts.MS_PRIVATE)
            dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fchmod(dir_fd, 0o700)
                src = _new_file(dir_fd, "params", copy)
            finally:
                os.close(dir_fd)
            try:
                _bind(root_fd, src)
            finally:
                os.close(src)
        finally:
            mounts.detach(folder)
    finally:
        os.rmdir(folder)
    return f"{PARAMS} shows ModifyDeviceFiles: 0 (read-only copy)"


TMPFS_MAGIC = 0x01021994  # statfs(2)'s f_type of a tmpfs (gpuctk-cdi-hook's too)


def _own_dev(root_fd: int) -> int | None:
    """The container's /dev (a descriptor), where it is the tmpfs the runtime mounts there: on
    another mount than the root's, not the host's /dev; None otherwise."""
    try:
        dev = rootfs.open_in_root(root_fd, "/dev", os.O_RDONLY | os.O_DIRECTORY)
    except rootfs.InRootError:
        return None
    buf = libc.buffer(bytes(128))  # struct statfs: f_type, a long, first
    try:
        st = os.fstat(dev)
        own = (
            rootfs.mount_id(dev) != rootfs.mount_id(root_fd)
            and st.st_dev != os.stat("/dev").st_dev
            and libc.function("fstatfs")(dev, buf) == 0
            and int.from_bytes(bytes(buf)[:8], "little") == TMPFS_MAGIC
        )
    except (OSError, rootfs.InRootError):
        own = False
    if not own:
        os.close(dev)
        return None
    return dev


def _unlink_copy(dir_fd: int, name: str, src: int) -> None:
    """Remove `name` from `dir_fd` when it is still the file `src`; errors ignored."""
    try:
        a, b = os.stat(name, dir_fd=dir_fd, follow_symlinks=False), os.fstat(src)
        if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
            os.unlink(name, dir_fd=dir_fd)
    except OSError:
        return


def _new_file(dir_fd: int, name: str, data: bytes) -> int:
    """`data` in a new file `name` of `dir_fd` (0444): the descriptor it was written through,
    from which the mount is cloned (never the name, which another could swap meanwhile)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o444, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        _unlink_copy(dir_fd, name, fd)
        os.close(fd)
        raise
    return fd


def _proc_mounted(root_fd: int) -> bool:
    """Whether the root's /proc is a mount of its own (the runtime's procfs), not a folder of
    the image: run on the host by hand, the hook must not mount over an image's files."""
    proc = rootfs.open_in_root(root_fd, "/proc", os.O_PATH | os.O_DIRECTORY)
    try:
        return os.fstat(proc).st_dev != os.fstat(root_fd).st_dev
    finally:
        os.close(proc)


def _bind(root_fd: int, src: int) -> None:
    """Bind the file `src` over the container's PARAMS (opened inside the root), then make
    that new mount read-only, nosuid, nodev, noexec, once it is checked to be the copy."""
    from gpuctk.hook.verbs import mounts

    clone = -1
    try:
        clone = _readonly_clone(src)
    except OSError as exc:
        if exc.errno not in (errno.ENOSYS, errno.EPERM):  # EPERM: a seccomp filter's answer
            raise
    try:
        target = rootfs.open_in_root(root_fd, PARAMS, os.O_PATH)
        try:
            if clone >= 0:
                _move_mount(clone, target)
            else:
                mounts.mount(
                    f"/proc/self/fd/{src}", f"/proc/self/fd/{target}", None, mounts.MS_BIND
                )
        finally:
            os.close(target)
    finally:
        if clone >= 0:
            os.close(clone)
    new = rootfs.open_in_root(root_fd, PARAMS, os.O_PATH)
    try:
        a, b = os.fstat(new), os.fstat(src)
        if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
            raise OSError(errno.EXDEV, f"{PARAMS} changed while it was mounted")
        flags = mounts.MS_RDONLY | mounts.MS_NOSUID | mounts.MS_NODEV | mounts.MS_NOEXEC
        mounts.mount(None, f"/proc/self/fd/{new}", None, mounts.MS_REMOUNT | mounts.MS_BIND | flags)
    finally:
        os.close(new)


def _scratch() -> str:
    """A new, empty folder of root's alone in SCRATCH (a fresh random name)."""
    for _ in range(8):
        path = f"{SCRATCH}/{SCRATCH_PREFIX}{os.urandom(6).hex()}"
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(errno.EEXIST, f"no free folder name in {SCRATCH}")
