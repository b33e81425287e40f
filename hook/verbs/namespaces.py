"""The user and pid namespaces of the confined host ldconfig (gpuctk.hook.verbs.ldconfig).

The child is forked as the first process of a new pid namespace; after its mount work it
unshares a user namespace and tells this process (host root) its pid as the hook's /proc shows
it, and this process maps UNPRIVILEGED (uid and gid) as 0 in it. Where the kernel refuses the
namespace, or the map (a hook that is not host root), the caller runs the child as before.
"""

from __future__ import annotations

import os
import select
import struct
import time

from gpuctk import libc
from gpuctk.log import hook as hooklog

CLONE_NEWUSER, CLONE_NEWPID = 0x10000000, 0x20000000
UNPRIVILEGED = 65534  # the host uid and gid the child runs as: nobody / nogroup


def new_user_namespace() -> int:
    """unshare(CLONE_NEWUSER): 0, or the errno that refused it."""
    return 0 if libc.function("unshare")(CLONE_NEWUSER) == 0 else libc.get_errno() or 1


def proc_pid() -> int:
    """This process's pid in the pid namespace of the /proc the hook sees: not getpid() when
    the hook runs in the container's pid namespace with the host's /proc (runc's
    createContainer), nor in the new pid namespace; 0 when that /proc does not show it."""
    try:
        return int(os.readlink("/proc/self"))
    except (OSError, ValueError):
        return 0


def fork_in_new_pid_namespace() -> int:
    """os.fork(), the child the first process of a new pid namespace where the kernel allows
    it: it cannot name (signal, ptrace) any process outside, and when it dies, so does all it
    started. This process's own later children stay in its namespace."""
    try:
        own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return os.fork()
    pid = -1
    try:
        if libc.function("unshare")(CLONE_NEWPID) != 0:
            return os.fork()
        try:
            pid = os.fork()
        finally:
            if pid != 0 and libc.function("setns")(own, CLONE_NEWPID) != 0:
                raise OSError(libc.get_errno(), "setns back to the hook's pid namespace")
        return pid
    finally:
        if pid != 0:
            os.close(own)


def _write_proc(pid: int, name: str, text: str) -> None:
    fd = os.open(f"/proc/{pid}/{name}", os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class MapRefused(Exception):
    """The child's user namespace could not be mapped (a hook that is not host root)."""


def map_user(ready_fd: int, go_fd: int, deadline: float) -> bool | None:
    """Wait for the child's word on its user namespace; map it (UNPRIVILEGED as 0) and let it
    go on. True: mapped; False: no namespace (logged at debug level); None: the child ended or
    hung before it got there (its output says why). MapRefused: the map was refused."""
    ready, _, _ = select.select([ready_fd], [], [], max(0.0, deadline - time.monotonic()))
    word = os.read(ready_fd, 8) if ready else b""
    if len(word) != 8:
        return None
    refused, proc_pid = struct.unpack("=ii", word)
    if refused:
        why = os.strerror(refused) if refused > 0 else "no /proc entry of it to map"
        hooklog.log(
            "debug",
            f"no user namespace for the host ldconfig ({why}): it runs as host root with "
            "DAC_OVERRIDE, DAC_READ_SEARCH and FOWNER, confined as before",
            to_stderr=False,
        )
        return False
    mapping = f"0 {UNPRIVILEGED} 1\n"
    try:
        _write_proc(proc_pid, "setgroups", "deny")
        _write_proc(proc_pid, "gid_map", mapping)
        _write_proc(proc_pid, "uid_map", mapping)
    except OSError as exc:
        raise MapRefused(str(exc)) from exc
    os.write(go_fd, b"g")
    return True
