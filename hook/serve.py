"""gpuctk-runtime's create server: container creates without a Python start.

    gpuctk create-server [--state-dir /run/gpuctk]      (gpuctk-create-server.service)

A create that asks for a GPU needs gpuctk's Python: ~13 ms of interpreter start and ~4 ms of
imports before ~3 ms of work, on every container. This server pays the first two once: it
imports the create path, then waits on a FIFO; it hands each create to a worker process
forked from it, which does the work of `gpuctk-runtime create`
(gpuctk.hook.runtime_main.prepare) in the environment, current folder and stderr of the sh
front that asked, and answers with the exit status. The front then
execs the low-level runtime itself, so runc still runs as the engine's child with the engine's
stdio and file descriptors, exactly as without the server.

The protocol, all in the state folder (`$GPUCTK_STATE_DIR`, default /run/gpuctk; owned by root,
mode 0700, checked by server and front alike):

- `create.lock`  held (flock) by the live server: one server per state folder;
- `create.pid`   the server's pid; its /proc comm is `gpuctk-serve` (COMM);
- `create.fifo`  the request FIFO (0600);
- the front (gpuctk.launchers, a bash client; bash for `read -t`) makes its reply pipe with
  no process (a bash 5.1+ here-string, reopened read-write through /proc/self/fd so that it
  never reads EOF, at a descriptor FD bash picks above any open one), writes
  `create.PID.req` (NUL-terminated: REQUEST_TAG, the memo's runtime, then its arguments),
  then writes `PID FD\\n` to `create.fifo` (one write under PIPE_BUF: atomic among fronts)
  and reads one line from its pipe, for at most `GPUCTK_SERVE_TIMEOUT` seconds (default 60);
- the server hands each line to an idle worker (forking one when none is idle), after
  opening the reply pipe itself through /proc/PID/fd/FD (write, non-blocking; only when the
  request file exists and FD is an anonymous pipe: a file is never written to). The
  worker opens it too, unlinks the request file, reads the request, takes the front's
  environment from /proc/PID/environ (less GPUCTK_FRONT_RUNTIME, which only the front sets),
  moves into /proc/PID/cwd, writes its messages to the front's stderr (/proc/PID/fd/2), runs
  `prepare` and writes its status: `0` (the front execs the runtime), `1` (the error is
  already in the engine's log and on stderr; the front exits 1) or `python` (nothing was done;
  the front runs the Python shim as without a server). A worker that dies without answering
  (a signal, WORKER_LIMIT_S passed) is answered `1` by the server, with a line on the front's
  stderr.
- Workers are reused. A worker goes back to its own environment, folder (/) and stderr after
  each create and tells the server on a pipe (`d`), which then closes its copy of the reply
  pipe and counts the worker idle; it serves up to WORKER_REQUESTS creates, and the server
  keeps up to IDLE_MAX idle. A fresh fork pays ~4 ms more per create here than a worker that
  served before: copy-on-write faults on the pages it shares with the server (a reference
  count written is a page copied) and the first run of each code path (CPython specializes
  bytecode as it runs; a lazily imported extension). So the server forks a spare ahead of
  need, which copies its shared pages at once (populate, MADV_POPULATE_WRITE), and takes the
  worker that finished last. What a worker keeps from one create to the next is only the
  import state and the caches keyed on a host file's identity (gpuctk.cdi.elf, devnodes);
  config, specs, plans and the memo are read from disk on every create, as by the shim.
- On SIGTERM/SIGINT the server removes `create.pid` and `create.fifo` (new fronts then start
  Python), answers `python` to the requests still queued, waits for its workers, and exits 0.

Anything the front cannot check (no server, a pid that is not a live root `gpuctk-serve`, no
bash or one older than 5.1, a leftover request file of the same pid) means the Python shim,
as before.
The worker runs the same code as the Python shim, so a config or spec change takes effect on
the next create; only a change of gpuctk's own code needs a server restart (the deb's postinst
restarts it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
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
WORKER_REQUESTS = 1000  # creates a worker serves before it exits (a new one takes over)
IDLE_MAX = 4  # idle workers kept; more exit when they finish
MAX_WORKERS = 16  # at once (default); a create beyond them runs the Python shim
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
    "_json",  # gpuctk.jsonfast's C scanner, imported on the first loads()
)  # fmt: skip
MADV_POPULATE_WRITE = 23  # Linux 5.14+


def request_path(state_dir: str, pid: int) -> str:
    """The request file of the front with `pid`."""
    return f"{state_dir}/create.{pid}.req"


_pipefs: list[int] = []  # the device number of anonymous pipes (pipefs), once known


def _anonymous_pipe(fd: int) -> bool:
    if not _pipefs:
        r, w = os.pipe()
        _pipefs.append(os.fstat(r).st_dev)
        os.close(r)
        os.close(w)
    st = os.fstat(fd)
    return stat.S_ISFIFO(st.st_mode) and st.st_dev == _pipefs[0]


def warm() -> None:
    """Import the create path and set up its C calls, so that a worker pays for neither."""
    import importlib

    for name in WARM_MODULES:
        importlib.import_module(name)
    from gpuctk import libc, rootfs

    rootfs.have_openat2()
    libc.function("renameat2")


def populate() -> int:
    """Break the copy-on-write sharing of every page this process shares with the server:
    a worker that writes to a shared page (a Python reference count is enough) takes a fault
    and a page copy for it, ~2 ms over a create. An idle worker calls this before its request
    comes (MADV_POPULATE_WRITE over each run of present pages of each private writable
    mapping; pages never touched stay unallocated). Returns the pages populated; 0 on a kernel
    without MADV_POPULATE_WRITE (the worker then copies on demand, as before)."""
    from gpuctk import libc

    madvise = libc.function("madvise")
    present = bytes(0x80 if b >= 0x80 else 0 for b in range(256))  # pagemap bit 63
    pages = 0
    try:
        with open("/proc/self/maps", "rb") as f:
            maps = f.read().splitlines()
        pagemap = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        for line in maps:
            fields = line.split()
            if fields[1] != b"rw-p" or fields[-1] in (b"[stack]", b"[vvar]"):
                continue
            start, end = (int(x, 16) for x in fields[0].split(b"-"))
            entries = os.pread(pagemap, (end - start) >> 9, (start >> 12) * 8)
            flags = entries[7::8].translate(present)  # 0x80 where a page is present
            i = flags.find(0x80)
            while i >= 0:
                j = flags.find(0, i)
                j = len(flags) if j < 0 else j
                length = (j - i) << 12
                if madvise(libc.long_arg(start + (i << 12)), libc.long_arg(length),
                           MADV_POPULATE_WRITE) != 0:  # fmt: skip
                    return pages  # EINVAL: an older kernel
                pages += j - i
                i = flags.find(0x80, j)
    except OSError:
        return pages
    finally:
        os.close(pagemap)
    return pages


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


def open_reply(state_dir: str, pid: int, fd: int) -> int | None:
    """The reply pipe of the front with `pid` (its descriptor `fd`), opened anew for writing;
    None when there is no such request (no request file: it timed out, or the line was not
    a front's), no such front or descriptor, or the descriptor is not an anonymous pipe (a
    file or a named FIFO is never written to)."""
    try:
        if not stat.S_ISREG(os.lstat(request_path(state_dir, pid)).st_mode):
            return None
        out = os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if _anonymous_pipe(out):
            return out
    except OSError:
        pass
    os.close(out)
    return None


def _same_files(pid: int) -> None:
    """ValueError unless the front with `pid` sees the files this worker sees: the same mount
    namespace and root, so that the bundle, config and spec paths it names are the same
    files here (an engine in its own mount namespace gets the Python shim, which runs in it)."""
    if os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt"):
        raise ValueError("it runs in another mount namespace")
    theirs, ours = os.stat(f"/proc/{pid}/root"), os.stat("/")
    if (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino):
        raise ValueError("it runs under another root")


def work(state_dir: str, pid: int, out: int) -> None:
    """One request, in a worker, answered on `out` (the front's reply pipe, which the server
    opened too: it answers for a worker that dies before it answers)."""
    req = request_path(state_dir, pid)
    try:
        try:
            fields = _read_file(req, MAX_REQUEST).split(b"\0")
        finally:
            _unlink(req)
        if len(fields) < 3 or fields[0] != REQUEST_TAG.encode() or fields[-1] != b"":
            raise ValueError(f"{req}: not a {REQUEST_TAG!r} request")
        runtime = os.fsdecode(fields[1])
        args = [os.fsdecode(f) for f in fields[2:-1]]
        _same_files(pid)
        env = _front_environ(pid)
        os.chdir(f"/proc/{pid}/cwd")
        _to_front_stderr(pid)
        os.environ.clear()
        os.environ.update(env)
    except (OSError, ValueError) as exc:
        # nothing done yet: the front runs the Python shim, which reports any real problem
        print(f"gpuctk-serve: request of pid {pid} not served: {exc}", file=sys.__stderr__)
        _say(out, "python\n")
        return
    try:
        from gpuctk.hook.runtime_main import prepare

        sys.argv = ["gpuctk-runtime", *args]
        status, _, _ = prepare(args, runtime)
        answer = str(status)
    except BaseException as exc:  # prepare logs its own errors; this is a bug in the worker
        print(f"gpuctk-runtime: create server worker failed: {exc!r}", file=sys.stderr)
        answer = "1"
    sys.stderr.flush()
    _say(out, answer + "\n")


def _next_front(requests: int) -> tuple[int, int] | None:
    """The next front's pid and reply descriptor from the server; None at EOF (the server
    stops or is gone)."""
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(requests, 32)
        if not chunk:
            return None
        line += chunk
    pid, fd = line.split()
    return int(pid), int(fd)


def worker_main(state_dir: str, requests: int, done: int, ahead: bool) -> int:
    """A worker's life, in a process forked from the server: serve the fronts whose pids come
    on `requests`, one at a time, each in its front's environment, folder and stderr, and go
    back to its own after each; write `d` on `done` after each (`x` after the last of
    WORKER_REQUESTS, then exit). A worker that serves again has its code paths warm and its
    pages its own: a reused worker's create costs what the work costs. `ahead`: forked
    before a request needed it; copy the shared pages now (populate)."""
    import gc

    gc.disable()  # collected after each create, off the create's path
    if ahead:
        populate()
    environ = dict(os.environ)
    stderr = os.dup(2)
    for n in range(1, WORKER_REQUESTS + 1):
        request = _next_front(requests)
        if request is None:
            return 0
        front, fd = request
        signal.alarm(WORKER_LIMIT_S)
        out = open_reply(state_dir, front, fd)
        if out is None:  # the front is gone
            _unlink(request_path(state_dir, front))
        else:
            try:
                work(state_dir, front, out)
            finally:
                os.close(out)
        signal.alarm(0)
        sys.stderr.flush()
        os.dup2(stderr, 2)
        os.chdir("/")
        os.environ.clear()
        os.environ.update(environ)
        os.write(done, b"x" if n == WORKER_REQUESTS else b"d")
        gc.collect(0)  # what this create left (the gc is off: it is all still generation 0)
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
    """Remove request files (and the named reply FIFOs an older front made) of fronts that
    are gone."""
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


class Worker:
    """A worker process as the server sees it: the pipe that takes a front's pid to it, the
    pipe on which it says it is done, and the request it serves (front pid, the server's copy
    of the reply pipe; -1 while idle)."""

    __slots__ = ("done", "front", "out", "pid", "to")

    def __init__(self, pid: int, to: int, done: int) -> None:
        self.pid, self.to, self.done = pid, to, done
        self.front = self.out = -1


class Server:
    """The server's state: its folder, FIFO, and its workers."""

    def __init__(
        self, state_dir: str, say: Callable[[str], None], max_workers: int = MAX_WORKERS
    ) -> None:
        self.state_dir = state_dir
        self.say = say
        self.max_workers = max_workers
        self.workers: dict[int, Worker] = {}  # by pid
        self.idle: list[Worker] = []  # the last one done is taken first
        self.stop = False
        self.fifo_fd = -1
        self.lock_fd = -1
        self.served = 0
        self.on_fork: Callable[[Worker], object] = lambda worker: None
        self.on_exit: Callable[[Worker], object] = lambda worker: None

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

    def fork_worker(self, ahead: bool) -> Worker | None:
        """A new worker; `ahead`: forked before any request needs it, so it also copies the
        pages it shares with the server now (populate) rather than on its first create.
        None (logged) when it cannot be forked."""
        try:
            to_r, to_w = os.pipe2(os.O_CLOEXEC)
            done_r, done_w = os.pipe2(os.O_CLOEXEC)
        except OSError as exc:
            self.say(f"cannot make a worker's pipes: {exc}")
            return None
        try:
            pid = os.fork()
        except OSError as exc:
            for fd in (to_r, to_w, done_r, done_w):
                os.close(fd)
            self.say(f"cannot fork a worker: {exc}")
            return None
        if pid == 0:
            status = 1
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.set_wakeup_fd(-1)
                inherited = [to_w, done_r, self.fifo_fd, self.lock_fd]
                for other in self.workers.values():
                    inherited += [other.to, other.done] + ([other.out] if other.out >= 0 else [])
                for fd in inherited:
                    os.close(fd)
                status = worker_main(self.state_dir, to_r, done_w, ahead)
            finally:
                os._exit(status)
        os.close(to_r)
        os.close(done_w)
        os.set_blocking(done_r, False)
        worker = Worker(pid, to_w, done_r)
        self.workers[pid] = worker
        self.on_fork(worker)
        return worker

    def spawn(self, front: int, fd: int) -> None:
        """Hand the request of `front` to an idle worker (a new one when none is idle),
        keeping a copy of its reply pipe to answer for a worker that dies."""
        out = open_reply(self.state_dir, front, fd)
        if out is None:
            _unlink(request_path(self.state_dir, front))
            return
        while True:
            if self.idle:
                worker: Worker | None = self.idle.pop()
            elif len(self.workers) < self.max_workers:
                worker = self.fork_worker(ahead=False)
            else:  # a burst beyond max_workers: this create starts Python, as without us
                worker = None
            if worker is None:
                self.answer(front, out, "python\n")
                return
            try:
                os.write(worker.to, f"{front} {fd}\n".encode())
                break
            except OSError:  # it died idle: reap() logs it; try the next one
                self.retire(worker)
        # the server keeps its copy of the reply pipe until the worker says it is done: a
        # worker that dies unanswered is answered through it
        worker.front, worker.out = front, out
        self.served += 1
        if not self.idle and len(self.workers) < min(IDLE_MAX, self.max_workers):
            self.spare()  # for the next create, made while this one runs

    def spare(self) -> None:
        """Fork a worker ahead of need, idle at the bottom of the list: a worker that has
        served (warm) is taken before it."""
        worker = self.fork_worker(ahead=True)
        if worker is not None:
            self.idle.insert(0, worker)

    def retire(self, worker: Worker) -> None:
        """No more requests for `worker`: it exits when it reads EOF (reap() forgets it)."""
        if worker.to >= 0:
            os.close(worker.to)
            worker.to = -1
        if worker in self.idle:
            self.idle.remove(worker)

    def finished(self, worker: Worker) -> None:
        """Read what `worker` said on its done pipe: `d` (request done, it takes another),
        `x` (done, and it exits now)."""
        try:
            said = os.read(worker.done, 64)
        except BlockingIOError:
            return
        except OSError:
            said = b""
        if not said:
            return  # EOF: it exits, reap() forgets it
        if worker.out >= 0:
            os.close(worker.out)
            worker.front = worker.out = -1
        if b"x" in said or self.stop or worker.to < 0 or len(self.idle) >= IDLE_MAX:
            self.retire(worker)
        else:
            self.idle.append(worker)

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
        _unlink(request_path(self.state_dir, front))

    def reap(self) -> None:
        """Forget the workers that exited; answer the front of one that died serving it."""
        while self.workers:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:  # not ours any more: nothing left to answer for
                pid, status = next(iter(self.workers)), 0
            if pid == 0:
                return
            worker = self.workers.pop(pid, None)
            if worker is None:
                continue
            self.finished(worker)  # a `d` it wrote before it exited
            self.retire(worker)
            self.on_exit(worker)
            os.close(worker.done)
            if worker.out < 0:
                if status and not self.stop:
                    self.say(f"idle worker {pid} exited (wait status {status:#x})")
                continue
            front, out = worker.front, worker.out
            if os.WIFSIGNALED(status):
                why = f"signal {os.WTERMSIG(status)}"
                self.say(f"worker {pid} for pid {front} killed by {why}")
                self.answer(front, out, why + "\n")
            else:
                self.say(f"worker {pid} for pid {front} exited unanswered")
                self.answer(front, out, "worker failed\n")

    def requests(self, buf: bytearray) -> list[tuple[int, int]]:
        """Complete request lines read so far (`PID FD`: a front and its reply pipe's
        descriptor), malformed ones logged and dropped."""
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
        found = []
        for line in lines:
            text = line.decode("ascii", "replace").strip()
            pid, _, fd = text.partition(" ")
            if pid.isdigit() and fd.isdigit() and int(pid) > 1 and len(fd) < 8:
                found.append((int(pid), int(fd)))
            elif text:
                self.say(f"ignored a malformed request line: {text[:80]!r}")
        return found

    def run(self) -> int:
        import selectors

        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        sel = selectors.DefaultSelector()
        sel.register(self.fifo_fd, selectors.EVENT_READ)
        sel.register(wake_r, selectors.EVENT_READ)
        self.on_fork = lambda worker: sel.register(worker.done, selectors.EVENT_READ, worker)
        self.on_exit = lambda worker: sel.unregister(worker.done)

        def step(timeout: float) -> bool:
            events = sel.select(timeout)
            try:
                while os.read(wake_r, 512):
                    pass
            except BlockingIOError:
                pass
            for key, _ in events:
                if isinstance(key.data, Worker):
                    self.finished(key.data)
            return bool(events)

        buf = bytearray()
        self.spare()
        while not self.stop:
            busy = step(SWEEP_S)
            for front, fd in self.requests(buf):
                self.spawn(front, fd)
            self.reap()
            if not busy:
                sweep(self.state_dir)
        self.close()
        for worker in list(self.workers.values()):
            self.retire(worker)  # idle ones exit now, busy ones when done
        for front, fd in self.requests(buf):  # queued before the FIFO went: Python serves them
            out = open_reply(self.state_dir, front, fd)
            if out is not None:
                self.answer(front, out, "python\n")
        while self.workers:
            step(1.0)
            self.reap()
        return 0


def serve(state_dir: str, say: Callable[[str], None], max_workers: int = MAX_WORKERS) -> int:
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
    server = Server(state_dir, say, max_workers)

    def on_stop(signum: int, frame: object) -> None:
        server.stop = True

    # before the pid file exists: a stop sent as soon as it appears is a clean stop
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    # a parent that blocked these (an agent waiting in sigwait) must not leave them blocked:
    # the server reaps on SIGCHLD, and a worker's time limit is SIGALRM
    stops = {signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGALRM}
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
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
    """`python -I -m gpuctk.hook.serve STATE_DIR [MAX_WORKERS]`: what `gpuctk create-server`
    execs, so that the resident process (and every fork of it) carries only the create path,
    not the CLI."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2) or not (len(args) == 1 or (args[1].isdigit() and int(args[1]))):
        print("usage: python -I -m gpuctk.hook.serve STATE_DIR [MAX_WORKERS]", file=sys.stderr)
        return 2

    def say(line: str) -> None:
        print(f"gpuctk-serve: {line}", file=sys.stderr, flush=True)

    try:
        return serve(args[0], say, int(args[1]) if len(args) == 2 else MAX_WORKERS)
    except GpuctkError as exc:
        say(f"error: {exc.message}")
        return exc.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
