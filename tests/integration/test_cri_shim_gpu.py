"""--mode shim, proven with GPUs through containerd's CRI plugin, as a RuntimeClass drives it.

`gpuctk runtime configure` (shim mode, the default) writes a handler `nvidia` whose BinaryName is
gpuctk-runtime. containerd 1.6 runs on a private socket, root, state and /run
(fixtures.containerd.PrivateContainerd) with exactly that configuration, and the test drives its
CRI plugin as the kubelet does for a pod whose RuntimeClass names the handler (fixtures.cri:
RunPodSandbox with runtime_handler `nvidia`, then CreateContainer / StartContainer). CRI builds
the spec, the runc.v2 shim runs gpuctk-runtime in place of runc, and gpuctk-runtime applies the
CDI edits to the bundle's config.json before it execs runc. GPUCTK_CONFIG (runc, the spec dir)
reaches it through the daemon's environment.

The spec comes from `gpuctk cdi generate --simulate h100-8` over the Debian 535 driver root and
mknod'ed nodes, in a temp spec dir. The pod's image is the debian test image, imported into the
private daemon as an OCI archive. Each container writes what it sees (fixtures.gpucheck.SCRIPT)
into a host folder mounted at /out, then waits until the test has read its bundle's config.json:

- granted as the device plugin grants, by its `volume-mounts` strategy (a `/dev/null` mount at
  /var/run/nvidia-container-devices/0, with `accept-volume-mounts = true`) for GPU 0, or its
  `cdi-annotations` strategy (`cdi.k8s.io/...`, which the handler's container_annotations pass
  through) for GPU 1: exactly that GPU's nodes and the control nodes, ENXIO on opening the GPU
  node (allowed in the device cgroup, no driver behind it), the driver libraries in the
  container, `ldconfig -p` listing libcuda.so.1;
- NVIDIA_VISIBLE_DEVICES=all in the container's env without a grant (what an image's ENV, or
  the plugin's `envvar` strategy, puts there), unprivileged: nothing, and one line in the
  shim's log, since containerd's own CRI annotations mark the container a Kubernetes one
  (`accept-envvar-unprivileged = "auto"`, the default);
- config.json as runc read it carries the spec's device nodes and driver mounts (and the
  libcuda.so.1 link the shim mounts in the root), none of which are in the spec containerd
  itself stored for the container;
- the same request on the default `runc` handler gets nothing: the GPU comes from the handler;
- with gpuctk-runtime as packaging installs it (the launchers' sh front and the compiled
  create) on the default install's folder spec, a CUDA image's second create of a request
  (by CDI annotation or volume-mounts) is the compiled create's: containerd writes
  NVIDIA_REQUIRE_CUDA's `>` as `\\u003e`, which it reads as JSON spells it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fixtures.containerd import SYSTEMD_SANDBOX, PrivateContainerd, can_run_daemon, private_config
from fixtures.cri import EXITED, Cri, have_grpc, oci_archive
from fixtures.gpucheck import LIBDIR, SCRIPT, Node, check_nodes, generate, seen
from fixtures.images import ImageError, build_image

from gpuctk.cdi.specs.speccache import SETTLE_NS

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not can_run_daemon(), reason="needs root, containerd, ctr and unshare"),
    pytest.mark.skipif(not have_grpc(), reason="needs grpcio (the CRI client)"),
]

BIN = Path(sys.executable).parent
SHIM = BIN / "gpuctk-runtime"
HANDLER = "nvidia"
DEFAULT = ""  # what the kubelet sends for a pod without a RuntimeClass: default_runtime_name
IMAGE = "registry.example.com/pause:3.9"  # SYSTEMD_SANDBOX's sandbox image: pod and container
CGROUP_PARENT = "/gpuctk-cri-shim"
CRI_NAMESPACE = "k8s.io"
ANNOTATION = "cdi.k8s.io/gpuctk-test_probe"  # a key like the device plugin's
DEVICE_MOUNTS = "/var/run/nvidia-container-devices"  # the plugin's volume-mounts strategy
# the container reports, then waits (at most 60 s) for the test to have read its bundle
COMMAND = (
    f"( {SCRIPT} ) > /out/result 2>&1; "
    "i=0; while [ ! -e /out/go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done"
)
DRIVER_FILES = (  # spec mounts a utility,compute container (the default) must get
    f"{LIBDIR}/libcuda.so.535.309.01",
    f"{LIBDIR}/libnvidia-ml.so.535.309.01",
    "/usr/bin/nvidia-smi",
    "/lib/firmware/nvidia/535.309.01/gsp_ga10x.bin",
)


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
def node(tmp_path_factory: pytest.TempPathFactory, driver_root: Path) -> Node:
    base = tmp_path_factory.mktemp("cri-shim-node")
    return generate(base, driver_root, "h100-8", base / "cdi" / "nvidia.json")


@dataclass(frozen=True)
class Daemon:
    """The private containerd and its CRI client."""

    containerd: PrivateContainerd
    cri: Cri


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, node: Node) -> Iterator[Daemon]:
    if not SHIM.exists():
        pytest.skip("gpuctk-runtime console script not installed in the venv")
    yield from private_daemon(tmp_path_factory.mktemp("cri-shim"), node, SHIM)


@pytest.fixture(scope="module")
def packaged(
    tmp_path_factory: pytest.TempPathFactory, driver_root: Path
) -> Iterator[tuple[Daemon, Path]]:
    """The daemon with gpuctk-runtime as packaging installs it (the launchers' sh front, the
    compiled create beside it: gpuctk.install.launchers) on the default install's spec (the
    folder spec, its entry the compiled gpuctk-cdi-hook); and gpuctk's state folder."""
    from gpuctk.install import launchers

    bindir = tmp_path_factory.mktemp("launchers")
    launchers.write_launchers(str(bindir), sys.executable)
    if not (bindir / launchers.FRONT).is_file():
        pytest.skip("no compiled gpuctk-cdi-hook in this venv (tests/run.sh builds it)")
    base = tmp_path_factory.mktemp("cri-packaged")
    staged = ("--library-mode", "auto", "--staging-dir", str(base / "staging"))
    node = generate(base, driver_root, "h100-8", base / "cdi" / "nvidia.json", bindir, staged)
    for daemon in private_daemon(base, node, bindir / "gpuctk-runtime", base / "state"):
        yield daemon, base / "state"


def private_daemon(
    base: Path, node: Node, runtime: Path, state: Path | None = None
) -> Iterator[Daemon]:
    """A private containerd in `base` whose handler HANDLER runs `runtime` on `node`'s spec
    (with gpuctk's state folder `state`, where given), the test image imported."""
    try:
        image = build_image("debian")
    except ImageError as exc:
        if os.environ.get("GPUCTK_REQUIRE_IMAGES") == "1":
            pytest.fail(f"cannot build test images: {exc}")
        pytest.skip(f"cannot build test images: {exc}")
    etc = base / "etc"
    etc.mkdir()
    # cgroupfs, and restrict_oom_score_adj: CRI gives sandboxes oom_score_adj -998, which root
    # without CAP_SYS_RESOURCE (as here) may not set; the option clamps it to containerd's own.
    main = SYSTEMD_SANDBOX.replace("SystemdCgroup = true", "SystemdCgroup = false")
    main = main.replace("max_container_log_line_size", "restrict_oom_score_adj = true\n  $&")
    (etc / "config.toml").write_text(main.replace("$&", "max_container_log_line_size"))
    configure = [
        str(BIN / "gpuctk"), "runtime", "configure", "--runtime", "containerd",
        "--config", str(etc / "config.toml"), "--drop-in", str(etc / "conf.d" / "99-gpuctk.toml"),
        "--mode", "shim", "--runtime-path", str(runtime), "--runtime-name", HANDLER,
    ]  # fmt: skip
    done = subprocess.run(configure, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    (base / "gpuctk.toml").write_text(
        f'runtimes = ["{shutil.which("runc")}"]\nspec-dirs = ["{node.spec_dir}"]\n'
        f'log-file = "{base}/gpuctk.log"\naccept-volume-mounts = true\n'
    )
    archive = oci_archive(image, base / "image.tar", IMAGE, ["/bin/sleep", "100000"])
    env = {"GPUCTK_CONFIG": str(base / "gpuctk.toml")}
    if state is not None:
        env["GPUCTK_STATE_DIR"] = str(state)
    containerd = PrivateContainerd(base, private_config(base, etc / "config.toml"), env=env)
    containerd.start()
    cri = None
    try:
        containerd.ctr("--namespace", CRI_NAMESPACE, "images", "import", str(archive))
        cri = Cri(containerd.address)
        yield Daemon(containerd, cri)
    finally:
        if cri is not None:
            cri.close()
        containerd.stop()  # its mount namespace, with the snapshots' mounts, goes with it
        remove_cgroups(CGROUP_PARENT)


@dataclass(frozen=True)
class Run:
    code: int
    output: str  # what the container wrote, and CRI's reason and message
    config: dict[str, Any]  # the bundle's config.json, as runc read it
    stored: dict[str, Any]  # the spec containerd stored for the container (CRI's own)


def run_pod(
    daemon: Daemon,
    handler: str,
    env: dict[str, str],
    annotations: dict[str, str] | None = None,
    mounts: dict[str, str] | None = None,
) -> Run:
    """One pod with one container on `handler`: what it saw, and its spec before and after."""
    cri, containerd = daemon.cri, daemon.containerd
    name = f"gpu-{uuid.uuid4().hex[:8]}"
    out = containerd.base / f"out-{name}"
    out.mkdir()
    config = cri.sandbox_config(name, CGROUP_PARENT)
    pod = cri.run_pod(config, handler)
    try:
        command = ["/bin/sh", "-c", COMMAND]
        container = cri.create(
            pod,
            config,
            "probe",
            IMAGE,
            command,
            env,
            {"/out": str(out), **(mounts or {})},
            annotations,
        )
        cri.start(container)
        # the task runs (waiting for /out/go) until the test lets it go: its bundle is there
        bundle = containerd.base / "state/io.containerd.runtime.v2.task" / CRI_NAMESPACE / container
        oci = json.loads((bundle / "config.json").read_text())
        info = containerd.ctr("--namespace", CRI_NAMESPACE, "containers", "info", container)
        (out / "go").touch()
        deadline = time.monotonic() + 60
        while True:
            state, code, text = cri.status(container)
            if state == EXITED:
                break
            assert time.monotonic() < deadline, "the container did not exit"
            time.sleep(0.1)
        result = out / "result"
        output = (result.read_text() if result.exists() else "") + text
        return Run(code, output, oci, json.loads(info.stdout)["Spec"])
    finally:
        cri.stop_pod(pod)
        cri.remove_pod(pod)


def completed(run: Run) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess([], run.code, run.output, "")


def gpu_nodes(spec: dict[str, Any]) -> set[str]:
    devices = spec.get("linux", {}).get("devices") or []
    return {d["path"] for d in devices if d["path"].startswith(("/dev/nvidia", "/dev/dri/"))}


def check_spec(run: Run, node: Node, device: str) -> None:
    """config.json carries `device`'s nodes and the driver files; the spec CRI stored, none."""
    assert gpu_nodes(run.config) == node.nodes(device)
    mounts = {m["destination"]: m["source"] for m in run.config.get("mounts", [])}
    spec = {m["containerPath"]: m["hostPath"] for m in node.spec["containerEdits"]["mounts"]}
    for path in DRIVER_FILES:
        assert mounts.get(path) == spec[path], path
    # the SONAME link, made by the shim in the root as a bind mount of the driver file
    assert mounts.get(f"{LIBDIR}/libcuda.so.1") == spec[f"{LIBDIR}/libcuda.so.535.309.01"]
    assert gpu_nodes(run.stored) == set()
    assert not set(DRIVER_FILES) & {m["destination"] for m in run.stored.get("mounts", [])}


def test_device_plugin_mounts_get_their_gpu(daemon: Daemon, node: Node) -> None:
    """The device plugin's volume-mounts strategy, as the kubelet passes its allocation."""
    env = {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}  # the plugin's too
    run = run_pod(daemon, HANDLER, env, mounts={f"{DEVICE_MOUNTS}/0": "/dev/null"})
    done = completed(run)
    check_nodes(done, node.nodes("0"))
    found = seen(done.stdout, "NODE")
    assert "/dev/nvidia0" in found and "/dev/nvidiactl" in found
    assert not {f"/dev/nvidia{i}" for i in range(1, 8)} & found
    assert "libcuda.so.535.309.01" in seen(done.stdout, "LIB")
    assert "LDCACHE libcuda.so.1" in done.stdout.splitlines()
    check_spec(run, node, "0")


def test_env_without_a_grant_gets_nothing(daemon: Daemon) -> None:
    """An unprivileged pod that the device plugin gave nothing, whose env says
    NVIDIA_VISIBLE_DEVICES=all: containerd's CRI annotations mark it, and the shim injects
    nothing, with one line saying why and what to set."""
    run = run_pod(daemon, HANDLER, {"NVIDIA_VISIBLE_DEVICES": "all"})
    annotations = run.config.get("annotations", {})
    assert annotations.get("io.kubernetes.cri.container-type") == "container"
    assert annotations.get("io.kubernetes.cri.sandbox-id")
    assert run.code == 0, run.output
    assert seen(run.output, "NODE") == set() and seen(run.output, "LIB") == set()
    assert "LDCACHE libcuda.so.1" not in run.output
    mounts = {m["destination"] for m in run.config.get("mounts", [])}
    assert gpu_nodes(run.config) == set() and not set(DRIVER_FILES) & mounts
    log = (daemon.containerd.base / "gpuctk.log").read_text()
    assert "ignoring NVIDIA_VISIBLE_DEVICES=all in an unprivileged Kubernetes container" in log


def test_cdi_annotation_gets_its_gpu(daemon: Daemon, node: Node) -> None:
    run = run_pod(daemon, HANDLER, {}, {ANNOTATION: "nvidia.com/gpu=1"})
    assert run.stored.get("annotations", {}).get(ANNOTATION) == "nvidia.com/gpu=1"
    done = completed(run)
    check_nodes(done, node.nodes("1"))
    found = seen(done.stdout, "NODE")
    assert "/dev/nvidia1" in found and "/dev/nvidia0" not in found
    assert "libcuda.so.535.309.01" in seen(done.stdout, "LIB")
    assert "LDCACHE libcuda.so.1" in done.stdout.splitlines()
    check_spec(run, node, "1")


def test_default_handler_gets_nothing(daemon: Daemon) -> None:
    """The same request on the default `runc` handler: plain runc, no GPU, no driver."""
    run = run_pod(daemon, DEFAULT, {"NVIDIA_VISIBLE_DEVICES": "0"})
    assert run.code == 0, run.output
    assert seen(run.output, "NODE") == set()
    assert seen(run.output, "LIB") == set()
    assert "LDCACHE libcuda.so.1" not in run.output
    mounts = {m["destination"] for m in run.config.get("mounts", [])}
    assert gpu_nodes(run.config) == set() and not set(DRIVER_FILES) & mounts


def test_no_request_gets_nothing(daemon: Daemon) -> None:
    run = run_pod(daemon, HANDLER, {})
    assert run.code == 0, run.output
    assert seen(run.output, "NODE") == set() and "LDCACHE libcuda.so.1" not in run.output
    assert gpu_nodes(run.config) == set()


def test_handler_runs_the_shim(daemon: Daemon) -> None:
    """The handler's BinaryName is gpuctk-runtime, with no base spec; runc's is untouched."""
    drop_in = daemon.containerd.base / "etc" / "conf.d" / "99-gpuctk.toml"
    plugins = tomllib.loads(drop_in.read_text())["plugins"]
    runtimes = plugins["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    assert runtimes[HANDLER]["options"]["BinaryName"] == str(SHIM)
    assert runtimes[HANDLER].get("base_runtime_spec", "") == ""
    assert runtimes["runc"]["options"].get("BinaryName", "") == ""


@pytest.mark.parametrize("form", ["CDI annotation", "volume-mounts"])
def test_a_cuda_images_second_create_is_the_compiled_creates(
    packaged: tuple[Daemon, Path], form: str
) -> None:
    """Through containerd's CRI as the deb installs gpuctk-runtime, a CUDA image (containerd
    writes its NVIDIA_REQUIRE_CUDA as `cuda\\u003e=12.0`: Go's JSON; and a value in another
    script as its UTF-8 bytes) granted GPU 1 as the device plugin grants it (its
    cdi-annotations strategy, or volume-mounts: a `/dev/null` mount the key holds by its
    destination and source): the first create is Python's, which writes the request's front
    plan; the second is the compiled create's, which reads it (and sets its mtime). Both
    containers see their GPU and the driver in `ldconfig -p`."""
    daemon, state = packaged
    time.sleep(SETTLE_NS / 1e9)  # the spec left alone, as on a node: plans are written after
    hello = "gr\u00fc\u00dfe \u65e5\u672c"
    env = {"NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "HELLO": hello}
    request: tuple[dict[str, str], dict[str, str] | None, dict[str, str] | None] = (
        (env, {ANNOTATION: "nvidia.com/gpu=1"}, None)
        if form == "CDI annotation"
        else ({**env, "NVIDIA_VISIBLE_DEVICES": DEVICE_MOUNTS}, None,
              {f"{DEVICE_MOUNTS}/1": "/dev/null"})
    )  # fmt: skip
    front = state / "front"
    before = set(front.glob("*.json"))
    runs = [run_pod(daemon, HANDLER, *request)]
    plans = {p: p.stat().st_mtime_ns for p in set(front.glob("*.json")) - before}
    assert len(plans) == 1, sorted(front.iterdir()) if front.is_dir() else "no front folder"
    time.sleep(0.05)
    runs.append(run_pod(daemon, HANDLER, *request))
    [(plan, written)] = plans.items()
    assert plan.stat().st_mtime_ns > written  # the compiled create read it
    for run in runs:
        done = completed(run)
        found = seen(done.stdout, "NODE")
        assert "/dev/nvidia1" in found and "/dev/nvidia0" not in found, done.stdout
        assert "LDCACHE libcuda.so.1" in done.stdout.splitlines(), done.stdout
        assert f"HELLO={hello}" in run.config["process"]["env"]
