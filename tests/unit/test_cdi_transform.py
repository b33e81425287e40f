"""`gpuctk cdi transform root`: host paths move from one root to another and back."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpuctk.cdi.transform import _args, move, transform_root

GPUCTK = str(Path(sys.executable).with_name("gpuctk"))
A, B = "/run/nvidia/driver", "/host/driver"

SPEC: dict[str, Any] = {
    "cdiVersion": "0.5.0",
    "kind": "nvidia.com/gpu",
    "devices": [
        {
            "name": "0",
            "containerEdits": {
                "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": f"{A}/dev/nvidia0"}]
            },
        }
    ],
    "containerEdits": {
        "env": [f"NVIDIA_CTK_LIBCUDA_DIR={A}/lib", f"OTHER={A}/lib"],
        "deviceNodes": [{"path": "/dev/nvidiactl"}],
        "mounts": [
            {"hostPath": f"{A}/usr/bin/nvidia-smi", "containerPath": "/usr/bin/nvidia-smi"},
            {"hostPath": f"{A}-old/lib/x.so", "containerPath": "/lib/x.so"},
            {"hostPath": "/usr/lib/y.so", "containerPath": f"{A}/y.so"},
        ],
        "hooks": [
            {
                "hookName": "createContainer",
                "path": f"{A}/bin/hook",
                "args": ["hook", f"{A}/lib/a::{A}/lib/b"],
            },
            {"hookName": "prestart", "path": "/bin/pre", "args": ["pre", f"{A}/lib/a::/x"]},
        ],
    },
}


def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPUCTK, "cdi", "transform", "root", *args],
        input=stdin, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_move_is_by_component() -> None:
    assert move(f"{A}/lib", A, B) == f"{B}/lib"
    assert move(A, A, B) == B
    assert move(f"{A}-old/lib", A, B) == f"{A}-old/lib"
    assert move("/usr/lib", "/", "/host") == "/host/usr/lib"


def test_every_path_of_a_hook_argument_moves() -> None:
    args = [
        "hook", f"compute:{A}/a::{A}/b", f"--link={A}/a::{A}/b", f"--folder={A}/lib",
        f"lib{A}/x", f"{A}/a::liba.so", "x=y",
    ]  # fmt: skip
    assert _args(args, A, B) == [
        "hook", f"compute:{B}/a::{B}/b", f"--link={B}/a::{B}/b", f"--folder={B}/lib",
        f"lib{A}/x", f"{B}/a::liba.so", "x=y",
    ]  # fmt: skip


def test_host_side_only_and_round_trip() -> None:
    doc = copy.deepcopy(SPEC)
    transform_root(doc, A, B)
    edits = doc["containerEdits"]
    assert doc["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"] == f"{B}/dev/nvidia0"
    assert edits["deviceNodes"] == [{"path": "/dev/nvidiactl"}]
    assert [m["hostPath"] for m in edits["mounts"]] == [
        f"{B}/usr/bin/nvidia-smi", f"{A}-old/lib/x.so", "/usr/lib/y.so",
    ]  # fmt: skip
    assert edits["mounts"][2]["containerPath"] == f"{A}/y.so"  # the container side stays
    assert edits["hooks"][0] == {**SPEC["containerEdits"]["hooks"][0], "path": f"{B}/bin/hook"}
    assert edits["hooks"][1]["args"] == ["pre", f"{B}/lib/a::/x"]
    transform_root(doc, B, A)
    assert doc == SPEC


def test_root_slash_gives_host_paths_and_back() -> None:
    doc = copy.deepcopy(SPEC)
    transform_root(doc, "/", "/host")
    assert doc["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidiactl", "hostPath": "/host/dev/nvidiactl"}
    ]
    transform_root(doc, "/host", "/")
    assert doc == SPEC


def test_container_side() -> None:
    doc = copy.deepcopy(SPEC)
    transform_root(doc, A, "/opt", "container")
    edits = doc["containerEdits"]
    assert edits["mounts"][2] == {"hostPath": "/usr/lib/y.so", "containerPath": "/opt/y.so"}
    assert edits["hooks"][0]["args"] == ["hook", "/opt/lib/a::/opt/lib/b"]
    assert edits["hooks"][0]["path"] == f"{A}/bin/hook"
    # the libcuda folder moves with the mounts; no other env entry is read as a path
    assert edits["env"] == ["NVIDIA_CTK_LIBCUDA_DIR=/opt/lib", f"OTHER={A}/lib"]
    doc = copy.deepcopy(SPEC)
    transform_root(doc, A, "/opt")
    assert doc["containerEdits"]["env"] == SPEC["containerEdits"]["env"]  # the host side


def test_cli_yaml_and_json_round_trip(tmp_path: Path) -> None:
    src = tmp_path / "in.json"
    src.write_text(json.dumps(SPEC))
    out = tmp_path / "out.json"
    p = cli("--from", A, "--to", B, str(src), "--output", str(out))
    assert p.returncode == 0, p.stderr
    back = cli("--from", B, "--to", A, stdin=out.read_text())
    assert back.returncode == 0, back.stderr
    assert json.loads(back.stdout) == SPEC
    as_yaml = cli("--from", A, "--to", B, "--format", "yaml", str(src))
    assert as_yaml.returncode == 0 and as_yaml.stdout.startswith("---\n")
    again = cli("--from", B, "--to", A, stdin=as_yaml.stdout)
    assert again.returncode == 0 and again.stdout.startswith("---\n")
    assert f"hostPath: {A}/usr/bin/nvidia-smi" in again.stdout


def test_cli_refuses_bad_input(tmp_path: Path) -> None:
    for text in ("not: [a, spec", json.dumps({**SPEC, "kind": "no-slash"})):
        p = cli("--from", A, "--to", B, stdin=text)
        assert p.returncode not in (0, 2), p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and p.stdout == ""
    p = cli("--from", "relative", "--to", B, stdin=json.dumps(SPEC))
    assert p.returncode == 2 and "--from" in p.stderr
