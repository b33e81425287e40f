"""`--additional-gids`: each device lists its group-only nodes' groups (CDI 0.7.0, only then)."""

from __future__ import annotations

from typing import Any

from gpuctk.cdi.generate import NodeLookup, Options, build_spec, group_gids
from gpuctk.cdi.node.devnodes import NodeInfo
from gpuctk.cdi.node.driverfiles import DriverFiles
from gpuctk.cdi.node.machine import Gpu
from gpuctk.cdi.node.profile import load_profile
from gpuctk.cdi.simulate import simulated_nodes

RENDER, VIDEO = 993, 44


def node(path: str, minor: int, mode: int, gid: int) -> NodeInfo:
    return NodeInfo(path, path, "c", 226, minor, mode, gid)


def test_group_gids_takes_group_only_nodes() -> None:
    nodes = [
        node("/dev/dri/renderD128", 128, 0o660, RENDER),
        node("/dev/dri/card1", 1, 0o660, VIDEO),
        node("/dev/dri/card2", 2, 0o666, VIDEO),  # everyone may open it: no group needed
        node("/dev/dri/card3", 3, 0o640, VIDEO),  # the group may not write: not a user node
        node("/dev/nvidia0", 0, 0o660, 0),  # root's group: never added
    ]
    assert group_gids(nodes) == (VIDEO, RENDER)


def lookup(profile: str) -> NodeLookup:
    base = simulated_nodes(load_profile(profile))

    def with_drm(gpu: Gpu) -> tuple[NodeInfo, ...]:
        card = 1 + gpu.index
        return (
            *base.gpu(gpu),
            node(f"/dev/dri/card{card}", card, 0o660, VIDEO),
            node(f"/dev/dri/renderD{127 + card}", 127 + card, 0o660, RENDER),
        )

    return NodeLookup(control=base.control, gpu=with_drm, mig=base.mig)


def spec(**kw: bool) -> dict[str, Any]:
    machine = load_profile("l4")
    built = build_spec(machine, DriverFiles(), Options(**kw), lookup("l4"))
    doc: dict[str, Any] = dict(built.to_dict())
    return doc


def test_spec_has_gids_and_0_7_0_only_when_asked() -> None:
    plain = spec()
    assert plain["cdiVersion"] == "0.5.0"
    assert all("additionalGids" not in d["containerEdits"] for d in plain["devices"])
    assert not any("gid" in n for d in plain["devices"] for n in d["containerEdits"]["deviceNodes"])
    asked = spec(additional_gids=True)
    assert asked["cdiVersion"] == "0.7.0"
    for d in asked["devices"]:
        assert d["containerEdits"]["additionalGids"] == [VIDEO, RENDER], d["name"]
        owners = {
            n["path"]: (n.get("uid"), n.get("gid")) for n in d["containerEdits"]["deviceNodes"]
        }
        assert owners["/dev/dri/card1"] == (0, VIDEO)  # as on the host, not the container's user
        assert owners["/dev/dri/renderD128"] == (0, RENDER)
        assert owners["/dev/nvidia0"] == (None, None)  # 0666: anyone opens it
    assert "additionalGids" not in asked["containerEdits"]  # control nodes are 0666
