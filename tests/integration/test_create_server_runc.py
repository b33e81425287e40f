"""gpuctk create-server behind real runc: a whole container lifecycle with no Python start.

The sh front under test names an interpreter that does not exist, so a create that reached
Python would fail (exit 127); the server (a real `gpuctk create-server` process) edits the
bundle, and the front execs runc with the engine's own stdio. The container is the debian
test image on a fresh overlay, with the simulated H100 node's spec (the default library mode):
it sees its GPU's nodes, `ldconfig -p` lists libcuda.so.1 and the loader opens it, and its
output reaches the stdout the front was given. The control: with the server stopped, the same
create goes to Python (127) and the bundle is left as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fixtures.createserver import start_create_server
from fixtures.gpucheck import generate, need_runtime
from fixtures.images import make_bundle

from gpuctk import launchers
from gpuctk.hook.runtime_main import remember_runtime

pytestmark = pytest.mark.integration

SCRIPT = (
    "ls /dev/nvidia0 /dev/nvidiactl; ldconfig -p | grep -c 'libcuda.so.1 ' | sed 's/^/CACHED /';"
    " dlopen-test libcuda.so.1"
)


class Served:
    def __init__(self, tmp: Path, spec_dir: Path) -> None:
        need_runtime("runc")
        self.runc = shutil.which("runc") or "runc"
        self.tmp = tmp
        self.state = tmp / "state"
        self.state.mkdir(mode=0o700)
        config = tmp / "gpuctk.toml"
        config.write_text(f'runtimes = ["{self.runc}"]\nspec-dirs = ["{spec_dir}"]\n')
        self.env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "GPUCTK_CONFIG": str(config),
            "GPUCTK_STATE_DIR": str(self.state),
        }
        assert remember_runtime(self.runc, self.env, ["NVIDIA_VISIBLE_DEVICES", "cdi.k8s.io/"])
        self.front = tmp / "gpuctk-runtime"
        self.front.write_text(launchers.runtime_front_text("/nonexistent/python3"))
        self.front.chmod(0o755)
        self.server = start_create_server(self.state)

    def verb(self, *args: str, stdout: int | None = None) -> subprocess.CompletedProcess[str]:
        """The front with `args`; a create's stdio goes to files (the container keeps them
        open until it exits): `stdout`, and stderr read back into the result."""
        err = self.tmp / "verb-stderr"
        with open(err, "w") as stderr:
            done = subprocess.run(
                [str(self.front), *args], env=self.env, stdin=subprocess.DEVNULL,
                stdout=stdout if stdout is not None else subprocess.DEVNULL, stderr=stderr,
                text=True, timeout=120, check=False,
            )  # fmt: skip
        done.stderr = err.read_text()
        return done

    def stop(self) -> str:
        self.server.send_signal(signal.SIGTERM)
        return self.server.communicate(timeout=30)[1]


@pytest.fixture
def served(tmp_path: Path, driver_root: Path) -> Iterator[Served]:
    if os.geteuid() != 0:
        pytest.skip("runc and the create server need root")
    node = generate(tmp_path / "h100", driver_root, "h100-8", tmp_path / "h100/cdi/nvidia.json")
    s = Served(tmp_path, node.spec_dir)
    yield s
    if s.server.poll() is None:
        s.server.kill()
        s.server.wait()


def _bundle(tmp: Path, fresh_rootfs: Callable[[str], Path], name: str) -> Path:
    return make_bundle(
        tmp / name, fresh_rootfs("debian"), ["/bin/sh", "-c", SCRIPT],
        env=["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "NVIDIA_VISIBLE_DEVICES=0"],
    )  # fmt: skip


def test_a_gpu_container_lifecycle_through_the_create_server(
    served: Served, fresh_rootfs: Callable[[str], Path], tmp_path: Path
) -> None:
    bundle = _bundle(tmp_path, fresh_rootfs, "bundle")
    name, out = f"gpuctk-serve-{os.getpid()}", tmp_path / "stdout"
    try:
        with open(out, "w") as stdout:
            made = served.verb(
                "create", "--bundle", str(bundle), "--pid-file", str(tmp_path / "pid"), name,
                stdout=stdout.fileno(),
            )  # fmt: skip
        assert made.returncode == 0, made.stderr
        pid = int((tmp_path / "pid").read_text())
        assert served.verb("start", name).returncode == 0
        deadline = time.monotonic() + 60
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert served.verb("delete", name).returncode == 0
    finally:
        subprocess.run([served.runc, "delete", "--force", name], capture_output=True, check=False)
    text = out.read_text()
    assert "/dev/nvidia0" in text and "/dev/nvidiactl" in text, text
    assert "CACHED 1" in text and "OK libcuda.so.1" in text, text
    config = json.loads((bundle / "config.json").read_text())
    assert "/dev/nvidia0" in {d["path"] for d in config["linux"]["devices"]}
    assert "stopped after 1 creates" in served.stop()
    assert sorted(p.name for p in served.state.iterdir() if p.name.startswith("create.")) == [
        "create.lock"
    ]


def test_with_the_server_stopped_the_create_goes_to_python(
    served: Served, fresh_rootfs: Callable[[str], Path], tmp_path: Path
) -> None:
    assert "stopped after 0 creates" in served.stop()
    bundle = _bundle(tmp_path, fresh_rootfs, "bundle")
    before = (bundle / "config.json").read_text()
    made = served.verb("create", "--bundle", str(bundle), f"gpuctk-serve-{os.getpid()}-c")
    assert made.returncode == 127 and "/nonexistent/python3" in made.stderr
    assert (bundle / "config.json").read_text() == before
