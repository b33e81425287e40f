"""gpuctk-runtime's front (gpuctk.install.launchers.runtime_front_text, which execs
`gpuctk-cdi-hook runtime-front`: hook/shimfront.c) and its memo
(gpuctk.hook.shim.memo.remember_runtime): every verb but create/run goes straight to the
runtime in the memo, and only while the memo is still true; so does a create or run whose
config.json cannot be asking for a GPU; the rest reaches Python.

Two fake low-level runtimes tell who ran: the config names A, a memo written by hand names B.
The front running B proves it read the memo (Python would resolve A from the config)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures.images import go_json

from gpuctk.hook import compiled
from gpuctk.hook.shim.memo import MEMO_TAG, remember_runtime
from gpuctk.install import launchers

PROGRAM = compiled.installed()  # tests/run.sh builds it beside the interpreter


class Node:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.state = tmp_path / "state"
        self.state.mkdir(mode=0o700)
        self.runtimes = {}
        for name in ("A", "B"):
            path = tmp_path / f"runtime-{name}"
            path.write_text(f'#!/bin/sh\necho "{name} $*"\n')
            path.chmod(0o755)
            self.runtimes[name] = path
        self.config = tmp_path / "config.toml"
        self.log = tmp_path / "gpuctk.log"  # Python's create logs at debug level: it ran
        self.config.write_text(
            f'runtimes = ["{self.runtimes["A"]}"]\nlog-file = "{self.log}"\nlog-level = "debug"\n'
        )
        self.front = tmp_path / "gpuctk-runtime"
        assert PROGRAM, "no gpuctk-cdi-hook: build it (tests/run.sh does)"
        self.front.write_text(launchers.runtime_front_text(sys.executable, PROGRAM))
        self.front.chmod(0o755)
        self.env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "GPUCTK_CONFIG": str(self.config),
            "GPUCTK_STATE_DIR": str(self.state),
        }
        self.memo = self.state / "runtime"

    def write_memo(self, runtime: str = "", **changes: str) -> None:
        lines = {
            "tag": MEMO_TAG,
            "conf": str(self.config),
            "state": "present",
            "runtime": runtime or str(self.runtimes["B"]),
            "create": "create-python",
        }
        lines.update(changes)
        self.memo.write_text("".join(f"{v}\n" for v in lines.values()))
        future = time.time() + 5  # newer than the config, whatever the clock granularity
        os.utime(self.memo, (future, future))

    def pin_memo(self) -> None:
        """Set the memo's time to the last change of the files it vouches for (equal: it
        holds), and let the clock move on, so that a change made after this call is one the
        front sees (a file's ctime past the memo's mtime; nobody can set a ctime back)."""
        paths = [self.config, *self.runtimes.values()]
        last = max(os.stat(p).st_ctime_ns for p in paths)
        os.utime(self.memo, ns=(last, last))
        time.sleep(0.05)  # past the kernel's coarse timestamp tick

    def python_ran(self) -> bool:
        """Whether Python logged anything since the last call (it logs every create)."""
        ran = self.log.exists() and self.log.read_text() != ""
        self.log.write_text("")
        return ran

    def run(self, *args: str, cwd: Path | None = None, **env: str) -> str:
        done = subprocess.run(
            [str(self.front), *args], env={**self.env, **env}, cwd=cwd,
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if done.returncode != 0 and "gpuctk-runtime: " in done.stderr:
            return "Python"  # Python ran, and refused the request (no spec dirs here)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()[0]  # which runtime ran


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


@pytest.mark.parametrize(
    "args",
    [
        ["state", "c1"],
        ["delete", "--force", "c1"],
        ["--root", "/run/x", "kill", "c1", "KILL"],
        ["--log", "create", "start", "c1"],  # "create" is --log's value
        ["-log-format", "json", "start", "c1"],
        ["--log=/tmp/l", "--debug", "start", "c1"],
        ["--", "start", "c1"],
        ["features"],
        ["start", "create"],  # a container named "create"
    ],
)
def test_other_verbs_go_to_the_memo_runtime_without_python(node: Node, args: list[str]) -> None:
    node.write_memo()
    assert node.run(*args) == "B"


CREATE_FORMS = [
    ["create", "--bundle", "{bundle}", "c1"],
    ["--log", "/tmp/l", "create", "-b", "{bundle}", "c1"],
    ["--log=/tmp/l", "run", "--bundle={bundle}", "c1"],
    ["--systemd-cgroup", "--", "create", "--bundle", "{bundle}", "c1"],
]


@pytest.mark.parametrize("args", CREATE_FORMS)
def test_create_and_run_start_python_which_takes_the_runtime_from_the_front(
    node: Node, args: list[str]
) -> None:
    bundle = node.tmp / "bundle"  # asks for no GPU: Python's create leaves it as it is
    bundle.mkdir()
    (bundle / "config.json").write_text('{"ociVersion": "1.0.2", "process": {"env": []}}')
    node.write_memo()
    node.python_ran()
    # the memo holds, so the front hands its runtime (B) to Python, which does not resolve
    # the config's (A) again: the verbs after this create go to B too
    assert node.run(*(a.replace("{bundle}", str(bundle)) for a in args)) == "B"
    assert node.python_ran()


def test_unreadable_arguments_start_python(node: Node) -> None:
    node.write_memo()
    # no verb at all: Python prints its version line, then resolves and execs the runtime
    done = subprocess.run(
        [str(node.front), "--version"], env=node.env, capture_output=True, text=True, check=False
    )
    lines = done.stdout.splitlines()
    assert lines[0].startswith("gpuctk-runtime version "), done.stderr
    assert lines[1].split()[0] == "A"


def test_the_front_runtime_reaches_python_only_from_the_front(node: Node) -> None:
    bundle = node.tmp / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text('{"ociVersion": "1.0.2", "process": {"env": []}}')
    show = node.tmp / "runtime-C"  # what a runtime exec'd by Python sees of the variable
    show.write_text('#!/bin/sh\necho "C ${GPUCTK_FRONT_RUNTIME-unset}"\n')
    show.chmod(0o755)
    node.write_memo(runtime=str(show))
    out = subprocess.run(
        [str(node.front), "create", "--bundle", str(bundle), "c1"], env=node.env,
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert out.split() == ["C", "unset"]  # used, then removed before the runtime ran
    node.write_memo(conf="/elsewhere")  # the memo does not hold: the engine's value is dropped
    create = ["create", "--bundle", str(bundle), "c1"]
    assert node.run(*create, GPUCTK_FRONT_RUNTIME=str(node.runtimes["B"])) == "A"


@pytest.mark.parametrize(
    "stale",
    [
        {"tag": "gpuctk-runtime memo 0"},
        {"conf": "/etc/other.toml"},
        {"state": "absent"},
        {"runtime": "/nonexistent/runc"},
    ],
)
def test_a_memo_that_no_longer_holds_is_ignored(node: Node, stale: dict[str, str]) -> None:
    node.write_memo(**stale)
    assert node.run("state", "c1") == "A"


def test_a_memo_in_a_folder_others_may_write_is_never_used(node: Node) -> None:
    node.write_memo()
    assert node.run("state", "c1") == "B"
    node.state.chmod(0o770)  # the group could swap the memo: not the rule Python wrote it by
    assert node.run("state", "c1") == "A"


def test_without_the_compiled_front_python_serves_every_call(node: Node) -> None:
    node.write_memo()
    node.front.write_text(launchers.runtime_front_text(sys.executable))
    assert node.run("state", "c1") == "A"  # the memo's B is the compiled front's alone
    node.write_memo()  # (Python wrote its own, naming A)
    moved = node.tmp / "moved-hook"
    moved.symlink_to(PROGRAM)
    node.front.write_text(launchers.runtime_front_text(sys.executable, str(moved)))
    assert node.run("state", "c1") == "B"
    moved.unlink()  # removed after the install: Python, not a failure
    node.write_memo()
    assert node.run("state", "c1") == "A"


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["state", "c1"], "runtime: not a create"),
        (["create", "--bundle", "{bundle}", "c1"], "runtime: no request marker"),
        (["run", "--bundle", "{bundle}", "c1"], "runtime: no request marker"),
        (["--version"], "python: no verb"),
        (["run", "-b{bundle}", "c1"], "python: a run"),
    ],
)
def test_the_front_says_why_under_its_trace(node: Node, args: list[str], why: str) -> None:
    bundle = _bundle(node, NO_GPU)
    node.write_memo(create=MARKERS)
    done = subprocess.run(
        [str(node.front), *(a.replace("{bundle}", str(bundle)) for a in args)],
        env={**node.env, "GPUCTK_SHIM_FRONT_TRACE": "1"}, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert done.stderr.splitlines()[0] == f"gpuctk-runtime: front: {why}", done.stderr


def test_python_rewrites_the_memo_and_the_front_then_uses_it(node: Node) -> None:
    assert not node.memo.exists()
    assert node.run("state", "c1") == "A"  # no memo yet: Python, which writes one
    lines = node.memo.read_text().splitlines()
    assert lines == [
        MEMO_TAG, str(node.config), "present",
        str(node.runtimes["A"]), "create-search\tNVIDIA_VISIBLE_DEVICES\tcdi.k8s.io/",
    ]  # fmt: skip
    node.runtimes["A"].chmod(0o644)  # the memo's runtime is no longer executable ...
    node.config.write_text(f'runtimes = ["{node.runtimes["A"]}", "{node.runtimes["B"]}"]\n')
    assert node.run("state", "c1") == "B"  # ... so Python resolves again: B
    assert node.memo.read_text().splitlines()[3] == str(node.runtimes["B"])


def test_a_config_changed_after_the_memo_takes_effect_at_once(node: Node) -> None:
    node.write_memo()
    node.pin_memo()
    assert node.run("state", "c1") == "B"
    node.config.write_text(node.config.read_text())  # edited after the memo was written
    assert node.run("state", "c1") == "A"


def test_a_config_copied_in_with_its_old_mtime_takes_effect_at_once(node: Node) -> None:
    """rsync -a, cp -p and tar keep a file's mtime: a config put in place after the memo with
    an mtime older than the memo's is still a change (its ctime is now)."""
    node.write_memo()
    node.pin_memo()
    assert node.run("state", "c1") == "B"
    old = node.config.stat().st_mtime_ns - 10**10
    node.config.write_text(node.config.read_text() + 'annotation-prefixes = ["gpu.example/"]\n')
    os.utime(node.config, ns=(old, old))
    assert node.config.stat().st_mtime_ns < node.memo.stat().st_mtime_ns
    assert node.run("state", "c1") == "A"  # Python, which writes the memo for this config
    assert node.memo.read_text().splitlines()[4].endswith("\tgpu.example/")


def test_a_missing_config_is_not_the_config_the_memo_saw(node: Node) -> None:
    node.write_memo()
    node.config.unlink()
    done = subprocess.run(
        [str(node.front), "state", "c1"], env=node.env, capture_output=True, text=True, check=False
    )
    assert "B" not in done.stdout  # Python: GPUCTK_CONFIG names a missing file
    assert "no such file" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_config_link_switched_to_an_older_file_takes_effect_at_once(node: Node) -> None:
    """`ln -sfn other.toml config.toml`: the file it now names is older than the memo, the
    link is not (its own ctime is its making)."""
    other = node.tmp / "other.toml"
    other.write_text(f'runtimes = ["{node.runtimes["A"]}"]\nannotation-prefixes = ["x.io/"]\n')
    real = node.tmp / "real.toml"
    node.config.rename(real)
    node.config.symlink_to(real)
    node.write_memo()
    node.pin_memo()
    assert node.run("state", "c1") == "B"
    node.config.unlink()
    node.config.symlink_to(other)
    assert os.stat(node.config).st_ctime_ns <= node.memo.stat().st_mtime_ns  # older, as named
    assert node.run("state", "c1") == "A"
    assert node.memo.read_text().splitlines()[4].endswith("\tx.io/")  # the new file's


def test_no_memo_is_written_for_a_config_changed_since_it_was_read(tmp_path: Path) -> None:
    """A config rewritten while Python's create ran: a memo written after the change, from
    what was read before it, would hold past the change."""
    from gpuctk.hook.config import load

    conf = tmp_path / "config.toml"
    conf.write_text('runtimes = ["/usr/bin/runc"]\n')
    env = {"PATH": "/bin", "GPUCTK_CONFIG": str(conf), "GPUCTK_STATE_DIR": str(tmp_path / "s")}
    settings = load(env)
    conf.write_text('runtimes = ["/usr/bin/crun"]\n')  # after the read
    assert not remember_runtime("/usr/bin/runc", env, settings=settings)
    assert not (tmp_path / "s" / "runtime").exists()
    assert remember_runtime("/usr/bin/crun", env, settings=load(env))  # read again: written
    assert (tmp_path / "s" / "runtime").read_text().splitlines()[3] == "/usr/bin/crun"


def test_a_memo_owned_by_someone_else_is_never_used(node: Node) -> None:
    node.write_memo()
    os.chown(node.memo, 65534, 65534)
    assert node.run("state", "c1") == "A"


def _age(*paths: Path, seconds: float) -> None:
    """Set the mtime of `paths` `seconds` back: written that long ago."""
    then = time.time() - seconds
    for path in paths:
        os.utime(path, (then, then), follow_symlinks=False)


def test_a_memo_runtime_written_after_the_memo_is_not_run(node: Node) -> None:
    """Nobody can set a file's ctime back: a write to the runtime after the memo (by someone
    who may write it, or a package upgrade) leaves it changed after the memo, and the front
    no longer runs it."""
    node.write_memo()
    node.pin_memo()  # the memo was written ...
    assert node.run("state", "c1") == "B"
    node.runtimes["B"].write_text('#!/bin/sh\necho "B-rewritten $*"\n')  # ... B since
    assert node.run("state", "c1") == "A"
    assert node.run("create", "--bundle", str(_bundle(node, NO_GPU)), "c1") == "A"


def test_a_memo_runtime_that_is_a_symlink_is_not_run_by_the_front(node: Node) -> None:
    link = node.tmp / "runtime-link"
    link.symlink_to(node.runtimes["B"])
    node.write_memo(runtime=str(link))
    assert node.run("state", "c1") == "A"


def test_a_memo_runtime_in_a_folder_others_may_write_is_not_run(node: Node) -> None:
    """A folder made writable by others after the memo (its runtime unchanged, so its ctime
    tells nothing): someone could swap the runtime between the front's check and its exec."""
    folder = node.tmp / "rt"
    folder.mkdir(mode=0o755)
    runtime = folder / "runtime-B"
    runtime.write_text(node.runtimes["B"].read_text())
    runtime.chmod(0o755)
    node.write_memo(runtime=str(runtime))
    assert node.run("state", "c1") == "B"
    node.write_memo(runtime=str(runtime))
    folder.chmod(0o775)
    assert node.run("state", "c1") == "A"
    node.write_memo(runtime=str(runtime))
    folder.chmod(0o1777)  # sticky: nobody else may replace root's file in it
    assert node.run("state", "c1") == "B"


def test_a_memo_that_is_a_symlink_is_not_read(node: Node) -> None:
    node.write_memo()
    elsewhere = node.tmp / "memo-elsewhere"
    node.memo.rename(elsewhere)
    node.memo.symlink_to(elsewhere)
    assert node.run("state", "c1") == "A"


def test_a_memo_runtime_python_refuses_is_forgotten(node: Node) -> None:
    """The front hands a create its memo runtime; Python finds it writable by others now: the
    memo goes, so that the verbs after the create do not run it either."""
    node.config.write_text(f'runtimes = ["{node.runtimes["B"]}"]\n')
    node.write_memo()
    node.runtimes["B"].chmod(0o775)  # before the memo's time (ahead): the front's tests hold
    assert node.run("create", "--bundle", str(_bundle(node, NO_GPU)), "c1") == "Python"
    assert not node.memo.exists()
    assert node.run("state", "c1") == "Python"  # not B: Python, which refuses it again


def test_python_rewrites_a_memo_older_than_the_config(node: Node) -> None:
    """A config edit that changes nothing in the memo still makes the memo older than the
    config: Python writes it again, or the front would start Python for every verb."""
    assert node.run("state", "c1") == "A"  # Python writes the memo
    _age(node.memo, seconds=10)
    assert node.run("state", "c1") == "A"  # the config is newer: Python, which rewrites it
    assert node.memo.stat().st_mtime_ns >= node.config.stat().st_mtime_ns


# --- create without Python when config.json asks for no GPU -------------------------------

MARKERS = "create-search\tNVIDIA_VISIBLE_DEVICES\tcdi.k8s.io/"
NO_GPU = {"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin", "HOME=/root"]},
          "annotations": {"io.kubernetes.cri.sandbox-id": "x"}}  # fmt: skip


def _bundle(node: Node, doc: dict[str, object] | str, name: str = "bundle") -> Path:
    bundle = node.tmp / name
    bundle.mkdir(exist_ok=True)
    text = doc if isinstance(doc, str) else json.dumps(doc)
    (bundle / "config.json").write_text(text)
    return bundle


@pytest.mark.parametrize(
    "args",
    [
        *CREATE_FORMS,
        ["create", "--pid-file", "/run/p", "-bundle", "{bundle}", "--console-socket", "/s", "c1"],
        ["create", "--bundle", "/elsewhere", "--bundle", "{bundle}", "c1"],  # the last one wins
        ["create", "--no-pivot", "c1", "--bundle", "{bundle}"],  # flags after the id
        ["create", "c1"],  # no --bundle: the current folder, as runc
        ["create", "--bundle=", "c1"],  # an empty one: the current folder too
    ],
)
def test_a_create_that_asks_for_no_gpu_skips_python(node: Node, args: list[str]) -> None:
    bundle = _bundle(node, NO_GPU)
    node.write_memo(create=MARKERS)
    node.python_ran()
    assert node.run(*(a.replace("{bundle}", str(bundle)) for a in args), cwd=bundle) == "B"
    assert not node.python_ran()  # B from the front itself, not from Python


GO_ASKS = go_json({**NO_GPU, "process": {"env": ["NVIDIA_VISIBLE_DEVICES=0", "X=a&&b"]}}).decode()


def test_gos_escapes_alone_do_not_start_python(node: Node) -> None:
    """Go's JSON (every engine's) writes <, > and & as \\u003c, \\u003e and \\u0026: a shell
    command's && or >, a CUDA image's NVIDIA_REQUIRE_CUDA. No marker holds one of them, so a
    create whose only escapes they are goes straight to the runtime."""
    env = ["PATH=/bin", "NVIDIA_REQUIRE_CUDA=cuda>=12.2", "COMMAND=make && ./run > out.log <x"]
    text = go_json({**NO_GPU, "process": {"args": ["sh", "-c", "a && b"], "env": env}}).decode()
    assert all(e in text for e in ("\\u003c", "\\u003e", "\\u0026"))
    bundle = _bundle(node, text)
    node.write_memo(create=MARKERS)
    node.python_ran()
    assert node.run("create", "--bundle", str(bundle), "c1") == "B"
    assert not node.python_ran()


@pytest.mark.parametrize(
    ("doc", "args"),
    [
        ({**NO_GPU, "process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]}}, []),
        ({**NO_GPU, "process": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}}, []),
        ({**NO_GPU, "annotations": {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}}, []),
        # JSON may spell any character as an escape: the front cannot see through one
        ('{"process": {"env": ["NVIDIA_VISIBLE_\\u0044EVICES=0"]}}', []),
        ('{"annotations": {"x": "\\u0041"}}', []),
        ('{"annotations": {"x": "\\u003C"}}', []),  # not as Go writes it: Python
        (GO_ASKS, []),  # a marker beside Go's escapes
        ('{"annotations": {"cdi.k8s.io\\/gpu": "nvidia.com/gpu=0"}}', []),  # "/" as "\/"
        (NO_GPU, ["--config", "other.json"]),  # crun's config name: Python reads it
        (NO_GPU, ["-f", "other.json"]),
        (NO_GPU, ["-b{bundle}"]),  # crun's attached form
        (None, []),  # no config.json at all: Python says so
    ],
)
def test_a_create_that_may_ask_for_a_gpu_starts_python(
    node: Node, doc: dict[str, object] | str | None, args: list[str]
) -> None:
    bundle = _bundle(node, NO_GPU if doc is None else doc)
    if doc is None:
        (bundle / "config.json").unlink()
    (bundle / "other.json").write_text(json.dumps(NO_GPU))
    node.write_memo(create=MARKERS)
    flags = [a.replace("{bundle}", str(bundle)) for a in args] or ["--bundle", str(bundle)]
    node.python_ran()
    ran = node.run("create", *flags, "c1", cwd=bundle)
    assert ran == "Python" or (ran in ("A", "B") and node.python_ran())


def test_without_markers_in_the_memo_every_create_starts_python(node: Node) -> None:
    bundle = _bundle(node, NO_GPU)
    node.write_memo()  # create-python
    node.python_ran()
    assert node.run("create", "--bundle", str(bundle), "c1") == "B"
    assert node.python_ran()
    node.write_memo(create="create-search")  # no marker at all: never trusted
    assert node.run("create", "--bundle", str(bundle), "c1") == "B"
    assert node.python_ran()


def test_the_configured_markers_are_the_ones_searched(node: Node) -> None:
    """Python writes the markers of the config in force; the front searches exactly those."""
    bundle = _bundle(node, {**NO_GPU, "annotations": {"example.com/gpus": "nvidia.com/gpu=0"}})
    node.config.write_text(
        f'runtimes = ["{node.runtimes["A"]}"]\n'
        'annotation-prefixes = ["example.com/"]\naccept-volume-mounts = true\n'
    )
    assert node.run("state", "c1") == "A"  # Python writes the memo
    assert node.memo.read_text().splitlines()[4] == (
        "create-search\tNVIDIA_VISIBLE_DEVICES\texample.com/\tnvidia-container-devices"
    )
    assert node.run("create", "--bundle", str(bundle), "c1") == "Python"  # asks: Python
    mounts = {**NO_GPU, "mounts": [{"source": "/dev/null", "type": "bind",
              "destination": "/var/run/nvidia-container-devices/0"}]}  # fmt: skip
    assert node.run("create", "--bundle", str(_bundle(node, mounts, "m")), "c1") == "Python"
    assert node.run("create", "--bundle", str(_bundle(node, NO_GPU, "n")), "c1") == "A"


@pytest.mark.parametrize("prefix", ["gpu+x.io/", "a(b)[c]{1}|d^$*?.io/"])
def test_a_marker_is_searched_as_it_is(node: Node, prefix: str) -> None:
    """The front matches each marker as the bytes it is: a prefix with the characters a
    pattern would give a meaning matches itself (else a request under it would reach the
    runtime with no GPU)."""
    bundle = _bundle(node, {**NO_GPU, "annotations": {f"{prefix}gpu": "nvidia.com/gpu=0"}})
    node.config.write_text(
        f'runtimes = ["{node.runtimes["A"]}"]\nannotation-prefixes = ["{prefix}"]\n'
    )
    assert node.run("state", "c1") == "A"  # Python writes the memo
    assert node.run("create", "--bundle", str(bundle), "c1") == "Python"
    assert node.run("create", "--bundle", str(_bundle(node, NO_GPU, "n")), "c1") == "A"


def test_request_markers_refuse_what_the_front_cannot_search() -> None:
    from gpuctk.hook.config import Settings
    from gpuctk.hook.shim.memo import request_markers

    assert request_markers(Settings()) == ["NVIDIA_VISIBLE_DEVICES", "cdi.k8s.io/"]
    assert request_markers(Settings({"annotation-prefixes": [""]})) is None
    assert request_markers(Settings({"annotation-prefixes": ["a\tb"]})) is None
    for escaped in ('a"b', "a\\b", "a<b", "a>b", "a&b", "a\u2028b"):  # (Go's) JSON escapes
        assert request_markers(Settings({"annotation-prefixes": [escaped]})) is None


def test_remember_runtime_writes_only_into_a_private_folder(tmp_path: Path) -> None:
    env = {"PATH": "/bin", "GPUCTK_CONFIG": str(tmp_path / "none.toml")}
    private = tmp_path / "new"
    assert remember_runtime("/usr/bin/runc", {**env, "GPUCTK_STATE_DIR": str(private)})
    assert private.stat().st_mode & 0o777 == 0o700
    memo = private / "runtime"
    lines = memo.read_text().splitlines()
    assert lines[2:] == ["absent", "/usr/bin/runc", "create-python"]  # no markers given
    before = memo.stat().st_mtime_ns, memo.stat().st_ino
    assert remember_runtime("/usr/bin/runc", {**env, "GPUCTK_STATE_DIR": str(private)})
    assert (memo.stat().st_mtime_ns, memo.stat().st_ino) == before  # unchanged: not rewritten
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert not remember_runtime("/usr/bin/runc", {**env, "GPUCTK_STATE_DIR": str(shared)})
    assert list(shared.iterdir()) == []
    assert not remember_runtime("/usr/bin/ru\nnc", {**env, "GPUCTK_STATE_DIR": str(private)})
    assert memo.read_text().splitlines()[3] == "/usr/bin/runc"


# --- a create that asks for a GPU: Python, whatever else lies in the state folder ----------

ONE_GPU = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
           "devices": [{"name": "0", "containerEdits": {"env": ["GPU_EDITED=0"]}}]}  # fmt: skip


def _asks_for(node: Node, value: str) -> Path:
    """A spec folder with one GPU (0) in the config, a memo whose markers send a create that
    names NVIDIA_VISIBLE_DEVICES on to Python, and a bundle asking for `value`."""
    cdi = node.tmp / "cdi"
    cdi.mkdir(exist_ok=True)
    (cdi / "gpu.json").write_text(json.dumps(ONE_GPU))
    node.config.write_text(f'runtimes = ["{node.runtimes["A"]}"]\nspec-dirs = ["{cdi}"]\n')
    node.write_memo(create=MARKERS)
    env = {"env": [f"NVIDIA_VISIBLE_DEVICES={value}"]}  # a plain host's request: no CRI marks
    return _bundle(node, {**NO_GPU, "process": env, "annotations": {}})


def _env_of(bundle: Path) -> list[str]:
    env: list[str] = json.loads((bundle / "config.json").read_text())["process"]["env"]
    return env


def test_a_fifo_and_a_live_gpuctk_serve_pid_in_the_state_folder_change_nothing(
    node: Node,
) -> None:
    """The state folder may hold `create.fifo` (a FIFO of the caller's uid) and `create.pid`
    naming a live process of that uid whose comm is `gpuctk-serve`: nothing listens there,
    and the front gives those names no meaning. The GPU create runs Python, gets its edits,
    and the runtime runs: no waiting on the FIFO, no failure."""
    bundle = _asks_for(node, "0")
    os.mkfifo(node.state / "create.fifo", 0o600)
    named = node.tmp / "gpuctk-serve"  # exec through this link: the kernel names it so
    named.symlink_to(os.path.realpath(sys.executable))
    squatter = subprocess.Popen(
        [str(named), "-I", "-c", "import time\nprint('up', flush=True)\ntime.sleep(120)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert squatter.stdout is not None and squatter.stdout.readline() == "up\n"  # exec'd
        assert Path(f"/proc/{squatter.pid}/comm").read_text() == "gpuctk-serve\n"
        assert Path(f"/proc/{squatter.pid}").stat().st_uid == os.geteuid()
        (node.state / "create.pid").write_text(f"{squatter.pid}\n")
        assert node.run("create", "--bundle", str(bundle), "c1") == "B"
        assert _env_of(bundle) == ["NVIDIA_VISIBLE_DEVICES=0", "GPU_EDITED=0"]
        assert squatter.poll() is None  # left alone
    finally:
        squatter.kill()
        squatter.wait()


BUSY = "import time\nend = time.monotonic() + 300\nwhile time.monotonic() < end:\n    pass\n"


def test_an_unknown_gpu_is_reported_on_the_creates_own_stderr_on_a_busy_machine(
    node: Node,
) -> None:
    """NVIDIA_VISIBLE_DEVICES=7 on a spec with one GPU: each of five creates, beside three
    CPU-bound processes, fails with the message on the stderr the engine gave it, and the
    runtime never runs."""
    bundle = _asks_for(node, "7")
    before = (bundle / "config.json").read_bytes()
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(3)]  # bounded
    try:
        for _ in range(5):
            done = subprocess.run(
                [str(node.front), "create", "--bundle", str(bundle), "c1"], env=node.env,
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert done.returncode == 1, done.stderr
            assert "unknown CDI device nvidia.com/gpu=7" in done.stderr
            assert done.stdout == ""  # the runtime never ran
            assert (bundle / "config.json").read_bytes() == before
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
