"""gpuctk-runtime guards the device nodes itself, after `runc create`, with no hook process.

On a host whose driver says `ModifyDeviceFiles: 1` (the driver's default), a hook entry for
gpuctk.hook.verbs.nodeprotect would start one more Python process at every GPU container's create.
For a `create` that names a `--pid-file` (containerd, podman's conmon and CRI-O all do), the
shim can do it for less: instead of exec'ing the runtime it forks it, waits for `create` to
end (the container's init is then blocked until `start`, having run nothing of the image),
and then, in this process:

1. reads the init's pid from the pid file (a regular file of root's, not followed through a
   link), pins it with a pidfd and checks it: its root is the very directory config.json's
   root.path names (dev, inode), its mount namespace is not ours, and its user namespace is
   ours exactly when config.json asks for none (a process a user made with `unshare -Urm` and
   a chroot into a root it can reach fails that);
2. reads the container's /proc/driver/nvidia/params inside that root (the descriptor of
   /proc/<pid>/root, resolved with RESOLVE_IN_ROOT) and, where it says `ModifyDeviceFiles: 1`,
   writes the copy that says 0 into a file of the state folder (root's alone), clones that
   file with open_tree(OPEN_TREE_CLONE) into a detached mount and makes it read-only, nosuid,
   nodev, noexec (mount_setattr);
3. joins the init's mount namespace, move_mounts the clone onto the target opened before,
   returns to its own namespace and removes the file (the mount keeps it).

The runtime child gets SIGKILL should the shim die (PR_SET_PDEATHSIG), as an exec'd runtime
would die with it; its exit status is the shim's. When the guard fails the container is
deleted (`RUNTIME [its global flags] delete --force ID`: the runtime finds it by its own state,
not by a pid) and the create fails: exit 1 with the reason in the engine's log.
Everything else (`run`, no pid file, a kernel without the new mount API, a host whose params
file is missing) gets the hook entry (gpuctk.hook.verbs.nodeguard).
"""

from __future__ import annotations

import errno
import os
import stat
import sys

from gpuctk import libc, rootfs
from gpuctk.errors import GpuctkError
from gpuctk.hook.verbs import nodeprotect
from gpuctk.hook.verbs.nodeprotect import readonly_clone

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

    from gpuctk.cdi.specs.shape import EditsDoc
    from gpuctk.hook.config import Settings
    from gpuctk.log import RuncLog


class Pending:
    """Set by the shim's create (gpuctk.hook.shim.runtime_main) when this module guards after
    create; main() then forks the runtime instead of exec'ing it."""

    __slots__ = ("container", "global_args", "pid_file", "root_path", "user_ns")

    def __init__(
        self, pid_file: str, root_path: str, user_ns: bool, container: str, global_args: list[str]
    ) -> None:
        self.pid_file = pid_file
        self.root_path = root_path
        self.user_ns = user_ns  # config.json asks for a user namespace
        self.container = container
        self.global_args = global_args


pending: Pending | None = None

_PIDFD_SEND_SIGNAL, _MOUNT_SETATTR = 424, 442
CLONE_NEWNS, PR_SET_PDEATHSIG, SIGKILL = 0x00020000, 1, 9
_syscall = nodeprotect.syscall


def new_mount_api() -> bool:
    """Whether the kernel has open_tree, move_mount and mount_setattr (5.12 and later)."""
    try:
        _syscall(_MOUNT_SETATTR, -1, b"", 0, None, 0)
    except OSError as exc:
        return exc.errno != errno.ENOSYS
    return True  # pragma: no cover (never succeeds on -1)


def host_says_1(path: str | None = None) -> bool:
    """Whether the host's params file exists and says `ModifyDeviceFiles: 1`."""
    try:
        fd = os.open(path or nodeprotect.PARAMS, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        data = os.read(fd, nodeprotect.MAX_BYTES + 1)
    except OSError:
        return False
    finally:
        os.close(fd)
    return len(data) <= nodeprotect.MAX_BYTES and nodeprotect.modified(data) is not None


def create_then_guard(runtime: str, args: list[str], log: RuncLog) -> NoReturn:
    """Run the runtime's `create` as a child, then guard its container (the module docstring);
    exits with the runtime's status, or 1 when the guard fails."""
    assert pending is not None
    job = pending
    parent = os.getpid()
    try:
        child = os.fork()
    except OSError as exc:
        log.error(f"gpuctk-runtime: cannot start {runtime}: {exc.strerror or exc}")
        _exit(1)
    if child == 0:  # pragma: no cover (replaced by the runtime)
        try:
            libc.function("prctl")(PR_SET_PDEATHSIG, libc.long_arg(SIGKILL))
            if os.getppid() == parent:  # else the shim died before the line above
                os.execv(runtime, [runtime, *args])
        finally:
            os._exit(127)
    _, status = os.waitpid(child, 0)  # retried on EINTR
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        _exit(code if code > 0 else 128 - code)
    try:
        done = guard(job.pid_file, job.root_path, job.user_ns)
    except (GpuctkError, OSError) as exc:
        message = exc.message if isinstance(exc, GpuctkError) else str(exc)
        gone = _delete(runtime, job)
        log.error(
            f"gpuctk-runtime: device node guard: {message}; "
            + ("the container is deleted" if gone else f"delete {job.container} by hand")
        )
        _exit(1)
    log.debug(f"gpuctk-runtime: {done}")
    _exit(0)


def _exit(code: int) -> NoReturn:
    """Exit at once, as an exec'd runtime would have: no interpreter teardown (the log lines are
    written already; the standard streams are flushed)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            continue
    os._exit(code)


def _delete(runtime: str, job: Pending) -> bool:
    """`RUNTIME [global flags] delete --force ID`; whether it succeeded."""
    import subprocess

    argv = [runtime, *job.global_args, "delete", "--force", job.container]
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def read_pid(pid_file: str) -> int:
    """The pid in the runtime's pid file: a regular file of root's, opened without following a
    link; GpuctkError otherwise."""
    try:
        fd = os.open(pid_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise GpuctkError(f"{pid_file}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0:
            raise GpuctkError(f"{pid_file} is not a regular file of root's")
        data = os.read(fd, 32)
    finally:
        os.close(fd)
    try:
        return int(data.strip() or b"0")
    except ValueError:
        return 0


def guard(pid_file: str, root_path: str, user_ns: bool = False) -> str:
    """Steps 1-3 of the module docstring; what was done, in words. OSError/GpuctkError, the
    init killed when it had been checked to be the container's (never another process)."""
    pid = read_pid(pid_file)
    if pid <= 1:
        raise GpuctkError(f"{pid_file} names no container process")
    pidfd = os.pidfd_open(pid)
    ns_fd = root_fd = -1
    try:
        ns_fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        root_fd = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        user = os.stat(f"/proc/{pid}/ns/user").st_ino
        _syscall(_PIDFD_SEND_SIGNAL, pidfd, 0, None, 0)  # still the process the file named
        a, b = os.fstat(root_fd), os.stat(root_path)
        if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
            raise GpuctkError(f"process {pid} has not {root_path} as its root")
        if os.fstat(ns_fd).st_ino == os.stat("/proc/self/ns/mnt").st_ino:
            raise GpuctkError(f"process {pid} shares the runtime's mount namespace")
        if (user != os.stat("/proc/self/ns/user").st_ino) != user_ns:
            raise GpuctkError(f"process {pid} is not in the user namespace config.json asks for")
        try:
            return _guard(pid, root_fd, ns_fd)
        except BaseException:
            _kill(pidfd)  # the container's init, checked above: it never starts
            raise
    finally:
        for fd in (root_fd, ns_fd, pidfd):
            if fd >= 0:
                os.close(fd)


def _kill(pidfd: int) -> bool:
    """SIGKILL to the pinned process; False when it is gone already."""
    try:
        _syscall(_PIDFD_SEND_SIGNAL, pidfd, SIGKILL, None, 0)
    except OSError:
        return False
    return True


def _guard(pid: int, root_fd: int, ns_fd: int) -> str:
    """Steps 2-3 for the checked init `pid` (its root and mount namespace opened)."""
    try:
        text = rootfs.read_file_in_root(
            root_fd, nodeprotect.PARAMS, nodeprotect.MAX_BYTES, any_mount=True
        )
    except rootfs.InRootError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
            raise
        text = None
    copy = nodeprotect.modified(text) if text is not None else None
    if copy is None:
        return f"process {pid}: {nodeprotect.PARAMS} lets it make no device nodes"
    clone, dir_fd, name = _clone_of(copy)
    try:
        target = rootfs.open_in_root(root_fd, nodeprotect.PARAMS, os.O_PATH)
        try:
            _attach(clone, target, ns_fd)
        finally:
            os.close(target)
    finally:
        os.close(clone)
        _remove(dir_fd, name)  # the mount keeps the file
        os.close(dir_fd)
    return f"process {pid}: {nodeprotect.PARAMS} shows ModifyDeviceFiles: 0 (read-only copy)"


def _setns(fd: int) -> None:
    if libc.function("setns")(fd, CLONE_NEWNS) != 0:
        err = libc.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def _attach(clone: int, target: int, ns_fd: int) -> None:
    """move_mount `clone` onto `target` from inside the mount namespace `ns_fd`, then back in
    this process's own namespace, root and folder (the log is written by path)."""
    own = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    here = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _setns(ns_fd)
        try:
            nodeprotect.move_mount(clone, target)
        finally:
            _setns(own)
            os.fchdir(here)
    finally:
        os.close(here)
        os.close(own)


def _clone_of(copy: bytes) -> tuple[int, int, str]:
    """(a detached, read-only mount of a file holding `copy`, the state folder's descriptor,
    the file's name there): the caller removes the file once the mount is attached (the
    kernel refuses to attach the mount of a removed file) and closes both descriptors."""
    from gpuctk.fs import open_private_dir
    from gpuctk.statedir import state_dir

    dir_fd = open_private_dir(state_dir(), create=True)
    name = f".params-{os.urandom(6).hex()}"
    try:
        fd = nodeprotect.new_file(dir_fd, name, copy)
        try:
            clone = readonly_clone(fd)
        finally:
            os.close(fd)
    except BaseException:
        _remove(dir_fd, name)
        os.close(dir_fd)
        raise
    return clone, dir_fd, name


def _remove(dir_fd: int, name: str) -> bool:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        return False
    return True


def params_path(proc_root: str) -> str:
    """The driver's params file under the host's /proc (the config's proc-root)."""
    return proc_root.rstrip("/") + nodeprotect.PARAMS.removeprefix("/proc")


def choose(verb: str, pid_file: str, settings: Settings) -> str:
    """The device node guard's mode for this invocation (gpuctk.hook.verbs.nodeguard.guard): "off"
    when the config turns it off, "after" where this module can guard the container after
    `create` (the module docstring), else "hook"."""
    if not settings.disable_device_node_modification:
        return "off"
    if (
        verb == "create"
        and pid_file
        and os.environ.get("GPUCTK_SHIM_INROOT", "1") != "0"
        and host_says_1(params_path(settings.proc_root))
        and new_mount_api()
    ):
        return "after"
    return "hook"


def arm(mode: str, spec_edits: EditsDoc, doc: dict[str, Any], bundle: str, inv: Any) -> None:
    """Set `pending` for main() when `mode` is "after" and no gpuctk hook of the spec says
    `--disable-hook disable-device-node-modification` (`inv`: the shim's Invocation)."""
    global pending
    from gpuctk.hook import oci_state
    from gpuctk.hook.verbs import nodeguard

    hooks = spec_edits.get("hooks") or []
    if mode != "after" or any(nodeguard.NAME in nodeguard.disabled(h) for h in hooks):
        return
    linux = doc.get("linux")
    spaces = linux.get("namespaces") if isinstance(linux, dict) else None
    user_ns = isinstance(spaces, list) and any(
        isinstance(n, dict) and n.get("type") == "user" for n in spaces
    )
    pending = Pending(
        os.path.abspath(inv.pid_file), oci_state.rootfs_path(doc, bundle), user_ns,
        inv.container, list(inv.global_args),
    )  # fmt: skip
