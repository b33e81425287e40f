"""CUDA forward compatibility through the real shim, its hook and runc (hook/verbs/cudacompat.py).

The debian test image gets a cuda-compat folder at /usr/local/cuda/compat (through a
/usr/local/cuda link, as in CUDA images): ELF files with the real SONAMEs and their links,
versioned above or below the fixture driver (535.309.01). The shim's `create` with the h100-8
spec, then `ldconfig -p` in a runc container: libcuda.so.1 resolves to the compat file first
when it is newer, and to the driver's when it is older.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fixtures.driver_root import make_elf
from fixtures.gpucheck import Node, generate, runc_run, shim_edit
from fixtures.images import make_bundle

from gpuctk.cdi.node.ldcache import read_ld_cache

pytestmark = pytest.mark.integration

LIBDIR = "/usr/lib/x86_64-linux-gnu/nvidia/current"
COMPAT = "/usr/local/cuda/compat"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, driver_root: Path) -> Node:
    if os.geteuid() != 0:
        pytest.skip("mknod and overlays need root")
    base = tmp_path_factory.mktemp("cudacompat")
    return generate(base, driver_root, "h100-8", base / "cdi" / "nvidia.json")


def add_compat(rootfs: Path, version: str) -> None:
    real = rootfs / "usr/local/cuda-12.9/compat"
    real.mkdir(parents=True)
    (rootfs / "usr/local/cuda").symlink_to("cuda-12.9")
    for soname in ("libcuda.so.1", "libnvidia-ptxjitcompiler.so.1", "libnvidia-nvvm.so.4"):
        stem = soname.rsplit(".so.", 1)[0]
        (real / f"{stem}.so.{version}").write_bytes(make_elf(soname))
        (real / soname).symlink_to(f"{stem}.so.{version}")


def create(node: Node, rootfs: Path, tmp_path: Path, inroot: bool = True) -> dict[str, Any]:
    """`gpuctk-runtime create`'s config.json: the shim's in-root work done, or with `inroot`
    False (GPUCTK_SHIM_INROOT=0) the spec's gpuctk-hook entry left for runc to run."""
    bundle = make_bundle(
        tmp_path / "bundle", rootfs, ["/bin/true"], env=["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0"]
    )
    state, inroot_env = tmp_path / "state", "1" if inroot else "0"
    config = shim_edit(bundle, node.spec_dir, state, GPUCTK_SHIM_INROOT=inroot_env)
    assert inroot is not any(
        h["path"].endswith("gpuctk-hook") and h["args"][1] == "createContainer"
        for hs in (config.get("hooks") or {}).values()
        for h in hs
    )  # the shim did the in-root work, or left it to the hook (the node guard aside)
    return config


@pytest.mark.parametrize(
    ("version", "wins"), [("575.57.08", COMPAT), ("470.256.02", LIBDIR)], ids=["newer", "older"]
)
def test_ldconfig_in_the_container_resolves_libcuda_by_version(
    node: Node, fresh_rootfs: Callable[[str], Path], tmp_path: Path, version: str, wins: str
) -> None:
    rootfs = fresh_rootfs("debian")
    add_compat(rootfs, version)
    config = create(node, rootfs, tmp_path)
    cache = read_ld_cache(str(rootfs / "etc/ld.so.cache"))
    libcuda = [e.value for e in cache if e.key == "libcuda.so.1"]
    assert libcuda[0] == f"{wins}/libcuda.so.1", libcuda
    conf = rootfs / "etc/ld.so.conf.d/00-compat-gpuctk.conf"
    assert (wins == COMPAT) is (conf.exists() and COMPAT in conf.read_text().splitlines())
    script = (
        "ldconfig -p | grep 'libcuda.so.1 ' | head -n1; "
        "ldconfig && ldconfig -p | grep 'libcuda.so.1 ' | head -n1"
    )  # the second: an image's own ldconfig run keeps the order
    done = run(config, tmp_path, script, "gpuctk-compat")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout
    for line in lines:
        assert line.rstrip().endswith(f"=> {wins}/libcuda.so.1"), done.stdout


def run(
    config: dict[str, Any], tmp_path: Path, script: str, name: str
) -> subprocess.CompletedProcess[str]:
    """`script` in a runc container of the shim's `config` (a bundle of its own)."""
    config["process"]["env"] = ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]
    bundle = tmp_path / "run"
    bundle.mkdir()
    return runc_run(bundle, config, script, f"{name}-{os.getpid()}")


PROBE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    struct link_map *map = NULL;
    if (h == NULL || dlinfo(h, RTLD_DI_LINKMAP, &map) != 0) {
        printf("DLERROR %s\n", dlerror());
        return 1;
    }
    printf("DLOPEN %s\n", map->l_name);
    return 0;
}
"""


def gcc(tmp_path: Path, *args: str) -> None:
    done = subprocess.run(["gcc", *args], capture_output=True, text=True, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("inroot", [True, False], ids=["shim", "hook"])
@pytest.mark.parametrize(
    ("version", "wins"), [("575.57.08", COMPAT), ("470.256.02", LIBDIR)], ids=["newer", "older"]
)
def test_dlopen_in_the_container_agrees(
    node: Node,
    fresh_rootfs: Callable[[str], Path],
    tmp_path: Path,
    version: str,
    wins: str,
    inroot: bool,
) -> None:
    """A program of the image dlopens libcuda.so.1 as CUDA does: it gets the compat file when
    that is newer than the driver, the driver's otherwise (a real shared object in the compat
    folder, built here, so that the loader maps it), whether the shim wrote the ld cache or the
    spec's gpuctk-hook did at createContainer."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the probe")
    rootfs = fresh_rootfs("debian")
    add_compat(rootfs, version)
    (tmp_path / "stub.c").write_text("int cuInit(unsigned int flags) { return (int)flags; }\n")
    stub = rootfs / f"usr/local/cuda-12.9/compat/libcuda.so.{version}"
    stub.unlink()
    gcc(tmp_path, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stub), "stub.c")
    (tmp_path / "probe.c").write_text(PROBE)
    gcc(tmp_path, "-o", str(rootfs / "cuda-probe"), "probe.c")
    config = create(node, rootfs, tmp_path, inroot)
    done = run(config, tmp_path, "exec /cuda-probe", "gpuctk-dlopen")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == f"DLOPEN {wins}/libcuda.so.1", done.stdout
