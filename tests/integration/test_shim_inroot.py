"""gpuctk-runtime does the hook's in-root work itself (hook/shim/shimroot.py), so no hook process
runs.

Each case runs the real shim's `create` on a fresh overlay of a test image with the generated
h100-8 spec and `/bin/true` as the low-level runtime (config.json is then inspected), or real
runc for the container's own view. With the take-over: no gpuctk-hook entry in config.json, one
bind mount per SONAME link, the image's ld.so.cache plus the driver libraries (PyYAML-free, in
ldconfig's order), and a container whose loader and `ldconfig -p` find libcuda.so.1. Where the
hook must still run (a musl image, an image without an ld cache, GPUCTK_SHIM_INROOT=0), the
entry stays and the root is untouched.
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
from fixtures.gpucheck import Node, generate
from fixtures.images import make_bundle, snapshot_tree

from gpuctk.cdi.node.ldcache import (
    MAGIC_NEW,
    MAX_CACHE_SIZE,
    build_ld_cache,
    parse_ld_cache,
    read_ld_cache,
)

pytestmark = pytest.mark.integration

SHIM = str(Path(sys.executable).with_name("gpuctk-runtime"))
LIBDIR = "/usr/lib/x86_64-linux-gnu/nvidia/current"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, driver_root: Path) -> Node:
    if os.geteuid() != 0:
        pytest.skip("mknod and overlays need root")
    base = tmp_path_factory.mktemp("inroot")
    return generate(base, driver_root, "h100-8", base / "cdi" / "nvidia.json")


def create(
    node: Node, rootfs: Path, tmp_path: Path, runtime: str = "/bin/true", **env: str
) -> dict[str, Any]:
    """config.json after the shim's `create` for NVIDIA_VISIBLE_DEVICES=0."""
    toml = tmp_path / "gpuctk.toml"
    toml.write_text(f'runtimes = ["{runtime}"]\nspec-dirs = ["{node.spec_dir}"]\n')
    bundle = make_bundle(
        tmp_path / "bundle", rootfs, ["/bin/true"], env=["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0"]
    )
    done = subprocess.run(
        [SHIM, "create", "--bundle", str(bundle), "gpuctk-inroot-test"],
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "GPUCTK_CONFIG": str(toml), **env},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    config: dict[str, Any] = json.loads((bundle / "config.json").read_text())
    return config


def gpuctk_hooks(config: dict[str, Any]) -> list[dict[str, Any]]:
    """gpuctk-hook entries doing in-root work (not the device node guard:
    hook/verbs/nodeguard.py)."""
    return [
        h
        for hooks in (config.get("hooks") or {}).values()
        for h in hooks
        if h["path"].endswith("gpuctk-hook") and h["args"][1] != "disable-device-node-modification"
    ]


def test_no_hook_link_mounts_and_a_cache_with_the_driver(
    node: Node, fresh_rootfs: Callable[[str], Path], tmp_path: Path
) -> None:
    rootfs = fresh_rootfs("debian")
    image_cache = read_ld_cache(str(rootfs / "etc/ld.so.cache"))
    config = create(node, rootfs, tmp_path)
    assert gpuctk_hooks(config) == []
    by_dest = {m["destination"]: m for m in config["mounts"]}
    soname = by_dest[f"{LIBDIR}/libcuda.so.1"]
    assert soname["source"] == by_dest[f"{LIBDIR}/libcuda.so.535.309.01"]["source"]
    assert soname["options"] == ["ro", "nosuid", "nodev", "rbind", "rprivate"]
    assert f"{LIBDIR}/libcuda.so" in by_dest  # the .so link, through libcuda.so.1
    cache = read_ld_cache(str(rootfs / "etc/ld.so.cache"))
    keys = {(e.key, e.value) for e in cache}
    assert ("libcuda.so.1", f"{LIBDIR}/libcuda.so.1") in keys
    assert ("libnvidia-ml.so.1", f"{LIBDIR}/libnvidia-ml.so.1") in keys
    assert {(e.key, e.value) for e in image_cache} <= keys  # the image's own entries kept
    assert LIBDIR in (rootfs / "etc/ld.so.conf.d/00-gpuctk.conf").read_text()


def test_the_container_loader_finds_the_driver_without_any_hook(
    node: Node, fresh_rootfs: Callable[[str], Path], tmp_path: Path
) -> None:
    rootfs = fresh_rootfs("debian")
    config = create(node, rootfs, tmp_path)
    assert gpuctk_hooks(config) == []
    config["process"]["args"] = [
        "/bin/sh", "-c",
        "ldconfig -p | grep -c 'libcuda.so.1 '; dlopen-test libcuda.so.1 libnvidia-ml.so.1",
    ]  # fmt: skip
    config["process"]["env"] = ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]
    bundle = tmp_path / "run"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(config))
    done = subprocess.run(
        ["runc", "run", "--bundle", str(bundle), f"gpuctk-inroot-{os.getpid()}"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "1", done.stdout
    assert "OK libcuda.so.1" in done.stdout and "OK libnvidia-ml.so.1" in done.stdout


@pytest.mark.parametrize(
    "kind", ["musl", "debian without ld.so.cache", "debian with an ld.so.cache over the cap"]
)
def test_images_the_shim_cannot_serve_keep_the_hook(
    node: Node, fresh_rootfs: Callable[[str], Path], tmp_path: Path, kind: str
) -> None:
    rootfs = fresh_rootfs(kind.split()[0])
    if kind.endswith("without ld.so.cache"):
        (rootfs / "etc/ld.so.cache").unlink()
    elif kind.endswith("over the cap"):  # not read past the cap: the hook's ldconfig does it
        (rootfs / "etc/ld.so.cache").write_bytes(MAGIC_NEW + bytes(MAX_CACHE_SIZE))
    before = snapshot_tree(rootfs)
    config = create(node, rootfs, tmp_path)
    assert len(gpuctk_hooks(config)) == 1
    assert snapshot_tree(rootfs) == before


def test_switched_off_keeps_the_hook(
    node: Node, fresh_rootfs: Callable[[str], Path], tmp_path: Path
) -> None:
    rootfs = fresh_rootfs("debian")
    before = snapshot_tree(rootfs)
    config = create(node, rootfs, tmp_path, GPUCTK_SHIM_INROOT="0")
    assert len(gpuctk_hooks(config)) == 1
    assert snapshot_tree(rootfs) == before


def test_cache_writer_matches_ldconfig_order(driver_root: Path, tmp_path: Path) -> None:
    # the host ldconfig over the driver root and the host's own libraries: several hundred
    # real names; our writer, fed them in reverse, must produce ldconfig's very order
    folders = [driver_root / LIBDIR.lstrip("/"), driver_root / "usr/lib/x86_64-linux-gnu"]
    subprocess.run(
        ["ldconfig", "-X", "-C", str(tmp_path / "c"), "-f", "/dev/null", *map(str, folders)],
        check=True, capture_output=True,
    )  # fmt: skip
    real = read_ld_cache(str(tmp_path / "c"))
    assert len(real) > 100
    ours = parse_ld_cache(build_ld_cache(list(reversed(real))))
    assert [(e.key, e.value, e.flags) for e in ours] == [(e.key, e.value, e.flags) for e in real]
    (tmp_path / "o").write_bytes(build_ld_cache(list(real)))
    printed = subprocess.run(
        ["ldconfig", "-p", "-C", str(tmp_path / "o")], capture_output=True, text=True, check=True
    ).stdout
    assert f"{len(real)} libs found in cache" in printed


@pytest.mark.parametrize("link", ["/etc/ld.so.conf.d", "/etc/ld.so.cache"])
def test_image_symlinks_out_of_the_root_are_not_followed(
    node: Node, fresh_rootfs: Callable[[str], Path], tmp_path: Path, link: str
) -> None:
    outside = tmp_path / "host-side"
    outside.mkdir()
    (outside / "ld.so.cache").write_bytes(b"host file")
    rootfs = fresh_rootfs("debian")
    target = rootfs / link.lstrip("/")
    if target.is_dir():
        subprocess.run(["rm", "-rf", str(target)], check=True)
    else:
        target.unlink()
    target.symlink_to(outside if link.endswith(".d") else outside / "ld.so.cache")
    (outside / "elsewhere").mkdir()
    before = snapshot_tree(outside)
    config = create(node, rootfs, tmp_path)
    assert snapshot_tree(outside) == before
    # the link resolves, inside the root, to a path that is not there: the shim leaves the
    # work to the hook (which resolves in the root the same way), having written nothing
    assert len(gpuctk_hooks(config)) == 1
