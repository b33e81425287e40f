"""`--library-mode folder`: the driver staged in one host folder, mounted at /usr/local/nvidia."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fixtures.devroot import make_node_roots

from gpuctk.cdi import stage, stageprune
from gpuctk.cdi.generate import STAGE_PATH, Options, build_spec
from gpuctk.cdi.node.driverfiles import DriverFile, DriverFiles
from gpuctk.cdi.node.ldcache import parse_ld_cache
from gpuctk.cdi.node.profile import load_profile
from gpuctk.cdi.simulate import simulated_nodes
from gpuctk.cdi.specs.validate import validate_files
from gpuctk.errors import OutputError, UsageError
from gpuctk.records import replace

SCHEMA = Path(__file__).resolve().parents[3] / "shared" / "vendor-data" / "cdi-schema"
GPUCTK = str(Path(sys.executable).with_name("gpuctk"))
V = "535.309.01"
TRIPLET = "/usr/lib/x86_64-linux-gnu"
FRONT = "gpuctk-cdi-hook"


@pytest.fixture
def driver(tmp_path: Path) -> DriverFiles:
    """A small driver under tmp_path/drv: four libraries (one 32-bit, one without SONAME, one
    with a development link beside it in the driver root), the gbm backend's library and two
    binaries, each file's content its own name."""
    entries = [
        (f"{TRIPLET}/libcuda.so.{V}", "library", "compute", "libcuda.so.1", "x86_64"),
        (f"{TRIPLET}/libnvidia-ml.so.{V}", "library", "utility", "libnvidia-ml.so.1", "x86_64"),
        (f"{TRIPLET}/libnvidia-allocator.so.{V}", "library", "compute",
         "libnvidia-allocator.so.1", "x86_64"),
        (f"{TRIPLET}/libnvidia-nosoname.so.{V}", "library", "utility", None, "x86_64"),
        (f"/usr/lib/i386-linux-gnu/libcuda.so.{V}", "library", "compat32", "libcuda.so.1", "i386"),
        ("/usr/bin/nvidia-smi", "binary", "utility", None, None),
        ("/usr/bin/nvidia-cuda-mps-control", "binary", "compute", None, None),
    ]  # fmt: skip
    files: dict[str, list[DriverFile]] = {"library": [], "binary": []}
    for path, kind, cap, soname, arch in entries:
        host = tmp_path / "drv" / path.lstrip("/")
        host.parent.mkdir(parents=True, exist_ok=True)
        host.write_text(path)
        host.chmod(0o755 if kind == "binary" else 0o644)
        links = ("libnvidia-ml.so",) if soname == "libnvidia-ml.so.1" else ()
        files[kind].append(DriverFile(str(host), path, kind, cap, soname, arch, links))
    return DriverFiles(libraries=tuple(files["library"]), binaries=tuple(files["binary"]))


def tree(folder: Path) -> dict[str, str]:
    """Every entry under `folder`: a link's target, or a file's content, or "dir"."""
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif rel == stage.CACHE:  # the stage's own ld cache, as `ldconfig -p` lists it
            out[rel] = "; ".join(f"{e.key} {e.description} {e.value}"
                                 for e in parse_ld_cache(path.read_bytes()))  # fmt: skip
        else:
            out[rel] = "dir" if path.is_dir() else path.read_text()
    return out


def test_the_layout(driver: DriverFiles, tmp_path: Path) -> None:
    folder = Path(stage.stage_driver(driver, V, str(tmp_path / "staging")))
    assert folder.parent == tmp_path / "staging" and folder.name.startswith(V + "-")
    assert tree(folder) == {
        "bin": "dir",
        "bin/nvidia-cuda-mps-control": "/usr/bin/nvidia-cuda-mps-control",
        "bin/nvidia-smi": "/usr/bin/nvidia-smi",
        "lib": "dir",
        "lib/libcuda.so": f"-> libcuda.so.{V}",
        "lib/libcuda.so.1": f"-> libcuda.so.{V}",
        f"lib/libcuda.so.{V}": f"/usr/lib/i386-linux-gnu/libcuda.so.{V}",
        "lib64": "dir",
        "lib64/gbm": "dir",
        "lib64/gbm/nvidia-drm_gbm.so": f"-> ../libnvidia-allocator.so.{V}",
        "lib64/libcuda.so": f"-> libcuda.so.{V}",
        "lib64/libcuda.so.1": f"-> libcuda.so.{V}",
        f"lib64/libcuda.so.{V}": f"{TRIPLET}/libcuda.so.{V}",
        "lib64/libnvidia-allocator.so.1": f"-> libnvidia-allocator.so.{V}",
        f"lib64/libnvidia-allocator.so.{V}": f"{TRIPLET}/libnvidia-allocator.so.{V}",
        "lib64/libnvidia-ml.so": f"-> libnvidia-ml.so.{V}",
        "lib64/libnvidia-ml.so.1": f"-> libnvidia-ml.so.{V}",
        f"lib64/libnvidia-ml.so.{V}": f"{TRIPLET}/libnvidia-ml.so.{V}",
        f"lib64/libnvidia-nosoname.so.{V}": f"{TRIPLET}/libnvidia-nosoname.so.{V}",
        "ld.so.cache": "; ".join(
            [  # each library under its SONAME and development links, at its path
                f"libnvidia-ml.so.1 libc6,x86-64 {STAGE_PATH}/lib64/libnvidia-ml.so.1",
                f"libnvidia-ml.so libc6,x86-64 {STAGE_PATH}/lib64/libnvidia-ml.so",
                "libnvidia-allocator.so.1 libc6,x86-64 "
                f"{STAGE_PATH}/lib64/libnvidia-allocator.so.1",
                f"libcuda.so.1 libc6,x86-64 {STAGE_PATH}/lib64/libcuda.so.1",
                f"libcuda.so.1 libc6 {STAGE_PATH}/lib/libcuda.so.1",
                f"libcuda.so libc6,x86-64 {STAGE_PATH}/lib64/libcuda.so",
                f"libcuda.so libc6 {STAGE_PATH}/lib/libcuda.so",
            ]
        ),
    }
    # Every folder is readable by an unprivileged container user; files keep their modes and
    # are the driver's own inodes (hard links: same filesystem here).
    for path in [folder, *folder.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            assert path.stat().st_mode & 0o777 == 0o755, path
    smi = folder / "bin/nvidia-smi"
    source = tmp_path / "drv/usr/bin/nvidia-smi"
    assert smi.stat().st_ino == source.stat().st_ino and smi.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in (tmp_path / "staging").iterdir()] == [folder.name]  # no leftovers


def test_a_new_rule_for_the_stages_cache_makes_a_new_stage(
    driver: DriverFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stage's name covers its ld cache: a gpuctk whose cache_of lists more names (the
    development links) stages anew instead of reusing a stage whose cache lacks them."""
    first = stage.stage_path_of(driver, V, str(tmp_path))
    real = stage.cache_of
    monkeypatch.setattr(stage, "cache_of", lambda files: real(files) + b"\0")
    assert stage.stage_path_of(driver, V, str(tmp_path)) != first


def test_a_rerun_reuses_the_stage_and_a_changed_file_makes_a_new_one(
    driver: DriverFiles, tmp_path: Path
) -> None:
    staging = tmp_path / "staging"
    first = stage.stage_driver(driver, V, str(staging))
    marker = Path(first) / "lib64"
    before = marker.stat().st_mtime_ns
    assert stage.stage_driver(driver, V, str(staging)) == first
    assert marker.stat().st_mtime_ns == before and len(list(staging.iterdir())) == 1
    # A driver upgrade replaces the file by rename: a new identity, a new stage; the old stays
    # (an older spec may still name it) with the old content.
    host = Path(driver.libraries[0].host_path)
    new = host.with_name("new")
    new.write_text("upgraded")
    new.rename(host)
    second = stage.stage_driver(driver, V, str(staging))
    assert second != first and sorted(staging.iterdir()) == sorted(map(Path, (first, second)))
    assert (Path(second) / f"lib64/libcuda.so.{V}").read_text() == "upgraded"
    assert (Path(first) / f"lib64/libcuda.so.{V}").read_text() == f"{TRIPLET}/libcuda.so.{V}"
    # The capability selection is part of the name too.
    fewer = DriverFiles(libraries=driver.libraries[:1])
    assert stage.stage_driver(fewer, V, str(staging)) not in (first, second)


def failing(monkeypatch: pytest.MonkeyPatch, call: str, code: int) -> None:
    """os.`call`(src, dst) fails with errno `code` for the rest of the test."""

    def fail(src: str, dst: str) -> None:
        raise OSError(code, os.strerror(code), dst)

    monkeypatch.setattr(os, call, fail)


def test_across_filesystems_the_files_are_copied(
    driver: DriverFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing(monkeypatch, "link", errno.EXDEV)
    said: list[str] = []
    folder = Path(stage.stage_driver(driver, V, str(tmp_path / "staging"), said.append))
    assert said == [f"driver staged in {folder}: 0 hard-linked, 7 copied (0 MiB: another "
                    "filesystem), 8 links"]  # fmt: skip
    smi, source = folder / "bin/nvidia-smi", tmp_path / "drv/usr/bin/nvidia-smi"
    assert smi.stat().st_ino != source.stat().st_ino
    assert smi.read_text() == "/usr/bin/nvidia-smi" and smi.stat().st_mode & 0o777 == 0o755


@pytest.mark.parametrize("kind", ["group-writable", "symlink", "a file"])
def test_an_unsafe_staging_dir_is_refused(driver: DriverFiles, tmp_path: Path, kind: str) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    staging = tmp_path / "staging"
    if kind == "group-writable":
        staging.mkdir()
        staging.chmod(0o775)
        target = staging
    elif kind == "symlink":
        staging.symlink_to(target)
    else:
        staging.write_text("")
    with pytest.raises(OutputError, match=r"staging dir|refusing to stage"):
        stage.stage_driver(driver, V, str(staging))
    assert list(target.iterdir()) == []


def test_a_failure_midway_leaves_nothing(
    driver: DriverFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing(monkeypatch, "symlink", errno.ENOSPC)
    staging = tmp_path / "staging"
    with pytest.raises(OutputError, match=r"No space left on device.*nothing was changed"):
        stage.stage_driver(driver, V, str(staging))
    assert list(staging.iterdir()) == []


def test_an_unreadable_driver_file_is_an_input_error(driver: DriverFiles, tmp_path: Path) -> None:
    Path(driver.binaries[0].host_path).unlink()
    with pytest.raises(Exception, match=r"cannot stage .*nvidia-smi") as info:
        stage.stage_driver(driver, V, str(tmp_path / "staging"))
    assert type(info.value).__name__ == "InputError"
    assert not (tmp_path / "staging").exists()


def test_the_spec_mounts_the_stage_only(driver: DriverFiles) -> None:
    machine = load_profile("l4")
    spec = build_spec(
        machine,
        driver,
        Options(library_mode="folder", stage_path="/var/lib/gpuctk/driver/x"),
        simulated_nodes(machine),
    ).to_dict()
    edits = spec["containerEdits"]
    (hook,) = edits["hooks"]  # one entry: the stage's folder for the images mounts miss
    assert hook["args"] == [  # this driver has 32-bit libraries: lib/ too
        "gpuctk-hook", "createContainer",
        "--link-for", f"utility:{STAGE_PATH}/bin/nvidia-smi::/usr/bin/nvidia-smi",
        "--link-for",
        f"compute:{STAGE_PATH}/bin/nvidia-cuda-mps-control::/usr/bin/nvidia-cuda-mps-control",
        "--folder", f"{STAGE_PATH}/lib64", "--folder", f"{STAGE_PATH}/lib",
        "--ld-cache", "/var/lib/gpuctk/driver/x/ld.so.cache",
    ]  # fmt: skip
    hookless = Options(library_mode="folder", stage_path="/x", disabled_hooks=("all",))
    assert (
        "hooks"
        not in build_spec(machine, driver, hookless, simulated_nodes(machine)).to_dict()[
            "containerEdits"
        ]
    )
    x = "/var/lib/gpuctk/driver/x"
    assert [(m["hostPath"], m["containerPath"]) for m in edits["mounts"]] == [
        (f"{x}/lib64", f"{TRIPLET}/glibc-hwcaps/x86-64-v2"),
        (f"{x}/lib64", "/usr/lib64/glibc-hwcaps/x86-64-v2"),
        (x, STAGE_PATH),
    ]
    one = Options(library_mode="folder", stage_path=x, loader_folders=("lib64",))
    doc = build_spec(machine, driver, one, simulated_nodes(machine)).to_dict()
    assert [m["containerPath"] for m in doc["containerEdits"]["mounts"]] == [
        "/usr/lib64/glibc-hwcaps/x86-64-v2",
        STAGE_PATH,
    ]
    # No level is known for another architecture: the stage mount alone.
    arm = DriverFiles(libraries=tuple(replace(f, arch="aarch64") for f in driver.libraries))
    doc = build_spec(machine, arm, Options(library_mode="folder", stage_path=x),
                     simulated_nodes(machine)).to_dict()  # fmt: skip
    assert [m["containerPath"] for m in doc["containerEdits"]["mounts"]] == [STAGE_PATH]
    with pytest.raises(UsageError, match="stage folder"):
        build_spec(machine, driver, Options(library_mode="folder"), simulated_nodes(machine))


def generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GPUCTK, "cdi", "generate", "--simulate", "l4", *args],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


def test_cli_folder_mode(tmp_path: Path, driver_root: Path) -> None:
    out, staging = tmp_path / "nvidia.json", tmp_path / "staging"
    p = generate("--driver-root", str(driver_root), "--library-mode", "folder",
                 "--staging-dir", str(staging), "-o", str(out))  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert validate_files([out], SCHEMA) == {str(out): []}
    doc = json.loads(out.read_text())
    (mount,) = [m for m in doc["containerEdits"]["mounts"] if m["containerPath"] == STAGE_PATH]
    assert f"driver staged in {mount['hostPath']}: " in p.stderr and "hard-linked" in p.stderr
    again = generate("--driver-root", str(driver_root), "--library-mode", "folder",
                     "--staging-dir", str(staging), "-o", str(out))  # fmt: skip
    assert again.returncode == 0 and f"stage {mount['hostPath']} is current" in again.stderr
    assert (Path(mount["hostPath"]) / "lib64/libcuda.so.1").is_symlink()
    paths = [m["containerPath"] for m in doc["containerEdits"]["mounts"]]
    # No library or binary mount of its own (the Xorg modules are display configs): the stage,
    # and its lib64/ in the two loader families' glibc-hwcaps folders.
    libs = [
        p for p in paths if p.startswith((f"{TRIPLET}/", "/usr/lib64", "/usr/bin/", "/usr/lib/i3"))
    ]
    assert libs == [f"{TRIPLET}/glibc-hwcaps/x86-64-v2", "/usr/lib64/glibc-hwcaps/x86-64-v2"]


@pytest.mark.parametrize(
    "args",
    [
        ("--library-mode", "folder", "--loader-folders", "triplet,lib32"),
        ("--library-mode", "folder", "--staging-dir", "relative/dir"),
    ],
)
def test_cli_bad_options_stage_nothing(tmp_path: Path, driver_root: Path, args: Any) -> None:
    staging = tmp_path / "staging"
    argv = [*args] if "--staging-dir" in args else [*args, "--staging-dir", str(staging)]
    p = generate("--driver-root", str(driver_root), *argv, "-o", str(tmp_path / "x.json"))
    assert p.returncode == 2, p.stderr
    assert "--loader-folders" in p.stderr or "--staging-dir" in p.stderr
    assert not staging.exists() and not (tmp_path / "x.json").exists()


def test_compute_only_specs_leave_the_drm_nodes_out(tmp_path: Path, driver_root: Path) -> None:
    """The GPUs' /dev/dri card and render nodes serve graphics and display only (as in the
    NVIDIA runtime's legacy mode): a spec without both leaves them out, one with either keeps
    them."""
    roots = make_node_roots(tmp_path / "node", load_profile("l4"))
    found = {}
    for value in ("all", "utility,compute", "compute,graphics", "utility,display"):
        out = tmp_path / f"{value}.json"
        p = generate("--driver-root", str(driver_root), "--dev-root", str(roots.dev_root),
                     "--proc-root", str(roots.proc_root), "--sys-root", str(roots.sys_root),
                     "--driver-capabilities", value, "--staging-dir", str(tmp_path / "st"),
                     "-o", str(out))  # fmt: skip
        assert p.returncode == 0, p.stderr
        doc = json.loads(out.read_text())
        found[value] = sorted(
            n["path"] for d in doc["devices"] for n in d["containerEdits"]["deviceNodes"]
        )
    assert any(p.startswith("/dev/dri/renderD") for p in found["all"])
    assert found["compute,graphics"] == found["utility,display"] == found["all"]
    assert found["utility,compute"] == [p for p in found["all"] if not p.startswith("/dev/dri/")]


def test_doctor_reads_the_driver_version_off_the_stage_folder() -> None:
    """A folder-mode spec has no hook entry (so no machine facts) and no versioned library
    path: `gpuctk doctor` takes the driver version from the stage folder's name."""
    from gpuctk.doctor.cdi import _spec_driver_version

    doc = {"containerEdits": {"mounts": [
        {"hostPath": "/lib/firmware/nvidia/535.309.01/gsp_ga10x.bin"},
        {"hostPath": f"/var/lib/gpuctk/driver/{V}-0123456789abcdef", "containerPath": STAGE_PATH},
    ]}}  # fmt: skip
    assert _spec_driver_version(doc, None) == V
    doc["containerEdits"]["mounts"].pop()
    assert _spec_driver_version(doc, None) is None


def _stage_edits(folder: Path, *extra: str) -> dict[str, Any]:
    """A folder spec's edits for the stage `folder`: its mount and its gpuctk-cdi-hook entry."""
    args = [FRONT, "createContainer", "--folder", f"{STAGE_PATH}/lib64",
            "--ld-cache", f"{folder}/{stage.CACHE}", *extra]  # fmt: skip
    return {
        "mounts": [{"hostPath": str(folder), "containerPath": STAGE_PATH, "options": ["ro"]}],
        "hooks": [
            {"hookName": "createContainer", "path": "/usr/bin/gpuctk-cdi-hook", "args": args}
        ],
    }


def test_the_shim_leaves_the_stage_to_its_entry(driver: DriverFiles, tmp_path: Path) -> None:
    """A folder spec's entry (gpuctk-cdi-hook) stays whatever its stage holds: runc runs it,
    as on the compiled create and in an engine that applies the spec, and the node guard is
    decided for it as for any entry of ours (protect = "off": the entry is told not to guard;
    "hook": it guards). The shim plans nothing for it."""
    from gpuctk.hook.shim import shimroot
    from gpuctk.hook.verbs import nodeguard

    folder = Path(stage.stage_driver(driver, V, str(tmp_path / "staging")))
    config = {"root": {"path": str(tmp_path / "rootfs")}, "process": {"env": []}}
    for case in ("the stage's cache", "another cache", "no cache"):
        edits = _stage_edits(folder)
        if case == "another cache":
            edits["hooks"][0]["args"][5] = f"{tmp_path}/{stage.CACHE}"
        elif case == "no cache":
            (folder / stage.CACHE).unlink()
        assert shimroot.prepare(edits) == {}, case
        assert shimroot.gpuctk_hooks(edits) == edits["hooks"], case
        out = shimroot.take_over(config, str(tmp_path), edits, print, {}, protect="off")
        (entry,) = edits["hooks"]
        assert out["hooks"] == [
            {**entry, "args": [*entry["args"], "--disable-hook", nodeguard.NAME]}
        ]
        assert shimroot.take_over(config, str(tmp_path), edits, print, {}) == edits
    assert not (tmp_path / "rootfs").exists()  # nothing written into a root
    assert not shimroot.gpuctk_hooks({"hooks": []})


def test_prune_keeps_what_a_spec_names(tmp_path: Path) -> None:
    """--prune-stages: the current stage and any a spec file names stay; an unnamed one and a
    `.tmp-` folder an hour old go; anything else in the staging dir is not touched."""
    staging, specs = tmp_path / "staging", tmp_path / "cdi"
    specs.mkdir()
    names = {n: staging / f"{V}-{n * 16}" for n in "abc"}
    for folder in names.values():
        (folder / "lib64").mkdir(parents=True)
    (specs / "other.yaml").write_text(f"mounts:\n- hostPath: {names['b']}\n")
    (specs / "notes.txt").write_text(str(names["c"]))  # not a spec file
    old, new = staging / ".tmp-old", staging / ".tmp-new"
    old.mkdir()
    new.mkdir()
    os.utime(old, (1, 1))
    (staging / "README").write_text("an admin's file")
    said: list[str] = []
    removed = stageprune.prune_stages(str(staging), str(names["a"]), (str(specs), "/nonexistent"),
                                 said.append)  # fmt: skip
    assert removed == [str(old), str(names["c"])]
    assert sorted(p.name for p in staging.iterdir()) == sorted(
        [".tmp-new", "README", names["a"].name, names["b"].name]
    )
    assert said == [
        f"removed {old}: a stage a run left unfinished over an hour ago",
        f"removed {names['c']}: no CDI spec in {specs}, /nonexistent names it",
    ]


def test_cli_prune_stages(tmp_path: Path, driver_root: Path) -> None:
    staging, out = tmp_path / "staging", tmp_path / "cdi" / "nvidia.json"
    out.parent.mkdir()
    common = ("--driver-root", str(driver_root), "--library-mode", "folder",
              "--staging-dir", str(staging), "-o", str(out))  # fmt: skip
    assert generate(*common).returncode == 0
    (first,) = staging.iterdir()
    p = generate(*common, "--driver-capabilities", "utility,compute", "--prune-stages")
    assert p.returncode == 0, p.stderr
    (second,) = staging.iterdir()  # the spec was rewritten: nothing names the first any more
    assert second != first and f"removed {first}" in p.stderr
    assert str(second) in out.read_text()
    # a stage a spec in another folder names stays when that folder is named to keep
    other = tmp_path / "runtime-specs"
    other.mkdir()
    (other / "old.json").write_text(json.dumps({"mounts": [{"hostPath": str(second)}]}))
    p = generate(*common, "--prune-stages", "--keep-spec-dir", str(other))
    assert p.returncode == 0, p.stderr
    assert second.is_dir() and len(list(staging.iterdir())) == 2 and "removed" not in p.stderr
    (other / "old.json").unlink()
    p = generate(*common, "--prune-stages", "--keep-spec-dir", str(other))
    assert p.returncode == 0 and f"removed {second}" in p.stderr and not second.exists()
    bad = generate("--driver-root", str(driver_root), "--library-mode", "hook",
                   "--prune-stages", "-o", str(out))  # fmt: skip
    assert bad.returncode == 2 and "--prune-stages goes with" in bad.stderr
    bad = generate(*common, "--keep-spec-dir", str(other))
    assert bad.returncode == 2 and "--keep-spec-dir goes with --prune-stages" in bad.stderr


def test_the_shim_mirrors_the_stage_path() -> None:
    """hook/shim/shimroot.py keeps its own copy of the stage's container path (the create path does
    not import gpuctk.cdi.generate): the two must agree."""
    from gpuctk.hook.shim import shimroot

    assert shimroot.STAGE_PATH == STAGE_PATH
