"""A hostile local user and the host paths a CDI spec mounts: the /tmp/nvidia-mps attack.

The user makes `/tmp/nvidia-mps` (or a link there) before root regenerates the spec, then
swaps the folder for `ln -s / /tmp/nvidia-mps`: runc follows links in a mount source, so every
GPU container would get the host's `/` read-write. Both layers refuse it: the generator
records only mount sources root alone can have made (gpuctk.fs trusted paths, below the
driver root), and every create checks each mount source and device host path again before
it goes into config.json (gpuctk.cdi.specs.apply).

A driver root of its own stands in for the node's `/`: root's, 0755, with a sticky `tmp/`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from secworld import run_tool
from test_local_user import GPU_SPEC, Node, local_user, node

__all__ = ["local_user", "node"]


@pytest.fixture
def driver(node: Node) -> Path:
    """A driver root whose `tmp/` is like /tmp: world-writable and sticky."""
    root = node.area / "driver"
    (root / "tmp").mkdir(parents=True)
    (root / "tmp").chmod(0o1777)
    return root


def _generate(node: Node, driver: Path) -> tuple[dict[str, Any], str]:
    out = node.area / "generated.json"
    args = ["cdi", "generate", "--simulate", "l4", "--library-mode", "mounts"]
    done = run_tool(
        node.bindir / "gpuctk", [*args, "--driver-root", str(driver), "--output", str(out)]
    )
    assert done.returncode == 0, done.stderr
    spec: dict[str, Any] = json.loads(out.read_text())
    return spec, done.stderr


def _sources(spec: dict[str, Any]) -> list[str]:
    return [m["hostPath"] for m in spec.get("containerEdits", {}).get("mounts", [])]


def _spec_mounting(node: Node, host: str, container: str = "/tmp/nvidia-mps") -> None:
    doc = json.loads(json.dumps(GPU_SPEC))
    doc["containerEdits"] = {
        "mounts": [
            {
                "hostPath": host,
                "containerPath": container,
                "options": ["nosuid", "nodev", "noexec", "rbind", "rprivate"],
            }
        ]
    }
    (node.cdi / "gpu.json").write_text(json.dumps(doc))


def _refused(node: Node, done: Any, source: str) -> None:
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if "level=error" in line]
    assert len(errors) == 1, done.stderr
    assert f"source {source} refused: " in errors[0] and "; fix: " in errors[0], errors[0]
    assert "mounts" not in node.config_json() and "GPU_EDITED" not in json.dumps(node.config_json())
    assert node.marks() == []


@pytest.mark.parametrize("request_env", ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=none"])
def test_the_users_mps_folder_is_neither_generated_nor_mounted(
    node: Node, driver: Path, request_env: str
) -> None:
    mps = driver / "tmp/nvidia-mps"
    node.user.mkdir(mps)  # 1. the user
    spec, err = _generate(node, driver)  # 2. root regenerates (udev rule, refresh unit)
    assert str(mps) not in _sources(spec)
    assert f"warning: left out {mps}: the folder is owned by uid {node.user.uid}" in err
    # a spec that names it anyway (written before the user's folder, or by hand)
    _spec_mounting(node, str(mps))
    _refused(node, node.create([request_env]), str(mps))
    node.user.run("/bin/sh", "-c", f"mv {mps} {mps}.old && ln -s / {mps}")  # 3. the swap
    _refused(node, node.create([request_env]), str(mps))


def test_a_link_planted_before_generation_never_becomes_a_mount_of_slash(
    node: Node, driver: Path
) -> None:
    mps = driver / "tmp/nvidia-mps"
    node.user.run("/bin/ln", "-s", "/", str(mps))
    spec, err = _generate(node, driver)
    assert [s for s in _sources(spec) if s in ("/", str(driver)) or "mps" in s] == []
    assert f"left out {mps}: " in err
    _spec_mounting(node, str(mps))
    _refused(node, node.create(), str(mps))


def test_a_root_owned_mps_folder_is_generated_and_mounted(node: Node, driver: Path) -> None:
    mps = driver / "tmp/nvidia-mps"
    mps.mkdir(mode=0o755)  # as the MPS control daemon, run as root, makes it
    spec, err = _generate(node, driver)
    assert str(mps) in _sources(spec) and "left out" not in err
    spec["devices"] = [{"name": "0", "containerEdits": {"env": ["GPU_EDITED=0"]}}]
    (node.cdi / "gpu.json").write_text(json.dumps(spec))
    done = node.create()
    assert done.returncode == 0, done.stderr
    assert [m["source"] for m in node.config_json()["mounts"]] == [str(mps)]


def test_a_spec_mount_source_below_a_user_folder_is_refused_at_create(node: Node) -> None:
    lib = node.user.mkdir(node.home / "lib") / "libcuda.so.1"
    lib.write_bytes(b"\x7fELF")  # root's file, in a folder the user can rename
    os.chown(lib, 0, 0)
    _spec_mounting(node, str(lib), "/usr/lib/x86_64-linux-gnu/libcuda.so.1")
    done = node.create()
    _refused(node, done, str(lib))
    assert f"is owned by uid {node.user.uid}" in done.stderr
    assert f"fix: chown root {node.home}" in done.stderr  # the first folder at fault
