"""containerd 1.6, configured by gpuctk, runs a container through the shim (private daemon).

`ctr` cannot pick a CRI handler, so the container is started the way the issue allows:
`ctr run --runtime io.containerd.runc.v2 --runc-binary <shim>`, on the daemon started with the
configured files. A synthetic CDI spec (no GPU needed) proves the shim edited the container on
the way: the device requested through NVIDIA_VISIBLE_DEVICES adds an env var the container sees.
The GPU checks proper (device nodes, libraries) belong to the runtime issue's tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.containerd import (
    SYSTEMD_SANDBOX,
    PrivateContainerd,
    can_run_daemon,
    gpuctk,
    private_config,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not can_run_daemon(), reason="needs root, containerd, ctr and unshare"),
]


def installed_shim() -> str | None:
    """gpuctk-runtime on PATH, else beside this Python (the virtual environment's bin)."""
    beside = Path(sys.executable).parent / "gpuctk-runtime"
    return shutil.which("gpuctk-runtime") or (str(beside) if beside.exists() else None)


def shim_path() -> str:
    path = installed_shim()
    if path is None:
        pytest.skip("gpuctk-runtime not implemented yet")
    proc = subprocess.run([path, "--version"], capture_output=True, timeout=30, check=False)
    if proc.returncode != 0:
        pytest.skip("gpuctk-runtime not implemented yet")
    return path


def minimal_rootfs(root: Path) -> None:
    sh = shutil.which("sh") or "/bin/sh"
    real = str(Path(sh).resolve())
    out = subprocess.run(["ldd", real], capture_output=True, text=True, check=True).stdout
    for path in [real] + [p for p in out.split() if p.startswith("/")]:
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    if not (root / "bin" / "sh").exists():
        (root / "bin").mkdir(exist_ok=True)
        (root / "bin" / "sh").symlink_to(real)


@pytest.fixture
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e", numbered=True)


@pytest.fixture
def daemon(base: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[PrivateContainerd]:
    etc = base / "etc"
    etc.mkdir()
    (etc / "config.toml").write_text(
        SYSTEMD_SANDBOX.replace("SystemdCgroup = true", "SystemdCgroup = false")
    )
    code, _, err = gpuctk(
        capsys,
        "runtime",
        "configure",
        "--config",
        str(etc / "config.toml"),
        "--drop-in",
        str(etc / "conf.d" / "99-gpuctk.toml"),
        "--runtime-path",
        installed_shim() or "/usr/bin/gpuctk-runtime",
    )
    assert code == 0, err
    cdi = base / "cdi"
    cdi.mkdir()
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": "e2e", "containerEdits": {"env": ["GPUCTK_E2E=injected"]}}],
        "containerEdits": {},
    }
    (cdi / "e2e.json").write_text(json.dumps(spec))
    (base / "gpuctk.toml").write_text(f'spec-dirs = ["{cdi}"]\n')
    instance = PrivateContainerd(
        base,
        private_config(base, etc / "config.toml"),
        env={"GPUCTK_CONFIG": str(base / "gpuctk.toml"), "GPUCTK_STATE_DIR": str(base / "state")},
    )
    instance.start()
    try:
        yield instance
    finally:
        instance.stop()
        remove_cgroups(CGROUP_PARENT)


CGROUP_PARENT = "gpuctk-e2e"


def remove_cgroups(parent: str) -> None:
    """rmdir the (empty) cgroup folders the test containers' parent left in each hierarchy."""
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        for candidate in (hierarchy / parent, Path("/sys/fs/cgroup") / parent):
            if candidate.is_dir():
                with contextlib.suppress(OSError):
                    candidate.rmdir()


def run(daemon: PrivateContainerd, binary: str, *env: str) -> subprocess.CompletedProcess[str]:
    rootfs = daemon.base / f"rootfs-{uuid.uuid4().hex[:6]}"
    minimal_rootfs(rootfs)
    name = f"gpuctk-e2e-{uuid.uuid4().hex[:8]}"
    args = ["--namespace", "gpuctk-e2e", "run", "--rm", "--rootfs"]
    args += ["--fifo-dir", str(daemon.base / "fifo"), "--cgroup", f"/{CGROUP_PARENT}/{name}"]
    args += ["--runtime", "io.containerd.runc.v2", "--runc-binary", binary]
    for item in env:
        args += ["--env", item]
    return daemon.ctr(
        *args, str(rootfs), name, "/bin/sh", "-c", 'echo "E2E=$GPUCTK_E2E"', check=False
    )


def test_harness_runs_plain_runc(daemon: PrivateContainerd) -> None:
    proc = run(daemon, shutil.which("runc") or "runc")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "E2E="


def test_container_through_shim(daemon: PrivateContainerd) -> None:
    shim = shim_path()
    plain = run(daemon, shim)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip() == "E2E="  # no request: passed straight through
    gpu = run(daemon, shim, "NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=e2e")
    assert gpu.returncode == 0, gpu.stderr
    assert gpu.stdout.strip() == "E2E=injected"  # the shim applied the CDI edits


def test_containers_through_the_installed_front(daemon: PrivateContainerd) -> None:
    """The launchers as installed (the sh front, the compiled create beside it): once a
    request was resolved, containerd's create of it needs no Python at all. Proved by taking
    Python away before the last container: a hand-over would fail that create."""
    bindir = daemon.base / "bin"
    bindir.mkdir()
    write = [sys.executable, "-m", "gpuctk.install.launchers", str(bindir)]
    subprocess.run([*write, "--python", sys.executable], check=True, capture_output=True)
    if not (bindir / "gpuctk-cdi-hook").is_file():
        pytest.skip("gpuctk-cdi-hook not built")
    shim = str(bindir / "gpuctk-runtime")
    ask = "NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=e2e"
    time.sleep(1.1)  # the spec and the config settle (SETTLE_NS), as on a node
    for _ in range(2):  # Python: the memo, the plan, the front plan
        done = run(daemon, shim, ask)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "E2E=injected"
    assert list((daemon.base / "state" / "front").iterdir())
    gone = bindir.parent / "no-python" / "python3"  # a path with nothing there
    other = bindir.parent / "bin-no-python"
    other.mkdir()
    subprocess.run([*write[:-1], str(other), "--python", str(gone)], check=True,
                   capture_output=True)  # fmt: skip
    # only the runtime's launcher replaced: the plan's guard entry names this gpuctk-cdi-hook
    os.replace(other / "gpuctk-runtime", bindir / "gpuctk-runtime")
    done = run(daemon, shim, ask)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "E2E=injected"  # the compiled create applied the edits
    other = run(daemon, shim, "NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=nope")
    assert other.returncode != 0  # a request never resolved needs Python, which is gone
