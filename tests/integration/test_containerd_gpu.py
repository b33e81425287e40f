"""containerd 1.6, configured by gpuctk, runs GPU containers through the shim (private daemon).

The whole chain through a real containerd: the daemon runs on a private socket, root, state
and /run (fixtures.containerd.PrivateContainerd) with the config `gpuctk runtime configure`
wrote, and
`ctr run --runtime io.containerd.runc.v2 --runc-binary <gpuctk-runtime>` starts a container of
the debian test image. The spec is generated as in test_shim_runtimes (`gpuctk cdi generate
--simulate h100-8` over the Debian 535 driver root and mknod'ed nodes), and the container
reports what the runtime issue checks: exactly the requested /dev/nvidia* nodes, ENXIO on
opening a GPU node (the device cgroup allowed it; no driver behind it), no node of a device not
requested, `ldconfig -p` listing libcuda.so.1 (the gpuctk-hook createContainer hook ran), and
NVIDIA_DRIVER_CAPABILITIES=utility leaving libcuda out.

GPUCTK_CONFIG reaches the shim through the daemon's environment (containerd -> shim ->
gpuctk-runtime). The daemon lives in its own mount namespace, so each container's overlay of the
image is mounted inside that namespace (nsenter) and vanishes with it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.containerd import (
    SYSTEMD_SANDBOX,
    PrivateContainerd,
    can_run_daemon,
    private_config,
)
from fixtures.gpucheck import SCRIPT, Node, check_nodes, generate, seen
from fixtures.images import ImageError, build_image

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not can_run_daemon() or shutil.which("nsenter") is None,
        reason="needs root, containerd, ctr, unshare and nsenter",
    ),
]

CGROUP_PARENT = "gpuctk-cd-gpu"
NAMESPACE = "gpuctk-cd-gpu"
BIN = Path(sys.executable).parent
SHIM = BIN / "gpuctk-runtime"


def remove_cgroups(parent: str) -> None:
    """rmdir the (empty) cgroup folders the test containers' parent left in each hierarchy."""
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        for candidate in (hierarchy / parent, Path("/sys/fs/cgroup") / parent):
            if candidate.is_dir():
                with contextlib.suppress(OSError):
                    candidate.rmdir()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, driver_root: Path) -> Node:
    base = tmp_path_factory.mktemp("cd-gpu-node")
    return generate(base, driver_root, "h100-8", base / "cdi" / "nvidia.json")


@pytest.fixture(scope="module")
def image() -> Path:
    try:
        return build_image("debian")
    except ImageError as exc:
        if os.environ.get("GPUCTK_REQUIRE_IMAGES") == "1":
            pytest.fail(f"cannot build test images: {exc}")
        pytest.skip(f"cannot build test images: {exc}")
        raise


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, node: Node, image: Path
) -> Iterator[PrivateContainerd]:
    if not SHIM.exists():
        pytest.skip("gpuctk-runtime console script not installed in the venv")
    base = tmp_path_factory.mktemp("cd-gpu")
    etc = base / "etc"
    etc.mkdir()
    (etc / "config.toml").write_text(
        SYSTEMD_SANDBOX.replace("SystemdCgroup = true", "SystemdCgroup = false")
    )
    configure = [
        str(BIN / "gpuctk"), "runtime", "configure", "--runtime", "containerd",
        "--config", str(etc / "config.toml"), "--drop-in", str(etc / "conf.d" / "99-gpuctk.toml"),
        "--runtime-path", str(SHIM),
    ]  # fmt: skip
    done = subprocess.run(configure, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    (base / "gpuctk.toml").write_text(
        f'runtimes = ["{shutil.which("runc")}"]\nspec-dirs = ["{node.spec_dir}"]\n'
        f'log-file = "{base}/gpuctk.log"\n'
    )
    instance = PrivateContainerd(
        base,
        private_config(base, etc / "config.toml"),
        env={"GPUCTK_CONFIG": str(base / "gpuctk.toml")},
    )
    instance.start()
    try:
        yield instance
    finally:
        instance.stop()  # its mount namespace, with the overlays, goes with it
        remove_cgroups(CGROUP_PARENT)


def in_daemon(daemon: PrivateContainerd, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run argv in the daemon's mount namespace."""
    assert daemon.proc is not None
    enter = ["nsenter", "-t", str(daemon.proc.pid), "-m", *argv]
    return subprocess.run(enter, capture_output=True, text=True, timeout=30, check=False)


def overlay_in_daemon(daemon: PrivateContainerd, lower: Path) -> Path:
    """A fresh overlay of `lower`, mounted in the daemon's mount namespace (where shims run)."""
    assert daemon.proc is not None
    top = daemon.base / f"ovl-{uuid.uuid4().hex[:8]}"
    upper, work, merged = (top / n for n in ("upper", "work", "merged"))
    for d in (upper, work, merged):
        d.mkdir(parents=True)
    opts = f"lowerdir={lower},upperdir={upper},workdir={work}"
    done = in_daemon(daemon, "mount", "-t", "overlay", "overlay", "-o", opts, str(merged))
    assert done.returncode == 0, done.stderr
    return merged


def run_gpu(daemon: PrivateContainerd, image: Path, *env: str) -> subprocess.CompletedProcess[str]:
    rootfs = overlay_in_daemon(daemon, image)
    name = f"gpuctk-cd-gpu-{uuid.uuid4().hex[:8]}"
    args = ["--namespace", NAMESPACE, "run", "--rm", "--rootfs"]
    args += ["--fifo-dir", str(daemon.base / "fifo"), "--cgroup", f"/{CGROUP_PARENT}/{name}"]
    args += ["--runtime", "io.containerd.runc.v2", "--runc-binary", str(SHIM)]
    for item in env:
        args += ["--env", item]
    try:
        return daemon.ctr(*args, str(rootfs), name, "/bin/sh", "-c", SCRIPT, check=False)
    finally:
        in_daemon(daemon, "umount", "-l", str(rootfs))


def test_one_gpu(daemon: PrivateContainerd, image: Path, node: Node) -> None:
    done = run_gpu(daemon, image, "NVIDIA_VISIBLE_DEVICES=0")
    check_nodes(done, node.nodes("0"))
    nodes = seen(done.stdout, "NODE")
    assert "/dev/nvidia0" in nodes and "/dev/nvidia1" not in nodes
    assert "/dev/nvidiactl" in nodes
    assert "libcuda.so.535.309.01" in seen(done.stdout, "LIB")
    assert "LDCACHE libcuda.so.1" in done.stdout.splitlines()


def test_all_gpus(daemon: PrivateContainerd, image: Path, node: Node) -> None:
    done = run_gpu(daemon, image, "NVIDIA_VISIBLE_DEVICES=all")
    check_nodes(done, node.nodes("all"))
    nodes = seen(done.stdout, "NODE")
    assert {f"/dev/nvidia{i}" for i in range(8)} <= nodes
    assert "LDCACHE libcuda.so.1" in done.stdout.splitlines()


def test_utility_leaves_libcuda_out(daemon: PrivateContainerd, image: Path, node: Node) -> None:
    env = ("NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=utility")
    done = run_gpu(daemon, image, *env)
    check_nodes(done, node.nodes("0"))
    libs = seen(done.stdout, "LIB")
    assert "libnvidia-ml.so.1" in libs
    assert not any(lib.startswith("libcuda") for lib in libs), libs
    assert "LDCACHE libcuda.so.1" not in done.stdout


def test_no_request_passes_through(daemon: PrivateContainerd, image: Path) -> None:
    done = run_gpu(daemon, image)
    assert done.returncode == 0, done.stderr
    assert seen(done.stdout, "NODE") == set()
    assert "LDCACHE libcuda.so.1" not in done.stdout
