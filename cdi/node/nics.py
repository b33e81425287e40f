"""RDMA network cards from sysfs: their verbs/CM/MAD device nodes, netdevs, PCI place and NUMA.

Everything comes from sysfs (pure functions over a root, so tests use fake trees):

    <sys>/class/infiniband/<dev>              one RDMA device (mlx5_0), `device` -> its PCI dir
    <sys>/class/infiniband/<dev>/device/net/* its network interfaces (ens1f0np0, ib0)
    <sys>/class/infiniband/<dev>/ports/<n>/link_layer    "InfiniBand" or "Ethernet" (RoCE)
    <sys>/class/infiniband_verbs/uverbs<N>    `ibdev` names the device, `dev` is "major:minor"
    <sys>/class/infiniband_mad/umad<N>, issm<N>   the same, per port
    <sys>/class/misc/rdma_cm                  /dev/infiniband/rdma_cm, shared by all devices
    <sys>/module/ib_core/parameters/netns_mode  Y: RDMA devices shared by all network
                                              namespaces (the default); N: exclusive

The device nodes live under /dev/infiniband/ with the sysfs names (udev's rule).
"""

from __future__ import annotations

import os

from gpuctk.cdi.node.topology import PciPath, path_of_dir, read_numa
from gpuctk.records import record

DEV_DIR = "/dev/infiniband"


@record
class CharNode:
    """A character device node: its path in /dev and its numbers."""

    path: str  # "/dev/infiniband/uverbs0"
    major: int
    minor: int


@record
class Nic:
    """One RDMA device (an HCA port set, or a RoCE function)."""

    name: str  # "mlx5_0"
    pci: PciPath | None  # None for a device with no PCI parent (rxe, siw)
    numa_node: int | None
    netdevs: tuple[str, ...]  # ("ens1f0np0",)
    link_layers: tuple[str, ...]  # per port: ("Ethernet",) or ("InfiniBand",)
    nodes: tuple[CharNode, ...]  # uverbs, umad, issm of this device (not rdma_cm)

    @property
    def pci_address(self) -> str | None:
        return self.pci.address if self.pci is not None else None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path), key=_natural)
    except OSError:
        return []


def _natural(name: str) -> tuple[str, int, str]:
    """umad2 before umad10."""
    head = name.rstrip("0123456789")
    tail = name[len(head) :]
    return (head, int(tail) if tail else -1, name)


def char_node(class_dir: str, name: str) -> CharNode | None:
    """The node of `<class_dir>/<name>` from its `dev` file ("231:192")."""
    dev = _read(os.path.join(class_dir, name, "dev"))
    if not dev or ":" not in dev:
        return None
    major, _, minor = dev.partition(":")
    if not (major.isdigit() and minor.isdigit()):
        return None
    return CharNode(f"{DEV_DIR}/{name}", int(major), int(minor))


def _nodes_by_ibdev(sys_root: str, class_name: str) -> dict[str, list[CharNode]]:
    class_dir = os.path.join(sys_root, "class", class_name)
    out: dict[str, list[CharNode]] = {}
    for name in _listdir(class_dir):
        ibdev = _read(os.path.join(class_dir, name, "ibdev"))
        node = char_node(class_dir, name)
        if ibdev and node is not None:
            out.setdefault(ibdev, []).append(node)
    return out


def rdma_cm_node(sys_root: str) -> CharNode | None:
    """/dev/infiniband/rdma_cm (a misc device), shared by every RDMA device."""
    return char_node(os.path.join(sys_root, "class", "misc"), "rdma_cm")


def discover(sys_root: str = "/sys") -> tuple[Nic, ...]:
    """Every RDMA device under `sys_root`, sorted by name (mlx5_2 before mlx5_10)."""
    ib_dir = os.path.join(sys_root, "class", "infiniband")
    verbs = _nodes_by_ibdev(sys_root, "infiniband_verbs")
    mads = _nodes_by_ibdev(sys_root, "infiniband_mad")
    nics = []
    for name in _listdir(ib_dir):
        dev_dir = os.path.join(ib_dir, name)
        parent = os.path.join(dev_dir, "device")
        pci = path_of_dir(sys_root, parent) if os.path.isdir(parent) else None
        numa = pci.numa_node if pci is not None else None
        if numa is None and os.path.isdir(parent):
            numa = read_numa(parent)
        ports = _listdir(os.path.join(dev_dir, "ports"))
        layers = tuple(
            _read(os.path.join(dev_dir, "ports", p, "link_layer")) or "unknown" for p in ports
        )
        nics.append(
            Nic(
                name=name,
                pci=pci,
                numa_node=numa,
                netdevs=tuple(_listdir(os.path.join(parent, "net"))),
                link_layers=layers,
                nodes=(*verbs.get(name, []), *mads.get(name, [])),
            )
        )
    return tuple(nics)


def exclusive_netns_mode(sys_root: str = "/sys") -> bool:
    """Whether ib_core runs in exclusive network-namespace mode (`rdma system` says
    "netns exclusive"): each RDMA device then belongs to one namespace and must move with
    its netdev. False when ib_core is not loaded or shared (the default)."""
    value = _read(os.path.join(sys_root, "module", "ib_core", "parameters", "netns_mode"))
    return value is not None and value.upper() in ("N", "0")


def rdma_devices_of_netdev(sys_root: str, netdev: str) -> list[str]:
    """The RDMA devices behind a network interface (its PCI function's infiniband/ folder)."""
    return _listdir(os.path.join(sys_root, "class", "net", netdev, "device", "infiniband"))
