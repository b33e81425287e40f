"""gpuctk-runtime in front of REAL runc and crun, with a generated spec and no GPU.

The spec comes from `gpuctk cdi generate --simulate <profile>` over the Debian 535 driver root
and mknod'ed device nodes (fixtures.driver_root, fixtures.devroot): h100-8 (8 whole GPUs, JSON
spec) and a100-mig (GPU 0 whole, GPUs 1-3 in MIG mode, YAML spec). Each container starts on a
fresh overlay of the debian image (fixtures.images) and reports what it sees:

- exactly the requested /dev/nvidia*, /dev/nvidia-caps/* and /dev/dri/* nodes (the spec's
  control nodes plus the requested devices' nodes), and no other;
- opening an injected GPU node fails with ENXIO ("No such device or address"): the device
  cgroup allowed it and there is no driver behind it (a blocked node gives EPERM);
- the driver libraries NVIDIA_DRIVER_CAPABILITIES selects, and `ldconfig -p` listing
  libcuda.so.1 (the shim wrote the cache itself, hook/shim/shimroot.py, or the hook ran).

Failures (unknown device, unmet NVIDIA_REQUIRE_CUDA, malformed config.json, missing spec dir)
make `run` exit 1 with a clear message, config.json unchanged and no container created.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.gpucheck import SCRIPT, Node, check_nodes, need_runtime, seen, shim_machines
from fixtures.images import make_bundle, run_container, runtime_argv, unique_name

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
SHIM = str(BIN / "gpuctk-runtime")
RUNTIMES = ["runc", "crun"]
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.fixture(scope="module")
def machines(tmp_path_factory: pytest.TempPathFactory, driver_root: Path) -> dict[str, Node]:
    return shim_machines(tmp_path_factory.mktemp("shim-machines"), driver_root)


def shim_argv(runtime: str) -> list[str]:
    """The shim, wrapped like fixtures.images.runtime_argv wraps crun on hybrid cgroups."""
    if runtime_argv(runtime) == [runtime]:
        return [SHIM]
    script = 'umount -l /sys/fs/cgroup/unified 2>/dev/null; exec "$0" "$@"'
    return ["unshare", "-m", "sh", "-c", script, SHIM]


@pytest.fixture
def shim(
    tmp_path: Path, fresh_rootfs: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., tuple[subprocess.CompletedProcess[str], Path]]]:
    """Factory: (runtime, node, env, annotations=None) -> (finished run, bundle)."""
    count = 0

    def run(
        runtime: str,
        node: Node | Path,
        env: list[str],
        annotations: dict[str, str] | None = None,
        config_bytes: bytes | None = None,
    ) -> tuple[subprocess.CompletedProcess[str], Path]:
        nonlocal count
        count += 1
        need_runtime(runtime)
        spec_dir = node.spec_dir if isinstance(node, Node) else node
        toml = tmp_path / f"gpuctk-{count}.toml"
        toml.write_text(
            f'runtimes = ["{shutil.which(runtime)}"]\nspec-dirs = ["{spec_dir}"]\n'
            f'log-file = "{tmp_path}/gpuctk.log"\n'
        )
        monkeypatch.setenv("GPUCTK_CONFIG", str(toml))
        rootfs = fresh_rootfs("debian")
        bundle = make_bundle(
            tmp_path / f"bundle-{count}", rootfs, ["/bin/sh", "-c", SCRIPT], env=[PATH_ENV, *env]
        )
        config = bundle / "config.json"
        if annotations:
            doc = json.loads(config.read_text())
            doc["annotations"] = annotations
            config.write_text(json.dumps(doc))
        if config_bytes is not None:
            config.write_bytes(config_bytes)
        name = unique_name(f"gpuctk-shim-{runtime}")
        return run_container(shim_argv(runtime), bundle, name), bundle

    yield run


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize(
    ("value", "names"),
    [("0", ["0"]), ("1,3", ["1", "3"]), ("all", ["all"]), ("none", [])],
)
def test_visible_devices(
    runtime: str, value: str, names: list[str], machines: dict[str, Node], shim: Any
) -> None:
    node = machines["h100-8"]
    done, _ = shim(runtime, node, [f"NVIDIA_VISIBLE_DEVICES={value}"])
    check_nodes(done, node.nodes(*names))
    if value == "0":
        assert "/dev/nvidia1" not in seen(done.stdout, "NODE")
    assert "libcuda.so.535.309.01" in seen(done.stdout, "LIB")
    assert "LDCACHE libcuda.so.1" in done.stdout.splitlines()


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_mig_device(runtime: str, machines: dict[str, Node], shim: Any) -> None:
    node = machines["a100-mig"]
    done, _ = shim(runtime, node, ["NVIDIA_VISIBLE_DEVICES=1:0"])
    expected = node.nodes("1:0")
    assert "/dev/nvidia1" in expected and any("/nvidia-caps/" in p for p in expected)
    check_nodes(done, expected)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_cdi_annotation(runtime: str, machines: dict[str, Node], shim: Any) -> None:
    node = machines["h100-8"]
    uuid = node.uuid(2)
    done, _ = shim(runtime, node, [], {"cdi.k8s.io/gpu": f"nvidia.com/gpu={uuid}"})
    check_nodes(done, node.nodes(uuid))
    assert "/dev/nvidia2" in seen(done.stdout, "NODE")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_driver_capabilities_utility(runtime: str, machines: dict[str, Node], shim: Any) -> None:
    node = machines["h100-8"]
    env = ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=utility"]
    done, _ = shim(runtime, node, env)
    check_nodes(done, node.nodes("0"))
    libs = seen(done.stdout, "LIB")
    assert "libnvidia-ml.so.535.309.01" in libs and "libnvidia-ml.so.1" in libs
    assert not any(lib.startswith("libcuda") for lib in libs), libs
    assert "LDCACHE libcuda.so.1" not in done.stdout


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_graphics_brings_the_drm_nodes(runtime: str, machines: dict[str, Node], shim: Any) -> None:
    """The GPU's /dev/dri card and render nodes come with graphics (or display) only, as in
    the NVIDIA runtime's legacy mode: the default (utility,compute) leaves them out."""
    node = machines["h100-8"]
    done, _ = shim(runtime, node, ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=all"])
    drm = node.nodes("0", drm=True) - node.nodes("0")
    assert any(p.startswith("/dev/dri/renderD") for p in drm), drm
    check_nodes(done, node.nodes("0", drm=True))


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("unknown", "unknown CDI device nvidia.com/gpu=42"),
        ("require", "unsatisfied requirement NVIDIA_REQUIRE_CUDA="),
        ("malformed", "malformed OCI config"),
        ("no-spec", "no CDI spec found in"),
    ],
)
def test_failures_leave_nothing_behind(
    runtime: str, case: str, message: str, machines: dict[str, Node], shim: Any, tmp_path: Path
) -> None:
    node: Node | Path = machines["h100-8"]
    env = ["NVIDIA_VISIBLE_DEVICES=0"]
    raw = None
    if case == "unknown":
        env = ["NVIDIA_VISIBLE_DEVICES=42"]
    elif case == "require":
        env.append("NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=550")
    elif case == "malformed":
        raw = b'{"ociVersion": "1.0.2", "process": '
    else:
        node = tmp_path / "no-such-cdi-dir"
    done, bundle = shim(runtime, node, env, config_bytes=raw)
    assert done.returncode == 1, done.stdout
    assert message in done.stderr, done.stderr
    config = (bundle / "config.json").read_bytes()
    if raw is not None:
        assert config == raw
    else:
        assert "NVIDIA_VISIBLE_DEVICES=void" not in json.loads(config)["process"]["env"]
    assert sorted(p.name for p in bundle.iterdir()) == ["config.json"]
    with open("/proc/self/mountinfo") as f:
        assert str(bundle) not in f.read()
