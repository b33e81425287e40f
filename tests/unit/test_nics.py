"""RDMA NIC discovery from fake sysfs, and the NIC spec (`gpuctk cdi generate --nics`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures.fakesys import make_two_socket

from gpuctk.cdi import nicspec
from gpuctk.cdi.node import nics
from gpuctk.cdi.node.profile import load_profile
from gpuctk.cdi.specs.schema import load_checker
from gpuctk.cdi.specs.validate import validate_spec_dict
from gpuctk.errors import NoDevicesError

GPUCTK = str(Path(sys.executable).with_name("gpuctk"))
SCHEMA_DIR = Path(__file__).resolve().parents[2].parent / "shared/vendor-data/cdi-schema"


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    return make_two_socket(tmp_path / "sys")


def valid(doc: dict[str, Any]) -> None:
    """Valid under the strict validator and, when vendored, the CDI schema."""
    checker = load_checker(SCHEMA_DIR) if (SCHEMA_DIR / "schema.json").is_file() else None
    assert validate_spec_dict(doc, "nic spec", schema=checker) == []


def test_discovery(sysfs: Path) -> None:
    found = nics.discover(str(sysfs))
    assert [n.name for n in found] == ["mlx5_0", "mlx5_1", "mlx5_2"]
    nic0, nic1, nic2 = found
    assert nic0.pci_address == "0000:19:00.0" and nic0.numa_node == 0
    assert nic0.netdevs == ("ens1f0np0",) and nic0.link_layers == ("Ethernet",)
    assert nic2.netdevs == ("ib0",) and nic2.link_layers == ("InfiniBand",)
    assert nic1.numa_node == 1
    assert nic1.nodes == (
        nics.CharNode("/dev/infiniband/uverbs1", 231, 193),
        nics.CharNode("/dev/infiniband/issm1", 231, 65),
        nics.CharNode("/dev/infiniband/umad1", 231, 1),
    )
    assert nics.rdma_cm_node(str(sysfs)) == nics.CharNode("/dev/infiniband/rdma_cm", 10, 58)


def test_no_rdma_at_all(tmp_path: Path) -> None:
    assert nics.discover(str(tmp_path)) == ()
    assert nics.rdma_cm_node(str(tmp_path)) is None
    assert nics.exclusive_netns_mode(str(tmp_path)) is False  # ib_core not loaded


def test_netns_mode_and_netdev_to_rdma(tmp_path: Path) -> None:
    shared = make_two_socket(tmp_path / "shared")
    exclusive = make_two_socket(tmp_path / "exclusive", netns_mode="N")
    assert nics.exclusive_netns_mode(str(shared)) is False
    assert nics.exclusive_netns_mode(str(exclusive)) is True
    assert nics.rdma_devices_of_netdev(str(shared), "ens2f0np0") == ["mlx5_1"]
    assert nics.rdma_devices_of_netdev(str(shared), "eth0") == []


def devices(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d["containerEdits"] for d in doc["devices"]}


def nodes(edits: dict[str, Any]) -> list[str]:
    return [n["path"] for n in edits["deviceNodes"]]


def moved(edits: dict[str, Any]) -> list[str]:
    create, stop = edits["hooks"]
    assert create["hookName"] == "createRuntime" and create["env"]
    assert stop["hookName"] == "poststop" and stop["env"] == create["env"]
    args = create["args"]
    assert args[:2] == ["gpuctk-hook", "createRuntime"]
    assert stop["args"] == ["gpuctk-hook", "poststop", *args[2:]]
    return [args[i + 1] for i, a in enumerate(args) if a == "--netdev"]


def test_spec_hook_mode_affinity(sysfs: Path) -> None:
    machine = load_profile("h100-8")
    found = nics.discover(str(sysfs))
    doc = nicspec.build_doc(
        machine, found, nics.rdma_cm_node(str(sysfs)), sys_root=str(sysfs), uuid_names=False
    )
    valid(doc)
    assert doc["cdiVersion"] == "0.3.0"  # nothing in it needs more: any engine reads it
    by_name = devices(doc)
    assert nodes(by_name["mlx5_0"]) == [
        "/dev/infiniband/uverbs0",
        "/dev/infiniband/issm0",
        "/dev/infiniband/umad0",
        "/dev/infiniband/rdma_cm",
    ]
    assert by_name["mlx5_0"]["deviceNodes"][0] == {
        "path": "/dev/infiniband/uverbs0",
        "type": "c",
        "major": 231,
        "minor": 192,
    }
    assert moved(by_name["mlx5_0"]) == ["ens1f0np0"]
    # The affine devices: each GPU's closest NIC(s), never across sockets (NODE default).
    expected = {
        "gpu0": ["ens1f0np0"],  # PIX
        "gpu1": ["ens1f0np0"],  # PXB
        "gpu2": ["ens1f0np0"],  # PHB
        "gpu3": ["ens1f0np0"],  # NODE (other host bridge, same socket)
        "gpu4": ["ens2f0np0"],  # PIX
        "gpu5": ["ens2f0np0", "ib0"],  # not in sysfs: NUMA 1 -> both socket-1 NICs at NODE
        "gpu6": ["ens2f0np0", "ib0"],
        "gpu7": ["ens2f0np0", "ib0"],
    }
    assert {n: moved(e) for n, e in by_name.items() if n.startswith("gpu")} == expected
    assert "/dev/infiniband/uverbs1" in nodes(by_name["gpu5"])
    assert "/dev/infiniband/uverbs0" not in nodes(by_name["gpu5"])
    assert moved(by_name["all"]) == ["ens1f0np0", "ens2f0np0", "ib0"]


def test_affinity_limit_and_off(sysfs: Path) -> None:
    machine = load_profile("h100-8")
    found = nics.discover(str(sysfs))
    pix = devices(nicspec.build_doc(machine, found, None, sys_root=str(sysfs), affinity="PIX"))
    assert {n for n in pix if n.startswith("gpu")} == {"gpu0", "gpu4"}
    uuid0 = machine.gpus[0].uuid
    assert uuid0 in pix  # the uuid strategy's name for the same device
    off = devices(nicspec.build_doc(machine, found, None, sys_root=str(sysfs), affinity="off"))
    assert set(off) == {"mlx5_0", "mlx5_1", "mlx5_2", "all"}


def test_spec_netdevices_mode_needs_cdi_11(sysfs: Path) -> None:
    machine = load_profile("h100-8")
    found = nics.discover(str(sysfs))
    doc = nicspec.build_doc(machine, found, None, sys_root=str(sysfs), mode="netdevices")
    valid(doc)
    assert doc["cdiVersion"] == "1.1.0"
    edits = devices(doc)["mlx5_2"]
    assert edits["netDevices"] == [{"hostInterfaceName": "ib0", "name": "ib0"}]
    assert "hooks" not in edits
    # The same document claiming an older version is refused by the validator.
    old = dict(doc, cdiVersion="1.0.0")
    assert any("netDevices" in p for p in validate_spec_dict(old))


def test_dev_root_gives_host_paths(sysfs: Path, tmp_path: Path) -> None:
    machine = load_profile("l4")
    found = nics.discover(str(sysfs))
    doc = nicspec.build_doc(
        machine, found, None, sys_root=str(sysfs), dev_root=str(tmp_path / "host")
    )
    valid(doc)
    node = devices(doc)["mlx5_0"]["deviceNodes"][0]
    assert node["hostPath"] == f"{tmp_path}/host/dev/infiniband/uverbs0"
    assert doc["cdiVersion"] == "0.5.0"  # hostPath


def generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPUCTK, "cdi", "generate", "--simulate", "h100-8", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_writes_both_specs(sysfs: Path, tmp_path: Path) -> None:
    out = tmp_path / "nvidia.json"
    p = generate("--sys-root", str(sysfs), "--nics", "--output", str(out))
    assert p.returncode == 0, p.stderr
    gpu = json.loads(out.read_text())
    nic = json.loads((tmp_path / "nvidia-nic.json").read_text())
    assert gpu["kind"] == "nvidia.com/gpu" and gpu["cdiVersion"] == "0.5.0"  # GPU spec untouched
    assert nic["kind"] == "nvidia.com/nic"
    assert {"mlx5_0", "gpu0", "all"} <= set(devices(nic))
    valid(nic)
    assert "wrote" in p.stderr and "GPU-affine" in p.stderr


def test_cli_stdout_yaml_has_two_documents(sysfs: Path) -> None:
    p = generate("--sys-root", str(sysfs), "--nics", "--nic-kind", "example.com/rdma")
    assert p.returncode == 0, p.stderr
    gpu, nic = yaml.safe_load_all(p.stdout)
    assert gpu["kind"] == "nvidia.com/gpu" and nic["kind"] == "example.com/rdma"


def test_cli_without_nics_flag_reads_no_nic(sysfs: Path) -> None:
    p = generate("--sys-root", str(sysfs))
    assert p.returncode == 0, p.stderr
    assert len(list(yaml.safe_load_all(p.stdout))) == 1


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--nic-kind", "nvidia.com/gpu"], "GPU spec's kind"),
        (["--nic-kind", "bad"], "--nic-kind"),
        (["--format", "json"], "give --output or --nic-output"),
    ],
)
def test_cli_bad_nic_options(sysfs: Path, args: list[str], words: str) -> None:
    p = generate("--sys-root", str(sysfs), "--nics", *args)
    assert p.returncode != 0
    assert p.stdout == ""
    assert words in p.stderr


def test_cli_warns_when_no_rdma(tmp_path: Path) -> None:
    out = tmp_path / "nvidia.yaml"
    p = generate("--sys-root", str(tmp_path), "--nics", "--output", str(out))
    assert p.returncode == 0, p.stderr
    assert "no usable RDMA device" in p.stderr
    assert out.exists() and not (tmp_path / "nvidia-nic.yaml").exists()


def test_cli_warns_in_exclusive_mode(tmp_path: Path) -> None:
    sysfs = make_two_socket(tmp_path / "sys", netns_mode="N")
    p = generate("--sys-root", str(sysfs), "--nics", "--output", str(tmp_path / "n.yaml"))
    assert p.returncode == 0, p.stderr
    assert "exclusive network-namespace mode" in p.stderr


def test_virtual_rdma_device_without_pci_or_nodes(tmp_path: Path) -> None:
    """A soft-RoCE style device: no PCI parent, no verbs node yet; listed, not crashing."""
    virtual = tmp_path / "devices/virtual/infiniband/rxe0"
    (virtual / "ports/1").mkdir(parents=True)
    (virtual / "ports/1/link_layer").write_text("Ethernet\n")
    (tmp_path / "class/infiniband").mkdir(parents=True)
    (tmp_path / "class/infiniband/rxe0").symlink_to(virtual)
    (rxe,) = nics.discover(str(tmp_path))
    assert (rxe.name, rxe.pci, rxe.numa_node, rxe.netdevs, rxe.nodes) == (
        "rxe0",
        None,
        None,
        (),
        (),
    )
    with pytest.raises(NoDevicesError):  # it would give a container nothing: left out
        nicspec.build_doc(load_profile("l4"), (rxe,), None, sys_root=str(tmp_path))
    p = generate("--sys-root", str(tmp_path), "--nics", "--output", str(tmp_path / "n.yaml"))
    assert p.returncode == 0, p.stderr
    assert "rxe0: no device nodes and no network interfaces" in p.stderr
    assert not (tmp_path / "n-nic.yaml").exists()


def test_device_id_limits_affine_devices(sysfs: Path, tmp_path: Path) -> None:
    out = tmp_path / "nvidia.json"
    p = generate("--sys-root", str(sysfs), "--nics", "--device-id", "4", "--output", str(out))
    assert p.returncode == 0, p.stderr
    nic = json.loads((tmp_path / "nvidia-nic.json").read_text())
    uuid4 = load_profile("h100-8").gpus[4].uuid
    assert set(devices(nic)) == {"mlx5_0", "mlx5_1", "mlx5_2", "gpu4", uuid4, "all"}
    assert moved(devices(nic)["gpu4"]) == ["ens2f0np0"]
