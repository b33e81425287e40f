"""gpuctk-runtime under load and faults, as installed: the sh front that gpuctk.install.launchers
writes, then Python, in front of REAL runc, each container on a fresh overlay of the debian
test image.

- A burst: 32 creates at once, each asking for a different GPU of a simulated 32-GPU node (even
  ones by NVIDIA_VISIBLE_DEVICES, odd ones by CDI annotation and UUID): all succeed, each
  config.json holds exactly its GPU's nodes and cgroup rules, and each container, started,
  sees exactly those nodes and opens its GPU with ENXIO (allowed, no driver behind it).
- SIGKILL of the whole create (front, Python, runc), at seeded random points and, through
  strace, at the entry of each system call that creates, fills or renames one of its files:
  config.json is then the original bytes or a complete edited document, never a partial one;
  the bundle, the state folder and the container's /etc hold only whole files under their
  own names, besides the temporary files of atomic writes; the spec is untouched. The
  engine's clean-up (`delete --force`) and a retry with the same bundle and id then succeed,
  and the container gets exactly its GPU. (That no temporary file stays outside the bundle
  is an expected failure: nothing removes one.)
- The state folder on a tiny tmpfs, full (no blocks, no inodes) or read-only (empty, missing
  under a read-only parent, holding a memo and caches): the memo and the caches are
  best-effort, so the create succeeds, with nothing on stderr and nothing above info in the
  engine's log. The bundle folder full: one clear line on stderr, config.json as it was, no
  temporary file left, no container.
- The spec replaced by rename, between two versions that differ in an env value, a mount and
  a device-level env, while 16 creates run: every create succeeds and gets one version whole.

Every loop is bounded in count and time; containers, mounts and writers are cleaned up in
finally blocks.
"""

from __future__ import annotations

import contextlib
import errno
import json
import marshal
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fixtures.burst import PATH_ENV, gpu_nodes, gpu_request, many_gpu_node, wait_exit
from fixtures.gpucheck import SCRIPT, Node, check_nodes, need_runtime
from fixtures.images import make_bundle, snapshot_tree, unique_name, unmount

from gpuctk.cdi.node.ldcache import read_ld_cache
from gpuctk.install import launchers

pytestmark = pytest.mark.integration

BURST = 32
HOST_PATH = PATH_ENV.partition("=")[2]
STATE_FILES = {"runtime", "plans", "specs.cache"}  # what the shim keeps there
PLAN_FILE = re.compile(r"^[0-9a-f]{8}\.plan$")  # in plans/: gpuctk.hook.shim.plans.file_name
WAIT = 120  # seconds any one runtime call or container may take before the test gives up
NVIDIA_MAJOR = 195


class KnownBug(AssertionError):
    """The one failure an xfail test here expects (`raises=KnownBug`): any other failure of
    such a test, in its set-up or its harness, still fails the run."""


def known_bug(holds: bool, what: object) -> None:
    if not holds:
        raise KnownBug(what)


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gpuctk-runtime as packaging installs it: gpuctk.install.launchers' sh front for this venv."""
    need_runtime("runc")
    bindir = tmp_path_factory.mktemp("launchers")
    launchers.write_launchers(str(bindir), sys.executable)
    return bindir / "gpuctk-runtime"


@pytest.fixture(scope="module")
def node32(tmp_path_factory: pytest.TempPathFactory, driver_root: Path) -> Node:
    need_runtime("runc")
    return many_gpu_node(tmp_path_factory.mktemp("node32"), driver_root, BURST)


@dataclass
class Container:
    name: str
    index: int  # the GPU it asks for
    bundle: Path
    rootfs: Path
    files: Path  # where its pid file, logs and output go (not in the bundle's folder)

    @property
    def config(self) -> Path:
        return self.bundle / "config.json"

    def file(self, what: str) -> Path:
        return self.files / f"{self.name}.{what}"


class Host:
    """One node's gpuctk-runtime: its config.toml (real runc), state folder and containers."""

    def __init__(self, tmp: Path, front: Path, node: Node, state: Path) -> None:
        self.tmp, self.front, self.node, self.state = tmp, front, node, state
        tmp.mkdir()
        self.toml = tmp / "gpuctk.toml"
        self.toml.write_text(
            f'runtimes = ["{runc_path()}"]\nspec-dirs = ["{node.spec_dir}"]\n'
            f'log-file = "{tmp}/gpuctk.log"\n'
        )
        self.env = {
            "PATH": HOST_PATH, "GPUCTK_CONFIG": str(self.toml), "GPUCTK_STATE_DIR": str(state),
        }  # fmt: skip
        self.made: list[Container] = []

    def container(self, rootfs: Path, index: int, bundle: Path | None = None) -> Container:
        """A bundle on `rootfs` (in `bundle`, default under tmp) that asks for GPU `index`
        and runs gpucheck's SCRIPT."""
        env, annotations = gpu_request(self.node, index)
        n = len(self.made)
        bundle = bundle or self.tmp / f"bundle-{n}"
        make_bundle(bundle, rootfs, ["/bin/sh", "-c", SCRIPT], env=[PATH_ENV, *env])
        if annotations:
            doc = json.loads((bundle / "config.json").read_text())
            doc["annotations"] = annotations
            (bundle / "config.json").write_text(json.dumps(doc, indent=1))
        made = Container(unique_name("gpuctk-faults"), index, bundle, rootfs, self.tmp)
        self.made.append(made)
        return made

    def create_argv(self, c: Container) -> list[str]:
        """`create` as containerd's runc shim calls it (its log, in JSON, and a pid file)."""
        return [
            str(self.front), "--log", str(c.file("log")), "--log-format", "json",
            "create", "--bundle", str(c.bundle), "--pid-file", str(c.file("pid")), c.name,
        ]  # fmt: skip

    def start_create(self, c: Container, **kw: Any) -> subprocess.Popen[bytes]:
        """The create, started: the container's stdout goes to c.file("out"), the runtime's
        stderr to c.file("err")."""
        with open(c.file("out"), "wb") as out, open(c.file("err"), "wb") as err:
            return subprocess.Popen(
                self.create_argv(c), env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=err, **kw,
            )  # fmt: skip

    def create(self, c: Container) -> subprocess.CompletedProcess[str]:
        proc = self.start_create(c)
        rc = proc.wait(timeout=WAIT)
        return subprocess.CompletedProcess(proc.args, rc, "", c.file("err").read_text())

    def verb(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Any other verb through the front, as the engine sends it."""
        return subprocess.run(
            [str(self.front), *args], env=self.env, capture_output=True, text=True,
            stdin=subprocess.DEVNULL, timeout=WAIT, check=False,
        )  # fmt: skip

    def start_and_collect(self, c: Container) -> subprocess.CompletedProcess[str]:
        """Start a created container, wait for its script, delete it; what it printed."""
        pid = int(c.file("pid").read_text())
        started = self.verb("start", c.name)
        assert started.returncode == 0, started.stderr
        assert wait_exit(pid, WAIT), f"{c.name} still running after {WAIT} s"
        deleted = self.verb("delete", c.name)
        assert deleted.returncode == 0, deleted.stderr
        return subprocess.CompletedProcess([], 0, c.file("out").read_text(), "")

    def cleanup(self) -> None:
        for c in self.made:
            subprocess.run(
                [runc_path(), "delete", "--force", c.name], capture_output=True, check=False
            )


def runc_path() -> str:
    for folder in HOST_PATH.split(":"):
        if os.access(f"{folder}/runc", os.X_OK):
            return f"{folder}/runc"
    pytest.skip("runc not installed")


@pytest.fixture
def host(tmp_path: Path, front: Path, node32: Node) -> Iterator[Callable[..., Host]]:
    """Factory: (state folder, default tmp_path/state; node, default node32) -> a Host; its
    containers are removed at teardown."""
    hosts: list[Host] = []

    def make(state: Path | None = None, node: Node = node32) -> Host:
        made = Host(tmp_path / f"host-{len(hosts)}", front, node, state or tmp_path / "state")
        hosts.append(made)
        return made

    try:
        yield make
    finally:
        for made in hosts:
            made.cleanup()


@contextlib.contextmanager
def mounted(*argv: str) -> Iterator[None]:
    """`mount ARGV...` (its last argument the mount point) for the block, lazily unmounted."""
    subprocess.run(["mount", *argv], check=True, capture_output=True)
    try:
        yield
    finally:
        unmount(Path(argv[-1]))


def gpu_rules(config: dict[str, Any]) -> set[int]:
    """The minors of NVIDIA_MAJOR that config.json's cgroup rules allow."""
    rules = config.get("linux", {}).get("resources", {}).get("devices") or []
    return {r["minor"] for r in rules if r.get("allow") and r.get("major") == NVIDIA_MAJOR}


def check_config(c: Container, node: Node, config: dict[str, Any]) -> None:
    """config.json holds exactly GPU c.index: its nodes in linux.devices, its cgroup rules."""
    expected = gpu_nodes(node, c.index)
    assert {d["path"] for d in config["linux"].get("devices") or []} == expected, c
    assert gpu_rules(config) == {c.index, 254, 255}, c
    assert "NVIDIA_VISIBLE_DEVICES=void" in config["process"]["env"]


def quiet_log(c: Container) -> None:
    """The engine's log for `c` holds no warning or error (the shim's or runc's)."""
    if not c.file("log").exists():
        return
    for line in c.file("log").read_text().splitlines():
        assert json.loads(line)["level"] in ("debug", "info"), line


def all_at_once(h: Host, containers: list[Container]) -> None:
    """Start every create before waiting for any; each must succeed."""
    procs = [h.start_create(c) for c in containers]
    codes = [p.wait(timeout=WAIT) for p in procs]
    failed = {
        c.name: c.file("err").read_text() for c, rc in zip(containers, codes, strict=True) if rc
    }
    assert not failed, failed


def test_a_burst_of_creates_each_gets_exactly_its_gpu(
    host: Callable[..., Host], node32: Node, fresh_rootfs: Callable[[str], Path]
) -> None:
    h = host()
    containers = [h.container(fresh_rootfs("debian"), i) for i in range(BURST)]
    all_at_once(h, containers)
    for c in containers:
        check_config(c, node32, json.loads(c.config.read_text()))
        quiet_log(c)
    for c in containers:
        check_nodes(h.start_and_collect(c), gpu_nodes(node32, c.index))


def test_a_burst_through_a_warm_state_folder(
    host: Callable[..., Host], node32: Node, fresh_rootfs: Callable[[str], Path]
) -> None:
    """The same with the memo and the caches in place (a node's steady state): the front
    takes the runtime from the memo and the creates share remembered plans."""
    h = host()
    time.sleep(1.1)  # the spec settles (gpuctk.cdi.specs.speccache.SETTLE_NS): the caches keep it
    for i in (0, 1):  # one of each kind of request, for the plans
        warm = h.container(fresh_rootfs("debian"), i)
        assert h.create(warm).returncode == 0
        h.verb("delete", "--force", warm.name)
    assert set(os.listdir(h.state)) >= STATE_FILES
    containers = [h.container(fresh_rootfs("debian"), i) for i in range(BURST)]
    all_at_once(h, containers)
    for c in containers:
        check_config(c, node32, json.loads(c.config.read_text()))
        quiet_log(c)
    for c in containers[:4]:
        check_nodes(h.start_and_collect(c), gpu_nodes(node32, c.index))
    assert set(os.listdir(h.state)) == STATE_FILES  # no temporary file left by a writer
    plans = os.listdir(h.state / "plans")
    assert all(PLAN_FILE.match(name) for name in plans), plans
    # each create resolved its own request (one per GPU) and kept its plan: none lost
    assert len(plan_keys(h.state)) == BURST, sorted(k[2] for k in plan_keys(h.state))


# --- SIGKILL -------------------------------------------------------------------------------

SEED = 0x5EED
TRIALS = 20
# Temporary names of the atomic writes (gpuctk.writes.atomic_write, gpuctk.rootfs): a kill between
# creating one and renaming it into place leaves it behind (test_killed_creates_leave_no_...)
FS_TMP = re.compile(r"^\.(?P<name>.+)\.[0-9a-f]{12}\.tmp$")
ROOT_TMP = re.compile(r"^\.(?P<name>.+)\.gpuctk-[0-9]+-[0-9a-f]{8}$")


def check_after_kill(h: Host, c: Container, original: bytes) -> list[str]:
    """What a killed create may leave: config.json as it was or whole and edited for exactly
    its GPU; in the bundle, the state folder and the container's /etc only whole files under
    their own names (and the temporary files of atomic writes, returned); runc's state gone
    after the engine's `delete --force`."""
    data = c.config.read_bytes()
    if data != original:
        check_config(c, h.node, json.loads(data))
    temps = []
    for name in os.listdir(c.bundle):
        if name != "config.json":
            match = FS_TMP.match(name)
            assert match and match["name"] == "config.json", name
            temps.append(f"bundle/{name}")
    for name in os.listdir(h.state) if h.state.exists() else ():
        if name not in STATE_FILES:
            match = FS_TMP.match(name)
            assert match and match["name"] in STATE_FILES, name
            temps.append(f"state/{name}")
    plans = h.state / "plans"
    for name in os.listdir(plans) if plans.exists() else ():
        if not PLAN_FILE.match(name):
            match = FS_TMP.match(name)
            assert match and PLAN_FILE.match(match["name"]), name
            temps.append(f"state/plans/{name}")
    etc = c.rootfs / "etc"
    read_ld_cache(str(etc / "ld.so.cache"))  # whole: parses (ValueError otherwise)
    conf = etc / "ld.so.conf.d" / "00-gpuctk.conf"
    if conf.exists():
        lines = conf.read_text().splitlines(keepends=True)
        assert lines[0].startswith("#") and all(
            line.startswith("/") and line.endswith("\n") for line in lines[1:]
        ), lines
    for folder, whole in ((etc, "ld.so.cache"), (etc / "ld.so.conf.d", "00-gpuctk.conf")):
        for name in os.listdir(folder):
            match = ROOT_TMP.match(name)
            if match:
                assert match["name"] == whole, name
                temps.append(f"rootfs/{folder.relative_to(c.rootfs)}/{name}")
    deleted = h.verb("delete", "--force", c.name)  # the engine's clean-up of a failed create
    assert deleted.returncode == 0, deleted.stderr
    state = Path("/run/runc", c.name)
    if state.exists():  # runc 1.1 killed before it recorded the container leaves its state
        # folder, with the read-only bind mount of its own binary it makes there
        # (`runc.XXXXXX`), and `delete --force` then finds no container to delete: the engine
        # unmounts and removes them
        assert not (state / "state.json").exists(), sorted(os.listdir(state))
        for name in os.listdir(state):
            subprocess.run(["umount", "-l", str(state / name)], capture_output=True, check=False)
        shutil.rmtree(state)
    pid = c.file("pid")  # runc writes it through `.NAME` (O_EXCL), left if runc was killed
    with contextlib.suppress(FileNotFoundError):
        pid.with_name(f".{pid.name}").unlink()
    return temps


def retry(h: Host, c: Container) -> None:
    """The engine's retry: the same bundle and id, which must get exactly GPU c.index."""
    done = h.create(c)
    assert done.returncode == 0, done.stderr
    config = json.loads(c.config.read_text())
    check_config(c, h.node, config)
    destinations = [m["destination"] for m in config["mounts"]]
    assert len(destinations) == len(set(destinations)), destinations
    check_nodes(h.start_and_collect(c), gpu_nodes(h.node, c.index))
    entries = [(e.key, e.value) for e in read_ld_cache(str(c.rootfs / "etc/ld.so.cache"))]
    assert len(entries) == len(set(entries)), "an ld cache entry twice"


def killed(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the create's whole process group (front, Python, runc, runc init)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=WAIT)


def test_sigkill_at_random_points_of_a_create(
    host: Callable[..., Host], fresh_rootfs: Callable[[str], Path]
) -> None:
    h = host()
    spec = snapshot_tree(h.node.spec_dir)
    span = 0.0  # how long a create takes here, from two that are not killed
    for i in (0, 1):
        c = h.container(fresh_rootfs("debian"), i)
        begin = time.monotonic()
        assert h.create(c).returncode == 0
        span = max(span, time.monotonic() - begin)
        h.verb("delete", "--force", c.name)
    rng = random.Random(SEED)
    for trial in range(TRIALS):
        c = h.container(fresh_rootfs("debian"), 2 + trial)
        original = c.config.read_bytes()
        proc = h.start_create(c, start_new_session=True)
        time.sleep(rng.uniform(0, min(span, 10) * 1.2))
        killed(proc)
        check_after_kill(h, c, original)
        retry(h, c)
    assert snapshot_tree(h.node.spec_dir) == spec


def strace() -> str:
    for folder in HOST_PATH.split(":"):
        if os.access(f"{folder}/strace", os.X_OK):
            return f"{folder}/strace"
    pytest.skip("strace not installed (it places the kills at given system calls)")


def settled(path: Path) -> None:
    """Until `path` and its entries were left alone for gpuctk.cdi.specs.speccache.SETTLE_NS (then
    the shim writes its spec and plan caches too)."""
    newest = max(p.stat().st_ctime for p in (path, *path.iterdir()))
    time.sleep(max(0.0, newest + 1.1 - time.time()))


WRITE_CALLS = "rename,renameat,renameat2,fchmod,execve"


def traced_create(h: Host, c: Container, tracer: str, inject: str = "") -> int:
    """The create of `c` under strace (its own pid only: the front, Python, then runc's main
    thread), the calls of WRITE_CALLS listed in c.file("trace"), `inject` applied."""
    argv = [tracer, "-qq", "-o", str(c.file("trace")), "-e", f"trace={WRITE_CALLS}"]
    if inject:
        argv += ["-e", inject]
    with open(c.file("err"), "wb") as err:
        proc = subprocess.Popen(
            [*argv, *h.create_argv(c)], env=h.env, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
        )  # fmt: skip
    try:
        return proc.wait(timeout=WAIT)
    finally:
        killed(proc)


def kill_points(h: Host, c: Container, tracer: str) -> list[tuple[str, int]]:
    """Where a create of `c` (a fresh state folder) changes files, from a traced run: each
    (system call, its ordinal among calls of that name, as strace's `when=` counts) of
    WRITE_CALLS up to the exec of runc. Killed on entry of one, the call does not happen:
    at an fchmod, an atomic write's temporary file was just created; at a rename, it is
    complete and not yet in place; at the exec of runc, every write is done."""
    assert traced_create(h, c, tracer) == 0, c.file("err").read_text()
    h.verb("delete", "--force", c.name)
    seen = {"execve": -1}  # strace lists its own exec of the front but does not count it
    points = []
    for line in c.file("trace").read_text().splitlines():
        call = line.partition("(")[0]
        if call not in WRITE_CALLS.split(","):
            continue
        seen[call] = seen.get(call, 0) + 1
        if call != "execve" or f'"{runc_path()}"' in line:
            points.append((call, seen[call]))
        if call == "execve" and f'"{runc_path()}"' in line:
            return points
    raise AssertionError(f"no exec of runc in {c.file('trace')}")


def test_sigkill_at_each_write_of_a_create(
    host: Callable[..., Host], fresh_rootfs: Callable[[str], Path], tmp_path: Path
) -> None:
    """Deterministic points: with an empty state folder and a settled spec, a create writes
    the memo, the spec and plan caches, the container's ld.so.conf.d file and ld cache, and
    config.json; it is killed as each is created and as each is about to be renamed."""
    tracer = strace()
    settled(Path(host().node.spec_dir))
    first = host(tmp_path / "state-first")
    points = kill_points(first, first.container(fresh_rootfs("debian"), 0), tracer)
    assert 'config.json")' in first.made[0].file("trace").read_text(), "no edit traced"
    for n, (call, when) in enumerate(points):
        h = host(tmp_path / f"state-{n}")
        c = h.container(fresh_rootfs("debian"), 1 + n)
        original = c.config.read_bytes()
        status = traced_create(h, c, tracer, f"inject={call}:signal=KILL:when={when}")
        assert status == -signal.SIGKILL, (call, when, c.file("err").read_text())
        check_after_kill(h, c, original)
        retry(h, c)


def test_killed_creates_leave_no_temporary_file_outside_the_bundle(
    host: Callable[..., Host], fresh_rootfs: Callable[[str], Path], tmp_path: Path
) -> None:
    tracer = strace()
    settled(Path(host().node.spec_dir))
    first = host(tmp_path / "state-first")
    points = kill_points(first, first.container(fresh_rootfs("debian"), 0), tracer)
    left = []
    for n, (call, when) in enumerate(p for p in points if p[0].startswith("rename")):
        h = host(tmp_path / f"state-{n}")
        c = h.container(fresh_rootfs("debian"), 1 + n)
        original = c.config.read_bytes()
        traced_create(h, c, tracer, f"inject={call}:signal=KILL:when={when}")
        check_after_kill(h, c, original)
        assert h.create(c).returncode == 0  # the retry: it could clear what the kill left
        left += [t for t in check_after_kill(h, c, c.config.read_bytes()) if t[:7] != "bundle/"]
    known_bug(not left, left)


def text_of(path: Path) -> str:
    """The text of `path`, "" while it is not there yet."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def plan_keys(state: Path) -> set[Any]:
    """The requests whose plans the state folder holds (gpuctk.hook.shim.plans: plans/, a file
    each)."""
    folder = state / "plans"
    return {
        marshal.loads((folder / name).read_bytes())["key"]
        for name in os.listdir(folder)
        if PLAN_FILE.match(name)
    }


def test_overlapping_creates_keep_each_others_plans(
    host: Callable[..., Host], fresh_rootfs: Callable[[str], Path], tmp_path: Path
) -> None:
    """Deterministic: create A stops (SIGSTOP through strace) just after creating the
    temporary file of its plan, create B runs to its end, then A goes on; both plans are
    kept (one file per request: neither write replaces the other's)."""
    tracer = strace()
    h = host()
    settled(Path(h.node.spec_dir))
    warm = h.container(fresh_rootfs("debian"), 30)  # the memo, the spec cache, one plan
    assert h.create(warm).returncode == 0
    probe = h.container(fresh_rootfs("debian"), 28)
    assert traced_create(h, probe, tracer) == 0
    fchmods = 0
    for line in probe.file("trace").read_text().splitlines():
        fchmods += line.startswith("fchmod(")
        if re.search(r'[0-9a-f]{8}\.plan"', line):  # the rename of its plan into place
            break
    else:
        raise AssertionError("the probe wrote no plan")
    before = plan_keys(h.state)
    a, b = h.container(fresh_rootfs("debian"), 2), h.container(fresh_rootfs("debian"), 4)
    argv = [tracer, "-qq", "-o", str(a.file("trace")), "-e", f"trace={WRITE_CALLS}"]
    argv += ["-e", f"inject=fchmod:signal=STOP:when={fchmods}", *h.create_argv(a)]
    proc = subprocess.Popen(
        argv, env=h.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + WAIT
        # strace's line for the stop itself (a tracee shows "t" at every system call)
        while "--- stopped by SIGSTOP ---" not in text_of(a.file("trace")):
            assert proc.poll() is None and time.monotonic() < deadline, "A never stopped"
            time.sleep(0.01)
        tracee = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text())
        assert h.create(b).returncode == 0
        os.kill(tracee, signal.SIGCONT)
        assert proc.wait(timeout=WAIT) == 0
    finally:
        killed(proc)
    new = plan_keys(h.state) - before
    assert len(new) == 2, f"of the plans of A and B, only {new} in plans/"


# --- a full or read-only state folder, a full bundle folder ---------------------------------

FILL_LIMIT = 4096  # at most this many writes or files to fill a tiny tmpfs


def fill_blocks(folder: Path) -> None:
    """Write `folder`/filler until the file system has no block left."""
    with open(folder / "filler", "wb", buffering=0) as f:
        for _ in range(FILL_LIMIT):
            try:
                f.write(b"\0" * 65536)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                break
        else:
            raise AssertionError(f"{folder} did not fill up")
    for size in (4096, 1):  # the tail of the last page
        with contextlib.suppress(OSError), open(folder / "filler", "ab", buffering=0) as f:
            while f.write(b"\0" * size):
                pass


def fill_inodes(folder: Path) -> None:
    """Create empty files in `folder` until the file system has no inode left."""
    for n in range(FILL_LIMIT):
        try:
            (folder / f"f{n}").touch()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
            return
    raise AssertionError(f"{folder} did not run out of inodes")


TINY = "size=1m,nr_inodes=64,mode=0700"
STATE_CASES = ["no blocks", "no inodes", "read-only", "missing under read-only", "read-only warm"]


@pytest.mark.parametrize("case", STATE_CASES)
def test_a_full_or_read_only_state_folder_does_not_fail_a_create(
    case: str, host: Callable[..., Host], fresh_rootfs: Callable[[str], Path], tmp_path: Path
) -> None:
    """The memo and the caches are best-effort: the create succeeds, says nothing (stderr,
    the engine's log above info) and leaves no temporary file; the verbs after it too."""
    fs = tmp_path / "state-fs"
    fs.mkdir()
    with mounted("-t", "tmpfs", "-o", TINY, "gpuctk-test-state", str(fs)):
        state = fs / "state" if case == "missing under read-only" else fs
        h = host(state)
        if case == "no blocks":
            fill_blocks(fs)
        elif case == "no inodes":
            fill_inodes(fs)
        elif case == "read-only warm":
            settled(Path(h.node.spec_dir))
            warm = h.container(fresh_rootfs("debian"), 0)
            assert h.create(warm).returncode == 0
            h.verb("delete", "--force", warm.name)
            assert set(os.listdir(fs)) >= STATE_FILES, os.listdir(fs)
        if case.startswith(("read-only", "missing")):
            subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
        before = sorted(os.listdir(fs))
        c = h.container(fresh_rootfs("debian"), 3)
        done = h.create(c)
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""
        quiet_log(c)
        check_config(c, h.node, json.loads(c.config.read_text()))
        check_nodes(h.start_and_collect(c), gpu_nodes(h.node, 3))
        after = sorted(os.listdir(fs))
        assert after == before or set(after) - set(before) <= STATE_FILES, (before, after)
        if case.startswith("no "):
            assert "runtime" not in after  # the memo's write did fail


@pytest.mark.parametrize(
    "fill",
    [
        fill_blocks,
        fill_inodes,
    ],
    ids=["no blocks", "no inodes"],
)
def test_a_full_bundle_folder_fails_the_create_in_one_clear_line(
    fill: Callable[[Path], None],
    host: Callable[..., Host],
    fresh_rootfs: Callable[[str], Path],
    tmp_path: Path,
) -> None:
    fs = tmp_path / "bundle-fs"
    fs.mkdir()
    with mounted("-t", "tmpfs", "-o", TINY, "gpuctk-test-bundle", str(fs)):
        h = host()
        c = h.container(fresh_rootfs("debian"), 5, bundle=fs / "bundle")
        original = c.config.read_bytes()
        fill(fs)
        done = h.create(c)
        assert done.returncode == 1
        lines = done.stderr.splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith(f"gpuctk-runtime: cannot write {c.config}: "), lines
        assert "no space left on device" in lines[0].lower(), lines
        assert c.config.read_bytes() == original
        assert os.listdir(c.bundle) == ["config.json"]
        state = subprocess.run([runc_path(), "state", c.name], capture_output=True, check=False)
        assert state.returncode != 0  # no container
        errors = [json.loads(x) for x in c.file("log").read_text().splitlines()]
        assert [e["msg"] for e in errors if e["level"] == "error"] == [lines[0]]
        known_bug(lines[0].endswith(": no space left on device"), lines[0])


# --- the spec replaced while creates run --------------------------------------------------

WAVES = 2
WAVE = 16
MAX_REWRITES = 5000
SETTLE_EVERY = 41  # rewrites (odd: each version in turn), then a pause for the caches to take it


def spec_version(spec: dict[str, Any], tag: str, host_file: Path) -> bytes:
    """`spec` with an env value, a mount and a device-level env of version `tag` (one
    character: both versions have the same size, so only the identity tells them apart)."""
    doc = json.loads(json.dumps(spec))
    edits = doc["containerEdits"]
    edits["env"] = [*edits.get("env", []), f"GPUCTK_TEST_SPEC=version-{tag}"]
    edits["mounts"] = [
        *edits.get("mounts", []),
        {"hostPath": str(host_file), "containerPath": f"/opt/spec-{tag}",
         "options": ["ro", "nosuid", "nodev", "bind"]},
    ]  # fmt: skip
    for device in doc["devices"]:
        device_edits = device["containerEdits"]
        device_edits["env"] = [*device_edits.get("env", []), f"GPUCTK_TEST_DEVICE=version-{tag}"]
    return json.dumps(doc, indent=1).encode()


def version_of(config: dict[str, Any]) -> str:
    """The one spec version config.json got (AssertionError for a mix)."""
    env: list[str] = config["process"]["env"]
    spec = [e.rpartition("-")[2] for e in env if e.startswith("GPUCTK_TEST_SPEC=")]
    device = [e.rpartition("-")[2] for e in env if e.startswith("GPUCTK_TEST_DEVICE=")]
    mounts = [m["destination"][-1] for m in config["mounts"] if m["destination"][:9] == "/opt/spec"]
    assert len(spec) == 1 and spec == device == mounts, (spec, device, mounts)
    return spec[0]


def test_the_spec_replaced_during_creates(
    host: Callable[..., Host], node32: Node, fresh_rootfs: Callable[[str], Path], tmp_path: Path
) -> None:
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    versions = []
    for tag in "ab":
        (tmp_path / f"spec-{tag}").write_text(f"{tag}\n")
        versions.append(spec_version(node32.spec, tag, tmp_path / f"spec-{tag}"))
    assert len(versions[0]) == len(versions[1])
    target = spec_dir / "nvidia.json"
    target.write_bytes(versions[0])
    h = host(node=Node(spec_dir, node32.spec))
    settled(spec_dir)
    warm = h.container(fresh_rootfs("debian"), 0)  # the caches hold version a
    assert h.create(warm).returncode == 0
    assert version_of(json.loads(warm.config.read_text())) == "a"
    h.verb("delete", "--force", warm.name)

    stop = threading.Event()
    rewrites = 0
    failure: list[BaseException] = []

    def writer() -> None:
        nonlocal rewrites
        rng = random.Random(SEED)
        try:
            while not stop.is_set() and rewrites < MAX_REWRITES:
                rewrites += 1
                tmp = spec_dir / f".nvidia.json.{rewrites}.tmp"
                tmp.write_bytes(versions[rewrites % 2])
                os.rename(tmp, target)
                stop.wait(1.2 if rewrites % SETTLE_EVERY == 0 else rng.uniform(0, 0.01))
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=writer, name="spec-writer", daemon=True)
    seen: dict[str, int] = {}
    try:
        thread.start()
        for _ in range(WAVES):
            containers = [h.container(fresh_rootfs("debian"), i) for i in range(WAVE)]
            all_at_once(h, containers)
            for c in containers:
                config = json.loads(c.config.read_text())
                check_config(c, h.node, config)
                version = version_of(config)
                seen[version] = seen.get(version, 0) + 1
                h.verb("delete", "--force", c.name)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not failure, failure
    assert rewrites > 0 and sum(seen.values()) == WAVES * WAVE, (rewrites, seen)
