"""`gpuctk cdi generate --output F` and a spec at F that nvidia-ctk wrote.

nvidia-container-toolkit-base's nvidia-cdi-refresh.service writes /var/run/cdi/nvidia.yaml, as
gpuctk's refresh unit does. generate refuses to replace such a spec (one line: the file, its
writer, the fix), replaces it with --force, and replaces a leftover whose hook program is gone
(the toolkit was removed). The specs here have nvidia-ctk's shape: its hooks run
nvidia-cdi-hook (1.16+) or `nvidia-ctk hook` (older), with NVIDIA_CTK_DEBUG in their env.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

GPUCTK = str(Path(sys.executable).with_name("gpuctk"))


def generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPUCTK, "cdi", "generate", "--simulate", "l4", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def nvidia_ctk_spec(hook: str, old_style: bool = False) -> dict[str, object]:
    """A spec laid out as `nvidia-ctk cdi generate` writes it, its hooks running `hook`."""
    argv0 = ["nvidia-ctk", "hook"] if old_style else ["nvidia-cdi-hook"]

    def entry(*args: str) -> dict[str, object]:
        return {
            "hookName": "createContainer",
            "path": hook,
            "args": [*argv0, *args],
            "env": ["NVIDIA_CTK_DEBUG=false"],
        }

    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
            {"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
        ],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [{"path": "/dev/nvidiactl"}],
            "hooks": [
                entry("create-symlinks", "--link", "libcuda.so.1::/usr/lib/libcuda.so"),
                entry("update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"),
            ],
            "mounts": [
                {
                    "hostPath": "/usr/bin/nvidia-smi",
                    "containerPath": "/usr/bin/nvidia-smi",
                    "options": ["ro", "nosuid", "nodev", "bind"],
                }
            ],
        },
    }


def installed_hook(tmp_path: Path, name: str = "nvidia-cdi-hook") -> str:
    """nvidia-ctk's hook program, present (the toolkit is still installed)."""
    hook = tmp_path / "usr" / "bin" / name
    hook.parent.mkdir(parents=True, exist_ok=True)
    hook.write_text("#!/bin/sh\n")
    hook.chmod(0o755)
    return str(hook)


def write_yaml(path: Path, doc: dict[str, object]) -> bytes:
    path.write_text(yaml.safe_dump(doc, explicit_start=True, sort_keys=False))
    return path.read_bytes()


def test_refuses_nvidia_ctk_spec_with_one_line(tmp_path: Path) -> None:
    out = tmp_path / "nvidia.yaml"
    before = write_yaml(out, nvidia_ctk_spec(installed_hook(tmp_path)))
    p = generate("--output", str(out))
    assert p.returncode == 5, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    line = lines[0]
    assert line.startswith(f"gpuctk: error: {out} was written by nvidia-ctk"), line
    for words in ("--force", "nvidia-container-toolkit-base", "nvidia-cdi-refresh"):
        assert words in line
    assert out.read_bytes() == before


def test_refuses_old_nvidia_ctk_hook_spec_in_json(tmp_path: Path) -> None:
    out = tmp_path / "nvidia.json"
    hook = installed_hook(tmp_path, "nvidia-ctk")
    out.write_text(json.dumps(nvidia_ctk_spec(hook, old_style=True), indent=2))
    before = out.read_bytes()
    p = generate("--output", str(out))
    assert p.returncode == 5, p.stderr
    assert "written by nvidia-ctk" in p.stderr and hook in p.stderr
    assert out.read_bytes() == before


def test_force_replaces_it(tmp_path: Path) -> None:
    out = tmp_path / "nvidia.yaml"
    write_yaml(out, nvidia_ctk_spec(installed_hook(tmp_path)))
    p = generate("--output", str(out), "--force")
    assert p.returncode == 0, p.stderr
    assert f"replacing {out}, written by nvidia-ctk" in p.stderr
    assert b"nvidia-cdi-hook" not in out.read_bytes()
    assert generate("--output", str(out)).returncode == 0  # now it is gpuctk's


@pytest.mark.skipif(os.path.exists("/usr/bin/nvidia-cdi-hook"), reason="the toolkit is here")
def test_leftover_of_a_removed_toolkit_is_replaced(tmp_path: Path) -> None:
    out = tmp_path / "nvidia.yaml"
    write_yaml(out, nvidia_ctk_spec("/usr/bin/nvidia-cdi-hook"))
    p = generate("--output", str(out))
    assert p.returncode == 0, p.stderr
    assert "/usr/bin/nvidia-cdi-hook no longer exists" in p.stderr
    assert b"nvidia-cdi-hook" not in out.read_bytes()


def test_other_files_are_replaced_as_before(tmp_path: Path) -> None:
    out = tmp_path / "nvidia.yaml"
    out.write_text("# nvidia-ctk was mentioned here, but this is no spec: [\n")
    assert generate("--output", str(out)).returncode == 0
    # a spec that names nvidia-ctk, but whose hooks run another program (still installed)
    doc = nvidia_ctk_spec(installed_hook(tmp_path, "gpuctk-hook"))
    edits = doc["containerEdits"]
    assert isinstance(edits, dict)
    for hook in edits["hooks"]:
        hook["args"][0] = "gpuctk-hook"
    edits["mounts"][0]["hostPath"] = "/usr/bin/nvidia-ctk"
    write_yaml(out, doc)
    p = generate("--output", str(out))
    assert p.returncode == 0, p.stderr
    assert "replacing" not in p.stderr
