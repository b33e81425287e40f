"""Which k devices to prefer: the set with the best links, as `nvidia-smi topo -m` ranks them.

Every pair of GPUs has one link label, best first: `NV<n>` (n NVLinks, more is better; two GPUs
on an NVSwitch fabric have as many as the fewer of their switch links), then the PCIe labels of
gpuctk.cdi.node.topology (PIX, PXB, PHB, NODE, SYS). A pair scores 100 * (100 + n) over n
NVLinks, plus its PCIe label's score (PIX 50 ... SYS 10), which alone ranks PCIe pairs and breaks
ties between equal NVLink pairs (on an NVSwitch fabric, the pair on one NUMA node wins); two MIG
devices of one GPU score highest. A candidate set is ranked by, in order:

1. with `--nics`: how many free RDMA NICs it is nearest to (a NIC is the nearest of a GPU when
   no other NIC is closer to it and it is at most PXB away; free when no allocated GPU has it
   as its nearest), so that a multi-node job gets its GPUDirect RDMA paths;
2. the sum of its pair scores (then the weakest pair): NVLink neighbours before PCIe ones;
3. the fewest links it breaks: the scores between it and the devices left free, so that taking
   one GPU of a bridged pair is avoided while a GPU whose partner is gone is free (packing
   keeps NVLink pairs whole for later requests, the fragmentation rule);
4. the lowest indices, so that the answer is stable.

Small pools are searched exhaustively; a pool too large for that (56 MIG devices) is filled
greedily by the same key.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpuctk.cdi.node import topology as pci
from gpuctk.cdi.node.machine import Machine
from gpuctk.deviceplugin.resources import Unit
from gpuctk.records import record

PCIE_SCORES = {"PIX": 50, "PXB": 40, "PHB": 30, "NODE": 20, "SYS": 10}
SAME_GPU = 1_000_000
NIC_LIMIT = "PXB"  # a NIC farther than this is nobody's nearest
EXHAUSTIVE_LIMIT = 20000  # candidate sets searched one by one; above: greedy


@record
class Topology:
    """Pairwise links between a machine's GPUs (by GPU index), and each GPU's nearest NIC."""

    nvlinks: tuple[tuple[int, int, int], ...] = ()  # (a, b, links) with a < b
    pcie: tuple[tuple[int, int, str], ...] = ()  # (a, b, label) with a < b
    nearest_nic: tuple[tuple[int, str], ...] = ()  # (gpu, NIC name)

    def nvlink_count(self, a: int, b: int) -> int:
        key = (min(a, b), max(a, b))
        return next((n for x, y, n in self.nvlinks if (x, y) == key), 0)

    def pcie_label(self, a: int, b: int) -> str:
        key = (min(a, b), max(a, b))
        return next((label for x, y, label in self.pcie if (x, y) == key), "SYS")

    def label(self, a: int, b: int) -> str:
        """The `nvidia-smi topo -m` label of GPUs a and b."""
        if a == b:
            return "X"
        n = self.nvlink_count(a, b)
        return f"NV{n}" if n else self.pcie_label(a, b)

    def gpu_score(self, a: int, b: int) -> int:
        if a == b:
            return SAME_GPU
        n = self.nvlink_count(a, b)
        return (100 * (100 + n) if n else 0) + PCIE_SCORES.get(self.pcie_label(a, b), 0)


def nvlink_pairs(
    direct: Mapping[tuple[int, int], int], switch: Mapping[int, int]
) -> dict[tuple[int, int], int]:
    """Links per GPU pair from direct links ((a, b) -> n) and switch links (gpu -> n)."""
    out: dict[tuple[int, int], int] = {}
    for (a, b), n in direct.items():
        key = (min(a, b), max(a, b))
        out[key] = out.get(key, 0) + n
    gpus = sorted(switch)
    for i, a in enumerate(gpus):
        for b in gpus[i + 1 :]:
            shared = min(switch[a], switch[b])
            if shared:
                out[(a, b)] = out.get((a, b), 0) + shared
    return out


def document_nvlinks(doc: Mapping[str, Any], machine: Machine) -> dict[tuple[int, int], int]:
    """The NVLinks a machine profile document describes (`nvlinks: {switch: N, pairs: [[a, b,
    n], ...]}`), as nvlink_pairs gives them."""
    table = doc.get("nvlinks") or {}
    switch = {g.index: int(table["switch"]) for g in machine.gpus} if table.get("switch") else {}
    direct: dict[tuple[int, int], int] = {}
    for a, b, n in table.get("pairs") or []:
        direct[(int(a), int(b))] = direct.get((int(a), int(b)), 0) + int(n)
    return nvlink_pairs(direct, switch)


def build(
    machine: Machine,
    nvlinks: Mapping[tuple[int, int], int],
    sys_root: str,
    nics: Sequence[Any] = (),
) -> Topology:
    """The Topology of `machine`: NVLinks as given, PCIe labels and NICs from sysfs at
    `sys_root` (NUMA nodes where sysfs does not list a device)."""
    gpus = machine.gpus
    pcie = []
    for i, a in enumerate(gpus):
        for b in gpus[i + 1 :]:
            label = pci.distance(sys_root, a.pci_bus_id, a.numa_node, b.pci_bus_id, b.numa_node)
            pcie.append((min(a.index, b.index), max(a.index, b.index), label))
    nearest = []
    for g in gpus:
        best: tuple[int, str] | None = None
        for nic in nics:
            address = nic.pci.address if nic.pci is not None else None
            label = pci.distance(sys_root, g.pci_bus_id, g.numa_node, address, nic.numa_node)
            if pci.rank(label) <= pci.rank(NIC_LIMIT) and (
                best is None or pci.rank(label) < best[0]
            ):
                best = (pci.rank(label), nic.name)
        if best is not None:
            nearest.append((g.index, best[1]))
    links = tuple(sorted((a, b, n) for (a, b), n in nvlinks.items() if n > 0))
    return Topology(nvlinks=links, pcie=tuple(sorted(pcie)), nearest_nic=tuple(nearest))


def pair_score(topo: Topology, a: Unit, b: Unit) -> int:
    return topo.gpu_score(a.gpu, b.gpu)


def _order(unit: Unit) -> tuple[int, ...]:
    return (unit.gpu, *(int(p) for p in unit.index_name.split(":")[1:]))


def preferred(
    units: Mapping[str, Unit],
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    topo: Topology,
    use_nics: bool = False,
) -> list[str]:
    """The IDs to prefer for one container: every `must_include`, then the best of
    `available` (IDs this plugin does not know are never chosen)."""
    must = [i for i in dict.fromkeys(must_include) if i in units]
    if len(must) >= size:
        return must[:size]
    pool = sorted(
        (i for i in dict.fromkeys(available) if i in units and i not in must),
        key=lambda i: _order(units[i]),
    )
    need = min(size - len(must), len(pool))
    free_gpus = {units[i].gpu for i in (*pool, *must)}
    nic_of = dict(topo.nearest_nic)
    taken_nics = {n for g, n in nic_of.items() if g not in free_gpus}

    def key(chosen: Sequence[str]) -> tuple[int, ...]:
        members = [units[i] for i in (*must, *chosen)]
        scores = [pair_score(topo, a, b) for a, b in itertools.combinations(members, 2)]
        rest = [units[i] for i in pool if i not in chosen]
        broken = sum(pair_score(topo, a, b) for a in members for b in rest)
        nics = {nic_of[u.gpu] for u in members if u.gpu in nic_of} - taken_nics
        order = [-p for i in chosen for p in _order(units[i])]
        return (len(nics) if use_nics else 0, sum(scores), min(scores, default=0), -broken, *order)

    if math.comb(len(pool), need) <= EXHAUSTIVE_LIMIT:
        best = max(itertools.combinations(pool, need), key=key, default=())
        return [*must, *best]
    chosen: list[str] = []
    for _ in range(need):
        nxt = max((i for i in pool if i not in chosen), key=lambda i: key([*chosen, i]))
        chosen.append(nxt)
    return [*must, *chosen]
