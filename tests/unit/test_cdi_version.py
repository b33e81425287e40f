"""cdiVersion rules (gpuctk.cdi.specs.version), mirrored from the reference specs-go/version.go."""

from __future__ import annotations

from typing import Any

import pytest

from gpuctk.cdi.specs.spec import ContainerEdits, Device, DeviceNode, Mount, Spec
from gpuctk.cdi.specs.version import (
    CURRENT_VERSION,
    EARLIEST_VERSION,
    compare_versions,
    is_known_version,
    minimum_version,
    normalize_version,
    version_problems,
)


def spec(*devices: dict[str, Any], kind: str = "vendor.com/class", **top: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"cdiVersion": "0.3.0", "kind": kind}
    doc["devices"] = list(devices) or [device()]
    doc.update(top)
    return doc


def device(name: str = "dev", **edits: Any) -> dict[str, Any]:
    return {"name": name, "containerEdits": edits or {"env": ["A=1"]}}


NODE = {"path": "/dev/x"}


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (spec(), "0.3.0"),
        (spec(device("gpu0")), "0.3.0"),
        (spec(device("0")), "0.5.0"),
        (spec(device("0:1")), "0.5.0"),
        (spec(device(deviceNodes=[{"path": "/dev/x", "hostPath": "/host/dev/x"}])), "0.5.0"),
        (spec(containerEdits={"deviceNodes": [{"path": "/dev/x", "hostPath": "/h"}]}), "0.5.0"),
        (spec(device(deviceNodes=[{"path": "/dev/x", "hostPath": ""}])), "0.3.0"),
        (spec(device(mounts=[{"hostPath": "/a", "containerPath": "/a", "type": "bind"}])), "0.4.0"),
        (spec(device(mounts=[{"hostPath": "/a", "containerPath": "/a"}])), "0.3.0"),
        (spec(annotations={"a": "b"}), "0.6.0"),
        (spec(annotations={}), "0.3.0"),
        (
            spec({"name": "d", "annotations": {"a": "b"}, "containerEdits": {"env": ["A=1"]}}),
            "0.6.0",
        ),
        (spec(kind="vendor.com/a.b"), "0.6.0"),
        (spec(kind="vendor.com/ab"), "0.3.0"),
        (spec(device(intelRdt={})), "0.7.0"),
        (spec(containerEdits={"intelRdt": {"closID": "x"}}), "0.7.0"),
        (spec(device(intelRdt={"enableMonitoring": False})), "0.7.0"),
        (spec(device(additionalGids=[5])), "0.7.0"),
        (spec(device(additionalGids=[])), "0.3.0"),
        (spec(device(netDevices=[{"hostInterfaceName": "eth1", "name": "eth0"}])), "1.1.0"),
        (spec(containerEdits={"netDevices": []}), "0.3.0"),
        (spec(device(intelRdt={"schemata": []})), "1.1.0"),
        (spec(containerEdits={"intelRdt": {"enableMonitoring": True}}), "1.1.0"),
    ],
)
def test_minimum_version(doc: dict[str, Any], expected: str) -> None:
    assert minimum_version(doc) == expected


def test_numeric_names_and_host_path_need_only_050() -> None:
    """The product fact: Debian 12's podman 4.3.1 reads up to 0.5.0, so do not say more."""
    node = DeviceNode("/dev/nvidia0", host_path="/run/nvidia/driver/dev/nvidia0", type="c")
    model = Spec(
        kind="nvidia.com/gpu",
        devices=(Device("0", ContainerEdits(device_nodes=(node,))),),
        edits=ContainerEdits(mounts=(Mount("/usr/lib/libcuda.so.1", "/usr/lib/libcuda.so.1"),)),
    )
    assert minimum_version(model.to_dict()) == "0.5.0"
    annotated = Spec(model.kind, model.devices, annotations=(("a", "b"),))
    assert minimum_version(annotated.to_dict()) == "0.6.0"


def test_the_highest_rule_wins() -> None:
    doc = spec(device("0", intelRdt={}), annotations={"a": "b"})
    assert minimum_version(doc) == "0.7.0"


def test_malformed_content_is_tolerated() -> None:
    assert minimum_version({}) == EARLIEST_VERSION
    assert minimum_version({"devices": "x", "containerEdits": [], "kind": 3}) == EARLIEST_VERSION
    assert minimum_version({"devices": [1, {"name": 5, "containerEdits": None}]}) == "0.3.0"


def test_compare_and_normalize() -> None:
    assert compare_versions("0.5.0", "0.10.0") == -1
    assert compare_versions("v1.0.0", "1.0.0") == 0
    assert compare_versions("1.1.0", "0.8.0") == 1
    assert normalize_version("v0.6.0") == "0.6.0"
    assert is_known_version("v0.5.0") and is_known_version(CURRENT_VERSION)
    assert not is_known_version("0.9.0")
    with pytest.raises(ValueError, match="not a CDI version"):
        compare_versions("0.5", "0.5.0")


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        (spec(cdiVersion="0.9.0"), "unknown version '0.9.0'"),
        (spec(cdiVersion="0.1.0"), "needs at least 0.3.0"),
        (spec(device("0"), cdiVersion="0.4.0"), "needs at least 0.5.0"),
        (spec(annotations={"a": "b"}, cdiVersion="0.5.0"), "needs at least 0.6.0"),
        (
            spec(containerEdits={"netDevices": []}, cdiVersion="1.0.0"),
            "containerEdits.netDevices: needs cdiVersion 1.1.0",
        ),
        (
            spec(device(intelRdt={"enableCMT": True}), cdiVersion="1.1.0"),
            "devices[0].containerEdits.intelRdt.enableCMT: not valid in cdiVersion 1.1.0",
        ),
        (
            spec(device(intelRdt={"enableMonitoring": False}), cdiVersion="0.7.0"),
            "intelRdt.enableMonitoring: needs cdiVersion 1.1.0",
        ),
    ],
)
def test_version_problems(doc: dict[str, Any], needle: str) -> None:
    problems = version_problems(doc)
    assert len(problems) == 1, problems
    assert needle in problems[0]


@pytest.mark.parametrize("written", ["0.5.0", "v0.5.0", "0.6.0", "1.1.0"])
def test_newer_or_equal_versions_are_fine(written: str) -> None:
    assert version_problems(spec(device("0"), cdiVersion=written)) == []


def test_enable_cmt_is_fine_before_110() -> None:
    assert version_problems(spec(device(intelRdt={"enableCMT": True}), cdiVersion="0.7.0")) == []
