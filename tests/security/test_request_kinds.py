"""The image's environment selects devices of the default kind only.

NVIDIA_VISIBLE_DEVICES is the image author's (and the device-list mounts under
/var/run/nvidia-container-devices/ the request author's): there a qualified name of any kind
other than `default-kind` is refused with one line saying what to do, the create fails and
config.json stays as it was. Two kinds show why:

- `example.com/hostdisk`, another vendor's spec in the same spec dirs, whose device `sda` is a
  read-write bind mount of a host folder: an unprivileged image that names it writes on the host
  (shown with REAL runc below);
- `nvidia.com/nic`, gpuctk's own NIC spec (`gpuctk cdi generate --nics`), whose devices carry
  the RDMA nodes and a createRuntime hook that moves a host network interface into the
  container.

Other kinds come from CDI annotations (cdi.k8s.io/*) or the engine's CDI devices, which the
orchestrator sets; the config key `device-list-kinds` lets an operator name kinds that the
device list may select as well. The same rule holds in the hook modes (precreate, prestart),
which read the request through the same code.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fixtures.fakesys import make_two_socket
from fixtures.images import make_bundle, unique_name
from secworld import assert_safe, run_tool

GPUCTK = str(Path(sys.executable).with_name("gpuctk"))
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOSTDISK = "example.com/hostdisk=sda"
NIC = "nvidia.com/nic=mlx5_0"
REFUSAL = "selects nvidia.com/gpu devices only"


def gpu_spec() -> dict[str, Any]:
    devices = [{"name": n, "containerEdits": {"env": [f"SEEN=gpu{n}"]}} for n in ("0", "all")]
    return {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": devices}


def hostdisk_spec(host_folder: Path) -> dict[str, Any]:
    mount = {"hostPath": str(host_folder), "containerPath": "/hostdisk", "options": ["rw", "rbind"]}
    return {
        "cdiVersion": "0.5.0",
        "kind": "example.com/hostdisk",
        "devices": [{"name": "sda", "containerEdits": {"mounts": [mount]}}],
    }


@pytest.fixture(scope="module")
def nic_spec(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """gpuctk's own NIC spec, generated for a fake two-socket machine with three RDMA cards."""
    tmp = tmp_path_factory.mktemp("nic-spec")
    sysfs = make_two_socket(tmp / "sys")
    out = tmp / "out"
    out.mkdir()
    args = ["cdi", "generate", "--simulate", "h100-8", "--sys-root", str(sysfs), "--nics"]
    done = subprocess.run(
        [GPUCTK, *args, "--output", str(out / "nvidia.json")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return (out / "nvidia-nic.json").read_bytes()


class Node:
    """Spec dirs with the GPU, host-disk and NIC specs (root-owned, 0755), a bundle, and the
    gpuctk config naming `runtime` (a fake that records the config.json it was given)."""

    def __init__(self, tmp: Path, bindir: Path, nic: bytes, runtime: str = "") -> None:
        self.tmp, self.bindir = tmp, bindir
        self.cdi, self.host, self.bundle = tmp / "cdi", tmp / "host-disk", tmp / "bundle"
        for d in (self.cdi, self.host, self.bundle):
            d.mkdir()
        self.cdi.chmod(0o755)
        (self.cdi / "nvidia.json").write_text(json.dumps(gpu_spec()))
        (self.cdi / "hostdisk.json").write_text(json.dumps(hostdisk_spec(self.host)))
        (self.cdi / "nvidia-nic.json").write_bytes(nic)
        for spec in self.cdi.iterdir():
            spec.chmod(0o644)
        if not runtime:
            fake = tmp / "fake-runc"
            fake.write_text(f"#!/bin/sh\ncp config.json {tmp}/seen.json\n")
            fake.chmod(0o755)
            runtime = str(fake)
        self.runtime = runtime
        self.configure()

    def configure(self, extra: str = "") -> None:
        conf = self.tmp / "gpuctk.toml"
        conf.write_text(f'runtimes = ["{self.runtime}"]\nspec-dirs = ["{self.cdi}"]\n{extra}')
        self.env = {"GPUCTK_CONFIG": str(conf)}

    def create(self, config: dict[str, Any]) -> tuple[subprocess.CompletedProcess[str], bytes]:
        (self.tmp / "seen.json").unlink(missing_ok=True)
        path = self.bundle / "config.json"
        data = json.dumps(config).encode()
        path.write_bytes(data)
        args = ["create", "--bundle", str(self.bundle), "ctr"]
        done = run_tool(self.bindir / "gpuctk-runtime", args, b"", self.env, self.bundle)
        assert_safe(done, "gpuctk-runtime")
        after = path.read_bytes()
        if done.returncode:
            assert after == data, "config.json changed on a refused create"
            assert not (self.tmp / "seen.json").exists(), "the runtime ran after an error"
        return done, after

    def seen(self) -> dict[str, Any]:
        return dict(json.loads((self.tmp / "seen.json").read_text()))


def oci(env: list[str], **extra: Any) -> dict[str, Any]:
    process = {"args": ["sh"], "cwd": "/", "user": {"uid": 1000, "gid": 1000}, "env": env}
    process["capabilities"] = {"bounding": ["CAP_CHOWN"]}  # unprivileged
    return {"ociVersion": "1.0.2", "root": {"path": "rootfs"}, "process": process, **extra}


@pytest.fixture
def node(tmp_path: Path, bindir: Path, nic_spec: bytes) -> Node:
    if os.geteuid() != 0:
        pytest.skip("spec files must be root's")
    tmp_path.chmod(0o755)
    return Node(tmp_path, bindir, nic_spec)


@pytest.mark.parametrize("value", [HOSTDISK, NIC, f"0,{HOSTDISK}", f"nvidia.com/gpu=0,{NIC}"])
def test_image_env_cannot_select_another_kind(node: Node, value: str) -> None:
    done, _ = node.create(oci([PATH_ENV, f"NVIDIA_VISIBLE_DEVICES={value}"]))
    assert done.returncode == 1, done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if "gpuctk-runtime:" in ln]
    assert REFUSAL in line and "annotation" in line and "device-list-kinds" in line, line
    assert not os.listdir(node.host)


def test_device_list_mounts_cannot_select_another_kind(node: Node) -> None:
    node.configure("accept-volume-mounts = true\n")
    folder = "/var/run/nvidia-container-devices/cdi/example.com/hostdisk/sda"
    mounts = [{"source": "/dev/null", "destination": folder, "type": "bind"}]
    done, _ = node.create(oci([PATH_ENV], mounts=mounts))
    assert done.returncode == 1 and "selects nvidia.com/gpu devices only" in done.stderr


@pytest.mark.parametrize(
    "value, seen",
    [("0", "SEEN=gpu0"), ("all", "SEEN=gpuall"), ("nvidia.com/gpu=0", "SEEN=gpu0")],
)
def test_the_default_kind_bare_and_qualified(node: Node, value: str, seen: str) -> None:
    done, _ = node.create(oci([PATH_ENV, f"NVIDIA_VISIBLE_DEVICES={value}"]))
    assert done.returncode == 0, done.stderr
    assert seen in node.seen()["process"]["env"]


def test_annotations_still_select_any_kind(node: Node) -> None:
    annotations = {"cdi.k8s.io/disk": HOSTDISK, "cdi.k8s.io/nic": NIC}
    done, _ = node.create(oci([PATH_ENV], annotations=annotations))
    assert done.returncode == 0, done.stderr
    seen = node.seen()
    assert [m["destination"] for m in seen["mounts"]] == ["/hostdisk"]
    assert "/dev/infiniband/uverbs0" in [d["path"] for d in seen["linux"]["devices"]]


def test_device_list_kinds_lets_an_operator_widen_it(node: Node) -> None:
    node.configure(
        'device-list-kinds = ["example.com/hostdisk", "nvidia.com/nic"]\n'
        "accept-volume-mounts = true\n"
    )
    done, _ = node.create(oci([PATH_ENV, f"NVIDIA_VISIBLE_DEVICES=0,{HOSTDISK},{NIC}"]))
    assert done.returncode == 0, done.stderr
    seen = node.seen()
    assert "SEEN=gpu0" in seen["process"]["env"]
    assert [m["destination"] for m in seen["mounts"]] == ["/hostdisk"]
    assert "/dev/infiniband/uverbs0" in [d["path"] for d in seen["linux"]["devices"]]
    folder = "/var/run/nvidia-container-devices/cdi/example.com/hostdisk/sda"
    mounts = [{"source": "/dev/null", "destination": folder, "type": "bind"}]
    done, _ = node.create(oci([PATH_ENV], mounts=mounts))
    assert done.returncode == 0, done.stderr
    assert "/hostdisk" in [m["destination"] for m in node.seen()["mounts"]]
    node.configure('device-list-kinds = ["example.com/hostdisk"]\n')  # only the kinds named
    done, _ = node.create(oci([PATH_ENV, f"NVIDIA_VISIBLE_DEVICES={NIC}"]))
    assert done.returncode == 1 and REFUSAL in done.stderr


def test_hook_modes_refuse_too(node: Node) -> None:
    data = json.dumps(oci([PATH_ENV, f"NVIDIA_VISIBLE_DEVICES={HOSTDISK}"])).encode()
    done = run_tool(node.bindir / "gpuctk-hook", ["precreate"], data, node.env)
    assert_safe(done)
    assert done.returncode == 1 and REFUSAL in done.stderr and done.stdout == ""
    (node.bundle / "config.json").write_bytes(data)
    state = {"ociVersion": "1.0.2", "id": "c", "status": "created", "pid": 1}
    state["bundle"] = str(node.bundle)
    done = run_tool(node.bindir / "gpuctk-hook", ["prestart"], json.dumps(state).encode(), node.env)
    assert_safe(done)
    assert done.returncode == 1 and REFUSAL in done.stderr
    assert (node.bundle / "config.json").read_bytes() == data


@pytest.mark.integration
def test_an_unprivileged_image_cannot_write_on_the_host_under_runc(
    tmp_path: Path, bindir: Path, nic_spec: bytes, fresh_rootfs: Any
) -> None:
    """With REAL runc: the image's env names the host-disk device and writes through it. The
    control (the same device from a CDI annotation, the orchestrator's channel) shows that
    the write would be seen on the host."""
    runc = shutil.which("runc")
    if runc is None or os.geteuid() != 0:
        pytest.skip("needs root and runc")
    tmp_path.chmod(0o755)
    node = Node(tmp_path, bindir, nic_spec, runtime=runc)
    script = "echo written-from-the-container > /hostdisk/pwned"
    env = [PATH_ENV, f"NVIDIA_VISIBLE_DEVICES={HOSTDISK}"]

    def run(annotations: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        rootfs = fresh_rootfs("debian")
        bundle = make_bundle(node.bundle, rootfs, ["/bin/sh", "-c", script], env=env)
        config = bundle / "config.json"
        doc = json.loads(config.read_text())
        assert "CAP_SYS_ADMIN" not in doc["process"]["capabilities"]["bounding"]  # unprivileged
        if annotations:
            doc["annotations"] = annotations
        config.write_text(json.dumps(doc))
        before = config.read_bytes()
        name, state = unique_name("gpuctk-sec-kinds"), str(tmp_path / "runc-state")
        try:
            args = ["--root", state, "run", "--bundle", str(bundle), name]
            done = run_tool(bindir / "gpuctk-runtime", args, b"", node.env, bundle, timeout=120)
        finally:
            subprocess.run(
                [runc, "--root", state, "delete", "--force", name], capture_output=True, check=False
            )
        assert_safe(done, "gpuctk-runtime")
        if done.returncode:
            assert config.read_bytes() == before
        return done

    done = run()
    assert done.returncode == 1 and REFUSAL in done.stderr, done.stderr
    assert not (node.host / "pwned").exists(), "the image wrote on the host"
    done = run({"cdi.k8s.io/disk": HOSTDISK})
    assert done.returncode == 0, done.stderr
    assert (node.host / "pwned").read_text() == "written-from-the-container\n"
