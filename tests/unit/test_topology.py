"""PCI link types from fake sysfs trees (tests/fixtures/fakesys.py: two sockets, PCIe switches)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.fakesys import add_pci, make_two_socket

from gpuctk.cdi.node import topology

NIC0 = "0000:19:00.0"  # mlx5_0 under switch A, socket 0
NIC1 = "0000:9b:00.0"  # mlx5_1 under switch C, socket 1
NIC2 = "0000:c1:00.0"  # mlx5_2 on its own host bridge, socket 1


@pytest.fixture
def sysfs(tmp_path: Path) -> str:
    return str(make_two_socket(tmp_path / "sys"))


def link(sysfs: str, a: str, b: str) -> str:
    pa, pb = topology.pci_path(sysfs, a), topology.pci_path(sysfs, b)
    assert pa is not None and pb is not None
    return topology.link_type(pa, pb)


@pytest.mark.parametrize(
    ("gpu", "nic", "expected"),
    [
        ("0000:18:00.0", NIC0, "PIX"),  # same switch
        ("0000:2a:00.0", NIC0, "PXB"),  # behind a second switch
        ("0000:3a:00.0", NIC0, "PHB"),  # another root port of the same host bridge
        ("0000:5d:00.0", NIC0, "NODE"),  # another host bridge, same NUMA node
        ("0000:9a:00.0", NIC0, "SYS"),  # other socket
        ("0000:9a:00.0", NIC1, "PIX"),
        ("0000:9a:00.0", NIC2, "NODE"),
        ("0000:18:00.0", NIC1, "SYS"),
        ("0000:18:00.0", "0000:18:00.0", "X"),
    ],
)
def test_link_types(sysfs: str, gpu: str, nic: str, expected: str) -> None:
    assert link(sysfs, gpu, nic) == expected
    assert link(sysfs, nic, gpu) == expected  # symmetric


def test_pci_path_from_sysfs(sysfs: str) -> None:
    path = topology.pci_path(sysfs, "00000000:2A:00.0")  # NVML's form, upper case
    assert path is not None
    assert path.address == "0000:2a:00.0"
    assert path.host_bridge == "pci0000:00"
    assert path.chain[1:3] == ("0000:00:01.0", "0000:10:00.0")
    assert path.numa_node == 0
    assert topology.pci_path(sysfs, "0000:ab:00.0") is None  # not in sysfs


def test_functions_of_one_card_are_pix(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    add_pci(root, "pci0000:00/0000:00:03.0/0000:04:00.0", 0)
    add_pci(root, "pci0000:00/0000:00:03.0/0000:04:00.1", 0)
    assert link(str(root), "0000:04:00.0", "0000:04:00.1") == "PIX"


def test_unknown_numa_is_one_node(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    add_pci(root, "pci0000:00/0000:00:01.0/0000:01:00.0", None)
    add_pci(root, "pci0000:40/0000:40:01.0/0000:41:00.0", None)
    assert link(str(root), "0000:01:00.0", "0000:41:00.0") == "NODE"  # single-node machines: -1


def test_distance_falls_back_to_numa(sysfs: str) -> None:
    # GPU 5 of h100-8 (ab:00.0) is not in this sysfs: its NUMA node from NVML decides.
    assert topology.distance(sysfs, "00000000:ab:00.0", 1, NIC1, None) == "NODE"
    assert topology.distance(sysfs, "00000000:ab:00.0", 1, NIC0, None) == "SYS"
    assert topology.distance(sysfs, None, 0, None, 0) == "NODE"
    assert topology.distance(sysfs, "00000000:18:00.0", None, NIC0, None) == "PIX"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("00000000:18:00.0", "0000:18:00.0"),
        ("0000:18:00.0", "0000:18:00.0"),
        ("18:00.0", "0000:18:00.0"),
        ("00000001:AB:00.1", "0001:ab:00.1"),
    ],
)
def test_normalize_address(raw: str, expected: str) -> None:
    assert topology.normalize_address(raw) == expected


def test_ranks_follow_nvidia_smi_order() -> None:
    ranks = [topology.rank(t) for t in ("X", "PIX", "PXB", "PHB", "NODE", "SYS")]
    assert ranks == sorted(ranks)
