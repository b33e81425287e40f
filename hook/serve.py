"""gpuctk-runtime's create server: container creates without a Python start.

    gpuctk create-server [--state-dir /run/gpuctk]      (gpuctk-create-server.service)

A create that asks for a GPU needs gpuctk's Python: ~13 ms of interpreter start and ~4 ms of
imports before ~3 ms of work, on every container. This server pays the first two once: it
imports the create path, then waits on a FIFO; for each create it forks a worker that does the
work of `gpuctk-runtime create` (gpuctk.hook.runtime_main.prepare) in the environment, current
folder and stderr of the sh front that asked, and answers with the exit status. The front then
execs the low-level runtime itself, so runc still runs as the engine's child with the engine's
stdio and file descriptors, exactly as without the server.

The protocol, all in the state folder (`$GPUCTK_STATE_DIR`, default /run/gpuctk; owned by root,
mode 0700, checked by server and front alike):

- `create.lock`  held (flock) by the live server: one server per state folder;
- `create.pid`   the server's pid; its /proc comm is `gpuctk-serve` (COMM);
- `create.fifo`  the request FIFO (0600);
- the front (gpuctk.launchers, a bash client; bash for `read -t`) makes `create.PID.rep`, a
  FIFO it opens read-write (so it never blocks and the pipe outlives any writer), writes
  `create.PID.req` (NUL-terminated: REQUEST_TAG, the memo's runtime, then its arguments),
  then writes `PID\\n` to `create.fifo` (one write under PIPE_BUF: atomic among fronts) and
  reads one line from its reply FIFO, for at most `GPUCTK_SERVE_TIMEOUT` seconds (default 60);
- the server forks a worker per line. The worker opens the reply FIFO (write, non-blocking:
  gone means the front is gone), unlinks both files, reads the request, takes the front's
  environment from /proc/PID/environ (less GPUCTK_FRONT_RUNTIME, which only the front sets),
  moves into /proc/PID/cwd, writes its messages to the front's stderr (/proc/PID/fd/2), runs
  `prepare` and writes its status: `0` (the front execs the runtime), `1` (the error is
  already in the engine's log and on stderr; the front exits 1) or `python` (nothing was done;
  the front runs the Python shim as without a server). A worker that dies without answering
  (a signal, WORKER_LIMIT_S passed) is answered `1` by the server, with a line on the front's
  stderr.
- On SIGTERM/SIGINT the server removes `create.pid` and `create.fifo` (new fronts then start
  Python), answers `python` to the requests still queued, waits for its workers, and exits 0.

Anything the front cannot check (no server, a pid that is not a live root `gpuctk-serve`, no
bash or mkfifo, a leftover reply FIFO of the same pid) means the Python shim, as before.
The worker runs the same code as the Python shim, so a config or spec change takes effect on
the next create; only a change of gpuctk's own code needs a server restart (the deb's postinst
restarts it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from gpuctk.errors import GpuctkError, OutputError
from gpuctk.launchers import FRONT_RUNTIME_ENV
from gpuctk.launchers import SERVE_COMM as COMM
from gpuctk.launchers import SERVE_REQUEST_TAG as REQUEST_TAG

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

FIFO, PIDFILE, LOCK = "create.fifo", "create.pid", "create.lock"
WORKER_LIMIT_S = 50  # below the front's default 60 s wait
MAX_REQUEST = 4 * 1024 * 1024
SWEEP_S = 60.0  # how often an idle server removes leftovers of fronts that died
# Imported before the first request: what `gpuctk-runtime create` imports (bench/imports),
# with what a create imports when it resolves a request and when it takes a remembered plan.
WARM_MODULES = (
    "gpuctk.hook.runtime_main", "gpuctk.hook.config", "gpuctk.hook.cdiedits",
    "gpuctk.hook.shimroot", "gpuctk.hook.plans", "gpuctk.hook.requests",
    "gpuctk.hook.drivercaps", "gpuctk.hook.require", "gpuctk.hook.inroot",
    "gpuctk.hook.ldmerge", "gpuctk.hook.hooklog", "gpuctk.cdi.apply", "gpuctk.cdi.registry",
    "gpuctk.cdi.speccache", "gpuctk.cdi.ldcache", "gpuctk.cdi.names",
    "gpuctk.cdi.capabilities", "gpuctk.cdi.facts", "gpuctk.jsonfast", "gpuctk.rootfs",
    "gpuctk.fs", "gpuctk.records", "gpuctk.launchers", "gpuctk.hook.oci_state",
    "gpuctk.hook.hook_main", "gpuctk.cdi.elf", "gpuctk.cdi.specfile", "gpuctk.cdi.spectrust",
)  # fmt: skip


def request_paths(state_dir: str, pid: int) -> tuple[str, str]:
    """The request file and reply FIFO of the front with `pid`."""
    return f"{state_dir}/create.{pid}.req", f"{state_dir}/create.{pid}.rep"


def warm() -> None:
    """Import the create path and set up its C calls, so that a worker pays for neither."""
    import importlib

    for name in WARM_MODULES:
        importlib.import_module(name)
    from gpuctk import libc, rootfs

    rootfs.have_openat2()
    libc.function("renameat2")


def _set_comm(name: str) -> None:
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(name)
    except OSError:
        return  # only the front's liveness check uses it: it then starts Python


def _read_file(path: str, limit: int) -> bytes:
    from gpuctk.fs import read_limited

    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        data = read_limited(fd, limit)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"{path} is larger than {limit} bytes")
    return data


def _front_environ(pid: int) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in _read_file(f"/proc/{pid}/environ", MAX_REQUEST).split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name:
            env[os.fsdecode(name)] = os.fsdecode(value)
    env.pop(FRONT_RUNTIME_ENV, None)  # only the front sets it
    return env


def _open_front_stderr(pid: int) -> int:
    """The stderr of the front with `pid`, opened anew for appending; OSError when it cannot
    be (a socket, or the front is gone)."""
    return os.open(f"/proc/{pid}/fd/2", os.O_WRONLY | os.O_APPEND | os.O_NOCTTY)


def _to_front_stderr(pid: int) -> None:
    """Point fd 2 (and sys.stderr) at the front's stderr; /dev/null when it cannot be opened
    (a socket): the engine's --log still gets every message."""
    try:
        fd = _open_front_stderr(pid)
    except OSError:
        fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 2)
    os.close(fd)


def _unlink(*paths: str) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _say(fd: int, text: str) -> None:
    try:
        os.write(fd, text.encode())
    except OSError:
        return  # the front is gone: nobody to tell


def open_reply(state_dir: str, pid: int) -> int | None:
    """The front's reply FIFO, open for writing; None when no front waits on it (it timed out
    or died: nobody holds it open, or it is gone)."""
    try:
        return os.open(
            request_paths(state_dir, pid)[1],
            os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC,
        )
    except OSError:
        return None


def work(state_dir: str, pid: int, out: int) -> int:
    """One request, in a forked worker, answered on `out` (the reply FIFO, which the server
    opened): 0 when it was answered, anything else when the server must answer for it."""
    req, rep = request_paths(state_dir, pid)
    answer = "python"
    try:
        try:
            fields = _read_file(req, MAX_REQUEST).split(b"\0")
        finally:
            _unlink(req, rep)
        if len(fields) < 3 or fields[0] != REQUEST_TAG.encode() or fields[-1] != b"":
            raise ValueError(f"{req}: not a {REQUEST_TAG!r} request")
        runtime = os.fsdecode(fields[1])
        args = [os.fsdecode(f) for f in fields[2:-1]]
        env = _front_environ(pid)
        os.chdir(f"/proc/{pid}/cwd")
        _to_front_stderr(pid)
        os.environ.clear()
        os.environ.update(env)
    except (OSError, ValueError) as exc:
        # nothing done yet: the front runs the Python shim, which reports any real problem
        print(f"gpuctk-serve: request of pid {pid} not served: {exc}", file=sys.__stderr__)
        _say(out, "python\n")
        return 0
    try:
        from gpuctk.hook.runtime_main import prepare

        sys.argv = ["gpuctk-runtime", *args]
        status, _, _ = prepare(args, runtime if runtime.startswith("/") else "")
        answer = str(status)
    except BaseException as exc:  # prepare logs its own errors; this is a bug in the worker
        print(f"gpuctk-runtime: create server worker failed: {exc!r}", file=sys.stderr)
        answer = "1"
    sys.stderr.flush()
    _say(out, answer + "\n")
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(state_dir: str) -> None:
    """Remove request files and reply FIFOs of fronts that are gone."""
    try:
        names = os.listdir(state_dir)
    except OSError:
        return
    for name in names:
        parts = name.split(".")
        if len(parts) != 3 or parts[0] != "create" or parts[2] not in ("req", "rep"):
            continue
        if not (parts[1].isdigit() and _alive(int(parts[1]))):
            _unlink(os.path.join(state_dir, name))


class Server:
    """The server's state: its folder, FIFO, and the workers in flight."""

    def __init__(self, state_dir: str, say: Callable[[str], None]) -> None:
        self.state_dir = state_dir
        self.say = say
        self.workers: dict[int, tuple[int, int]] = {}  # worker -> (front, reply fd)
        self.stop = False
        self.fifo_fd = -1
        self.lock_fd = -1
        self.served = 0

    def path(self, name: str) -> str:
        return os.path.join(self.state_dir, name)

    def open(self) -> None:
        """Take the lock, make the FIFO, write the pid file; GpuctkError when it cannot."""
        import fcntl

        from gpuctk.fs import atomic_write, private_folder

        if not private_folder(self.state_dir, create=True):
            raise OutputError(
                f"{self.state_dir} is not a folder owned by this user that nobody else can "
                "write: fix its owner and mode (0700), or pass --state-dir"
            )
        self.lock_fd = os.open(self.path(LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = ""
            with contextlib.suppress(OSError, ValueError):
                other = _read_file(self.path(PIDFILE), 64).decode().strip()
            raise GpuctkError(
                f"a create server already serves {self.state_dir}"
                + (f" (pid {other})" if other else "")
                + ": stop it first (systemctl stop gpuctk-create-server)"
            ) from None
        fifo = self.path(FIFO)
        _unlink(fifo, self.path(PIDFILE))
        os.mkfifo(fifo, 0o600)
        # read-write: the server is a writer too, so the FIFO never reads as closed
        self.fifo_fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        sweep(self.state_dir)
        atomic_write(self.path(PIDFILE), f"{os.getpid()}\n".encode(), mode=0o644, durable=False)

    def close(self) -> None:
        """Stop taking requests: new fronts start Python from here on."""
        _unlink(self.path(PIDFILE), self.path(FIFO))

    def spawn(self, front: int) -> None:
        out = open_reply(self.state_dir, front)
        if out is None:
            _unlink(*request_paths(self.state_dir, front))
            return
        try:
            worker = os.fork()
        except OSError as exc:
            self.say(f"cannot fork a worker for pid {front}: {exc}; it runs Python")
            self.answer(front, out, "python\n")
            return
        if worker == 0:
            status = 1
            try:
                import gc

                gc.disable()  # a worker lives a few ms: no collection touching shared pages
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.set_wakeup_fd(-1)
                os.close(self.fifo_fd)
                os.close(self.lock_fd)
                signal.alarm(WORKER_LIMIT_S)
                status = work(self.state_dir, front, out)
            finally:
                os._exit(status)
        # the server keeps its copy of the reply FIFO until the worker is reaped: the worker
        # unlinks the name, and a worker that dies unanswered is answered through it
        self.workers[worker] = (front, out)
        self.served += 1

    def answer(self, front: int, fd: int, text: str) -> None:
        """Answer `front` on `fd` from the server itself (its worker died, or the server
        stops), and close `fd`."""
        if text != "python\n":
            try:
                err = _open_front_stderr(front)
                why = text.strip()
                _say(err, f"gpuctk-runtime: the create server's worker died ({why}); see "
                          "the server's log: journalctl -u gpuctk-create-server\n")  # fmt: skip
                os.close(err)
            except OSError:
                pass
            text = "1\n"
        _say(fd, text)
        os.close(fd)
        _unlink(*request_paths(self.state_dir, front))

    def reap(self) -> None:
        while self.workers:
            try:
                worker, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:  # not ours any more: nothing left to answer for
                for _, out in self.workers.values():
                    os.close(out)
                self.workers.clear()
                return
            if worker == 0:
                return
            entry = self.workers.pop(worker, None)
            if entry is None:
                continue
            front, out = entry
            if os.WIFSIGNALED(status):
                why = f"signal {os.WTERMSIG(status)}"
                self.say(f"worker {worker} for pid {front} killed by {why}")
                self.answer(front, out, why + "\n")
            elif os.waitstatus_to_exitcode(status) != 0:
                self.say(f"worker {worker} for pid {front} failed")
                self.answer(front, out, "worker failed\n")
            else:
                os.close(out)

    def requests(self, buf: bytearray) -> list[int]:
        """Complete request lines read so far (pids), malformed ones logged and dropped."""
        try:
            while True:
                chunk = os.read(self.fifo_fd, 65536)
                if not chunk:
                    break
                buf += chunk
        except BlockingIOError:
            pass
        lines = bytes(buf).split(b"\n")
        buf[:] = lines.pop()
        pids = []
        for line in lines:
            text = line.decode("ascii", "replace").strip()
            if text.isdigit() and int(text) > 1:
                pids.append(int(text))
            elif text:
                self.say(f"ignored a malformed request line: {text[:80]!r}")
        return pids

    def run(self) -> int:
        import selectors

        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)

        def on_stop(signum: int, frame: object) -> None:
            self.stop = True

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        sel = selectors.DefaultSelector()
        sel.register(self.fifo_fd, selectors.EVENT_READ)
        sel.register(wake_r, selectors.EVENT_READ)
        buf = bytearray()
        while not self.stop:
            events = sel.select(SWEEP_S)
            try:
                while os.read(wake_r, 512):
                    pass
            except BlockingIOError:
                pass
            for front in self.requests(buf):
                self.spawn(front)
            self.reap()
            if not events:
                sweep(self.state_dir)
        self.close()
        for front in self.requests(buf):  # queued before the FIFO went: Python serves them
            out = open_reply(self.state_dir, front)
            if out is not None:
                self.answer(front, out, "python\n")
        while self.workers:
            sel.select(1.0)
            self.reap()
        return 0


def serve(state_dir: str, say: Callable[[str], None]) -> int:
    """Run the create server on `state_dir` until SIGTERM/SIGINT."""
    if os.geteuid() != 0:
        raise GpuctkError(
            "the create server must run as root: it serves gpuctk-runtime, which the engine "
            "runs as root"
        )
    warm()
    import gc

    gc.collect()
    gc.freeze()  # what warm() made is never collected: a worker's GC leaves those pages shared
    server = Server(state_dir, say)
    try:
        server.open()
    except OSError as exc:
        raise OutputError(f"cannot set up the create server in {state_dir}: {exc}") from None
    _set_comm(COMM)
    say(f"serving container creates on {server.path(FIFO)} (pid {os.getpid()})")
    try:
        return server.run()
    finally:
        server.close()
        say(f"stopped after {server.served} creates")


def main(argv: list[str] | None = None) -> int:
    """`python -I -m gpuctk.hook.serve STATE_DIR`: what `gpuctk create-server` execs, so that
    the resident process (and every fork of it) carries only the create path, not the CLI."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -I -m gpuctk.hook.serve STATE_DIR", file=sys.stderr)
        return 2

    def say(line: str) -> None:
        print(f"gpuctk-serve: {line}", file=sys.stderr, flush=True)

    try:
        return serve(args[0], say)
    except GpuctkError as exc:
        say(f"error: {exc.message}")
        return exc.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
