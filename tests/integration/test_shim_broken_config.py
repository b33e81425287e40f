"""gpuctk-runtime in front of REAL runc under a config file it cannot use.

One typo in /etc/gpuctk/config.toml must not stop the node: where the shim is the default
runtime handler, every container goes through it. So a config the shim cannot read (an unknown
key, invalid TOML, a bad value):

- leaves a container that asks for no GPU untouched: runc runs with the arguments as they came,
  config.json keeps its bytes, and the engine's log (`--log`) gets one warning line naming the
  file and the problem;
- fails a container that asks for a GPU (NVIDIA_VISIBLE_DEVICES, a CDI annotation) with one
  line naming the file, the key at fault and the fix, config.json as it was, no container;
- still execs the runtime the file names in `runtimes` when that key itself is valid.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures.gpucheck import need_runtime
from fixtures.images import make_bundle, unique_name

pytestmark = pytest.mark.integration

SHIM = str(Path(sys.executable).parent / "gpuctk-runtime")
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TYPO = "acept-volume-mounts = true\n"  # accept-volume-mounts, misspelt
BROKEN = {
    "unknown-key": TYPO,
    "bad-toml": "runtimes = [\n",
    "bad-value": 'log-level = "loud"\n',
}
MARK = "gpuctk-broken-config-test"


class Run:
    def __init__(
        self, tmp: Path, fresh_rootfs: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        self.tmp, self.fresh_rootfs, self.monkeypatch = tmp, fresh_rootfs, monkeypatch
        self.count = 0
        self.last_config = tmp / "none"

    def __call__(
        self,
        toml: str,
        env: list[str],
        annotations: dict[str, str] | None = None,
        runtime_link: bool = False,
    ) -> tuple[int, str, str, Path, bytes]:
        """(exit status, stdout, stderr, the engine's log, config.json before) of a `run`."""
        need_runtime("runc")
        self.count += 1
        runc = shutil.which("runc")
        assert runc
        if runtime_link:  # a runtime only the config names: proves `runtimes` was used
            linked = self.tmp / "bin" / "my-runc"
            linked.parent.mkdir(exist_ok=True)
            linked.parent.chmod(0o755)
            if not linked.exists():
                linked.symlink_to(runc)
            runc = str(linked)
        config = self.tmp / f"gpuctk-{self.count}.toml"
        config.write_text(f'runtimes = ["{runc}"]\n{toml}')
        bundle = make_bundle(
            self.tmp / f"bundle-{self.count}",
            self.fresh_rootfs("debian"),
            ["/bin/sh", "-c", f"echo {MARK}"],
            env=[PATH_ENV, *env],
        )
        if annotations:
            doc = json.loads((bundle / "config.json").read_text())
            doc["annotations"] = annotations
            (bundle / "config.json").write_text(json.dumps(doc))
        before = (bundle / "config.json").read_bytes()
        log = self.tmp / f"engine-{self.count}.log"
        self.monkeypatch.setenv("GPUCTK_CONFIG", str(config))
        self.last_config = config
        name = unique_name("gpuctk-broken")
        argv = [SHIM, "--log", str(log), "--log-format", "json", "run", "--bundle", str(bundle)]
        try:
            done = subprocess.run(
                [*argv, name], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                timeout=120, check=False,
            )  # fmt: skip
        finally:  # not logged: the lines under test are the create's
            subprocess.run([SHIM, "delete", "--force", name], capture_output=True, check=False)
        assert (bundle / "config.json").read_bytes() == before
        return done.returncode, done.stdout, done.stderr, log, before


@pytest.fixture
def run(
    tmp_path: Path, fresh_rootfs: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> Run:
    return Run(tmp_path, fresh_rootfs, monkeypatch)


def shim_lines(log: Path) -> list[dict[str, str]]:
    """The engine log's lines that the shim wrote (runc writes there too)."""
    if not log.exists():
        return []
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [line for line in lines if line.get("msg", "").startswith("gpuctk-runtime")]


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_no_gpu_container_starts(case: str, run: Run) -> None:
    code, out, err, log, _ = run(BROKEN[case], ["NVIDIA_VISIBLE_DEVICES=void"])
    assert code == 0, err
    assert MARK in out
    lines = shim_lines(log)
    assert len(lines) == 1, lines
    assert lines[0]["level"] == "warning"
    assert str(run.last_config) in lines[0]["msg"]
    assert "asks for no GPU" in lines[0]["msg"]


def test_no_gpu_container_uses_the_configured_runtime(run: Run) -> None:
    """`runtimes` is valid on its own: the runtime it names runs, not the default search."""
    code, out, err, log, _ = run(TYPO, [], runtime_link=True)
    assert code == 0, err
    assert MARK in out
    assert len(shim_lines(log)) == 1


@pytest.mark.parametrize(
    ("env", "annotations"),
    [
        (["NVIDIA_VISIBLE_DEVICES=0"], None),
        (["NVIDIA_VISIBLE_DEVICES=none"], None),
        ([], {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}),
    ],
)
def test_gpu_container_fails_with_one_clear_line(
    env: list[str], annotations: dict[str, str] | None, run: Run
) -> None:
    code, out, err, log, _ = run(TYPO, env, annotations)
    assert code == 1 and MARK not in out
    errors = [line for line in err.splitlines() if line.strip()]
    assert len(errors) == 1, err
    line = errors[0]
    assert str(run.last_config) in line
    assert "acept-volume-mounts" in line and "accept-volume-mounts" in line  # key, suggestion
    assert "asks for a GPU" in line and "fix" in line
    logged = shim_lines(log)
    assert [entry["level"] for entry in logged] == ["error"]
