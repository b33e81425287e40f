"""`gpuctk cdi generate --additional-gids` through the real shim and runc, as a non-root user.

The fixture's /dev/dri card and render nodes are mode 0660; here their group is a `render`-like
group (GID 4242) the container's user (1000:1000) is not in. With `--additional-gids` the spec
lists 4242 on each GPU device (cdiVersion 0.7.0) and the shim adds it to the process's groups:
opening the render node then passes the permission check and fails only for want of a driver
(ENXIO). Less the group, the open is refused (EACCES); without the flag the spec stays at 0.5.0.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures.devroot import make_node_roots
from fixtures.gpucheck import BIN, Node, generate, need_runtime, seen
from fixtures.images import make_bundle, run_container, unique_name

from gpuctk.cdi.node.profile import load_profile

pytestmark = pytest.mark.integration

RENDER = 4242
USER = 1000
SCRIPT = r"""
for f in /dev/dri/renderD*; do (: < "$f") 2>&1 | sed "s|^|OPEN $f |"; done
echo "GROUPS $(id -G)"
for f in /dev/dri/renderD*; do echo "OWNER $(stat -c '%A %u:%g' "$f")"; done
"""


def machine(base: Path, driver_root: Path, *extra: str) -> Node:
    roots = make_node_roots(base / "node", load_profile("l4"))
    for node in (Path(roots.dev_root) / "dev/dri").iterdir():
        os.chown(node, 0, RENDER)
        os.chmod(node, 0o660)
    return generate(base, driver_root, "l4", base / "cdi" / "nvidia.json", extra=extra, roots=roots)


def run(node: Node, tmp_path: Path, rootfs: Path) -> tuple[set[str], str]:
    need_runtime("runc")
    tmp_path.mkdir()
    toml = tmp_path / "gpuctk.toml"
    toml.write_text(f'runtimes = ["{shutil.which("runc")}"]\nspec-dirs = ["{node.spec_dir}"]\n')
    env = ["PATH=/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=all"]
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["/bin/sh", "-c", SCRIPT], env=env)
    config = json.loads((bundle / "config.json").read_text())
    config["process"]["user"] = {"uid": USER, "gid": USER}
    (bundle / "config.json").write_text(json.dumps(config))
    os.environ["GPUCTK_CONFIG"] = str(toml)
    try:
        done = run_container([str(BIN / "gpuctk-runtime")], bundle, unique_name("gpuctk-gids"))
    finally:
        del os.environ["GPUCTK_CONFIG"]
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert seen(done.stdout, "OWNER") == {f"crw-rw---- 0:{RENDER}"}, done.stdout  # as on the host
    return seen(done.stdout, "OPEN"), next(iter(seen(done.stdout, "GROUPS")), "")


def test_render_node_opens_with_additional_gids(
    tmp_path: Path, driver_root: Path, fresh_rootfs: Callable[[str], Path]
) -> None:
    node = machine(tmp_path / "m", driver_root, "--additional-gids")
    assert node.spec["cdiVersion"] == "0.7.0"
    assert node.devices["0"]["additionalGids"] == [RENDER]
    opened, groups = run(node, tmp_path / "c", fresh_rootfs("debian"))
    assert str(RENDER) in groups.split(), groups
    assert opened and all(line.endswith("No such device or address") for line in opened), opened


def test_render_node_refused_without_the_group(
    tmp_path: Path, driver_root: Path, fresh_rootfs: Callable[[str], Path]
) -> None:
    """The same spec less its additionalGids: the node keeps its host group, the process lacks
    it, and the open is refused: the group is what lets a non-root user in."""
    node = machine(tmp_path / "m", driver_root, "--additional-gids")
    spec_file = node.spec_dir / "nvidia.json"
    doc = json.loads(spec_file.read_text())
    for device in doc["devices"]:
        device["containerEdits"].pop("additionalGids", None)
    spec_file.write_text(json.dumps(doc))
    opened, groups = run(node, tmp_path / "c", fresh_rootfs("debian"))
    assert str(RENDER) not in groups.split(), groups
    assert opened and all(line.endswith("Permission denied") for line in opened), opened


def test_default_spec_has_no_groups(tmp_path: Path, driver_root: Path) -> None:
    """Without the flag the spec stays at 0.5.0 (Debian 12's podman reads no newer) and its
    nodes carry no owner: the engine gives them the container's user, as before."""
    node = machine(tmp_path / "m", driver_root)
    assert node.spec["cdiVersion"] == "0.5.0"
    assert "additionalGids" not in node.devices["0"]
    assert all("gid" not in n for n in node.devices["0"]["deviceNodes"])
