"""The management spec (`gpuctk cdi generate --mode management`, cdi/management.py) in podman
4.3.1 and through the shim with real runc; the IMEX channel spec (`--mode imex`) in podman.

The spec is generated over the Debian driver root and the fixture dev root of h100-8 (8 GPUs,
control and capability nodes, IMEX channels 0 and 1). A container given
`management.nvidia.com/gpu=all` must see every NVIDIA node of the dev root (each GPU node
opens with ENXIO: allowed by the device cgroup, no driver behind it), nvidia-smi and
libnvidia-ml, and no compute library (libcuda). podman reads the spec itself; the shim takes
the request from a CDI annotation, or from NVIDIA_VISIBLE_DEVICES when the config names the
kind in `device-list-kinds`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.devroot import NodeRoots, make_node_roots
from fixtures.gpucheck import BIN, runc_run
from fixtures.images import make_bundle
from fixtures.podman import CdiPodman, private_podman

from gpuctk.cdi.node.profile import load_profile

pytestmark = pytest.mark.integration

PROFILE = "h100-8"
KIND = "management.nvidia.com/gpu"
IMAGE = "localhost/gpuctk-test-debian:latest"
LIBDIR = "/usr/lib/x86_64-linux-gnu/nvidia/current"
ENXIO = "No such device or address"
SCRIPT = rf"""
for f in /dev/nvidia* /dev/nvidia-caps/* /dev/nvidia-caps-imex-channels/*; do
  [ -c "$f" ] && echo "NODE $f"
done
for f in /dev/nvidia[0-9]*; do (: < "$f") 2>&1 | sed "s|^|OPEN $f |"; done
ls {LIBDIR} 2>/dev/null | sed 's/^/LIB /'
[ -x /usr/bin/nvidia-smi ] && echo BIN nvidia-smi
ldconfig -p | grep -q 'libcuda.so' && echo LDCACHE libcuda
true
"""


class Mgmt:
    def __init__(self, roots: NodeRoots, spec_dir: Path, imex_dir: Path) -> None:
        self.roots = roots
        self.spec_dir = spec_dir
        self.imex_dir = imex_dir


def host_nodes(roots: NodeRoots) -> set[str]:
    """Every NVIDIA character device of the fixture dev root, as container paths."""
    dev = roots.dev_root / "dev"
    found = set()
    for path in [*dev.glob("nvidia*"), *dev.glob("nvidia-caps*/*")]:
        if path.is_char_device():
            found.add("/" + str(path.relative_to(roots.dev_root)))
    return found


@pytest.fixture(scope="module")
def mgmt(tmp_path_factory: pytest.TempPathFactory, driver_root: Path) -> Mgmt:
    if os.geteuid() != 0:
        pytest.skip("mknod and real runtimes need root")
    work = tmp_path_factory.mktemp("management")
    roots = make_node_roots(work / "node", load_profile(PROFILE))
    spec_dir = work / "cdi"
    spec_dir.mkdir()
    done = subprocess.run(
        [str(BIN / "gpuctk"), "cdi", "generate", "--mode", "management", "--simulate", PROFILE,
         "--driver-root", str(driver_root), "--dev-root", str(roots.dev_root),
         "--proc-root", str(roots.proc_root), "--sys-root", str(roots.sys_root),
         "--hook-path", str(BIN / "gpuctk-hook"), "--output", str(spec_dir / "management.json")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    spec = json.loads((spec_dir / "management.json").read_text())
    assert spec["kind"] == KIND and [d["name"] for d in spec["devices"]] == ["all"]
    imex_dir = work / "imex"
    imex_dir.mkdir()
    done = subprocess.run(
        [str(BIN / "gpuctk"), "cdi", "generate", "--mode", "imex",
         "--dev-root", str(roots.dev_root), "--proc-root", str(roots.proc_root),
         "--output", str(imex_dir / "imex.json")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return Mgmt(roots, spec_dir, imex_dir)


def check_management_view(mgmt: Mgmt, done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    nodes = {ln.split(" ", 1)[1] for ln in lines if ln.startswith("NODE ")}
    expected = host_nodes(mgmt.roots)
    assert {"/dev/nvidia0", "/dev/nvidia7", "/dev/nvidiactl", "/dev/nvidia-uvm"} <= expected
    assert "/dev/nvidia-caps-imex-channels/channel1" in expected
    assert nodes == expected
    opened = [ln for ln in lines if ln.startswith("OPEN ")]
    assert len(opened) == 8 and all(ENXIO in ln for ln in opened), done.stdout
    libs = {ln[4:] for ln in lines if ln.startswith("LIB ")}
    assert "libnvidia-ml.so.1" in libs and "libnvidia-ml.so.535.309.01" in libs, libs
    assert not [lib for lib in libs if lib.startswith("libcuda")], libs
    assert "BIN nvidia-smi" in lines
    assert "LDCACHE libcuda" not in lines


@pytest.fixture(scope="module")
def podman(mgmt: Mgmt, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiPodman]:
    if shutil.which("podman") is None or shutil.which("unshare") is None:
        pytest.skip("needs podman and unshare")
    Path("/run/cdi").mkdir(parents=True, exist_ok=True)
    with private_podman(tmp_path_factory.mktemp("management-podman"), IMAGE) as base:
        yield CdiPodman(base, {"management": mgmt.spec_dir, "imex": mgmt.imex_dir}, IMAGE)


@pytest.mark.parametrize(
    ("device", "channels"), [("0", {"channel0"}), ("all", {"channel0", "channel1"})]
)
def test_podman_runs_the_imex_channel_spec(
    podman: CdiPodman, device: str, channels: set[str]
) -> None:
    done = podman.run(SCRIPT, spec="imex", kind="nvidia.com/imex-channel", device=device)
    assert done.returncode == 0, done.stdout + done.stderr
    nodes = {ln.split(" ", 1)[1] for ln in done.stdout.splitlines() if ln.startswith("NODE ")}
    assert nodes == {f"/dev/nvidia-caps-imex-channels/{c}" for c in channels}, done.stdout


def test_podman_runs_the_management_device(mgmt: Mgmt, podman: CdiPodman) -> None:
    done = podman.run(SCRIPT, spec="management", kind=KIND, device="all")
    check_management_view(mgmt, done)


def shim_create(mgmt: Mgmt, bundle: Path, toml: str) -> dict[str, Any]:
    (bundle.parent / "gpuctk.toml").write_text(
        f'runtimes = ["/bin/true"]\nspec-dirs = ["{mgmt.spec_dir}"]\n{toml}'
    )
    done = subprocess.run(
        [str(BIN / "gpuctk-runtime"), "create", "--bundle", str(bundle), "gpuctk-mgmt"],
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
             "GPUCTK_CONFIG": str(bundle.parent / "gpuctk.toml"),
             "GPUCTK_STATE_DIR": str(bundle.parent / "state")},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    config: dict[str, Any] = json.loads((bundle / "config.json").read_text())
    return config


@pytest.mark.parametrize("form", ["annotation", "device-list"])
def test_the_shim_injects_the_management_device(
    mgmt: Mgmt, fresh_rootfs: Callable[[str], Path], tmp_path: Path, form: str
) -> None:
    if shutil.which("runc") is None:
        pytest.skip("runc not installed")
    rootfs = fresh_rootfs("debian")
    if form == "annotation":
        env, toml = ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"], ""
    else:
        env = ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", f"NVIDIA_VISIBLE_DEVICES={KIND}=all"]
        toml = f'device-list-kinds = ["{KIND}"]\n'
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["/bin/true"], env=env)
    if form == "annotation":
        config = json.loads((bundle / "config.json").read_text())
        config["annotations"] = {"cdi.k8s.io/management": f"{KIND}=all"}
        (bundle / "config.json").write_text(json.dumps(config))
    config = shim_create(mgmt, bundle, toml)
    done = runc_run(bundle, config, SCRIPT, f"gpuctk-mgmt-{os.getpid()}")
    check_management_view(mgmt, done)
