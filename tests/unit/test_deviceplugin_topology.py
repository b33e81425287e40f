"""GetPreferredAllocation's choice (gpuctk.deviceplugin.topology) on the simulated machines,
NVLinks from the profiles, PCIe from a fake sysfs tree (fixtures.fakesys) or NUMA nodes; and
the v1beta1 bytes (gpuctk.deviceplugin.wire) against hand-written ones."""

from __future__ import annotations

from pathlib import Path

from fixtures.fakesys import make_two_socket

from gpuctk.cdi.node import nics
from gpuctk.cdi.node.profile import load_profile, load_profile_document
from gpuctk.deviceplugin import wire
from gpuctk.deviceplugin.resources import Unit, build_units
from gpuctk.deviceplugin.topology import Topology, build, document_nvlinks, preferred


def setup(profile: str, sys_root: str = "/nonexistent", with_nics: bool = False,
          mig: str = "none") -> tuple[dict[str, Unit], list[str], Topology]:  # fmt: skip
    machine = load_profile(profile)
    links = document_nvlinks(load_profile_document(profile), machine)
    found = nics.discover(sys_root) if with_nics else ()
    groups = build_units(machine, mig_strategy=mig, id_strategy="index")
    units = {u.id: u for g in groups.values() for u in g}
    return units, list(units), build(machine, links, sys_root, found)


def test_mixed_links_keep_pairs_whole_after_fragmentation() -> None:
    units, ids, topo = setup("h100nvl-8")
    assert topo.label(0, 2) == "NV12" and topo.label(0, 1) == "NODE" and topo.label(0, 4) == "SYS"
    assert preferred(units, ids, [], 2, topo) == ["0", "2"]
    assert preferred(units, ids, [], 4, topo) == ["0", "1", "2", "3"]  # two pairs, one node
    assert preferred(units, ids, ["4"], 2, topo) == ["4", "6"]
    assert preferred(units, ["1", "2", "3", "5", "6"], [], 2, topo) == ["1", "3"]
    # one GPU: take the one whose partner is gone (2: 0 is allocated), not one of the 1-3 pair
    assert preferred(units, ["1", "2", "3"], [], 1, topo) == ["2"]


def test_pcie_ranks_pairs_where_there_is_no_nvlink(tmp_path: Path) -> None:
    """h100-8's PCIe tree with NVLink taken away: GPU0-GPU1 (PXB) before GPU0-GPU2 (PHB)."""
    sys_root = str(make_two_socket(tmp_path))
    machine = load_profile("h100-8")
    topo = build(machine, {}, sys_root)
    units = {u.id: u for u in build_units(machine, id_strategy="index")["nvidia.com/gpu"]}
    assert [topo.label(0, b) for b in (1, 2, 3, 4)] == ["PXB", "PHB", "NODE", "SYS"]
    assert preferred(units, ["0", "1", "2", "3"], ["0"], 2, topo) == ["0", "1"]
    assert preferred(units, ["0", "2", "3"], ["0"], 2, topo) == ["0", "2"]


def test_nics_prefer_a_gpu_whose_nic_is_free(tmp_path: Path) -> None:
    """fakesys: mlx5_0 is nearest GPU0 (PIX) and GPU1 (PXB), mlx5_1 nearest GPU4. With GPU0
    allocated, mlx5_0 is taken: --nics picks GPU4, without it GPU1 (NUMA 0, lowest)."""
    sys_root = str(make_two_socket(tmp_path))
    units, ids, topo = setup("h100-8", sys_root, with_nics=True)
    assert dict(topo.nearest_nic) == {0: "mlx5_0", 1: "mlx5_0", 4: "mlx5_1"}
    free = ids[1:]
    assert preferred(units, free, [], 1, topo, use_nics=True) == ["4"]
    assert preferred(units, free, [], 1, topo, use_nics=False) != ["4"]


def test_mig_devices_of_one_gpu_go_together() -> None:
    """h100-8-mig7 (56 MIG devices, too many sets to try one by one: filled greedily)."""
    units, ids, topo = setup("h100-8-mig7", mig="mixed")
    assert len(ids) == 56
    chosen = preferred(units, ids[3:], [], 4, topo)
    assert {units[i].gpu for i in chosen} == {0}  # GPU 0's four free ones, not spread
    assert preferred(units, ids, [ids[10]], 2, topo)[1].split(":")[0] == "1"


def test_v1beta1_bytes() -> None:
    opts = wire.options()
    assert opts == b"\x10\x01"  # get_preferred_allocation_available = true
    request = wire.register_request("a.sock", "nvidia.com/gpu", opts)
    assert request == (b'\n\x07v1beta1\x12\x06a.sock\x1a\x0envidia.com/gpu"\x02\x10\x01')
    assert wire.decode_register_request(request) == ("v1beta1", "a.sock", "nvidia.com/gpu",
                                                     (False, True))  # fmt: skip
    listing = wire.list_and_watch([wire.Device("G", wire.HEALTHY, (0,))])
    # Device{ID "G", health "Healthy", topology{nodes [NUMANode{ID 0}]}}
    assert listing == b"\n\x10\n\x01G\x12\x07Healthy\x1a\x02\n\x00"
    answer = wire.allocate_response([wire.ContainerAllocation(cdi_devices=("k=x",))])
    assert answer == b"\n\x07*\x05\n\x03k=x"  # ContainerAllocateResponse.cdi_devices = 5
    assert wire.decode_allocate_response(answer)[0].cdi_devices == ("k=x",)
