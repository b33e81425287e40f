"""`gpuctk doctor --pod NAMESPACE/NAME` on a fake kubelet folder: the checkpoint as the kubelet
writes it (fixtures.kubelet), the pod resources API served by a real gRPC server on the
kubelet's socket (fixtures.podresources), the specs `gpuctk cdi generate --simulate h100-8`'s
and the allocations gpuctk's plugin code answers (cdi-cri).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.doctornode import listen
from fixtures.kubelet import PodDevices, remove, short_folder, write_checkpoint
from fixtures.podresources import PodResources, container, pod

from gpuctk.cdi.node.profile import load_profile
from gpuctk.deviceplugin import wire
from gpuctk.deviceplugin.allocate import container_allocation
from gpuctk.deviceplugin.resources import build_units
from gpuctk.doctor import podresources
from gpuctk.doctor.cli import run_pod_checks
from gpuctk.doctor.context import Context

pytest.importorskip("grpc")

GPUCTK = Path(sys.executable).parent / "gpuctk"
GPU = "nvidia.com/gpu"
UNITS = {u.id: u for u in build_units(load_profile("h100-8"))[GPU]}
IDS = list(UNITS)


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for naming in ("uuid", "index"):
        folder = tmp_path_factory.mktemp(f"cdi-{naming}")
        done = subprocess.run(
            [str(GPUCTK), "cdi", "generate", "--simulate", "h100-8",
             "--device-name-strategy", naming, "--output", str(folder / "nvidia.yaml")],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        out[naming] = folder
    return out


@pytest.fixture
def root() -> Iterator[Path]:
    """A kubelet root with a listening plugin socket (a unix socket path is short)."""
    folder = short_folder()
    sock = listen(folder / "device-plugins" / "gpuctk-nvidia.com-gpu.sock")
    yield folder
    sock.close()
    remove(folder)


def allocated(root: Path, uid: str, ids: list[str], name: str = "cuda") -> PodDevices:
    (root / "pods" / uid).mkdir(parents=True, exist_ok=True)
    answer = container_allocation(UNITS, ids, ("cdi-cri",))
    raw = wire.decode(wire.allocate_response([answer]))[1][0]
    return PodDevices(uid, name, GPU, ids, raw)


def doctor(root: Path, spec: Path, target: str) -> tuple[int, dict[str, dict[str, object]]]:
    done = subprocess.run(
        [str(GPUCTK), "doctor", "--pod", target, "--format", "json", "--kubelet-root", str(root),
         "--spec-dir", str(spec), "--host-root", str(root / "host")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    body = json.loads(done.stdout)
    assert body["exitCode"] == done.returncode
    return done.returncode, {c["id"]: c for c in body["checks"]}


def text(check: dict[str, object]) -> str:
    evidence = check["evidence"]
    assert isinstance(evidence, list)
    return "\n".join(evidence)


def serve(root: Path, *pods: bytes) -> PodResources:
    return PodResources(root / "pod-resources" / "kubelet.sock", pods)


def test_the_decoder_reads_the_api_field_numbers() -> None:
    """Hand-written bytes: pod "p" in "ns", container "c" with nvidia.com/gpu "G" and a
    claim's CDI device "k=v"."""
    devices = b"\x0a\x0envidia.com/gpu" + b"\x12\x01G"
    cdi = b"\x22\x07" + b"\x0a\x05" + b"\x0a\x03k=v"  # claim_resources{cdi_devices{name}}
    c = b"\x0a\x01c" + b"\x12" + bytes([len(devices)]) + devices + b"\x2a\x09" + cdi
    p = b"\x0a\x01p" + b"\x12\x02ns" + b"\x1a" + bytes([len(c)]) + c
    (got,) = podresources.decode_list_response(b"\x0a" + bytes([len(p)]) + p)
    want = podresources.Container("c", (podresources.Devices(GPU, ("G",)),), ("k=v",))
    assert got == podresources.Pod("ns", "p", (want,))


def test_a_pod_with_two_gpus_that_resolve(root: Path, specs: dict[str, Path]) -> None:
    write_checkpoint(root / "device-plugins", {GPU: IDS}, [allocated(root, "uid-a", IDS[:2])])
    train = pod("default", "train", container("cuda", {GPU: IDS[:2]}), container("sidecar"))
    with serve(root, pod("kube-system", "dns", container("dns")), train):
        code, checks = doctor(root, specs["uuid"], "default/train")
    assert code == 0, checks
    assert "UID uid-a (kubelet checkpoint), pod folder present" in text(checks["kubernetes.pod"])
    devices = checks["kubernetes.pod-devices"]
    assert devices["status"] == "ok"
    names = ", ".join(f"{GPU}={i}" for i in IDS[:2])
    assert f"container cuda: {GPU} {', '.join(IDS[:2])} -> {names}" in text(devices)
    assert "kubernetes.pod-capacity" not in checks  # it has its GPUs


def test_a_device_no_spec_names_fails_with_the_fix(root: Path, specs: dict[str, Path]) -> None:
    write_checkpoint(root / "device-plugins", {GPU: IDS}, [allocated(root, "uid-b", IDS[2:3])])
    with serve(root, pod("ml", "job", container("cuda", {GPU: IDS[2:3]}))):
        code, checks = doctor(root, specs["index"], "ml/job")  # names "0".."7": no UUIDs
    assert code == 2
    devices = checks["kubernetes.pod-devices"]
    assert devices["status"] == "failed"
    assert f"{GPU}={IDS[2]} in no CDI spec: it cannot start" in text(devices)
    assert "the specs name no device by UUID" in text(devices)
    assert devices["fix"] == "gpuctk cdi generate --output /var/run/cdi/nvidia.yaml"


def test_an_unknown_pod_with_gpus_free(root: Path, specs: dict[str, Path]) -> None:
    write_checkpoint(root / "device-plugins", {GPU: IDS}, [allocated(root, "uid-c", IDS[:1])])
    with serve(root, pod("default", "other", container("cuda", {GPU: IDS[:1]}))):
        code, checks = doctor(root, specs["uuid"], "default/missing")
    assert code == 1
    known = checks["kubernetes.pod"]
    assert known["status"] == "warning"
    assert "default/missing: not among the 1 pods the kubelet runs" in text(known)
    assert known["fix"].startswith("kubectl describe pod -n default missing")
    capacity = checks["kubernetes.pod-capacity"]
    assert capacity["status"] == "ok"
    assert f"{GPU}: 8 registered, 1 allocated to 1 pod(s), 7 free" in text(capacity)


def test_pending_because_every_gpu_is_allocated(root: Path, specs: dict[str, Path]) -> None:
    holders = [allocated(root, f"uid-{n}", IDS[n * 4 : n * 4 + 4]) for n in range(2)]
    holders.append(PodDevices("uid-gone", "cuda", GPU, IDS[:1]))  # a pod no longer here
    write_checkpoint(root / "device-plugins", {GPU: IDS}, holders)
    running = [pod("ml", f"big-{n}", container("cuda", {GPU: IDS[n * 4 : n * 4 + 4]}))
               for n in range(2)]  # fmt: skip
    with serve(root, *running):
        code, checks = doctor(root, specs["uuid"], "ml/waiting")
    assert code == 1
    capacity = checks["kubernetes.pod-capacity"]
    assert capacity["status"] == "warning"
    assert f"{GPU}: 8 registered, 8 allocated to 2 pod(s), 0 free" in text(capacity)
    assert f"every {GPU} is allocated: a pod that requests one stays Pending" in text(capacity)


def test_no_pod_resources_socket_falls_back_to_the_checkpoint(
    root: Path, specs: dict[str, Path]
) -> None:
    write_checkpoint(root / "device-plugins", {GPU: IDS}, [allocated(root, "uid-d", IDS[:2])])
    code, checks = doctor(root, specs["uuid"], "default/train")
    known = checks["kubernetes.pod"]
    assert known["status"] == "warning" and code == 1
    assert "pod-resources API not read" in text(known)
    assert "pods with devices here, by UID: uid-d" in text(known)
    assert "kubectl get pod -n default train -o jsonpath" in str(known["fix"])
    code, checks = doctor(root, specs["uuid"], "uid-d")  # what the fix runs
    assert code == 0, checks
    assert checks["kubernetes.pod-devices"]["status"] == "ok"


def test_without_grpcio_the_api_is_not_read(
    root: Path, specs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_checkpoint(root / "device-plugins", {GPU: IDS}, [allocated(root, "uid-e", IDS[:1])])
    monkeypatch.setitem(sys.modules, "grpc", None)  # `import grpc` raises ImportError
    (root / "pod-resources").mkdir()
    (root / "pod-resources" / "kubelet.sock").touch()
    ctx = Context(kubelet_root=str(root), spec_dirs=(str(specs["uuid"]),),
                  host_root=str(root / "host"))  # fmt: skip
    results = {r.id: r for r in run_pod_checks(ctx, "default/train")}
    assert "grpcio is not installed" in "\n".join(results["kubernetes.pod"].evidence)


def test_no_plugin_for_the_requested_name(root: Path, specs: dict[str, Path]) -> None:
    write_checkpoint(root / "device-plugins", {"nvidia.com/mig-1g.10gb": IDS[:2]})
    with serve(root):
        code, checks = doctor(root, specs["uuid"], "default/train")
    assert code == 2
    capacity = checks["kubernetes.pod-capacity"]
    assert f"{GPU}: registered by no device plugin" in text(capacity)
    assert "the node offers nvidia.com/mig-1g.10gb (2)" in text(capacity)


def test_a_pod_here_without_a_gpu_sees_none(root: Path, specs: dict[str, Path]) -> None:
    write_checkpoint(root / "device-plugins", {GPU: IDS})
    with serve(root, pod("default", "web", container("nginx"))):
        code, checks = doctor(root, specs["uuid"], "default/web")
    assert code == 1
    assert checks["kubernetes.pod"]["status"] == "ok"
    devices = checks["kubernetes.pod-devices"]
    assert "no container of the pod was given a nvidia.com/* device" in text(devices)
    assert "8 registered, 0 allocated to 0 pod(s), 8 free" in text(
        checks["kubernetes.pod-capacity"]
    )
