"""gpuctk-hook precreate: OCI config in, the config the shim would have written out.

The transform is checked against the shim itself (gpuctk.hook.shim.runtime_main.inject on a bundle
with the same config.json): one model of what to inject, so the two outputs must be equal.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuctk.errors import InputError, RequestError
from gpuctk.hook import config
from gpuctk.hook.shim import runtime_main
from gpuctk.hook.verbs import precreate
from gpuctk.log import RuncLog

HOOK = str(Path(sys.executable).parent / "gpuctk-hook")
LIB = "/usr/lib/x86_64-linux-gnu"
FACTS_ENV = [
    "GPUCTK_DRIVER_VERSION=535.309.01",
    "GPUCTK_CUDA_VERSION=12.2",
    "GPUCTK_GPUS=0/GPU-aaaa/9.0/hopper/;1/GPU-bbbb/8.0/ampere/MIG-x",
]


def node(path: str, minor: int, major: int = 195) -> dict[str, Any]:
    return {"path": path, "type": "c", "major": major, "minor": minor, "fileMode": 0o666}


def ro(name: str, folder: str = LIB) -> dict[str, Any]:
    return {
        "hostPath": f"/drv{folder}/{name}",
        "containerPath": f"{folder}/{name}",
        "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"],
    }


def make_spec() -> dict[str, Any]:
    gpu0, gpu1 = node("/dev/nvidia0", 0), node("/dev/nvidia1", 1)
    mig = [gpu1, node("/dev/nvidia-caps/nvidia-cap12", 12, 508)]
    devices = [("0", [gpu0]), ("1", [gpu1]), ("1:0", mig), ("all", [gpu0, gpu1])]
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": n, "containerEdits": {"deviceNodes": d}} for n, d in devices],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [node("/dev/nvidiactl", 255)],
            "mounts": [
                ro("libcuda.so.535.309.01"),
                ro("libnvidia-ml.so.535.309.01"),
                ro("nvidia-smi", "/usr/bin"),
            ],
            "hooks": [
                {
                    "hookName": "createContainer",
                    "path": "/usr/bin/gpuctk-hook",
                    "args": [
                        "gpuctk-hook",
                        "createContainer",
                        "--link",
                        f"libcuda.so.535.309.01::{LIB}/libcuda.so.1",
                        "--link",
                        f"libnvidia-ml.so.535.309.01::{LIB}/libnvidia-ml.so.1",
                        "--folder",
                        LIB,
                    ],
                    "env": ["PATH=/usr/bin:/bin", *FACTS_ENV],
                }
            ],
        },
    }


def oci(env: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "ociVersion": "1.0.2-dev",
        "process": {
            "user": {"uid": 1000, "gid": 1000},
            "args": ["sh"],
            "env": ["PATH=/usr/bin:/bin", *env],
            "cwd": "/",
            "capabilities": {"bounding": ["CAP_CHOWN", "CAP_SYS_ADMIN"]},
        },
        "root": {"path": "rootfs"},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        "linux": {"resources": {"devices": [{"allow": False, "access": "rwm"}]}, "x-new": [1]},
        "x-engine": {"kept": True},
        **extra,
    }


@pytest.fixture
def settings(tmp_path: Path) -> config.Settings:
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "nvidia.json").write_text(json.dumps(make_spec()))
    return config.Settings({"spec-dirs": [str(cdi)]})


def shim_output(tmp_path: Path, doc: dict[str, Any], settings: config.Settings) -> Any:
    """What gpuctk-runtime's create writes into config.json for `doc`."""
    bundle = tmp_path / "bundle"
    bundle.mkdir(exist_ok=True)
    (bundle / "config.json").write_text(json.dumps(doc))
    inv = runtime_main.parse_argv(["create", "--bundle", str(bundle), "ctr"])
    runtime_main.inject(inv, settings, RuncLog(stderr=io.StringIO()))
    return json.loads((bundle / "config.json").read_text())


@pytest.mark.parametrize(
    "env",
    [
        ["NVIDIA_VISIBLE_DEVICES=0"],
        ["NVIDIA_VISIBLE_DEVICES=1:0"],
        ["NVIDIA_VISIBLE_DEVICES=0,1"],
        ["NVIDIA_VISIBLE_DEVICES=all"],
        ["NVIDIA_VISIBLE_DEVICES=none"],
        ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=utility"],
        ["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_REQUIRE_CUDA=cuda>=12.0"],
    ],
)
def test_same_config_as_the_shim(env: list[str], tmp_path: Path, settings: config.Settings) -> None:
    doc = oci(env)
    out = json.loads(precreate.transform(json.dumps(doc).encode(), settings))
    assert out == shim_output(tmp_path, doc, settings)
    assert out["x-engine"] == {"kept": True} and out["linux"]["x-new"] == [1]


def test_annotation_request_like_the_shim(tmp_path: Path, settings: config.Settings) -> None:
    doc = oci([], annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=1"})
    out = json.loads(precreate.transform(json.dumps(doc).encode(), settings))
    assert out == shim_output(tmp_path, doc, settings)
    assert [d["path"] for d in out["linux"]["devices"]] == ["/dev/nvidiactl", "/dev/nvidia1"]


def test_edits_applied(settings: config.Settings) -> None:
    out = json.loads(
        precreate.transform(json.dumps(oci(["NVIDIA_VISIBLE_DEVICES=0"])).encode(), settings)
    )
    devices = out["linux"]["devices"]
    assert [d["path"] for d in devices] == ["/dev/nvidiactl", "/dev/nvidia0"]
    assert devices[1] == {
        "path": "/dev/nvidia0",
        "type": "c",
        "major": 195,
        "minor": 0,
        "fileMode": 0o666,
        "uid": 1000,
        "gid": 1000,
    }
    rules = out["linux"]["resources"]["devices"]
    assert rules[0] == {"allow": False, "access": "rwm"}
    assert rules[1:] == [
        {"allow": True, "type": "c", "major": 195, "minor": 255, "access": "rwm"},
        {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"},
    ]
    assert "NVIDIA_VISIBLE_DEVICES=void" in out["process"]["env"]
    dests = [m["destination"] for m in out["mounts"]]
    assert dests[0] == "/proc" and f"{LIB}/libcuda.so.535.309.01" in dests
    (hook,) = out["hooks"]["createContainer"]
    assert hook["args"][:2] == ["gpuctk-hook", "createContainer"]
    assert hook["env"][0] == "PATH=/usr/bin:/bin"


def test_driver_capabilities_leave_libcuda_out(settings: config.Settings) -> None:
    env = ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=utility"]
    out = json.loads(precreate.transform(json.dumps(oci(env)).encode(), settings))
    dests = {m["destination"] for m in out["mounts"]}
    assert f"{LIB}/libnvidia-ml.so.535.309.01" in dests and "/usr/bin/nvidia-smi" in dests
    assert f"{LIB}/libcuda.so.535.309.01" not in dests
    args = out["hooks"]["createContainer"][0]["args"]
    assert not any("libcuda" in a for a in args)


@pytest.mark.parametrize("env", [[], ["NVIDIA_VISIBLE_DEVICES="], ["NVIDIA_VISIBLE_DEVICES=void"]])
def test_nothing_requested_is_byte_identical(env: list[str], settings: config.Settings) -> None:
    data = json.dumps(oci(env), indent=3).encode() + b"\n"
    assert precreate.transform(data, settings) is data


def test_unknown_device_fails(settings: config.Settings) -> None:
    with pytest.raises(RequestError, match=r"nvidia.com/gpu=7.*known: .*nvidia.com/gpu=0"):
        precreate.transform(json.dumps(oci(["NVIDIA_VISIBLE_DEVICES=7"])).encode(), settings)


def test_unmet_requirement_fails(settings: config.Settings) -> None:
    env = ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=13.0"]
    with pytest.raises(RequestError, match=r"cuda>=13.0.*12.2"):
        precreate.transform(json.dumps(oci(env)).encode(), settings)


@pytest.mark.parametrize("data", [b"{", b"[]", b'{"a": 1, "a": 2}', b"\xff"])
def test_malformed_input_fails(data: bytes, settings: config.Settings) -> None:
    with pytest.raises(InputError, match="OCI config on stdin"):
        precreate.transform(data, settings)


def _hook(args: list[str], stdin: bytes, toml: Path) -> subprocess.CompletedProcess[bytes]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GPUCTK_CONFIG": str(toml)}
    return subprocess.run(
        [HOOK, *args], input=stdin, capture_output=True, env=env, timeout=60, check=False
    )


def test_console_script(tmp_path: Path, settings: config.Settings) -> None:
    toml = tmp_path / "gpuctk.toml"
    toml.write_text(f'spec-dirs = ["{settings.spec_dirs[0]}"]\n')
    done = _hook(["precreate"], json.dumps(oci(["NVIDIA_VISIBLE_DEVICES=all"])).encode(), toml)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert {d["path"] for d in out["linux"]["devices"]} >= {"/dev/nvidia0", "/dev/nvidia1"}

    plain = json.dumps(oci([])).encode()
    done = _hook(["precreate"], plain, toml)
    assert (done.returncode, done.stdout) == (0, plain)

    done = _hook(["precreate"], json.dumps(oci(["NVIDIA_VISIBLE_DEVICES=9"])).encode(), toml)
    assert done.returncode == 1 and done.stdout == b""
    assert done.stderr.decode().count("\n") == 1 and "nvidia.com/gpu=9" in done.stderr.decode()
