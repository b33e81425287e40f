"""PCI topology from sysfs: where a device sits, and how far apart two devices are.

A PCI device's sysfs directory is reached through `/sys/bus/pci/devices/<address>`, a symlink
into `/sys/devices/pci<domain>:<bus>/<root port>/<switch ports>.../<address>`: the realpath is
the device's path from its host bridge down. Two devices' paths tell their link type, the way
`nvidia-smi topo -m` names it (closest first):

    X     the same device
    PIX   at most one PCIe bridge/switch between them (same switch, or functions of one card)
    PXB   several PCIe switches, without crossing the host bridge
    PHB   through the PCIe host bridge (the CPU's root complex): same host bridge, other ports
    NODE  across host bridges within one NUMA node
    SYS   across NUMA nodes (the SMP interconnect between sockets: UPI, xGMI)

Devices missing from sysfs (a `--simulate` machine, say) fall back to their NUMA nodes: NODE
when both are on the same node, SYS otherwise. Pure functions over a sysfs root so that tests
use fake trees.
"""

from __future__ import annotations

import os

from gpuctk.records import record

LINK_TYPES = ("X", "PIX", "PXB", "PHB", "NODE", "SYS")  # closest first
LINK_HELP = {
    "X": "self",
    "PIX": "at most one PCIe switch between them",
    "PXB": "several PCIe switches, not through the host bridge",
    "PHB": "through a PCIe host bridge (same CPU root complex)",
    "NODE": "across PCIe host bridges within one NUMA node",
    "SYS": "across NUMA nodes (the inter-socket link)",
}


@record
class PciPath:
    """A PCI device's place: its chain from the host bridge (`pci0000:00`) down to itself."""

    address: str  # "0000:18:00.0"
    chain: tuple[str, ...]  # ("pci0000:00", "0000:00:01.0", "0000:01:00.0", ..., address)
    numa_node: int | None  # None when sysfs says -1 or nothing

    @property
    def host_bridge(self) -> str:
        return self.chain[0]


def normalize_address(bus_id: str) -> str:
    """NVML's "00000000:18:00.0" (or "0000:18:00.0", "18:00.0") -> sysfs "0000:18:00.0"."""
    bus_id = bus_id.strip().lower()
    parts = bus_id.split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    if len(parts) != 3:
        return bus_id
    domain, bus, devfn = parts
    return f"{int(domain, 16):04x}:{bus.zfill(2)}:{devfn}"


def read_numa(device_dir: str) -> int | None:
    """The `numa_node` file of a sysfs device directory; None for -1, missing or malformed."""
    try:
        with open(os.path.join(device_dir, "numa_node"), encoding="ascii") as f:
            value = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def pci_path(sys_root: str, address: str) -> PciPath | None:
    """Where PCI device `address` sits under `sys_root`; None when sysfs does not list it."""
    address = normalize_address(address)
    link = os.path.join(sys_root, "bus", "pci", "devices", address)
    if not os.path.exists(link):
        return None
    return path_of_dir(sys_root, os.path.realpath(link))


def path_of_dir(sys_root: str, device_dir: str) -> PciPath | None:
    """The PciPath of a resolved sysfs device directory (under <sys_root>/devices)."""
    devices = os.path.join(os.path.realpath(sys_root), "devices")
    real = os.path.realpath(device_dir)
    rel = os.path.relpath(real, devices)
    if rel.startswith("..") or rel == ".":
        return None
    chain = tuple(p for p in rel.split(os.sep) if p)
    if not chain or not chain[0].startswith("pci"):
        return None
    return PciPath(address=chain[-1], chain=chain, numa_node=read_numa(real))


def numa_link(a: int | None, b: int | None) -> str:
    """The link type of two devices known only by NUMA node: NODE if the same node, else SYS."""
    return "NODE" if a == b else "SYS"


def link_type(a: PciPath, b: PciPath) -> str:
    """The `nvidia-smi topo -m` link type between two PCI devices."""
    if a.address == b.address:
        return "X"
    if a.host_bridge != b.host_bridge:
        return numa_link(a.numa_node, b.numa_node)
    common = 0
    for x, y in zip(a.chain, b.chain, strict=False):
        if x != y:
            break
        common += 1
    if common <= 1:
        return "PHB"  # they meet only at the host bridge: different root ports
    # Bridges strictly between each device and the place where their paths meet. A PCIe
    # switch shows up as an upstream port with one downstream port per device below it, so one
    # switch leaves at most one bridge on each side; more means more switches.
    below = max(len(a.chain) - common - 1, len(b.chain) - common - 1)
    return "PIX" if below <= 1 else "PXB"


def rank(link: str) -> int:
    """Sort key: lower is closer."""
    return LINK_TYPES.index(link)


def distance(
    sys_root: str,
    a_address: str | None,
    a_numa: int | None,
    b_address: str | None,
    b_numa: int | None,
) -> str:
    """Link type between two devices by PCI address, falling back to NUMA nodes."""
    pa = pci_path(sys_root, a_address) if a_address else None
    pb = pci_path(sys_root, b_address) if b_address else None
    if pa is not None and pb is not None:
        return link_type(pa, pb)
    na = pa.numa_node if pa is not None and pa.numa_node is not None else a_numa
    nb = pb.numa_node if pb is not None and pb.numa_node is not None else b_numa
    return numa_link(na, nb)
