"""Hostile config.json, OCI state and request values, against the real hook and shim.

The hook reads the state on stdin and the bundle's config.json; the shim reads config.json and
the request in it (NVIDIA_VISIBLE_DEVICES, CDI annotations, device volume mounts). Each hostile
value ends in one clear error (exit 1, config.json byte-identical, the low-level runtime not
run) or a safe success; nothing outside the root changes (the `world` fixture checks).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from secworld import FOLDER, World, assert_safe, run_tool

LINK = ["createContainer", "--link", f"libfoo.so.1.2.3::{FOLDER}/libfoo.so.1", "--folder", FOLDER]
DEEP = b"[" * 200000 + b"]" * 200000


def _config_bytes(world: World, kind: str) -> bytes | None:
    root = json.dumps(str(world.root))
    table: dict[str, bytes] = {
        "huge": b'{"root": {"path": ' + root.encode() + b'}, "pad": "' + b"x" * (17 << 20) + b'"}',
        "deep": b'{"root": {"path": ' + root.encode() + b'}, "x": ' + DEEP + b"}",
        "not-utf8": b'{"root": {"path": "\xff\xfe"}}',
        "dup-root": b'{"root": {"path": "/"}, "root": {"path": ' + root.encode() + b"}}",
        "root-string": b'{"root": "/"}',
        "root-path-int": b'{"root": {"path": 5}}',
        "root-path-nul": b'{"root": {"path": "/tmp/\\u0000x"}}',
        "root-missing": b'{"process": {}}',
        "array": b"[]",
        "nan": b'{"root": {"path": ' + root.encode() + b'}, "x": NaN}',
        "empty": b"",
    }
    return table.get(kind)


CONFIGS = [
    "huge",
    "deep",
    "not-utf8",
    "dup-root",
    "root-string",
    "root-path-int",
    "root-path-nul",
    "root-missing",
    "array",
    "nan",
    "empty",
]


@pytest.mark.parametrize("kind", CONFIGS)
def test_hostile_config_json_is_one_clear_error(world: World, bindir: Path, kind: str) -> None:
    data = _config_bytes(world, kind)
    assert data is not None
    (world.bundle / "config.json").write_bytes(data)
    world.resnap()
    done = run_tool(bindir / "gpuctk-hook", LINK, world.state())
    assert done.returncode == 1, done.stderr
    assert_safe(done)
    assert not (world.root / FOLDER.lstrip("/") / "libfoo.so.1").exists()


@pytest.mark.parametrize("kind", ["symlink-to-host", "fifo", "directory"])
def test_config_json_that_is_not_a_file(world: World, bindir: Path, kind: str) -> None:
    config = world.bundle / "config.json"
    config.unlink()
    if kind == "symlink-to-host":  # to a host file that parses as a config naming `/`
        (world.host / "config.json").write_text(json.dumps({"root": {"path": "/"}}))
        config.symlink_to(world.host / "config.json")
    elif kind == "fifo":
        os.mkfifo(config)
    else:
        config.mkdir()
    world.resnap()
    done = run_tool(bindir / "gpuctk-hook", LINK, world.state(), timeout=30)
    assert done.returncode == 1, done.stderr
    assert_safe(done)


STATES = {
    "bundle-dotdot": {"bundle": "{bundle}/../bundle"},
    "bundle-relative": {"bundle": "bundle"},
    "bundle-nul": {"bundle": "{bundle}\u0000x"},
    "bundle-int": {"bundle": 7},
    "pid-string": {"pid": "1"},
    "pid-negative": {"pid": -5},
    "pid-bool": {"pid": True},
}


@pytest.mark.parametrize("kind", sorted(STATES))
def test_hostile_state_is_one_clear_error(world: World, bindir: Path, kind: str) -> None:
    over = {
        k: v.replace("{bundle}", str(world.bundle)) if isinstance(v, str) else v
        for k, v in STATES[kind].items()
    }
    done = run_tool(bindir / "gpuctk-hook", LINK, world.state(**over))
    assert done.returncode == 1, done.stderr
    assert_safe(done)


@pytest.mark.parametrize(
    "raw",
    [b"\xff" * 64, b'{"bundle": "/x", "bundle": "/y"}', DEEP, b"{" + b" " * (2 << 20) + b"}"],
    ids=["not-utf8", "dup-bundle", "deep", "huge"],
)
def test_hostile_state_bytes(world: World, bindir: Path, raw: bytes) -> None:
    done = run_tool(bindir / "gpuctk-hook", LINK, raw)
    assert done.returncode == 1, done.stderr
    assert_safe(done)


# --- prestart mode: the state's pid must be the container's init, or nothing is entered ------

SPEC = {
    "cdiVersion": "0.5.0",
    "kind": "example.com/gpu",
    "devices": [
        {"name": "0", "containerEdits": {"env": ["SEEN=0"]}},
        {"name": "all", "containerEdits": {"env": ["SEEN=all"]}},
    ],
    "containerEdits": {"mounts": [{"hostPath": "/etc/hostname", "containerPath": "/etc/hn"}]},
}


def spec_env(tmp: Path, extra: str = "") -> dict[str, str]:
    cdi = tmp / "cdi"
    cdi.mkdir(exist_ok=True)
    (cdi / "example.json").write_text(json.dumps(SPEC))
    conf = tmp / "gpuctk.toml"
    conf.write_text(f'spec-dirs = ["{cdi}"]\ndefault-kind = "example.com/gpu"\n{extra}')
    return {"GPUCTK_CONFIG": str(conf)}


@pytest.mark.parametrize("which", ["own", "init", "gone", "other-namespace"])
def test_prestart_refuses_a_pid_that_is_not_the_containers(
    world: World, bindir: Path, which: str
) -> None:
    env = spec_env(world.tmp)
    helper = None
    if which == "own":
        pid = os.getpid()
    elif which == "init":
        pid = 1
    elif which == "gone":
        pid = 4194304 - 7
    else:  # a process in its own mount namespace, where root.path is not the container's root
        ready = world.tmp / "ready"
        script = f"umount -l {world.root} && touch {ready} && exec sleep 60"
        helper = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script])
        while not ready.exists():
            assert helper.poll() is None, "the helper namespace could not be set up"
            time.sleep(0.01)
        pid = helper.pid
    world.write_config({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}})
    world.resnap()
    try:
        done = run_tool(bindir / "gpuctk-hook", ["prestart"], world.state(pid=pid), env)
    finally:
        if helper is not None:
            helper.kill()
            helper.wait()
    assert done.returncode == 1, done.stderr
    assert_safe(done)
    assert not (world.root / "etc/hn").exists()


# --- the shim: hostile config.json and request values ----------------------------------------


class Shim:
    def __init__(self, tmp: Path, bindir: Path, extra_toml: str = "") -> None:
        self.tmp, self.bindir = tmp, bindir
        self.bundle = tmp / "shim-bundle"
        self.bundle.mkdir()
        self.runtime = tmp / "fake-runc"
        self.runtime.write_text(f"#!/bin/sh\ntouch {tmp}/runtime-ran\n")
        self.runtime.chmod(0o755)
        self.env = spec_env(tmp, f'runtimes = ["{self.runtime}"]\n{extra_toml}')

    def create(self, config: bytes) -> tuple[subprocess.CompletedProcess[str], bytes]:
        path = self.bundle / "config.json"
        path.write_bytes(config)
        args = ["create", "--bundle", str(self.bundle), "ctr"]
        done = run_tool(self.bindir / "gpuctk-runtime", args, b"", self.env, timeout=60)
        return done, path.read_bytes()

    def refused(self, config: bytes, expect: str = "") -> str:
        done, after = self.create(config)
        assert done.returncode == 1, done.stderr
        assert_safe(done, "gpuctk-runtime")
        assert after == config, "config.json changed on error"
        assert not (self.tmp / "runtime-ran").exists(), "the runtime ran after an error"
        assert expect in done.stderr, done.stderr
        return done.stderr


def oci(env: list[str] | None = None, **extra: Any) -> bytes:
    doc = {"ociVersion": "1.0.2", "root": {"path": "rootfs"}, "process": {"env": env or []}}
    doc.update(extra)
    return json.dumps(doc).encode()


@pytest.fixture
def shim(tmp_path: Path, bindir: Path) -> Shim:
    if os.geteuid() != 0:
        pytest.skip("runs as root")
    return Shim(tmp_path, bindir)


@pytest.mark.parametrize(
    "data",
    [
        b'{"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}, "pad": "'
        + b"x" * (33 << 20)
        + b'"}',
        b'{"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}, "x": ' + DEEP + b"}",
        b'{"process": {"env": ["NVIDIA_VISIBLE_DEVICES=\xff"]}}',
        b'{"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}, "x": Infinity}',
        b"[1]",
        b"{} {}",
    ],
    ids=["huge", "deep", "not-utf8", "infinity", "array", "two-documents"],
)
def test_shim_hostile_config_json(shim: Shim, data: bytes) -> None:
    shim.refused(data)


@pytest.mark.parametrize(
    "doc",
    [
        {"process": "x", "annotations": []},
        {"process": {"env": "NVIDIA_VISIBLE_DEVICES=all"}},
        {"process": {"env": [1, None, {"a": 1}]}},
        {"annotations": {"cdi.k8s.io/x": 5}},
        {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}, "linux": "x"},
        {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}, "mounts": {"a": 1}},
        {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}, "hooks": []},
    ],
    ids=[
        "process-str",
        "env-str",
        "env-items",
        "annotation-int",
        "linux-str",
        "mounts-dict",
        "hooks-list",
    ],
)
def test_shim_wrong_types_are_an_error_or_no_request(shim: Shim, doc: dict[str, Any]) -> None:
    data = json.dumps(doc).encode()
    done, after = shim.create(data)
    assert_safe(done, "gpuctk-runtime")
    if done.returncode == 0:
        assert after == data  # nothing was asked (unreadable request): untouched
    else:
        assert after == data and not (shim.tmp / "runtime-ran").exists()


def test_shim_refuses_duplicate_keys(shim: Shim) -> None:
    """Go's encoding/json (runc) merges a duplicate object into the first, field by field,
    where a last-wins reader sees the last alone: here runc would see the GPU request in the
    first `process` and the shim none. The shim refuses duplicates, config.json unchanged."""
    for data in (
        b'{"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}, "process": {"args": ["sh"]}}',
        b'{"process": {"env": [], "env": ["NVIDIA_VISIBLE_DEVICES=0"]}}',
    ):
        assert "duplicate key" in shim.refused(data)


@pytest.mark.parametrize(
    "value, expect",
    [
        (",".join(["0"] * 100_000), "at most 1024"),
        (",".join(f"GPU-{i:08x}" for i in range(100_000)), "longer than"),
        ("../../etc/shadow", ""),
        ("0/../../../x", ""),
        ("/etc/shadow", ""),
        ("example.com/gpu=../../x", ""),
        ("example.com/gpu=0/../1", ""),
        ("0\u0000all", ""),
        ("0;touch /pwned", ""),
        ("$(touch /pwned)", ""),
        ("GPU-00000000-dead-beef-0000-000000000000", "unknown CDI device"),
        ("9999", "unknown CDI device"),
        ("x" * 300, "at most 256"),
    ],
    ids=[
        "1e5-entries",
        "1e5-uuids",
        "dotdot",
        "dotdot-mixed",
        "abs-path",
        "qualified-dotdot",
        "qualified-slash",
        "nul",
        "shell",
        "subst",
        "unknown-uuid",
        "unknown-index",
        "long-name",
    ],
)
def test_shim_hostile_visible_devices(shim: Shim, value: str, expect: str) -> None:
    stderr = shim.refused(oci([f"NVIDIA_VISIBLE_DEVICES={value}"]), expect)
    assert "Traceback" not in stderr


@pytest.mark.parametrize(
    "annotations, expect",
    [
        ({"cdi.k8s.io/a": "amd.com/gpu=0"}, "unknown CDI device"),
        ({"cdi.k8s.io/a": "intel.com/gpu=../../dev/sda"}, ""),
        ({"cdi.k8s.io/a": "example.com/gpu=0,example.com/gpu=0"}, ""),
        ({"cdi.k8s.io/a": "0"}, "fully qualified"),
        ({"cdi.k8s.io/a": ",".join(["example.com/gpu=0"] * 2000)}, "at most 1024"),
        ({"cdi.k8s.io/a": "example.com/gpu=0\u0000"}, ""),
    ],
    ids=["other-vendor", "other-vendor-dotdot", "duplicate", "bare", "many", "nul"],
)
def test_shim_hostile_annotations(shim: Shim, annotations: dict[str, str], expect: str) -> None:
    data = oci(annotations=annotations)
    if (
        annotations["cdi.k8s.io/a"] == "example.com/gpu=0,example.com/gpu=0"
    ):  # a duplicate is merely merged
        done, after = shim.create(data)
        assert done.returncode == 0, done.stderr
        assert json.loads(after)["process"]["env"].count("SEEN=0") == 1
        return
    shim.refused(data, expect)


@pytest.mark.parametrize(
    "destination, outcome",
    [
        ("/var/run/nvidia-container-devices/../../../etc/shadow", "error"),
        ("/var/run/nvidia-container-devices/..", "error"),
        ("/var/run/nvidia-container-devices/cdi/example.com/gpu/..", "error"),
        ("/var/run/nvidia-container-devices/cdi/../../../../x/y/z", "error"),
        ("/var/run/nvidia-container-devices/cdi/example.com/gpu/../../../0", "error"),
        ("/etc/../var/run/nvidia-container-devices/0", "error"),
        ("/var/run/nvidia-container-devices/a/b", "error"),
        ("/var/run/nvidia-container-devices/0", "injected"),
    ],
)
def test_shim_hostile_volume_mount_requests(
    tmp_path: Path, bindir: Path, destination: str, outcome: str
) -> None:
    if os.geteuid() != 0:
        pytest.skip("runs as root")
    shim = Shim(tmp_path, bindir, "accept-volume-mounts = true\n")
    mounts = [{"source": "/dev/null", "destination": destination, "type": "bind"}]
    data = oci(["PATH=/bin"], mounts=mounts)
    if outcome == "error":
        shim.refused(data)
        return
    done, after = shim.create(data)
    assert done.returncode == 0, done.stderr
    assert (b"SEEN=0" in after) == (outcome == "injected")
