"""`--library-mode mounts`: SONAME mounts in the loader's folders instead of a hook entry."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuctk.cdi.generate import READ_ONLY, Options, build_spec
from gpuctk.cdi.libmounts import library_mounts, loader_dirs
from gpuctk.cdi.node import capabilities as caps
from gpuctk.cdi.node.driverfiles import DriverFile, DriverFiles
from gpuctk.cdi.node.profile import available_profiles, load_profile
from gpuctk.cdi.simulate import simulated_nodes
from gpuctk.cdi.specs.validate import schema_checker, validate_files, validate_spec_dict
from gpuctk.errors import UsageError
from gpuctk.hook.requests import drivercaps

SCHEMA = Path(__file__).resolve().parents[3] / "shared" / "vendor-data" / "cdi-schema"
GPUCTK = str(Path(sys.executable).with_name("gpuctk"))
CUDA = "/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.535.309.01"


def lib(path: str, soname: str | None, arch: str = "x86_64", cap: str = "compute") -> DriverFile:
    return DriverFile("/drv" + path, path, "library", cap, soname, arch)


LIBS = (
    lib(CUDA, "libcuda.so.1"),
    lib("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.309.01", "libnvidia-ml.so.1", cap="utility"),
    lib("/usr/lib/x86_64-linux-gnu/libGLX_nvidia.so.535.309.01", "libGLX_nvidia.so.0",
        cap="graphics"),
    lib("/usr/lib/x86_64-linux-gnu/libnvidia-tls.so.535.309.01", "libnvidia-tls.so.535.309.01",
        cap="graphics"),
    lib("/usr/lib/x86_64-linux-gnu/libnvidia-allocator.so.535.309.01", "libnvidia-allocator.so.1"),
    lib("/usr/lib/x86_64-linux-gnu/libnvidia-nosoname.so.535.309.01", None, cap="utility"),
    lib("/usr/lib/i386-linux-gnu/libcuda.so.535.309.01", "libcuda.so.1", "i386", "compat32"),
)  # fmt: skip
FILES = DriverFiles(
    libraries=LIBS,
    symlinks=(("libcuda.so.535.309.01", CUDA.replace(".535.309.01", ".1")),),
    ld_folders=("/usr/lib/x86_64-linux-gnu/nvidia/current",),
)


def spec_for(profile: str = "h100-8", **kw: Any) -> dict[str, Any]:
    machine = load_profile(profile)
    return build_spec(machine, FILES, Options(**kw), simulated_nodes(machine)).to_dict()


def mounts_of(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["containerPath"]: m for m in doc["containerEdits"]["mounts"]}


def test_default_is_hook_mode_unchanged() -> None:
    assert Options().library_mode == "hook"
    doc = spec_for()
    assert doc == spec_for(library_mode="hook")
    (hook,) = doc["containerEdits"]["hooks"]
    assert hook["args"][:2] == ["gpuctk-hook", "createContainer"]
    # One mount per library, at its own path: no SONAME mounts.
    assert set(mounts_of(doc)) == {f.container_path for f in LIBS}


def test_mounts_mode_has_no_hook_and_soname_mounts_in_both_loader_families() -> None:
    doc = spec_for(library_mode="mounts")
    edits = doc["containerEdits"]
    assert "hooks" not in edits
    assert all("hooks" not in d["containerEdits"] for d in doc["devices"])
    mounts = mounts_of(doc)
    expected = {
        # 64-bit: Debian/Ubuntu multiarch folder and the RHEL-family lib64 folder
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1": "/drv" + CUDA,
        "/usr/lib64/libcuda.so.1": "/drv" + CUDA,
        "/usr/lib/x86_64-linux-gnu/libcuda.so": "/drv" + CUDA,  # hook mode's dev link
        "/usr/lib64/libcuda.so": "/drv" + CUDA,
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1": "/drv" + LIBS[1].container_path,
        "/usr/lib64/libnvidia-ml.so.1": "/drv" + LIBS[1].container_path,
        "/usr/lib/x86_64-linux-gnu/libGLX_nvidia.so.0": "/drv" + LIBS[2].container_path,
        "/usr/lib/x86_64-linux-gnu/libGLX_indirect.so.0": "/drv" + LIBS[2].container_path,
        "/usr/lib64/libGLX_nvidia.so.0": "/drv" + LIBS[2].container_path,
        "/usr/lib64/libGLX_indirect.so.0": "/drv" + LIBS[2].container_path,
        # SONAME == file name: the own path is one of the loader paths
        LIBS[3].container_path: "/drv" + LIBS[3].container_path,
        "/usr/lib64/libnvidia-tls.so.535.309.01": "/drv" + LIBS[3].container_path,
        "/usr/lib/x86_64-linux-gnu/libnvidia-allocator.so.1": "/drv" + LIBS[4].container_path,
        "/usr/lib64/libnvidia-allocator.so.1": "/drv" + LIBS[4].container_path,
        "/usr/lib/x86_64-linux-gnu/gbm/nvidia-drm_gbm.so": "/drv" + LIBS[4].container_path,
        "/usr/lib64/gbm/nvidia-drm_gbm.so": "/drv" + LIBS[4].container_path,
        # no SONAME: its own mount, as in hook mode
        LIBS[5].container_path: "/drv" + LIBS[5].container_path,
        # 32-bit: the i386 multiarch folder and /usr/lib (RHEL's 32-bit folder)
        "/usr/lib/i386-linux-gnu/libcuda.so.1": "/drv" + LIBS[6].container_path,
        "/usr/lib/libcuda.so.1": "/drv" + LIBS[6].container_path,
        "/usr/lib/i386-linux-gnu/libcuda.so": "/drv" + LIBS[6].container_path,
        "/usr/lib/libcuda.so": "/drv" + LIBS[6].container_path,
    }
    # Instead of, not beside, the versioned files' own mounts (podman pays ~0.7 ms a mount).
    assert {p: m["hostPath"] for p, m in mounts.items()} == expected
    assert all(m["options"] == list(READ_ONLY) for m in mounts.values())
    assert [m["containerPath"] for m in edits["mounts"]] == sorted(mounts)
    # the 64-bit libcuda.so.1's first folder (nvidia-ctk's NVIDIA_CTK_LIBCUDA_DIR)
    assert edits["env"] == [
        "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu",
        "NVIDIA_VISIBLE_DEVICES=void",
    ]
    assert edits["deviceNodes"] == spec_for()["containerEdits"]["deviceNodes"]


@pytest.mark.parametrize("profile", available_profiles())
def test_mounts_mode_specs_validate_at_0_5_0(profile: str) -> None:
    checker = schema_checker(SCHEMA)
    assert checker is not None, f"vendored schema not found at {SCHEMA}"
    doc = spec_for(profile, library_mode="mounts")
    assert validate_spec_dict(doc, profile, schema=checker) == []
    assert doc["cdiVersion"] == "0.5.0"  # podman 4.3.1 still reads it
    assert doc["devices"] == spec_for(profile)["devices"]


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(UsageError, match="library mode"):
        spec_for(library_mode="links")


@pytest.mark.parametrize(
    ("arch", "elf32", "dirs"),
    [
        ("x86_64", False, ("/usr/lib/x86_64-linux-gnu", "/usr/lib64")),
        ("aarch64", False, ("/usr/lib/aarch64-linux-gnu", "/usr/lib64")),
        ("ppc64", False, ("/usr/lib/powerpc64le-linux-gnu", "/usr/lib64")),
        ("i386", True, ("/usr/lib/i386-linux-gnu", "/usr/lib")),
        ("em999", False, ("/usr/lib64",)),
        (None, True, ("/usr/lib",)),
    ],
)
def test_loader_dirs(arch: str | None, elf32: bool, dirs: tuple[str, ...]) -> None:
    assert loader_dirs(arch, elf32) == dirs


@pytest.mark.parametrize(
    ("families", "elf32", "dirs"),
    [
        (("triplet",), False, ("/usr/lib/x86_64-linux-gnu",)),
        (("lib64",), False, ("/usr/lib64",)),
        (("triplet",), True, ("/usr/lib/x86_64-linux-gnu",)),
        (("lib64",), True, ("/usr/lib",)),
    ],
)
def test_loader_dirs_of_one_family(families: tuple[str, ...], elf32: bool, dirs: Any) -> None:
    assert loader_dirs("x86_64", elf32, families) == dirs
    assert loader_dirs("em999", elf32, ("triplet",)) == ()  # no triplet: no folder at all


def test_one_loader_family_in_the_spec() -> None:
    """--loader-folders: the library mounts of one family only; a library with no folder in
    it (an architecture without a triplet) keeps its own mount rather than vanishing."""
    paths = {
        f: {m["containerPath"] for m in spec_for(library_mode="mounts", loader_folders=f)[
            "containerEdits"]["mounts"]}
        for f in (("triplet",), ("lib64",), ("triplet", "lib64"))
    }  # fmt: skip
    both, triplet, lib64 = paths[("triplet", "lib64")], paths[("triplet",)], paths[("lib64",)]
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.1" in triplet
    assert not any(p.startswith("/usr/lib64/") for p in triplet)
    assert "/usr/lib64/libcuda.so.1" in lib64
    in_triplet = {p for p in lib64 if p.startswith("/usr/lib/x86_64-linux-gnu/")}
    assert in_triplet == {"/usr/lib/x86_64-linux-gnu/libnvidia-nosoname.so.535.309.01"}  # own
    assert triplet | lib64 == both
    odd = lib("/x/libodd.so.1.0", "libodd.so.1", arch="em999")
    out = library_mounts([odd], READ_ONLY, ("triplet",))
    assert [m.container_path for m in out] == ["/x/libodd.so.1.0"]


@pytest.mark.parametrize(
    ("mode", "folders", "message"),
    [
        ("mounts", ("triplet", "lib32"), "lib32 given; expected triplet, lib64"),
        ("mounts", (), "nothing given"),
        ("hook", ("triplet",), "applies to --library-mode mounts and folder only"),
    ],
)
def test_loader_folders_are_checked(mode: str, folders: Any, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        spec_for(library_mode=mode, loader_folders=folders)


def test_first_library_keeps_a_soname_and_odd_sonames_are_skipped() -> None:
    a = lib("/usr/lib/x86_64-linux-gnu/libcuda.so.535.309.01", "libcuda.so.1")
    b = lib("/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.535.309.01", "libcuda.so.1")
    odd = [lib("/x/liba.so.535", s) for s in ("../../etc/passwd", "..", "", None)]
    out = {m.container_path: m.host_path for m in library_mounts([a, b, *odd], READ_ONLY)}
    assert out["/usr/lib64/libcuda.so.1"] == a.host_path
    # an unusable SONAME: the library keeps its own mount, and nothing is mounted by that name
    assert {p for p in out if not p.startswith(("/usr/lib64/", "/usr/lib/x86_64"))} == {
        "/x/liba.so.535"
    }
    assert len(out) == 5


def test_driver_capabilities_filter_the_soname_mounts() -> None:
    """The shim honours NVIDIA_DRIVER_CAPABILITIES on this spec too: graphics names go with
    the default utility,compute; the 32-bit ones need compat32."""
    edits = spec_for(library_mode="mounts")["containerEdits"]
    default = frozenset({"utility", "compute"})
    kept = {m["containerPath"] for m in drivercaps.filter_edits(edits, default)["mounts"]}
    assert {"/usr/lib64/libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"} <= kept
    assert "/usr/lib64/libnvidia-allocator.so.1" in kept  # compute
    assert "/usr/lib64/gbm/nvidia-drm_gbm.so" not in kept  # its gbm name is graphics
    assert "/usr/lib64/libGLX_nvidia.so.0" not in kept
    assert "/usr/lib/libcuda.so.1" not in kept and "/usr/lib/i386-linux-gnu/libcuda.so" not in kept
    everything = drivercaps.filter_edits(edits, default | {"graphics", "compat32"})["mounts"]
    assert {"/usr/lib64/libGLX_nvidia.so.0", "/usr/lib/libcuda.so.1"} <= {
        m["containerPath"] for m in everything
    }


def test_cli_on_the_debian_driver_root(
    tmp_path: Path,
    driver_root: Path,
) -> None:
    out = {}
    for mode in ("hook", "mounts"):
        out[mode] = tmp_path / f"{mode}.json"
        p = subprocess.run(
            [GPUCTK, "cdi", "generate", "--simulate", "l4", "--driver-root", str(driver_root),
             "--library-mode", mode, "-o", str(out[mode])],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr
    assert validate_files([out["mounts"]], SCHEMA) == {str(out["mounts"]): []}
    hook, mounts = (json.loads(out[m].read_text())["containerEdits"] for m in ("hook", "mounts"))
    assert "hooks" not in mounts and len(hook["hooks"]) == 1
    by_path = {m["containerPath"]: m for m in mounts["mounts"]}
    # Every file hook mode mounts is mounted, the libraries under other names.
    assert {m["hostPath"] for m in hook["mounts"]} == {m["hostPath"] for m in mounts["mounts"]}
    others = [m for m in hook["mounts"] if "/lib/x86_64-linux-gnu/" not in m["containerPath"]]
    assert [m for m in others if by_path.get(m["containerPath"]) != m] == []
    lib = "/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.535.309.01"
    for folder in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64"):
        assert by_path[f"{folder}/libcuda.so.1"]["hostPath"] == f"{driver_root}{lib}"
        assert by_path[f"{folder}/libnvidia-ml.so.1"]["hostPath"].endswith(
            "/nvidia/current/libnvidia-ml.so.535.309.01"
        )
    # Every --link the hook mode would make has a mount of the same name in the loader folder
    # (the links into nvidia/current are served from /usr/lib/x86_64-linux-gnu instead).
    args = hook["hooks"][0]["args"]
    links = [a.split("::")[1] for a in args[args.index("--link") + 1 :: 2] if "::" in a]
    assert len(links) > 20
    names = {p.removeprefix("/usr/lib/x86_64-linux-gnu/").removeprefix("nvidia/current/")
             for p in links}  # fmt: skip
    assert {n for n in names if f"/usr/lib/x86_64-linux-gnu/{n}" not in by_path} == set()


def test_select_capabilities_keeps_only_the_selected_files() -> None:
    from gpuctk.cdi.node.driverfiles import select_capabilities

    fw = DriverFile("/drv/lib/firmware/gsp.bin", "/lib/firmware/gsp.bin", "firmware", "utility")
    smi = DriverFile("/drv/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi", "binary", "utility")
    icd = DriverFile("/drv/vk.json", "/usr/share/vulkan/icd.d/nvidia_icd.json", "config",
                     "graphics")  # fmt: skip
    files = DriverFiles(
        libraries=LIBS, binaries=(smi,), firmware=(fw,), configs=(icd,),
        symlinks=(("x", "y"),), ld_folders=("/old",),
    )  # fmt: skip
    assert select_capabilities(files, frozenset(caps.ALL)) is files
    cut = select_capabilities(files, frozenset({"utility"}))
    assert {f.soname for f in cut.libraries} == {"libnvidia-ml.so.1", None}
    assert cut.binaries == (smi,) and cut.firmware == (fw,) and cut.configs == ()
    assert cut.ld_folders == ("/usr/lib/x86_64-linux-gnu",)
    assert [link for _, link in cut.symlinks] == ["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"]
    none = select_capabilities(files, frozenset({"video"}))
    assert none.libraries == () and none.firmware == (fw,)  # firmware always: the GPU's first open
    assert none.symlinks == () and none.ld_folders == ()


@pytest.mark.parametrize(
    ("value", "expected"),
    [("all", set(caps.ALL)), ("utility,compute", {"utility", "compute"}),
     (" compute , utility ", {"utility", "compute"}), ("video,all", set(caps.ALL))],
)  # fmt: skip
def test_parse_strict(value: str, expected: set[str]) -> None:
    assert caps.parse_strict(value) == expected


@pytest.mark.parametrize("value", ["", " , ", "compute,bogus", "COMPUTE"])
def test_parse_strict_names_the_bad_words(value: str) -> None:
    with pytest.raises(ValueError, match=r"bogus|COMPUTE|no capability"):
        caps.parse_strict(value)


@pytest.mark.parametrize("mode", ["hook", "mounts"])
def test_cli_driver_capabilities(tmp_path: Path, driver_root: Path, mode: str) -> None:
    """A compute-only node: the spec mounts the utility and compute files only (and firmware),
    the hook entry links and lists only their folders, and a bad word is a usage error that
    writes nothing."""
    specs = {}
    for value in ("all", "utility,compute"):
        out = tmp_path / f"{value}.json"
        p = subprocess.run(
            [GPUCTK, "cdi", "generate", "--simulate", "l4", "--driver-root", str(driver_root),
             "--library-mode", mode, "--driver-capabilities", value, "-o", str(out)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr
        assert validate_files([out], SCHEMA) == {str(out): []}
        specs[value] = json.loads(out.read_text())["containerEdits"]
    full, cut = (mounts_of({"containerEdits": specs[v]}) for v in ("all", "utility,compute"))
    assert len(cut) < len(full) / 2
    names = {p.rsplit("/", 1)[1] for p in cut}
    assert {"nvidia-smi", "nvidia-cuda-mps-server", "gsp_ga10x.bin"} <= names
    assert any(n.startswith("libcuda.so") for n in names)
    assert any(n.startswith("libnvidia-ml.so") for n in names)
    graphics = [n for n in names if "GLX" in n or "EGL" in n or "vulkan" in n or "vdpau" in n]
    assert graphics == []
    assert set(cut) <= set(full) and all(cut[p] == full[p] for p in cut)
    if mode == "hook":
        args = specs["utility,compute"]["hooks"][0]["args"]
        links = [a for a in args if "::" in a]
        assert links and not [a for a in links if "GLX" in a or "EGL" in a or "vdpau" in a]
        assert any("libcuda.so.1" in a for a in links)
    bad = tmp_path / "bad.json"
    p = subprocess.run(
        [GPUCTK, "cdi", "generate", "--simulate", "l4", "--driver-root", str(driver_root),
         "--driver-capabilities", "compute,graphcs", "-o", str(bad)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert p.returncode == 2 and "--driver-capabilities" in p.stderr and "graphcs" in p.stderr
    assert not bad.exists()
