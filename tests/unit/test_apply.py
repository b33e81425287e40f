"""gpuctk.cdi.specs.apply against the reference library's semantics (pkg/cdi/container-edits.go)."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest

from gpuctk.cdi.specs.apply import apply, clean_depth, merge, problems
from gpuctk.errors import TrustError, ValidationError


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


# --- mount and device-node sources on the create path (gpuctk.fs trusted paths) -------------

OTHER_UID = 54321  # an account that is not root (no passwd entry needed)


def _needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a folder to another uid needs root")


def _user_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "user"
    folder.mkdir(mode=0o755)
    os.chown(folder, OTHER_UID, OTHER_UID)
    return folder


def test_a_mount_source_below_a_user_folder_is_refused_and_nothing_changes(
    tmp_path: Path,
) -> None:
    _needs_root()
    lib = _user_folder(tmp_path) / "libcuda.so.1"
    lib.write_bytes(b"\x7fELF")  # root's file, but the user can rename the folder it is in
    os.chown(lib, 0, 0)
    oci: dict[str, Any] = {"process": {"env": ["A=1"]}, "mounts": []}
    before = copy.deepcopy(oci)
    edits = {
        "env": ["B=2"],
        "mounts": [
            {"hostPath": "/etc/hostname", "containerPath": "/etc/hostname"},
            {"hostPath": str(lib), "containerPath": "/usr/lib/libcuda.so.1"},
        ],
    }
    with pytest.raises(TrustError) as info:
        apply(oci, edits)
    message = info.value.message
    assert "\n" not in message
    assert message.startswith(f"CDI mount /usr/lib/libcuda.so.1: source {lib} refused: ")
    assert f"is owned by uid {OTHER_UID}" in message and f"fix: chown root {lib.parent}" in message
    assert oci == before


def test_a_link_a_user_swapped_in_for_a_mount_source_is_refused(tmp_path: Path) -> None:
    """The /tmp/nvidia-mps attack: the user's folder in a sticky /tmp, then a link to /."""
    _needs_root()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    mps = tmp / "nvidia-mps"
    mps.mkdir()
    os.chown(mps, OTHER_UID, OTHER_UID)
    edits = {"mounts": [{"hostPath": str(mps), "containerPath": "/tmp/nvidia-mps"}]}
    with pytest.raises(TrustError, match=f"is owned by uid {OTHER_UID}"):
        apply({}, edits)
    mps.rmdir()
    mps.symlink_to("/")
    os.lchown(mps, OTHER_UID, OTHER_UID)
    with pytest.raises(TrustError, match=f"source {mps} refused: .*symlink"):
        apply({}, edits)
    mps.unlink()
    mps.mkdir(mode=0o755)  # root's own, as the MPS control daemon run as root makes it
    oci: dict[str, Any] = {}
    apply(oci, edits)
    assert oci["mounts"] == [{"destination": "/tmp/nvidia-mps", "source": str(mps)}]


def test_a_world_writable_mount_source_and_a_device_host_path_are_refused(
    tmp_path: Path,
) -> None:
    _needs_root()
    conf = tmp_path / "nvidia.icd"
    conf.write_text("libcuda.so.1\n")
    conf.chmod(0o666)
    with pytest.raises(TrustError, match=r"world-writable \(mode 0666\); fix: chmod go-w"):
        apply({}, {"mounts": [{"hostPath": str(conf), "containerPath": "/etc/x.icd"}]})
    user = _user_folder(tmp_path)
    node = {"path": "/dev/nvidia0", "hostPath": f"{user}/nvidia0", "type": "c", "major": 195}
    oci: dict[str, Any] = {}
    with pytest.raises(TrustError, match=f"CDI device /dev/nvidia0: host path {user}/nvidia0"):
        apply(oci, {"deviceNodes": [node]})
    assert oci == {}
    # a node with its numbers and no hostPath: runc in a user namespace bind-mounts it from
    # its `path` on the host (it cannot make nodes there), which others must not be able to swap
    node = {"path": f"{user}/nvidia0", "type": "c", "major": 195, "minor": 0}
    with pytest.raises(TrustError, match=f"CDI device {user}/nvidia0: path on the host {user}/"):
        apply(oci, {"deviceNodes": [node]})
    assert oci == {}


def test_sources_missing_from_trusted_folders_pass_and_links_of_root_are_followed(
    tmp_path: Path,
) -> None:
    real = tmp_path / "lib" / "libcuda.so.535"
    real.parent.mkdir()
    real.write_bytes(b"\x7fELF")
    (tmp_path / "lib" / "libcuda.so.1").symlink_to("libcuda.so.535")
    (tmp_path / "lib64").symlink_to("lib")
    oci: dict[str, Any] = {}
    apply(
        oci,
        {
            "mounts": [
                {"hostPath": f"{tmp_path}/lib64/libcuda.so.1", "containerPath": "/a"},
                {"hostPath": f"{tmp_path}/lib/gone.so", "containerPath": "/b"},  # runc says so
                {"hostPath": "/dev/null", "containerPath": "/c"},
            ]
        },
    )
    assert [m["source"] for m in oci["mounts"]] == [
        f"{tmp_path}/lib64/libcuda.so.1",
        f"{tmp_path}/lib/gone.so",
        "/dev/null",
    ]


def test_each_folder_is_walked_once_per_apply_and_never_remembered_across(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 sources in 5 folders: each folder on the way opened once, one fstatat a source."""
    folders = [tmp_path / f"d{i}" for i in range(5)]
    mounts = []
    for folder in folders:
        folder.mkdir()
        for j in range(8):
            (folder / f"lib{j}.so.1").write_bytes(b"\x7fELF")
            mounts.append({"hostPath": f"{folder}/lib{j}.so.1", "containerPath": f"/l/{j}"})
    calls: list[tuple[str, str]] = []
    real_open, real_stat = os.open, os.stat

    def counting_open(path: Any, *args: Any, **kw: Any) -> int:
        calls.append(("open", str(path)))
        return real_open(path, *args, **kw)

    def counting_stat(path: Any, *args: Any, **kw: Any) -> os.stat_result:
        calls.append(("stat", str(path)))
        return real_stat(path, *args, **kw)

    monkeypatch.setattr(os, "open", counting_open)
    monkeypatch.setattr(os, "stat", counting_stat)
    apply({}, {"mounts": mounts})
    first = list(calls)
    assert [c for c in first if c[0] == "stat"] == [("stat", f"lib{j}.so.1") for j in range(8)] * 5
    folders_on_the_way = len(tmp_path.parts) + len(folders)  # "/" and each one below it
    assert len([c for c in first if c[0] == "open"]) <= folders_on_the_way + 2
    calls.clear()
    apply({}, {"mounts": mounts})  # a second create walks again: nothing outlives a call
    monkeypatch.undo()
    assert calls == first


class _Counted(dict):  # type: ignore[type-arg]
    """An OCI entry that counts how often apply looks into it."""

    looks = 0

    def get(self, *args: Any) -> Any:
        _Counted.looks += 1
        return super().get(*args)

    def __getitem__(self, key: Any) -> Any:
        _Counted.looks += 1
        return super().__getitem__(key)


@pytest.mark.parametrize("n", [1000, 4000])
def test_apply_looks_at_each_existing_mount_and_device_a_bounded_number_of_times(n: int) -> None:
    """Linear: spec mounts x request mounts would be 100 * n looks."""
    oci: dict[str, Any] = {
        "mounts": [_Counted(destination=f"/m/{i}", source="/x") for i in range(n)],
        "linux": {
            "devices": [_Counted(path=f"/dev/x{i}", type="c", major=1, minor=3) for i in range(n)]
        },
    }
    mounts = [{"hostPath": "/h", "containerPath": f"/usr/lib/lib{i}.so"} for i in range(100)]
    mounts.append({"hostPath": "/h", "containerPath": "/m/7"})  # replaces one
    nodes = [_node(f"/dev/nvidia{i}", 195, i) for i in range(100)] + [_node("/dev/x9", 1, 9)]
    _Counted.looks = 0
    apply(oci, {"mounts": mounts, "deviceNodes": nodes})
    assert _Counted.looks <= 3 * 2 * n
    assert len(oci["mounts"]) == n + 100 and len(oci["linux"]["devices"]) == n + 100
    assert [m["source"] for m in oci["mounts"] if m["destination"] == "/m/7"] == ["/h"]
    assert [d["minor"] for d in oci["linux"]["devices"] if d["path"] == "/dev/x9"] == [9]


def _old_rules(oci: dict[str, Any], mounts: list[Any], devices: list[Any]) -> None:
    """The reference's RemoveMount/AddMount and RemoveDevice/AddDevice, one scan each."""
    cur = oci.setdefault("mounts", [])
    for m in mounts:
        for i, e in enumerate(cur):
            if e.get("destination") == m["containerPath"]:
                del cur[i]
                break
        cur.append({"destination": m["containerPath"], "source": m["hostPath"]})
    if mounts:
        cur.sort(key=lambda e: clean_depth(e["destination"]))
    devs = oci.setdefault("linux", {}).setdefault("devices", [])
    for d in devices:
        dev = {"path": d["path"], "type": d["type"], "major": d["major"], "minor": d["minor"]}
        for i, e in enumerate(devs):
            if e.get("path") == d["path"]:
                del devs[i]
                break
        for i, e in enumerate(devs):
            if e.get("path") == d["path"]:
                devs[i] = dev
                break
        else:
            devs.append(dev)


@pytest.mark.parametrize("seed", range(40))
def test_repeated_destinations_and_paths_keep_the_reference_order(seed: int) -> None:
    import random

    rng = random.Random(seed)
    names = ["/a", "/b", "/a/b", "/c//d", "/e/"]
    oci: dict[str, Any] = {
        "mounts": [
            {"destination": rng.choice(names), "source": f"o{i}"} for i in range(rng.randint(0, 8))
        ],
        "linux": {
            "devices": [_node(f"/dev/{rng.choice('ab')}", 1, i) for i in range(rng.randint(0, 6))]
        },
    }
    mounts = [
        {"hostPath": f"/h{i}", "containerPath": rng.choice(names)} for i in range(rng.randint(0, 8))
    ]
    nodes = [_node(f"/dev/{rng.choice('ab')}", 9, i) for i in range(rng.randint(0, 6))]
    expected = copy.deepcopy(oci)
    _old_rules(expected, mounts, nodes)
    apply(oci, {"mounts": mounts, "deviceNodes": nodes})
    assert oci["mounts"] == expected["mounts"]
    assert oci["linux"]["devices"] == expected["linux"]["devices"]


def test_a_sticky_folder_of_roots_may_be_a_mount_source(tmp_path: Path) -> None:
    """/tmp/.X11-unix: others can add entries, but nobody else can swap the folder itself."""
    x11 = tmp_path / ".X11-unix"
    x11.mkdir()
    x11.chmod(0o1777)
    oci: dict[str, Any] = {}
    apply(oci, {"mounts": [{"hostPath": str(x11), "containerPath": "/tmp/.X11-unix"}]})
    assert oci["mounts"][0]["source"] == str(x11)
    x11.chmod(0o777)
    with pytest.raises(TrustError, match=r"world-writable \(mode 0777\)"):
        apply({}, {"mounts": [{"hostPath": str(x11), "containerPath": "/tmp/.X11-unix"}]})
