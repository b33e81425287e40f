"""`gpuctk doctor --probe`: a real throwaway container through gpuctk-runtime and real runc.

The node is fixtures.doctornode's (mknod'ed nodes, the Debian 535 driver root, a generated
spec, the fake NVML): the container must see exactly the spec's nodes for device 0, the ld
cache must list libcuda.so.1 and libnvidia-ml.so.1 (the gpuctk-hook entry ran), and opening
/dev/nvidia0 gives ENXIO (allowed by the device cgroup, no driver behind it), which the probe
reports as a warning naming ENXIO. Whatever happens, nothing is left behind: no container, no
mount, no temporary folder.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fixtures.doctornode import DoctorNode, build_node, generate_spec

pytestmark = pytest.mark.integration


@pytest.fixture
def node(
    tmp_path: Path, driver_root: Path, fake_nvml_env: Callable[..., dict[str, str]]
) -> Iterator[DoctorNode]:
    if os.geteuid() != 0:
        pytest.skip("the probe needs root (mounts, runc)")
    if shutil.which("runc") is None:
        pytest.skip("runc not installed")
    made = build_node(tmp_path / "node", driver_root, "a100-mig", fake_nvml_env)
    yield made
    made.close()


def leftovers() -> list[str]:
    """Containers, mounts and folders a probe may have left (any run, this process or not)."""
    found: list[str] = []
    with open("/proc/self/mountinfo") as f:
        found += [line for line in f if "gpuctk-doctor-probe" in line or "gpuctk-probe" in line]
    found += glob.glob(os.path.join(tempfile.gettempdir(), "gpuctk-doctor-probe-*"))
    done = subprocess.run(["runc", "list", "-q"], capture_output=True, text=True, check=False)
    found += [n for n in done.stdout.split() if n.startswith(f"gpuctk-doctor-probe-{os.getpid()}")]
    return found


@pytest.mark.parametrize("rootfs", ["host", "image"])
def test_probe_gets_one_gpu_and_cleans_up(
    node: DoctorNode, rootfs: str, image_rootfs: Callable[[str], Path]
) -> None:
    before = leftovers()
    extra = ["--probe"]
    if rootfs == "image":
        extra += ["--probe-rootfs", str(image_rootfs("debian"))]
    code, report, stderr = node.doctor(*extra, "--probe-device", "1:0")
    check = node.check(report, "probe.container")
    assert check["status"] == "warning", (check, stderr)
    evidence = check["evidence"]
    spec_nodes = 4 + 3  # nvidiactl, uvm, uvm-tools, modeset; nvidia1 + GI and CI caps
    assert (
        evidence[0]
        == f"cdi.k8s.io/gpuctk-doctor-probe: nvidia.com/gpu=1:0: {spec_nodes} GPU device node(s)"
        " in the container"
    )
    assert "open /dev/nvidia1: ENXIO (No such device or address)" in evidence
    assert not any(" lack " in e for e in evidence)  # the hook rebuilt the ld cache
    assert "ENXIO" in evidence[-1]
    assert check["fix"].startswith("modprobe nvidia")
    others = {c["id"]: c["status"] for c in report["checks"] if c["id"] != "probe.container"}
    assert set(others.values()) <= {"ok", "skipped"}, {
        k: v for k, v in others.items() if v not in ("ok", "skipped")
    }
    assert code == 1
    assert leftovers() == before


def test_probe_of_a_mounts_spec_finds_the_libraries_in_the_loader_folders(
    node: DoctorNode, image_rootfs: Callable[[str], Path]
) -> None:
    """`--library-mode mounts`: no ld cache entry, the SONAMEs in the loader's own folders;
    the probe says where it found them and does not warn about the ld cache."""
    generate_spec(node.spec, node.profile, node.driver_root, node.roots, node.env,
                  ("--library-mode", "mounts"))  # fmt: skip
    rootfs = ["--probe-rootfs", str(image_rootfs("debian"))]
    _, report, stderr = node.doctor("--probe", *rootfs, "--probe-device", "1:0")
    check = node.check(report, "probe.container")
    evidence = check["evidence"]
    assert any(
        e.startswith("libcuda.so.1: in /usr/lib/x86_64-linux-gnu, a loader system folder")
        for e in evidence
    ), (check, stderr)
    assert not any(" lack " in e for e in evidence), evidence
    assert check["status"] == "warning" and check["fix"].startswith("modprobe nvidia")  # ENXIO


def test_probe_reports_the_shim_error_and_cleans_up(node: DoctorNode, tmp_path: Path) -> None:
    """The shim reads an empty spec dir (its config) while the doctor reads the real one."""
    before = leftovers()
    empty = tmp_path / "empty-cdi"
    empty.mkdir()
    config = tmp_path / "shim.toml"
    runc = shutil.which("runc")
    config.write_text(f'runtimes = ["{runc}"]\nspec-dirs = ["{empty}"]\n')
    code, report, _ = node.doctor(
        "--probe", "--runtime-config", str(config), "--spec-dir", str(node.spec_dir)
    )
    check = node.check(report, "probe.container")
    assert check["status"] == "failed"
    assert check["evidence"][0].endswith("run exited 1")
    assert any(f"no CDI spec found in {empty}" in e for e in check["evidence"])
    assert code == 2
    assert leftovers() == before


def test_probe_of_an_unknown_device_starts_nothing(node: DoctorNode) -> None:
    code, report, _ = node.doctor("--probe", "--probe-device", "9")
    check = node.check(report, "probe.container")
    assert check["status"] == "failed"
    assert check["evidence"] == ["the CDI spec has no device '9'"]
    assert code == 2
