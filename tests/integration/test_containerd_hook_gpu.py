"""--mode hook, proven with GPUs: containerd's CRI plugin has runc run the REAL gpuctk-hook.

`gpuctk runtime configure --mode hook` writes a handler whose `base_runtime_spec` is a complete
OCI spec carrying `gpuctk-hook prestart` (with `--hook-config`, the hook entry's env names the
gpuctk config that lists the spec dir). containerd 1.6 runs on a private socket, root, state and
/run (fixtures.containerd.PrivateContainerd) with exactly that configuration, and the test drives
its CRI plugin as the kubelet would (fixtures.cri: RunPodSandbox with the handler, then
CreateContainer / StartContainer): CRI builds each container's spec FROM THE WRITTEN BASE SPEC
(`ctr run` never reads base_runtime_spec), the runc.v2 shim runs runc, and runc runs the hook
from that spec. No gpuctk-runtime is involved anywhere: the handler's BinaryName is runc.

The spec comes from `gpuctk cdi generate --simulate` (h100-8; a100-mig for the MIG device) over
the Debian 535 driver root and mknod'ed nodes, in a temp spec dir (nothing in /etc/cdi or
/var/run/cdi). The pod's image is the debian test image, imported into the private daemon as an
OCI archive. Each container writes what it sees (fixtures.gpucheck.SCRIPT) into a host folder
mounted at /out:

- exactly the requested /dev/nvidia*, /dev/nvidia-caps/* and /dev/dri/* nodes, and none of a
  device not requested;
- opening each injected GPU node gives ENXIO (the hook allowed it in the device cgroup; no
  driver behind it);
- `ldconfig -p` lists libcuda.so.1 (the hook mounted the driver and refreshed the ld cache);
- with no NVIDIA_VISIBLE_DEVICES, nothing: the hook runs for every container and does nothing.

The gpuctk config opts in to `accept-envvar-unprivileged = true` (the `envvar` strategy): by
default an unprivileged Kubernetes container's env is no grant (test_shim_no_grant.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.containerd import SYSTEMD_SANDBOX, PrivateContainerd, can_run_daemon, private_config
from fixtures.cri import EXITED, Cri, have_grpc, oci_archive
from fixtures.gpucheck import SCRIPT, Node, check_nodes, generate, seen
from fixtures.images import ImageError, build_image, hook_path

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not can_run_daemon(), reason="needs root, containerd, ctr and unshare"),
    pytest.mark.skipif(not have_grpc(), reason="needs grpcio (the CRI client)"),
]

BIN = Path(sys.executable).parent
HANDLER = "nvidia"
IMAGE = "registry.example.com/pause:3.9"  # SYSTEMD_SANDBOX's sandbox image: pod and container
CGROUP_PARENT = "/gpuctk-cri-hook"
CRI_NAMESPACE = "k8s.io"


def remove_cgroups(parent: str) -> None:
    """rmdir the (empty) cgroup folders the pods' parent left in each v1 hierarchy."""
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        candidate = hierarchy / parent.lstrip("/")
        if candidate.is_dir():
            for child in candidate.iterdir():
                if child.is_dir():
                    with contextlib.suppress(OSError):
                        child.rmdir()
            with contextlib.suppress(OSError):
                candidate.rmdir()


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory, driver_root: Path) -> dict[str, Node]:
    base = tmp_path_factory.mktemp("cri-hook-node")
    return {
        "h100-8": generate(base / "h100", driver_root, "h100-8", base / "h100/cdi/nvidia.json"),
        "a100-mig": generate(base / "a100", driver_root, "a100-mig", base / "a100/cdi/nvidia.json"),
    }


class Daemon:
    """The private containerd, its CRI client and the gpuctk config the hook entry names."""

    def __init__(self, containerd: PrivateContainerd, cri: Cri, toml: Path) -> None:
        self.containerd = containerd
        self.cri = cri
        self.toml = toml

    def use(self, node: Node) -> None:
        """Point the hook (through the config its entry names) at `node`'s spec dir. These
        pods ask by NVIDIA_VISIBLE_DEVICES, the device plugin's `envvar` strategy, which a
        Kubernetes container's unprivileged env gets only by the operator's explicit opt-in
        (gpuctk.hook.requests.devices.env_allowed; tests/integration/test_shim_no_grant.py)."""
        self.toml.write_text(
            f'spec-dirs = ["{node.spec_dir}"]\naccept-envvar-unprivileged = true\n'
        )


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    try:
        image = build_image("debian")
    except ImageError as exc:
        if os.environ.get("GPUCTK_REQUIRE_IMAGES") == "1":
            pytest.fail(f"cannot build test images: {exc}")
        pytest.skip(f"cannot build test images: {exc}")
    base = tmp_path_factory.mktemp("cri-hook")
    etc = base / "etc"
    etc.mkdir()
    # cgroupfs, and restrict_oom_score_adj: CRI gives sandboxes oom_score_adj -998, which root
    # without CAP_SYS_RESOURCE (as here) may not set; the option clamps it to containerd's own.
    main = SYSTEMD_SANDBOX.replace("SystemdCgroup = true", "SystemdCgroup = false")
    main = main.replace("max_container_log_line_size", "restrict_oom_score_adj = true\n  $&")
    (etc / "config.toml").write_text(main.replace("$&", "max_container_log_line_size"))
    toml = base / "gpuctk.toml"
    configure = [
        str(BIN / "gpuctk"), "runtime", "configure", "--runtime", "containerd",
        "--config", str(etc / "config.toml"), "--drop-in", str(etc / "conf.d" / "99-gpuctk.toml"),
        "--mode", "hook", "--hook-path", hook_path(), "--hook-config", str(toml),
        "--runtime-name", HANDLER,
    ]  # fmt: skip
    done = subprocess.run(configure, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert (etc / "conf.d" / "99-gpuctk.base-spec.json").is_file()
    archive = oci_archive(image, base / "image.tar", IMAGE, ["/bin/sleep", "100000"])
    containerd = PrivateContainerd(base, private_config(base, etc / "config.toml"))
    containerd.start()
    cri = None
    try:
        containerd.ctr("--namespace", CRI_NAMESPACE, "images", "import", str(archive))
        cri = Cri(containerd.address)
        yield Daemon(containerd, cri, toml)
    finally:
        if cri is not None:
            cri.close()
        containerd.stop()  # its mount namespace, with the snapshots' mounts, goes with it
        remove_cgroups(CGROUP_PARENT)


def run_pod(daemon: Daemon, env: dict[str, str]) -> tuple[int, str]:
    """One pod with one container through the handler: (exit code, what the container wrote)."""
    name = f"gpu-{uuid.uuid4().hex[:8]}"
    out = daemon.containerd.base / f"out-{name}"
    out.mkdir()
    cri = daemon.cri
    config = cri.sandbox_config(name, CGROUP_PARENT)
    pod = cri.run_pod(config, HANDLER)
    try:
        command = ["/bin/sh", "-c", f"( {SCRIPT} ) > /out/result 2>&1"]
        container = cri.create(pod, config, "probe", IMAGE, command, env, {"/out": str(out)})
        cri.start(container)
        deadline = time.monotonic() + 60
        while True:
            state, code, text = cri.status(container)
            if state == EXITED:
                break
            assert time.monotonic() < deadline, "the container did not exit"
            time.sleep(0.1)
        result = out / "result"
        return code, (result.read_text() if result.exists() else "") + text
    finally:
        cri.stop_pod(pod)
        cri.remove_pod(pod)


def completed(code: int, output: str) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess([], code, output, "")


def test_one_gpu(daemon: Daemon, nodes: dict[str, Node]) -> None:
    node = nodes["h100-8"]
    daemon.use(node)
    done = completed(*run_pod(daemon, {"NVIDIA_VISIBLE_DEVICES": "0"}))
    check_nodes(done, node.nodes("0"))
    found = seen(done.stdout, "NODE")
    assert "/dev/nvidia0" in found and "/dev/nvidia1" not in found
    assert "libcuda.so.535.309.01" in seen(done.stdout, "LIB")
    assert "LDCACHE libcuda.so.1" in done.stdout.splitlines()


def test_mig_device(daemon: Daemon, nodes: dict[str, Node]) -> None:
    node = nodes["a100-mig"]
    daemon.use(node)
    done = completed(*run_pod(daemon, {"NVIDIA_VISIBLE_DEVICES": "1:0"}))
    expected = node.nodes("1:0")
    assert "/dev/nvidia1" in expected and any("/nvidia-caps/" in p for p in expected)
    check_nodes(done, expected)
    assert "/dev/nvidia0" not in seen(done.stdout, "NODE")
    assert "LDCACHE libcuda.so.1" in done.stdout.splitlines()


def test_all_gpus(daemon: Daemon, nodes: dict[str, Node]) -> None:
    node = nodes["h100-8"]
    daemon.use(node)
    done = completed(*run_pod(daemon, {"NVIDIA_VISIBLE_DEVICES": "all"}))
    check_nodes(done, node.nodes("all"))
    assert {f"/dev/nvidia{i}" for i in range(8)} <= seen(done.stdout, "NODE")


def test_no_request_gets_nothing(daemon: Daemon, nodes: dict[str, Node]) -> None:
    daemon.use(nodes["h100-8"])
    code, output = run_pod(daemon, {})
    assert code == 0, output
    assert seen(output, "NODE") == set() and "LDCACHE libcuda.so.1" not in output


def test_no_shim_in_the_handler(daemon: Daemon) -> None:
    """What ran the hook is runc, from the base spec: the handler names no gpuctk binary."""
    drop_in = daemon.containerd.base / "etc" / "conf.d" / "99-gpuctk.toml"
    plugins = tomllib.loads(drop_in.read_text())["plugins"]
    handler = plugins["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"][HANDLER]
    assert handler["options"].get("BinaryName", "") == ""  # the runc.v2 shim runs plain runc
    spec = json.loads(Path(handler["base_runtime_spec"]).read_text())
    (hook,) = spec["hooks"]["prestart"]
    assert hook["path"] == hook_path() and f"GPUCTK_CONFIG={daemon.toml}" in hook["env"]
