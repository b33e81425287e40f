"""The generator on every shipped profile: names, MIG edits, the hook entry, versions."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuctk.cdi.generate import Options, build_spec
from gpuctk.cdi.node import facts
from gpuctk.cdi.node.driverfiles import DriverFile, DriverFiles
from gpuctk.cdi.node.profile import available_profiles, load_profile
from gpuctk.cdi.simulate import mig_cap_minors, simulated_nodes
from gpuctk.cdi.specs.validate import schema_checker, validate_spec_dict
from gpuctk.errors import NoDevicesError, UsageError
from gpuctk.records import replace

SCHEMA = Path(__file__).resolve().parents[3] / "shared" / "vendor-data" / "cdi-schema"

LIB = DriverFile(
    host_path="/drv/usr/lib/x86_64-linux-gnu/libcuda.so.535.309.01",
    container_path="/usr/lib/x86_64-linux-gnu/libcuda.so.535.309.01",
    kind="library",
    capability="compute",
    soname="libcuda.so.1",
)
SOCK = DriverFile(
    host_path="/drv/run/nvidia-persistenced/socket",
    container_path="/run/nvidia-persistenced/socket",
    kind="socket",
    capability="utility",
)
FILES = DriverFiles(
    libraries=(LIB,),
    sockets=(SOCK,),
    symlinks=(("libcuda.so.535.309.01", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),),
    ld_folders=("/usr/lib/x86_64-linux-gnu",),
)


def spec_for(profile: str, **kw: object) -> dict[str, object]:
    machine = load_profile(profile)
    spec = build_spec(machine, FILES, Options(**kw), simulated_nodes(machine))  # type: ignore[arg-type]
    return spec.to_dict()


def names(doc: dict[str, object]) -> list[str]:
    return [d["name"] for d in doc["devices"]]  # type: ignore[attr-defined,index]


def device(doc: dict[str, object], name: str) -> dict[str, object]:
    return next(d for d in doc["devices"] if d["name"] == name)  # type: ignore[attr-defined]


@pytest.mark.parametrize("profile", available_profiles())
def test_every_profile_gives_a_valid_spec_at_0_5_0(profile: str) -> None:
    doc = spec_for(profile)
    checker = schema_checker(SCHEMA)
    assert checker is not None, f"vendored schema not found at {SCHEMA}"
    assert validate_spec_dict(doc, profile, schema=checker) == []
    # Numeric device names need 0.5.0; nothing in a default spec needs more (podman 4.3.1).
    assert doc["cdiVersion"] == "0.5.0"
    assert doc["kind"] == "nvidia.com/gpu"


def test_h100_names_index_uuid_and_all() -> None:
    machine = load_profile("h100-8")
    doc = spec_for("h100-8")
    expected = [n for g in machine.gpus for n in (str(g.index), g.uuid)] + ["all"]
    assert names(doc) == expected
    nodes = device(doc, "3")["containerEdits"]["deviceNodes"]  # type: ignore[index]
    assert nodes == [
        {"path": "/dev/nvidia3", "type": "c", "major": 195, "minor": 3, "fileMode": 0o666}
    ]
    all_paths = [n["path"] for n in device(doc, "all")["containerEdits"]["deviceNodes"]]  # type: ignore[index]
    assert all_paths == [f"/dev/nvidia{i}" for i in range(8)]


def test_mig_gpu_is_exposed_through_its_mig_devices_only() -> None:
    machine = load_profile("a100-mig")
    doc = spec_for("a100-mig")
    got = names(doc)
    assert "0" in got and machine.gpus[0].uuid in got  # MIG off: the whole GPU
    for gpu in machine.gpus[1:]:
        assert str(gpu.index) not in got and gpu.uuid not in got
        for mig in gpu.mig_devices:
            assert mig.name in got and mig.uuid in got
            paths = [
                n["path"]
                for n in device(doc, mig.name)["containerEdits"]["deviceNodes"]  # type: ignore[index]
            ]
            gi_minor, ci_minor = mig_cap_minors(gpu.minor, mig.gi, mig.ci)
            assert paths == [
                f"/dev/nvidia{gpu.minor}",
                f"/dev/nvidia-caps/nvidia-cap{gi_minor}",
                f"/dev/nvidia-caps/nvidia-cap{ci_minor}",
            ]
    # Two compute instances of one GPU instance share the GI node but not the CI node.
    a, b = machine.gpus[3].mig_devices[:2]
    assert (a.gi, b.gi) == (2, 2)
    assert mig_cap_minors(3, a.gi, a.ci)[1] != mig_cap_minors(3, b.gi, b.ci)[1]


@pytest.mark.parametrize(
    ("mode", "want"),
    [
        ("hook", "/usr/lib/x86_64-linux-gnu"),  # the library's folder: the hook links it there
        ("mounts", "/usr/lib64"),  # its first SONAME mount's folder (no ELF arch here: lib64's)
        ("folder", "/usr/local/nvidia/lib64"),  # the stage's 64-bit folder
    ],
)
def test_every_mode_names_the_folder_of_libcuda(mode: str, want: str) -> None:
    """nvidia-ctk's NVIDIA_CTK_LIBCUDA_DIR: the folder where the container finds the driver's
    libcuda.so.1 (scripts put it first on LD_LIBRARY_PATH); none without a libcuda."""
    stage = "/var/lib/gpuctk/driver/x" if mode == "folder" else ""
    doc = spec_for("l4", library_mode=mode, stage_path=stage)
    assert doc["containerEdits"]["env"][0] == f"NVIDIA_CTK_LIBCUDA_DIR={want}"  # type: ignore[index]
    machine = load_profile("l4")
    nvml = replace(LIB, soname="libnvidia-ml.so.1", host_path=LIB.host_path.replace("cuda", "x"))
    files = DriverFiles(libraries=(nvml,), ld_folders=FILES.ld_folders)
    opts = Options(library_mode=mode, stage_path=stage)
    spec = build_spec(machine, files, opts, simulated_nodes(machine)).to_dict()
    assert spec["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]


def test_mounts_mode_names_the_folder_of_the_64_bit_libcuda() -> None:
    """Mounts mode with the 32-bit libcuda's SONAME mounted in a loader folder and the 64-bit
    one (no ELF arch known) at its own path: the folder of the 64-bit one."""
    lib32 = replace(LIB, host_path="/drv/usr/lib/i386-linux-gnu/libcuda.so.535.309.01",
                    container_path="/usr/lib/i386-linux-gnu/libcuda.so.535.309.01",
                    capability="compat32", arch="i386")  # fmt: skip
    machine = load_profile("l4")
    files = DriverFiles(libraries=(LIB, lib32), ld_folders=FILES.ld_folders)
    opts = Options(library_mode="mounts", loader_folders=("triplet",))
    doc = build_spec(machine, files, opts, simulated_nodes(machine)).to_dict()
    assert doc["containerEdits"]["env"][0] == "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu"


def test_common_edits_mounts_env_and_one_hook_with_explicit_env() -> None:
    doc = spec_for("l4", hook_path="/opt/gpuctk/bin/gpuctk-hook")
    edits = doc["containerEdits"]
    assert edits["env"] == [  # type: ignore[index]
        "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu",
        "NVIDIA_VISIBLE_DEVICES=void",
    ]
    assert [n["path"] for n in edits["deviceNodes"]] == [  # type: ignore[index]
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
    ]
    mounts = {m["containerPath"]: m for m in edits["mounts"]}  # type: ignore[index]
    assert mounts[LIB.container_path] == {
        "hostPath": LIB.host_path,
        "containerPath": LIB.container_path,
        "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"],
    }
    assert mounts[SOCK.container_path]["options"] == [
        "ro",
        "nosuid",
        "nodev",
        "noexec",
        "rbind",
        "rprivate",
    ]
    (hook,) = edits["hooks"]  # type: ignore[index]
    assert hook["hookName"] == "createContainer"
    assert hook["path"] == "/opt/gpuctk/bin/gpuctk-hook"
    assert hook["args"] == [
        "gpuctk-hook",
        "createContainer",
        "--link",
        "libcuda.so.535.309.01::/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "--folder",
        "/usr/lib/x86_64-linux-gnu",
    ]
    assert hook["env"] and hook["env"][0].startswith("PATH=")
    got = facts.decode(hook["env"])
    assert got is not None and got.driver_version == "535.309.01"
    assert got.cuda_version == "12.2"
    assert [g.compute_capability for g in got.gpus] == ["8.9"]


def test_facts_list_mig_uuids_per_gpu() -> None:
    machine = load_profile("a100-mig")
    doc = spec_for("a100-mig")
    got = facts.decode(doc["containerEdits"]["hooks"][0]["env"])  # type: ignore[index]
    assert got is not None
    assert [g.mig_uuids for g in got.gpus] == [
        tuple(m.uuid for m in g.mig_devices) for g in machine.gpus
    ]


def test_strategies_and_no_all_device() -> None:
    doc = spec_for("a100-mig", name_strategies=("type-index",), all_device=False)
    assert names(doc)[:3] == ["gpu0", "mig1:0", "mig1:1"]
    assert "all" not in names(doc)
    # Device names that start with a letter and no hostPath: the lowest version that exists.
    assert doc["cdiVersion"] == "0.3.0"


def test_device_id_limits_generation() -> None:
    machine = load_profile("a100-mig")
    doc = spec_for("a100-mig", device_ids=("0", machine.gpus[2].mig_devices[1].uuid))
    assert names(doc) == [
        "0",
        machine.gpus[0].uuid,
        "2:1",
        machine.gpus[2].mig_devices[1].uuid,
        "all",
    ]
    # Naming a MIG-enabled GPU selects all of its MIG devices.
    doc = spec_for("a100-mig", device_ids=("1",), name_strategies=("index",))
    assert names(doc) == [f"1:{i}" for i in range(7)] + ["all"]


def test_unknown_device_id_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--device-id names no device on this machine: 9"):
        spec_for("l4", device_ids=("9",))


def test_no_gpus_raises_no_devices(tmp_path: Path) -> None:
    profile = tmp_path / "empty.yaml"
    profile.write_text("driver_version: '535.309.01'\ncuda_driver_version: '12.2'\ngpus: []\n")
    machine = load_profile(str(profile))
    with pytest.raises(NoDevicesError, match="no NVIDIA GPU found"):
        build_spec(machine, FILES, Options(), simulated_nodes(machine))
