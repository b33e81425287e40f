"""`gpuctk info` as run: simulated and fake-NVML machines over a fake two-socket sysfs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fixtures.fakesys import make_two_socket

from gpuctk.cdi import info
from gpuctk.cdi.node import nics
from gpuctk.cdi.node.profile import load_profile

GPUCTK = str(Path(sys.executable).with_name("gpuctk"))


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPUCTK, "info", *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    return make_two_socket(tmp_path / "sys")


def cell(report: dict[str, Any], a: str, b: str) -> str:
    names = report["topology"]["devices"]
    return str(report["topology"]["matrix"][names.index(a)][names.index(b)])


def test_json_report(sysfs: Path) -> None:
    p = run("--simulate", "h100-8", "--sys-root", str(sysfs), "--format", "json")
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["driver_version"] == "535.309.01" and report["cuda_driver_version"] == "12.2"
    assert [g["index"] for g in report["gpus"]] == list(range(8))
    assert report["gpus"][0]["pci_bus_id"] == "00000000:18:00.0"
    assert [n["name"] for n in report["nics"]] == ["mlx5_0", "mlx5_1", "mlx5_2"]
    assert report["nics"][0]["netdevs"] == ["ens1f0np0"]
    assert report["rdma_netns_mode"] == "shared"
    topo = report["topology"]
    assert topo["devices"] == [f"GPU{i}" for i in range(8)] + ["NIC0", "NIC1", "NIC2"]
    matrix = topo["matrix"]
    assert all(matrix[i][j] == matrix[j][i] for i in range(11) for j in range(11))
    assert all(matrix[i][i] == "X" for i in range(11))
    # GPU <-> NIC, GPU <-> GPU by PCI path; GPUs 5-7 (not in sysfs) by NUMA node.
    assert cell(report, "GPU0", "NIC0") == "PIX"
    assert cell(report, "GPU1", "NIC0") == "PXB"
    assert cell(report, "GPU2", "NIC0") == "PHB"
    assert cell(report, "GPU3", "NIC0") == "NODE"
    assert cell(report, "GPU4", "NIC1") == "PIX"
    assert cell(report, "GPU0", "GPU1") == "PXB"
    assert cell(report, "GPU0", "GPU4") == "SYS"
    assert cell(report, "GPU5", "NIC2") == "NODE"
    assert topo["numa_nodes"][-3:] == [0, 1, 1]


def test_table(sysfs: Path) -> None:
    p = run("--simulate", "h100-8", "--sys-root", str(sysfs))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("Driver 535.309.01  CUDA 12.2")
    assert "RDMA NICs (netns mode: shared)" in lines
    (row,) = [ln for ln in lines if ln.startswith("GPU0 ")]
    assert row.split() == ["GPU0", "X", "PXB", "PHB", "NODE"] + ["SYS"] * 4 + [
        "PIX",
        "SYS",
        "SYS",
        "0",
    ]
    assert any(ln.split()[:2] == ["NIC2", "mlx5_2"] and "InfiniBand" in ln for ln in lines)
    assert "Legend:" in lines


def test_mig_devices_with_profiles(tmp_path: Path) -> None:
    p = run("--simulate", "a100-mig", "--sys-root", str(tmp_path), "--format", "json")
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    migs = {m["name"]: m for m in report["mig_devices"]}
    assert migs["2:0"]["profile"] == "3g.20gb" and migs["2:0"]["parent_index"] == 2
    assert report["nics"] == [] and report["rdma_netns_mode"] is None
    # No sysfs: GPU-GPU links from their NUMA nodes alone.
    assert cell(report, "GPU0", "GPU1") == "NODE" and cell(report, "GPU0", "GPU2") == "SYS"
    table = run("--simulate", "a100-mig", "--sys-root", str(tmp_path)).stdout
    assert "MIG devices" in table and "3g.20gb" in table and "RDMA NICs" not in table


def test_through_nvml(sysfs: Path, fake_nvml_env: Any) -> None:
    env = fake_nvml_env("h100-8")
    p = run(
        "--nvml-library", env["FAKE_NVML_LIBRARY"], "--sys-root", str(sysfs), "--format", "json",
        env=env,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["source"] == "NVML"
    assert report["gpus"][0]["uuid"] == load_profile("h100-8").gpus[0].uuid
    assert cell(report, "GPU0", "NIC0") == "PIX"


def test_device_node_presence(sysfs: Path, tmp_path: Path) -> None:
    dev_root = tmp_path / "root"
    (dev_root / "dev/infiniband").mkdir(parents=True)
    (dev_root / "dev/nvidia0").touch()
    (dev_root / "dev/infiniband/uverbs0").touch()
    report = info.describe(
        load_profile("h100-8"),
        nics.discover(str(sysfs)),
        sys_root=str(sysfs),
        dev_root=str(dev_root),
        source="test",
    )
    assert [g["device_node_present"] for g in report["gpus"][:2]] == [True, False]
    assert [d["present"] for d in report["nics"][0]["device_nodes"]] == [True, False, False]


def test_errors_are_one_line(tmp_path: Path) -> None:
    p = run("--nvml-library", str(tmp_path / "none.so"))
    assert p.returncode != 0 and p.stdout == ""
    assert p.stderr.startswith("gpuctk: error: ") and len(p.stderr.splitlines()) == 1
    p = run("--simulate", "l4", "--driver-root", str(tmp_path / "missing"))
    assert p.returncode != 0 and "--driver-root" in p.stderr
