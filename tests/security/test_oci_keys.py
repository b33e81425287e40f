"""config.json keys that runc folds onto an OCI name are refused (gpuctk.hook.ocikeys).

runc decodes config.json with Go's encoding/json, which matches an object key to a struct
field case-insensitively, with Unicode folding (U+017F, the long s, is an `s`; U+212A, the
Kelvin sign, a `k`): `"Process"` and `"proce\u017fs"` set the process. Python reads them as
other keys. So a config whose `process` asks for nothing and whose `Process` holds
NVIDIA_VISIBLE_DEVICES is one request to runc and another to the shim (shown with REAL runc
below; the control run proves runc's folding). Every reader of config.json on the create path
(the shim, the hook modes, the createContainer hook) refuses such a key with one line naming
it and where it is; map-valued fields (annotations, linux.sysctl, ...) hold free keys and are
not checked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fixtures.images import make_bundle, unique_name
from secworld import FOLDER, World, assert_safe, run_tool

PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SCRIPT = 'echo "VISIBLE=${NVIDIA_VISIBLE_DEVICES-unset} SEEN=${SEEN-unset}"'


def gpu_spec() -> dict[str, Any]:
    devices = [{"name": n, "containerEdits": {"env": [f"SEEN=gpu{n}"]}} for n in ("0", "all")]
    return {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": devices}


class Shim:
    """A root-owned spec dir with a GPU spec, a bundle, and a gpuctk config naming `runtime`
    (by default a fake one that records the config.json it was given)."""

    def __init__(self, tmp: Path, bindir: Path, runtime: str = "") -> None:
        self.tmp, self.bindir = tmp, bindir
        self.cdi, self.bundle = tmp / "cdi", tmp / "bundle"
        self.cdi.mkdir()
        self.bundle.mkdir()
        self.cdi.chmod(0o755)
        (self.cdi / "nvidia.json").write_text(json.dumps(gpu_spec()))
        (self.cdi / "nvidia.json").chmod(0o644)
        if not runtime:
            fake = tmp / "fake-runc"
            fake.write_text(f"#!/bin/sh\ncp config.json {tmp}/seen.json\n")
            fake.chmod(0o755)
            runtime = str(fake)
        conf = tmp / "gpuctk.toml"
        conf.write_text(f'runtimes = ["{runtime}"]\nspec-dirs = ["{self.cdi}"]\n')
        self.env = {"GPUCTK_CONFIG": str(conf)}

    def create(self, data: bytes) -> subprocess.CompletedProcess[str]:
        path = self.bundle / "config.json"
        path.write_bytes(data)
        args = ["create", "--bundle", str(self.bundle), "ctr"]
        done = run_tool(self.bindir / "gpuctk-runtime", args, b"", self.env, self.bundle)
        assert_safe(done, "gpuctk-runtime")
        if done.returncode:
            assert path.read_bytes() == data, "config.json changed on a refused create"
            assert not (self.tmp / "seen.json").exists(), "the runtime ran after an error"
        return done


@pytest.fixture
def shim(tmp_path: Path, bindir: Path) -> Shim:
    if os.geteuid() != 0:
        pytest.skip("spec files must be root's")
    tmp_path.chmod(0o755)
    return Shim(tmp_path, bindir)


def config_text(**fields: str) -> bytes:
    """A config.json written key by key (raw JSON values), so that any key spelling stays."""
    body = ", ".join(f"{json.dumps(k)}: {v}" for k, v in fields.items())
    return ("{" + body + "}").encode()


ASKS = json.dumps({"env": [PATH_ENV, "NVIDIA_VISIBLE_DEVICES=all"], "args": ["sh"], "cwd": "/"})
NOTHING = json.dumps({"env": [PATH_ENV], "args": ["sh"], "cwd": "/"})
ROOT = json.dumps({"path": "rootfs"})


@pytest.mark.parametrize(
    "fields, key, where, name",
    [
        ({"process": NOTHING, "Process": ASKS}, "Process", "/", "process"),
        ({"process": NOTHING, "proce\u017fs": ASKS}, "proce\u017fs", "/", "process"),
        ({"process": ASKS, "PROCESS": NOTHING}, "PROCESS", "/", "process"),
        ({"process": ASKS, "ociversion": '"1.0.2"'}, "ociversion", "/", "ociVersion"),
        ({"process": ASKS, "linux": '{"Devices": []}'}, "Devices", "/linux", "devices"),
        (
            {"process": ASKS, "mounts": '[{"destination": "/a"}, {"Destination": "/b"}]'},
            "Destination",
            "/mounts/1",
            "destination",
        ),
        (
            {"process": ASKS, "linux": '{"resources": {"memory": {"\u212aernel": 1}}}'},
            "\u212aernel",
            "/linux/resources/memory",
            "kernel",
        ),
    ],
)
def test_shim_refuses_a_key_runc_folds(
    shim: Shim, fields: dict[str, str], key: str, where: str, name: str
) -> None:
    done = shim.create(config_text(root=ROOT, **fields))
    assert done.returncode == 1, done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if "gpuctk-runtime:" in ln]
    expect = f"key {key!a} at {where} is not an OCI name (runc reads it as {name!r})"
    assert expect.replace("\\", "\\\\") in line, line  # runc's log format doubles a \\


@pytest.mark.parametrize(
    "extra",
    [
        '"annotations": {"Process": "x", "example.com/Process": "y"}',
        '"linux": {"sysctl": {"Net.Core.Somaxconn": "1"}, '
        '"resources": {"unified": {"Memory.Max": "1"}}}',
        '"linux": {"netDevices": {"Eth0": {"name": "x"}}, "x-future": {"Devices": 1}}',
        '"X-Process": {"Root": 1}, "pr\u00f3cess": {}',
    ],
    ids=["annotations", "sysctl-unified", "map-keys-unknown-fields", "no-fold"],
)
def test_shim_accepts_free_keys_and_unknown_fields(shim: Shim, extra: str) -> None:
    data = b'{"root": {"path": "rootfs"}, "process": ' + ASKS.encode() + b", " + extra.encode()
    done = shim.create(data + b"}")
    assert done.returncode == 0, done.stderr
    assert "SEEN=gpuall" in json.loads((shim.tmp / "seen.json").read_text())["process"]["env"]


def test_hook_modes_refuse_too(world: World, bindir: Path) -> None:
    (world.tmp / "shim").mkdir(mode=0o755)
    shim = Shim(world.tmp / "shim", bindir)
    data = config_text(root=ROOT, process=NOTHING, Process=ASKS)
    done = run_tool(bindir / "gpuctk-hook", ["precreate"], data, shim.env)
    assert_safe(done)
    assert done.returncode == 1 and "key 'Process' at /" in done.stderr and done.stdout == ""
    # the createContainer hook reads the root from config.json: runc took "Root"'s
    world.write_config({"Root": {"path": str(world.host)}})
    world.resnap()
    args = ["createContainer", "--link", f"libfoo.so.1.2.3::{FOLDER}/libfoo.so.1"]
    done = run_tool(bindir / "gpuctk-hook", args, world.state())
    assert_safe(done)
    assert done.returncode == 1 and "key 'Root' at /" in done.stderr
    assert not (world.root / FOLDER.lstrip("/") / "libfoo.so.1").exists()


@pytest.mark.integration
@pytest.mark.parametrize("spelling", ["Process", "proce\u017fs"])
def test_shim_and_runc_would_read_different_requests(
    tmp_path: Path, bindir: Path, fresh_rootfs: Any, spelling: str
) -> None:
    """With REAL runc: `process` asks for nothing, `Process` (or `proce\u017fs`) for every GPU.
    runc alone (the control) runs the container with the second one's env; the shim, which
    would have seen no request, refuses the config."""
    runc = shutil.which("runc")
    if runc is None or os.geteuid() != 0:
        pytest.skip("needs root and runc")
    tmp_path.chmod(0o755)
    shim = Shim(tmp_path, bindir, runtime=runc)
    bundle = make_bundle(shim.bundle, fresh_rootfs("debian"), ["/bin/sh", "-c", SCRIPT])
    doc = json.loads((bundle / "config.json").read_text())
    process = doc.pop("process")
    text = json.dumps({**doc, "process": process})[:-1]
    folded = {**process, "env": [PATH_ENV, "NVIDIA_VISIBLE_DEVICES=all"]}
    data = f"{text}, {json.dumps(spelling)}: {json.dumps(folded)}}}".encode()
    state = str(tmp_path / "runc-state")

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        (bundle / "config.json").write_bytes(data)
        name = unique_name("gpuctk-sec-keys")
        try:
            args = ["--root", state, "run", "--bundle", str(bundle), name]
            return run_tool(Path(argv[0]), args, b"", shim.env, bundle, timeout=120)
        finally:
            subprocess.run(
                [runc, "--root", state, "delete", "--force", name], capture_output=True, check=False
            )

    control = run([runc])
    assert control.returncode == 0, control.stderr
    assert "VISIBLE=all SEEN=unset" in control.stdout  # runc read the folded key as `process`
    done = run([str(bindir / "gpuctk-runtime")])
    assert_safe(done, "gpuctk-runtime")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"key {spelling!a} at / is not an OCI name".replace("\\", "\\\\") in done.stderr
    assert (bundle / "config.json").read_bytes() == data
