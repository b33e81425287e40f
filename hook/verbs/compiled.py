"""gpuctk-cdi-hook (hook/cdihook.c) as gpuctk-hook and gpuctk-runtime run it for the rules
written in C alone: the device node guard (gpuctk.hook.verbs.nodeprotect) and the merge of an
image's ld cache (gpuctk.hook.verbs.ldmerge). Each such form takes what Python resolved inside
the root as inherited descriptors, does its one job and never hands anything back.

The C is a required part of every install (setup.py builds it; no compiler, no install).
"""

from __future__ import annotations

import os
import sys

from gpuctk.cdi.node.facts import COMPILED_HOOK, compiled_beside
from gpuctk.errors import GpuctkError

PROGRAM = COMPILED_HOOK
ERROR_PREFIX = f"{PROGRAM}: error: "
ROOT_FD_OPT = "--root-fd"  # the guard's form: the container root as an inherited descriptor
MERGE_VERB = "merge-ld-cache"  # the ld cache merge's form (gpuctk.hook.verbs.ldmerge.merged)
SERVED_VERBS = (MERGE_VERB,)  # the verbs of its own forms


def installed() -> str:
    """The compiled gpuctk-cdi-hook this install has: gpuctk.hook's copy (setup.py's build),
    else the one beside the interpreter (a venv's bin/, where tests/run.sh builds it for an
    editable install); "" where there is none."""
    from gpuctk import hook

    package = os.path.dirname(os.path.abspath(hook.__file__))
    for folder in (package, os.path.dirname(sys.executable)):
        path = os.path.join(folder, PROGRAM)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return ""


def program() -> str:
    """The gpuctk-cdi-hook of this Python's own install (installed(): built with it, so never
    of another version), else the one beside this launcher (as named, then its real file);
    "" where there is none."""
    me = sys.argv[0] if sys.argv else ""
    return installed() or (compiled_beside(me) if me[:1] == "/" else "")


class Done:
    """What a run of gpuctk-cdi-hook gave: its exit status and output."""

    __slots__ = ("returncode", "stderr", "stdout")

    def __init__(self, returncode: int, stdout: bytes, stderr: bytes) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def high(fd: int) -> int:
    """`fd`, moved above the standard streams where it took one's number (a caller that ran
    with 0, 1 or 2 closed): the spawn puts /dev/null and pipes there."""
    if fd > 2:
        return fd
    import fcntl

    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    finally:
        os.close(fd)


def run(args: list[str], fds: tuple[int, ...], what: str, timeout: float = 60.0) -> Done:
    """gpuctk-cdi-hook `args` with `fds` (each above 2: high()) inherited under their numbers
    and no other descriptor, an empty environment, SIGPIPE and SIGXFSZ at their defaults (not
    Python's "ignore"), /dev/null on stdin, its output read whole, waited for even where
    SIGCHLD is ignored; killed after `timeout` seconds or when this process is interrupted.
    Spawned with os.posix_spawn: subprocess's import alone costs a container start several
    ms. GpuctkError (`what`: the job, for the message) when it is not installed, cannot run or
    hangs; the caller reads the exit status."""
    import _signal  # type: ignore[import-not-found]  # signal would load enum: the hook avoids it
    import time

    exe = program()
    if not exe:
        raise GpuctkError(
            f"{what}: no {PROGRAM} beside gpuctk-hook or in the gpuctk package: reinstall "
            "gpuctk (pip install ., the deb or the node image), which builds it"
        )
    if any(fd < 3 for fd in fds):
        raise GpuctkError(f"{what}: descriptors {fds}: one has a standard stream's number")
    out_r, out_w = (high(fd) for fd in os.pipe())
    err_r, err_w = (high(fd) for fd in os.pipe())
    null = high(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
    actions: list[tuple[int, ...]] = [
        (os.POSIX_SPAWN_DUP2, null, 0), (os.POSIX_SPAWN_DUP2, out_w, 1),
        (os.POSIX_SPAWN_DUP2, err_w, 2),
    ]  # fmt: skip
    actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in _inherited({*fds, out_w, err_w, null})]
    ignored = _signal.getsignal(_signal.SIGCHLD) == _signal.SIG_IGN  # no exit status then
    if ignored:
        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
    deadline = time.monotonic() + timeout
    try:
        try:
            for fd in fds:
                os.set_inheritable(fd, True)
            pid = os.posix_spawn(  # Python's own SIGPIPE and SIGXFSZ "ignore" not passed on
                exe, [exe, *args], {}, file_actions=actions,
                setsigdef=(_signal.SIGPIPE, _signal.SIGXFSZ),
            )  # fmt: skip
        except OSError as exc:
            os.close(out_r)
            os.close(err_r)
            raise GpuctkError(f"{what}: {exe}: {exc.strerror}") from None
        finally:
            for fd in fds:
                os.set_inheritable(fd, False)
            for fd in (out_w, err_w, null):
                os.close(fd)
        try:
            out, err = _read_both(out_r, err_r, deadline)
            status = _wait(pid, deadline)
        except BaseException as exc:  # a hang, or this process interrupted: never left behind
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            if isinstance(exc, TimeoutError):
                why = f"{exe} did not finish in {timeout:g} s (killed)"
                raise GpuctkError(f"{what}: {why}") from None
            raise
        finally:
            os.close(out_r)
            os.close(err_r)
    finally:
        if ignored:
            _signal.signal(_signal.SIGCHLD, _signal.SIG_IGN)
    return Done(status, out, err)


def _inherited(keep: set[int]) -> list[int]:
    """This process's descriptors above 2, other than `keep`, that a spawned program would
    inherit (those not close-on-exec): the spawn closes them."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd > 2 and fd not in keep and os.get_inheritable(fd):
                out.append(fd)
        except OSError:  # the listing's own descriptor, closed since
            continue
    return out


def _wait(pid: int, deadline: float) -> int:
    """The exit status of `pid`; TimeoutError past `deadline` (time.monotonic)."""
    import time

    while True:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            raise TimeoutError
        time.sleep(0.0005)


def _read_both(out_fd: int, err_fd: int, deadline: float) -> tuple[bytes, bytes]:
    """Both pipes read to their end; TimeoutError past `deadline` (time.monotonic)."""
    import select
    import time

    chunks: dict[int, list[bytes]] = {out_fd: [], err_fd: []}
    poll = select.poll()
    for fd in chunks:
        poll.register(fd, select.POLLIN)
    open_ = set(chunks)
    while open_:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        for fd, _ in poll.poll(left * 1000):
            data = os.read(fd, 1 << 16)
            if data:
                chunks[fd].append(data)
            else:
                poll.unregister(fd)
                open_.discard(fd)
    return b"".join(chunks[out_fd]), b"".join(chunks[err_fd])


def why(done: Done) -> str:
    """The C's error line (or gpuctk-hook's, where an older C handed the form back), without
    the program's prefix."""
    lines = done.stderr.decode(errors="replace").strip().splitlines() or ["no message"]
    line = lines[-1].removeprefix(ERROR_PREFIX).removeprefix("gpuctk-hook: error: ")
    return f"{line} (exit {done.returncode})"
