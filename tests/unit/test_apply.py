"""gpuctk.cdi.apply against the reference library's semantics (pkg/cdi/container-edits.go)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpuctk.cdi.apply import apply, clean_depth, merge, problems
from gpuctk.errors import ValidationError


def _node(path: str, major: int, minor: int, **extra: Any) -> dict[str, Any]:
    return {"path": path, "type": "c", "major": major, "minor": minor, **extra}


def test_empty_spec_env_and_device_like_the_reference() -> None:
    oci: dict[str, Any] = {}
    apply(oci, {"env": ["FOO=BAR"], "deviceNodes": [{"path": "/dev/null", "type": "c"}]})
    assert oci == {
        "process": {"env": ["FOO=BAR"]},
        "linux": {
            "devices": [{"path": "/dev/null", "type": "c", "major": 1, "minor": 3}],
            "resources": {
                "devices": [{"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"}]
            },
        },
    }


def test_missing_type_and_numbers_come_from_the_host_path() -> None:
    calls: list[str] = []

    def fake_stat(path: str) -> tuple[str, int, int]:
        calls.append(path)
        return "c", 195, 7

    oci: dict[str, Any] = {}
    apply(
        oci,
        {"deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/host/dev/nvidia7"}]},
        stat_device=fake_stat,
    )
    assert calls == ["/host/dev/nvidia7"]
    assert oci["linux"]["devices"] == [
        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 7}
    ]
    # a complete node is never stat'ed
    apply({}, {"deviceNodes": [_node("/dev/nvidia1", 195, 1)]}, stat_device=fake_stat)
    assert calls == ["/host/dev/nvidia7"]


def test_host_type_mismatch_and_missing_host_node_fail_before_any_edit() -> None:
    oci: dict[str, Any] = {"process": {"env": ["A=1"]}}
    before = copy.deepcopy(oci)
    with pytest.raises(ValidationError, match="host type mismatch"):
        apply(oci, {"env": ["B=2"], "deviceNodes": [{"path": "/dev/null", "type": "b"}]})
    with pytest.raises(ValidationError, match="failed to stat CDI host device"):
        apply(oci, {"env": ["B=2"], "deviceNodes": [{"path": "/nonexistent/dev/x"}]})
    assert oci == before


def test_env_replaced_by_key_else_appended() -> None:
    oci: dict[str, Any] = {"process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0", "X=1"]}}
    apply(oci, {"env": ["NVIDIA_VISIBLE_DEVICES=void", "NEW=yes", "NEW=again"]})
    assert oci["process"]["env"] == ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void", "X=1", "NEW=again"]


def test_device_nodes_replaced_by_path_with_cgroup_rules() -> None:
    oci: dict[str, Any] = {
        "process": {"user": {"uid": 1000, "gid": 0}},
        "linux": {
            "devices": [{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}],
            "resources": {"devices": [{"allow": False, "access": "rwm"}]},
        },
    }
    apply(
        oci,
        {
            "deviceNodes": [
                _node("/dev/fuse", 10, 230, fileMode=0o666),
                _node("/dev/nvidiactl", 195, 255, permissions="rw"),
                _node("/dev/nvidia-caps/nvidia-cap1", 508, 1, permissions="none", gid=44),
                {"path": "/dev/fifo", "type": "p"},
            ]
        },
    )
    assert oci["linux"]["devices"] == [
        {"path": "/dev/fuse", "type": "c", "major": 10, "minor": 230, "fileMode": 0o666,
         "uid": 1000},
        {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255, "uid": 1000},
        {"path": "/dev/nvidia-caps/nvidia-cap1", "type": "c", "major": 508, "minor": 1, "gid": 44,
         "uid": 1000},
        {"path": "/dev/fifo", "type": "p", "major": 0, "minor": 0, "uid": 1000},
    ]  # fmt: skip
    assert oci["linux"]["resources"]["devices"] == [
        {"allow": False, "access": "rwm"},
        {"allow": True, "type": "c", "major": 10, "minor": 230, "access": "rwm"},
        {"allow": True, "type": "c", "major": 195, "minor": 255, "access": "rw"},
        {"allow": True, "type": "c", "major": 508, "minor": 1},  # "none": no access key
    ]


def test_duplicate_device_paths_follow_remove_then_add() -> None:
    # RemoveDevice drops the first match; AddDevice then replaces the second in place.
    oci: dict[str, Any] = {
        "linux": {
            "devices": [
                _node("/dev/x", 1, 1),
                _node("/dev/y", 1, 2),
                _node("/dev/x", 1, 3),
            ]
        }
    }
    apply(oci, {"deviceNodes": [_node("/dev/x", 9, 9)]})
    assert [(d["path"], d["minor"]) for d in oci["linux"]["devices"]] == [
        ("/dev/y", 2),
        ("/dev/x", 9),
    ]


def test_mounts_replaced_by_destination_then_sorted_by_depth() -> None:
    oci: dict[str, Any] = {
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts"},
            {"destination": "/usr/bin/nvidia-smi", "source": "/old", "options": ["ro"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "x-unknown": 1},
        ]
    }
    apply(
        oci,
        {
            "mounts": [
                {
                    "hostPath": "/drv/libcuda.so.535",
                    "containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.535",
                    "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"],
                },
                {"hostPath": "/drv/nvidia-smi", "containerPath": "/usr/bin/nvidia-smi"},
                {"hostPath": "/run/x", "containerPath": "/run/x", "type": "bind"},
            ]
        },
    )
    assert [m["destination"] for m in oci["mounts"]] == [
        "/proc",
        "/dev",
        "/sys",
        "/dev/pts",
        "/run/x",  # depth 2 like /dev/pts, and after it: the sort is stable
        "/usr/bin/nvidia-smi",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.535",
    ]
    smi = next(m for m in oci["mounts"] if m["destination"] == "/usr/bin/nvidia-smi")
    assert smi == {"destination": "/usr/bin/nvidia-smi", "source": "/drv/nvidia-smi"}
    assert oci["mounts"][2]["x-unknown"] == 1
    assert oci["mounts"][4] == {"destination": "/run/x", "type": "bind", "source": "/run/x"}


@pytest.mark.parametrize(
    ("path", "depth"),
    [
        ("/", 1),
        ("/a", 1),
        ("/a/b/", 2),
        ("//a//b", 2),
        ("/a/./b/../c", 2),
        ("a/b", 1),
        ("", 0),
        ("/..", 1),
    ],
)
def test_clean_depth_matches_go_filepath_clean(path: str, depth: int) -> None:
    assert clean_depth(path) == depth


def test_hooks_appended_to_their_stage() -> None:
    oci: dict[str, Any] = {"hooks": {"createContainer": [{"path": "/other"}]}}
    stages = [
        "prestart",
        "createRuntime",
        "createContainer",
        "startContainer",
        "poststart",
        "poststop",
    ]
    apply(
        oci,
        {
            "hooks": [
                {"hookName": s, "path": f"/hook-{s}", "args": ["h", s], "env": ["A=1"]}
                for s in stages
            ]
            + [{"hookName": "poststop", "path": "/bare", "timeout": 5}]
        },
    )
    assert oci["hooks"]["createContainer"] == [
        {"path": "/other"},
        {"path": "/hook-createContainer", "args": ["h", "createContainer"], "env": ["A=1"]},
    ]
    assert oci["hooks"]["poststop"][-1] == {"path": "/bare", "timeout": 5}
    assert set(oci["hooks"]) == set(stages)


def test_additional_gids_intel_rdt_net_devices() -> None:
    oci: dict[str, Any] = {"process": {"user": {"uid": 0, "additionalGids": [5]}}}
    apply(
        oci,
        {
            "additionalGids": [0, 5, 44, 44],
            "intelRdt": {"closID": "clos1", "schemata": ["L3:0=f"]},
            "netDevices": [{"hostInterfaceName": "eth9", "name": "net0"}],
        },
    )
    assert oci["process"]["user"]["additionalGids"] == [5, 44]
    assert oci["linux"]["intelRdt"] == {"closID": "clos1", "schemata": ["L3:0=f"]}
    assert oci["linux"]["netDevices"] == {"eth9": {"name": "net0"}}


def test_merge_concatenates_in_order() -> None:
    merged = merge(
        [
            {"env": ["A=1"], "deviceNodes": [{"path": "/dev/a"}]},
            None,
            {"env": ["B=2", "C=3"], "mounts": [{"hostPath": "/h", "containerPath": "/c"}]},
            {"env": ["D=4"], "intelRdt": {"closID": "x"}},
        ]
    )
    assert merged == {
        "env": ["A=1", "B=2", "C=3", "D=4"],
        "deviceNodes": [{"path": "/dev/a"}],
        "mounts": [{"hostPath": "/h", "containerPath": "/c"}],
        "intelRdt": {"closID": "x"},
    }


@pytest.mark.parametrize(
    "edits",
    [
        {"env": [""]},
        {"env": ["=foo"]},
        {"env": ["FOOBAR"]},
        {"deviceNodes": [{"path": ""}]},
        {"deviceNodes": [{"path": "/dev/vendorctl", "type": "f"}]},
        {"deviceNodes": [{"path": "/dev/vendorctl", "type": "b", "permissions": "to land"}]},
        {"deviceNodes": [{"path": "/dev/x", "type": "c", "major": -1}]},
        {"mounts": [{"hostPath": "", "containerPath": "/x"}]},
        {"mounts": [{"hostPath": "/x", "containerPath": ""}]},
        {"hooks": [{"hookName": "prestart"}]},
        {"hooks": [{"hookName": "misCreateRuntime", "path": "/x"}]},
        {"hooks": [{"hookName": "poststart", "path": "/x", "env": ["=value2"]}]},
    ],
)
def test_invalid_edits_are_refused_and_nothing_changes(edits: dict[str, Any]) -> None:
    assert problems(edits)
    oci: dict[str, Any] = {"process": {"env": ["A=1"]}}
    with pytest.raises(ValidationError):
        apply(oci, {**edits, "env": [*edits.get("env", []), "Z=9"]})
    assert oci == {"process": {"env": ["A=1"]}}


def test_wrongly_typed_oci_fields_are_refused_before_editing() -> None:
    oci: dict[str, Any] = {"process": {"env": "A=1"}, "mounts": []}
    with pytest.raises(ValidationError, match=r"process\.env must be a list"):
        apply(oci, {"mounts": [{"hostPath": "/h", "containerPath": "/c"}]})
    assert oci == {"process": {"env": "A=1"}, "mounts": []}


def test_unknown_fields_survive() -> None:
    oci: dict[str, Any] = {
        "ociVersion": "1.0.2",
        "x-vendor": {"nested": [1, 2]},
        "process": {"terminal": False, "env": [], "x": 1},
        "linux": {"namespaces": [{"type": "pid"}], "resources": {"memory": {"limit": 1}}},
        "annotations": {"a": "b"},
    }
    before = copy.deepcopy(oci)
    apply(oci, {"env": ["A=1"], "deviceNodes": [_node("/dev/nvidia0", 195, 0)]})
    assert oci["x-vendor"] == before["x-vendor"]
    assert oci["linux"]["namespaces"] == before["linux"]["namespaces"]
    assert oci["linux"]["resources"]["memory"] == {"limit": 1}
    assert oci["process"]["x"] == 1 and oci["annotations"] == {"a": "b"}


def test_null_containers_are_created() -> None:
    oci: dict[str, Any] = {"process": None, "linux": None, "mounts": None, "hooks": None}
    apply(
        oci,
        {
            "env": ["A=1"],
            "deviceNodes": [_node("/dev/nvidia0", 195, 0)],
            "mounts": [{"hostPath": "/h", "containerPath": "/c"}],
            "hooks": [{"hookName": "prestart", "path": "/p"}],
        },
    )
    assert oci["process"] == {"env": ["A=1"]}
    assert oci["mounts"] == [{"destination": "/c", "source": "/h"}]
    assert oci["hooks"] == {"prestart": [{"path": "/p"}]}
