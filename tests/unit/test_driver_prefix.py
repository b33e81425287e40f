"""A driver under a prefix (GKE, COS, an H200 node among them): NVML found through the driver
root's own ld cache and the known prefixes; the driver's ELF programs (never the wrapper script
at /usr/bin/nvidia-smi) and its GSP firmware in the spec, in hook and folder mode."""

from __future__ import annotations

import ctypes.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.prefix_root import PROGRAMS, build_prefix_root, cached

from gpuctk.cdi import discover
from gpuctk.cdi.node import driverfiles as df
from gpuctk.cdi.node.ldcache import read_ld_cache

GPUCTK = str(Path(sys.executable).with_name("gpuctk"))
PREFIX = "/usr/local/nvidia"
IN_ROOT = PREFIX.lstrip("/")
ELF = b"\x7fELF"


@pytest.fixture(scope="module")
def prefix_root(tmp_path_factory: pytest.TempPathFactory, driver_root: Path,
                driver_version: str) -> Path:  # fmt: skip
    root = build_prefix_root(tmp_path_factory.mktemp("gke") / "root", driver_root, driver_version)
    if not cached(root):
        pytest.skip("ldconfig -r needs root (chroot): the prefix root has no ld cache")
    return root


def generate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GPUCTK, "cdi", "generate", *args], capture_output=True, text=True,
                          env=env, timeout=120, check=False)  # fmt: skip


def test_the_fixture_has_the_prefix_layout(prefix_root: Path, driver_version: str) -> None:
    entries = {e.key: e.value for e in read_ld_cache(str(prefix_root / "etc/ld.so.cache"))}
    assert entries["libnvidia-ml.so.1"] == f"{PREFIX}/lib64/libnvidia-ml.so.1"
    assert not (prefix_root / "usr/bin/nvidia-smi").read_bytes().startswith(ELF)
    assert not (prefix_root / "usr/lib/x86_64-linux-gnu").exists()
    assert not (prefix_root / "lib/firmware").exists()


# --- 1. NVML under a driver root ---------------------------------------------------------------


def test_find_nvml_reads_the_roots_ld_cache(prefix_root: Path, driver_version: str) -> None:
    found, looked = discover.find_nvml(str(prefix_root))
    assert found == f"{prefix_root}{PREFIX}/lib64/libnvidia-ml.so.{driver_version}"
    assert looked == (f"{prefix_root}/etc/ld.so.cache",)  # the cache answered


def _nvml_root(tmp_path: Path, fake: Path, folder: str, ld_cache: bool) -> Path:
    """A driver root whose only NVML is the fake, in `folder`, named by the root's ld cache or
    not, as installed: libnvidia-ml.so.<version> and its SONAME link."""
    root = tmp_path / "drv"
    lib = root / folder.lstrip("/")
    lib.mkdir(parents=True)
    shutil.copy(fake, lib / "libnvidia-ml.so.535.309.01")
    (lib / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.535.309.01")
    (root / "etc/ld.so.conf.d").mkdir(parents=True)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / "etc/ld.so.conf.d/nvidia.conf").write_text(f"{folder}\n")
    if ld_cache:
        subprocess.run(["ldconfig", "-X", "-r", str(root)], capture_output=True, check=False)
        if not (root / "etc/ld.so.cache").is_file():
            pytest.skip("ldconfig -r needs root (chroot)")
    return root


def _no_system_nvml(env: dict[str, str]) -> dict[str, str]:
    """`env` where only a driver root can supply NVML: the loader's path does not have it."""
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has a real libnvidia-ml")
    return {k: v for k, v in env.items() if k not in ("LD_LIBRARY_PATH", "GPUCTK_NVML_LIBRARY")}


@pytest.mark.parametrize(
    ("folder", "ld_cache"),
    [
        (f"{PREFIX}/lib64", True),  # GKE, an H200 node among them
        ("/opt/driver-580/lib", True),  # anywhere at all: the root's ld cache names it
        ("/home/kubernetes/bin/nvidia/lib64", False),  # COS, no cache: the known prefix
    ],
)
def test_generate_finds_nvml_under_the_driver_root(  # type: ignore[no-untyped-def]
    tmp_path: Path, fake_nvml_env, fake_nvml_lib: Path, folder: str, ld_cache: bool
) -> None:
    from fixtures.devroot import make_node_roots

    from gpuctk.cdi.node.profile import load_profile

    root = _nvml_root(tmp_path, fake_nvml_lib, folder, ld_cache)
    roots = make_node_roots(tmp_path / "node", load_profile("l4"))
    env = _no_system_nvml(fake_nvml_env("l4"))
    out = tmp_path / "spec.json"
    p = generate("--driver-root", str(root), "--dev-root", str(roots.dev_root),
                 "--proc-root", str(roots.proc_root), "--sys-root", str(roots.sys_root),
                 "--library-mode", "hook", "-o", str(out), env=env)  # fmt: skip
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    assert {d["name"] for d in doc["devices"]} >= {"0", "all"}
    mounts = {m["containerPath"]: m["hostPath"] for m in doc["containerEdits"]["mounts"]}
    lib = f"{folder}/libnvidia-ml.so.535.309.01"
    assert mounts[lib] == f"{root}{lib}"


def test_no_nvml_under_the_driver_root_says_where_it_looked_and_what_to_pass(
    tmp_path: Path,
) -> None:
    root = tmp_path / "empty"
    (root / "etc").mkdir(parents=True)
    p = generate("--driver-root", str(root), "-o", str(tmp_path / "x.json"),
                 env=_no_system_nvml(dict(os.environ)))  # fmt: skip
    assert p.returncode == 3, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith("gpuctk: error: NVML library libnvidia-ml.so.1 not found")
    for where in (
        f"{root}/etc/ld.so.cache",
        f"{root}{PREFIX}/lib64",
        f"{root}/home/kubernetes/bin/nvidia/lib64",
        f"{root}/usr/lib/x86_64-linux-gnu",
    ):
        assert where in line, line  # fmt: skip
    assert "--nvml-library PATH" in line


# --- 2. the driver's programs and firmware under the prefix ------------------------------------


def _expected_binaries(root: Path, prefix: str = PREFIX) -> dict[str, str]:
    return {f"/usr/bin/{n}": f"{root}{prefix}/bin/{n}" for n in PROGRAMS}


def _expected_firmware(root: Path, version: str, prefix: str = PREFIX) -> dict[str, str]:
    folder = f"{prefix}/firmware/nvidia/{version}"
    names = sorted(p.name for p in (root / folder.lstrip("/")).iterdir())
    assert names == ["gsp_ga10x.bin", "gsp_tu10x.bin"]
    return {f"/lib/firmware/nvidia/{version}/{n}": f"{root}{folder}/{n}" for n in names}


def test_discovery_takes_the_prefix_elf_over_the_wrapper(
    prefix_root: Path, driver_version: str
) -> None:
    files = df.discover_driver_files(str(prefix_root), driver_version)
    got = {f.container_path: f.host_path for f in files.binaries}
    assert got == _expected_binaries(prefix_root)
    assert all(Path(f.host_path).read_bytes()[:4] == ELF for f in files.binaries)
    got = {f.container_path: f.host_path for f in files.firmware}
    assert got == _expected_firmware(prefix_root, driver_version)
    libs = {f.container_path for f in files.libraries}
    assert f"{PREFIX}/lib64/libcuda.so.{driver_version}" in libs
    assert files.ld_folders == (f"{PREFIX}/lib64",)


@pytest.mark.parametrize(
    "prefix",
    [
        "/home/kubernetes/bin/nvidia",  # COS: a known prefix
        "/opt/driver-580",  # anywhere: the prefix of the libraries the root's ld cache names
    ],
)
def test_other_prefixes(
    tmp_path: Path, driver_root: Path, driver_version: str, prefix: str
) -> None:
    root = build_prefix_root(tmp_path / "root", driver_root, driver_version, prefix)
    if not cached(root):
        pytest.skip("ldconfig -r needs root (chroot): the prefix root has no ld cache")
    files = df.discover_driver_files(str(root), driver_version)
    assert files.ld_folders == (f"{prefix}/lib64",)
    got = {f.container_path: f.host_path for f in files.binaries}
    assert got == _expected_binaries(root, prefix)
    got = {f.container_path: f.host_path for f in files.firmware}
    assert got == _expected_firmware(root, driver_version, prefix)
    found, _ = discover.find_nvml(str(root))
    assert found == f"{root}{prefix}/lib64/libnvidia-ml.so.{driver_version}"


def test_a_wrapper_alone_is_left_out_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "r"
    (root / "usr/bin").mkdir(parents=True)
    wrapper = root / "usr/bin/nvidia-smi"
    wrapper.write_text(f'#!/bin/sh\nexec {PREFIX}/bin/nvidia-smi "$@"\n')
    wrapper.chmod(0o755)
    assert df.discover_driver_files(str(root), "535.309.01").binaries == ()
    (line,) = capsys.readouterr().err.splitlines()
    assert f"left out {wrapper}: not an ELF program" in line and "--driver-root" in line


def test_hook_mode_spec_mounts_the_prefix_programs_and_firmware(
    tmp_path: Path, prefix_root: Path, driver_version: str
) -> None:
    out = tmp_path / "spec.json"
    p = generate("--simulate", "l4", "--driver-root", str(prefix_root), "--library-mode", "hook",
                 "-o", str(out))  # fmt: skip
    assert p.returncode == 0, p.stderr
    mounts = {m["containerPath"]: m["hostPath"]
              for m in json.loads(out.read_text())["containerEdits"]["mounts"]}  # fmt: skip
    assert Path(mounts["/usr/bin/nvidia-smi"]).read_bytes()[:4] == ELF
    for want in (_expected_binaries(prefix_root), _expected_firmware(prefix_root, driver_version)):
        assert {k: mounts.get(k) for k in want} == want


def test_folder_mode_stages_the_prefix_programs_and_firmware(
    tmp_path: Path, prefix_root: Path, driver_version: str
) -> None:
    out, staging = tmp_path / "spec.json", tmp_path / "staging"
    p = generate("--simulate", "l4", "--driver-root", str(prefix_root), "--staging-dir",
                 str(staging), "-o", str(out))  # fmt: skip
    assert p.returncode == 0 and "driver staged in" in p.stderr, p.stderr
    edits = json.loads(out.read_text())["containerEdits"]
    (stage,) = [m["hostPath"] for m in edits["mounts"] if m["containerPath"] == PREFIX]
    (hook,) = edits["hooks"]
    args = hook["args"]
    links = [args[i + 1] for i, a in enumerate(args) if a in ("--link", "--link-for")]
    for name in PROGRAMS:
        staged = Path(stage) / "bin" / name
        assert staged.read_bytes() == (prefix_root / f"{IN_ROOT}/bin/{name}").read_bytes()
        assert any(link.endswith(f":{PREFIX}/bin/{name}::/usr/bin/{name}") for link in links), links
    assert staged.read_bytes()[:4] == ELF
    for container, host in _expected_firmware(prefix_root, driver_version).items():
        staged = Path(stage) / "files" / container.lstrip("/")
        assert staged.read_bytes() == Path(host).read_bytes()
        assert f"{PREFIX}/files{container}::{container}" in links
