"""gpuctk create-server (gpuctk.hook.serve) with the real sh front (gpuctk.launchers).

The front under test names an interpreter that does not exist, so any create that reaches
Python fails with exit 127: a create that succeeds was served by the server. The server runs
as a real process (as root, like the unit it ships as) with an environment of its own, which
names no gpuctk config: the config, folder and stderr in force are the front's.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.createserver import CHECKOUT_GPUCTK, start_create_server

from gpuctk import launchers
from gpuctk.hook import serve
from gpuctk.hook.runtime_main import remember_runtime

NO_PYTHON = "/nonexistent/python3"
SPEC = {
    "cdiVersion": "0.6.0",
    "kind": "nvidia.com/gpu",
    "devices": [{"name": "0", "containerEdits": {"env": ["SERVED=yes"]}}],
}
ASKS = {"ociVersion": "1.0.2", "process": {"args": ["/bin/true"], "cwd": "/",
        "env": ["NVIDIA_VISIBLE_DEVICES=0"]}, "root": {"path": "rootfs"}}  # fmt: skip

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the create server runs as root")


class Node:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.state = tmp / "state"
        self.state.mkdir(mode=0o700)
        (tmp / "cdi").mkdir()
        (tmp / "cdi" / "gpu.json").write_text(json.dumps(SPEC))
        self.runtime = tmp / "runtime-B"
        self.runtime.write_text('#!/bin/sh\necho "B $*"\n')
        self.runtime.chmod(0o755)
        self.config = tmp / "config.toml"
        self.config.write_text(f'runtimes = ["{self.runtime}"]\nspec-dirs = ["{tmp / "cdi"}"]\n')
        self.front = tmp / "gpuctk-runtime"
        self.front.write_text(launchers.runtime_front_text(NO_PYTHON))
        self.front.chmod(0o755)
        self.env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "GPUCTK_CONFIG": str(self.config),
            "GPUCTK_STATE_DIR": str(self.state),
        }
        assert remember_runtime(
            str(self.runtime), self.env, ["NVIDIA_VISIBLE_DEVICES", "cdi.k8s.io/"]
        )
        self.bundle = tmp / "bundle"
        (self.bundle / "rootfs").mkdir(parents=True)
        self.server: subprocess.Popen[str] | None = None

    def ask(self, config: dict[str, object] = ASKS) -> None:
        (self.bundle / "config.json").write_text(json.dumps(config))

    def edited(self) -> list[str]:
        env: list[str] = json.loads((self.bundle / "config.json").read_text())["process"]["env"]
        return env

    def start(self, *extra: str) -> subprocess.Popen[str]:
        self.server = start_create_server(self.state, env={
            "PATH": self.env["PATH"], "GPUCTK_CONFIG": str(self.tmp / "not-this-one.toml"),
            "PYTHONPATH": os.pathsep.join(sys.path),
        }, extra=extra)  # fmt: skip
        return self.server

    def stop(self) -> str:
        assert self.server is not None
        self.server.send_signal(signal.SIGTERM)
        _, err = self.server.communicate(timeout=30)
        assert self.server.returncode == 0, err
        self.server = None
        return err

    def run(
        self, *args: str, cwd: Path | None = None, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.front), *args], env={**self.env, **env}, cwd=cwd,
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    def leftovers(self) -> list[str]:
        return sorted(p.name for p in self.state.iterdir() if p.name.count(".") == 2)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path)
    yield n
    if n.server is not None:
        n.server.kill()
        n.server.wait()


def test_the_front_mirrors_the_server_names() -> None:
    assert launchers.SERVE_COMM == serve.COMM
    assert launchers.SERVE_REQUEST_TAG == serve.REQUEST_TAG


def test_without_a_server_a_gpu_create_starts_python(node: Node) -> None:
    node.ask()
    done = node.run("create", "--bundle", str(node.bundle), "c1")
    assert done.returncode == 127 and NO_PYTHON in done.stderr
    assert "SERVED=yes" not in node.edited()


def test_the_server_edits_the_bundle_and_the_front_execs_the_runtime(node: Node) -> None:
    node.start()
    node.ask()
    done = node.run(
        "--log", str(node.tmp / "log.json"), "create", "--bundle", str(node.bundle), "c1"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"B --log {node.tmp / 'log.json'} create --bundle {node.bundle} c1\n"
    assert node.edited() == ["NVIDIA_VISIBLE_DEVICES=0", "SERVED=yes"]
    assert node.leftovers() == []  # the request file and reply FIFO are gone
    assert "stopped after 1 creates" in node.stop()
    assert not (node.state / serve.FIFO).exists() and not (node.state / serve.PIDFILE).exists()


def test_the_engines_descriptors_reach_the_runtime_untouched(node: Node) -> None:
    """runc gets the engine's extra descriptors (--preserve-fds, ...): the client's own are
    ones bash picks above all that are open, and are closed before the runtime runs."""
    node.start()
    node.ask()
    fds = (3, 4, 10)  # 10: where bash starts picking its own
    node.runtime.write_text(
        "#!/bin/sh\n" + "".join(f"echo fd{fd} >/proc/self/fd/{fd}\n" for fd in fds)
        + "ls /proc/self/fd | sort -n | tr '\\n' ' '\n"
    )  # fmt: skip
    opens = " ".join(f"{fd}>{node.tmp / f'out{fd}'}" for fd in fds)
    done = subprocess.run(
        ["/bin/bash", "-c", f'exec {opens}; exec "$0" create -b "$1" c1', str(node.front),
         str(node.bundle)],
        env=node.env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [(node.tmp / f"out{fd}").read_text() for fd in fds] == [f"fd{fd}\n" for fd in fds]
    # 0-2, the engine's, and the one ls lists its folder with: nothing of the client's
    assert done.stdout.split() == ["0", "1", "2", "3", "4", "5", "10"]
    assert "SERVED=yes" in node.edited()


def test_the_worker_works_in_the_fronts_folder_and_environment(node: Node) -> None:
    """No --bundle: the bundle is the front's current folder. The spec dirs come from the
    front's GPUCTK_CONFIG: the server's names a missing file (the defaults, /etc/cdi and
    /var/run/cdi, where no device gives SERVED=yes)."""
    node.start()
    node.ask()
    assert node.run("create", "c1", cwd=node.bundle).returncode == 0
    assert "SERVED=yes" in node.edited()


def _fds(pid: str) -> list[str]:
    return sorted(os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd"))


def test_a_worker_serves_create_after_create_each_in_its_own_fronts_state(node: Node) -> None:
    """Workers are reused: after eight creates the server has no more than IDLE_MAX of
    them, those that served early still serve and hold the files they held then (nothing of
    a front's left open), and each create ran in its own front's folder and stderr."""
    node.start()
    assert node.server is not None
    children = Path(f"/proc/{node.server.pid}/task/{node.server.pid}/children")
    bundles = [node.bundle, node.tmp / "bundle2"]
    (bundles[1] / "rootfs").mkdir(parents=True)
    good = json.dumps(ASKS)
    bad = json.dumps({**ASKS, "process": {**ASKS["process"], "env": ["NVIDIA_VISIBLE_DEVICES=7"]}})  # type: ignore[dict-item]
    before: dict[str, list[str]] = {}
    for n in range(8):
        bundle = bundles[n % 2]
        (bundle / "config.json").write_text(bad if n % 4 == 3 else good)
        done = node.run("create", f"c{n}", cwd=bundle)  # no --bundle: the front's folder
        if n % 4 == 3:
            assert done.returncode == 1 and "unknown CDI device nvidia.com/gpu=7" in done.stderr
        else:
            assert done.returncode == 0 and done.stderr == "", done.stderr
            edited = json.loads((bundle / "config.json").read_text())["process"]["env"]
            assert edited == ["NVIDIA_VISIBLE_DEVICES=0", "SERVED=yes"]
        if n == 1:
            time.sleep(0.5)  # a spare forked ahead is done copying its pages (populate)
            before = {pid: _fds(pid) for pid in children.read_text().split()}
    after = {pid: _fds(pid) for pid in children.read_text().split()}
    assert len(after) <= serve.IDLE_MAX  # not a process per create
    kept = set(before) & set(after)
    assert kept and {p: after[p] for p in kept} == {p: before[p] for p in kept}
    assert "stopped after 8 creates" in node.stop()


def test_an_error_reaches_the_fronts_stderr_and_the_engine_log(node: Node) -> None:
    node.start()
    node.ask({**ASKS, "process": {**ASKS["process"], "env": ["NVIDIA_VISIBLE_DEVICES=7"]}})  # type: ignore[dict-item]
    before = (node.bundle / "config.json").read_text()
    log = node.tmp / "log.json"
    done = node.run(
        "--log", str(log), "--log-format", "json", "create", "-b", str(node.bundle), "c1"
    )
    assert done.returncode == 1 and done.stdout == ""  # the runtime never ran
    assert "unknown CDI device nvidia.com/gpu=7" in done.stderr
    assert json.loads(log.read_text().splitlines()[-1])["level"] == "error"
    assert (node.bundle / "config.json").read_text() == before


def test_a_container_that_asks_for_nothing_skips_the_server_too(node: Node) -> None:
    node.start()
    node.ask({**ASKS, "process": {**ASKS["process"], "env": []}})  # type: ignore[dict-item]
    assert node.run("create", "-b", str(node.bundle), "c1").stdout.startswith("B create")
    assert "stopped after 0 creates" in node.stop()


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare")
def test_a_front_in_another_mount_namespace_runs_python(node: Node) -> None:
    """The server cannot know what a front in another mount namespace means by its paths:
    the worker answers `python`, and the front runs the Python shim in its own."""
    node.start()
    node.ask()
    before = (node.bundle / "config.json").read_text()
    done = subprocess.run(
        ["unshare", "-m", str(node.front), "create", "-b", str(node.bundle), "c1"],
        env=node.env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 127 and NO_PYTHON in done.stderr  # the Python shim, not served
    assert (node.bundle / "config.json").read_text() == before
    assert "not served: it runs in another mount namespace" in node.stop()


def test_a_stopped_server_sends_creates_back_to_python(node: Node) -> None:
    node.start()
    node.stop()
    node.ask()
    assert node.run("create", "-b", str(node.bundle), "c1").returncode == 127


def test_a_pid_file_naming_another_process_is_not_trusted(node: Node) -> None:
    os.mkfifo(node.state / serve.FIFO, 0o600)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (node.state / serve.PIDFILE).write_text(f"{sleeper.pid}\n")
        node.ask()
        done = node.run("create", "-b", str(node.bundle), "c1", GPUCTK_SERVE_TIMEOUT="1")
        assert done.returncode == 127  # Python, not a wait on a FIFO nobody reads
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_server_that_never_answers_times_out_with_an_error(node: Node) -> None:
    """A process named gpuctk-serve that owns the FIFO but never reads it: the front gives up
    after GPUCTK_SERVE_TIMEOUT seconds with an error (the server might still be at work on the
    bundle, so it does not fall back to Python)."""
    os.mkfifo(node.state / serve.FIFO, 0o600)
    mute = subprocess.Popen(
        [sys.executable, "-c", "import time\nopen('/proc/self/comm', 'w').write('gpuctk-serve')\n"
         "print(flush=True)\ntime.sleep(60)"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert mute.stdout is not None and mute.stdout.readline() == b"\n"
        (node.state / serve.PIDFILE).write_text(f"{mute.pid}\n")
        node.ask()
        start = time.monotonic()
        done = node.run("create", "-b", str(node.bundle), "c1", GPUCTK_SERVE_TIMEOUT="1")
        assert done.returncode == 1, done.stderr
        assert f"create server (pid {mute.pid}) did not answer within 1 s" in done.stderr
        assert time.monotonic() - start < 30
    finally:
        mute.kill()
        mute.wait()


def _cwd_served(children: Path, cwd: Path) -> bool:
    """Whether one of the server's workers works in `cwd` (it moved into its front's)."""
    for pid in children.read_text().split():
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/cwd") == str(cwd):
                return True
    return False


def _blocked_create(node: Node) -> tuple[subprocess.Popen[str], Path]:
    """A create whose worker blocks writing its log line to the engine's --log, here a FIFO
    nobody reads; returns once a worker took it (it moved into the front's folder), with the
    file that lists the server's workers."""
    assert node.server is not None
    blocker = node.tmp / "log-fifo"
    os.mkfifo(blocker)
    node.ask()
    front = subprocess.Popen(
        [str(node.front), "--log", str(blocker), "create", "-b", str(node.bundle), "c1"],
        env=node.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=node.tmp,
    )  # fmt: skip
    children = Path(f"/proc/{node.server.pid}/task/{node.server.pid}/children")
    deadline = time.monotonic() + 30
    while not _cwd_served(children, node.tmp):
        assert time.monotonic() < deadline, "no worker took the request"
        time.sleep(0.05)
    return front, children


def test_a_worker_that_dies_is_answered_by_the_server(node: Node) -> None:
    """The worker blocks writing its log line to the engine's --log, here a FIFO nobody
    reads, and is killed: the server answers the front with an error instead of leaving it
    waiting."""
    node.start()
    front, children = _blocked_create(node)
    time.sleep(0.3)  # into the blocking open
    for worker in children.read_text().split():  # the busy one, and any idle one
        os.kill(int(worker), signal.SIGKILL)
    out, err = front.communicate(timeout=30)
    assert front.returncode == 1 and out == ""
    assert "create server's worker died (signal 9)" in err
    assert "killed by signal 9" in node.stop()


def test_a_create_beyond_max_workers_runs_python_at_once(node: Node) -> None:
    """--max-workers 1: while a create holds the only worker (blocked writing to a FIFO
    --log nobody reads), the next one is not queued behind it: it runs the Python shim."""
    node.start("--max-workers", "1")
    first, children = _blocked_create(node)
    second = node.run("create", "-b", str(node.bundle), "c2", GPUCTK_SERVE_TIMEOUT="30")
    assert second.returncode == 127 and NO_PYTHON in second.stderr
    assert len(children.read_text().split()) == 1  # no second worker was forked
    for worker in children.read_text().split():
        os.kill(int(worker), signal.SIGKILL)
    assert first.wait(timeout=30) == 1  # answered for its dead worker
    node.stop()


def test_one_server_per_state_folder(node: Node) -> None:
    node.start()
    second = subprocess.run(
        [*CHECKOUT_GPUCTK, "create-server", "--state-dir", str(node.state)],
        env={"PATH": node.env["PATH"], "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert second.returncode == 1
    assert f"a create server already serves {node.state} (pid {node.server.pid})" in second.stderr  # type: ignore[union-attr]


def test_an_unsafe_state_folder_is_refused(node: Node) -> None:
    node.state.chmod(0o777)
    done = subprocess.run(
        [*CHECKOUT_GPUCTK, "create-server", "--state-dir", str(node.state)],
        env={"PATH": node.env["PATH"], "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0 and "nobody else can write" in done.stderr
    assert not (node.state / serve.FIFO).exists()


def test_malformed_lines_are_dropped_and_leftovers_swept(node: Node) -> None:
    dead = node.state / "create.999999999.req"
    dead.write_text("x")
    live = node.state / f"create.{os.getpid()}.req"
    live.write_text("x")
    node.start()
    assert not dead.exists() and live.exists()
    live.unlink()
    # a well-formed line whose descriptor is a file, not the anonymous pipe a front makes:
    # never written to, even with its request file in place
    victim = node.tmp / "victim"
    victim.write_text("keep\n")
    live.write_text("x")
    with open(victim, "r+") as held, open(node.state / serve.FIFO, "w") as fifo:
        fifo.write(f"junk\n1\n{os.getpid()}\n{os.getpid()} {held.fileno()}\n")
        fifo.flush()
        node.ask()
        assert node.run("create", "-b", str(node.bundle), "c1").returncode == 0
    assert victim.read_text() == "keep\n" and not live.exists()
    err = node.stop()
    assert "ignored a malformed request line: 'junk'" in err
    assert "'1'" in err and f"'{os.getpid()}'" in err and "stopped after 1 creates" in err


def _private_kib() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1])
    raise AssertionError("no Private_Dirty in smaps_rollup")


def test_populate_copies_the_pages_a_fork_shares() -> None:
    """A forked child shares its parent's pages until it writes them; populate() makes them
    its own at once (MADV_POPULATE_WRITE), so a worker's first create takes no copy faults."""
    serve.warm()  # a heap like the server's
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            before = _private_kib()
            pages = serve.populate()
            os.write(w, f"{pages} {before} {_private_kib()}".encode())
        finally:
            os._exit(0)
    os.close(w)
    pages, before, after = (int(x) for x in os.read(r, 100).split())
    os.close(r)
    os.waitpid(child, 0)
    if pages == 0:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14+)")
    assert pages > 100 and after - before >= pages * 4 // 2, (pages, before, after)
