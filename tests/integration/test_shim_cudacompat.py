"""CUDA forward compatibility through the real shim and runc (hook/cudacompat.py).

The debian test image gets a cuda-compat folder at /usr/local/cuda/compat (through a
/usr/local/cuda link, as in CUDA images): ELF files with the real SONAMEs and their links,
versioned above or below the fixture driver (535.309.01). The shim's `create` with the h100-8
spec, then `ldconfig -p` in a runc container: libcuda.so.1 resolves to the compat file first
when it is newer, and to the driver's when it is older.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fixtures.driver_root import make_elf
from fixtures.gpucheck import Node, generate
from fixtures.images import make_bundle

from gpuctk.cdi.node.ldcache import read_ld_cache

pytestmark = pytest.mark.integration

SHIM = str(Path(sys.executable).with_name("gpuctk-runtime"))
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


def create(node: Node, rootfs: Path, tmp_path: Path) -> dict[str, Any]:
    toml = tmp_path / "gpuctk.toml"
    toml.write_text(f'runtimes = ["/bin/true"]\nspec-dirs = ["{node.spec_dir}"]\n')
    bundle = make_bundle(
        tmp_path / "bundle", rootfs, ["/bin/true"], env=["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0"]
    )
    done = subprocess.run(
        [SHIM, "create", "--bundle", str(bundle), "gpuctk-compat-test"],
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "GPUCTK_CONFIG": str(toml)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    config: dict[str, Any] = json.loads((bundle / "config.json").read_text())
    assert not any(
        h["path"].endswith("gpuctk-hook") and h["args"][1] == "createContainer"
        for hs in (config.get("hooks") or {}).values()
        for h in hs
    )  # the shim did the in-root work (the device node guard aside: hook/nodeguard.py)
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
    config["process"]["args"] = [
        "/bin/sh", "-c", "ldconfig -p | grep 'libcuda.so.1 ' | head -n1; "
        "ldconfig && ldconfig -p | grep 'libcuda.so.1 ' | head -n1",
    ]  # fmt: skip  # the second: an image's own ldconfig run keeps the order
    config["process"]["env"] = ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]
    bundle = tmp_path / "run"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(config))
    done = subprocess.run(
        ["runc", "run", "--bundle", str(bundle), f"gpuctk-compat-{os.getpid()}"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout
    for line in lines:
        assert line.rstrip().endswith(f"=> {wins}/libcuda.so.1"), done.stdout
