"""`gpuctk doctor`'s device-plugin checks on a fake kubelet folder with a real plugin in it.

The plugin is `gpuctk device-plugin --simulate h100-8`, registered with the test's kubelet
(fixtures.kubelet); the kubelet's checkpoint is written as the kubelet writes it, from what the
plugin registered and the bytes its Allocate answered; the specs are `gpuctk cdi generate`'s.
Then `kubernetes.device-plugin` (listening, registered) and `kubernetes.device-plugin-names`
(what was handed out resolves in the specs) judge it, through the CDI layer's own reading of
the specs (gpuctk.doctor.cdi) and, once, through the `gpuctk doctor` command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from fixtures.doctornode import listen
from fixtures.kubelet import (
    Kubelet,
    PluginClient,
    PodDevices,
    healthy,
    remove,
    short_folder,
    start_plugin,
    stop_plugin,
    write_checkpoint,
)

from gpuctk.cdi.node.profile import load_profile
from gpuctk.deviceplugin import wire
from gpuctk.deviceplugin.allocate import container_allocation
from gpuctk.deviceplugin.resources import build_units
from gpuctk.doctor import cdi, devplugin
from gpuctk.doctor.context import Context, Findings
from gpuctk.doctor.report import Result

pytest.importorskip("grpc")

GPUCTK = Path(sys.executable).parent / "gpuctk"
REPO = Path(__file__).resolve().parents[2]
GPU = "nvidia.com/gpu"
SOCKET = "gpuctk-nvidia.com-gpu.sock"


class Bed:
    def __init__(self, root: Path, client: PluginClient, ids: list[str]) -> None:
        self.root = root  # the kubelet root
        self.folder = root / "device-plugins"
        self.client = client
        self.ids = ids  # what the plugin advertised, in its order

    def pod(self, uid: str) -> str:
        (self.root / "pods" / uid).mkdir(parents=True, exist_ok=True)
        return uid


@pytest.fixture(scope="module")
def bed() -> Iterator[Bed]:
    root = short_folder()
    folder = root / "device-plugins"
    folder.mkdir()
    kubelet = Kubelet(folder)
    kubelet.start()
    proc = start_plugin(folder, dict(os.environ), "--simulate", "h100-8")
    try:
        endpoint = kubelet.next_registration()[1]
        client = kubelet.plugin(endpoint)
        watch = client.watch()
        devices = watch.wait_for(lambda d: len(healthy(d)) == 8)
        watch.cancel()
        yield Bed(root, client, [d.id for d in devices])
        client.close()
    finally:
        stop_plugin(proc)
        kubelet.stop()
        remove(root)


def spec_dir(tmp_path: Path, *flags: str) -> Path:
    out = tmp_path / "cdi"
    done = subprocess.run(
        [str(GPUCTK), "cdi", "generate", "--simulate", "h100-8", *flags,
         "--output", str(out / "nvidia.yaml")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out


def checks(root: Path, specs: Path, host: Path | None = None) -> dict[str, Result]:
    """The CDI layer, then the device-plugin checks, as `gpuctk doctor` runs them."""
    ctx = Context(kubelet_root=str(root), spec_dirs=(str(specs),), host_root=str(host or "/"))
    found = Findings(spec_dirs=ctx.spec_dirs)
    cdi.cdi_checks(ctx, found)
    return {r.id: r for r in devplugin.plugin_checks(ctx, found)}


def text(result: Result) -> str:
    return "\n".join(result.evidence)


def allocated(bed: Bed, uid: str, ids: list[str]) -> PodDevices:
    (answer,) = bed.client.allocate_raw(ids)
    return PodDevices(bed.pod(uid), "cuda", GPU, ids, answer)


def test_registered_and_its_names_resolve(bed: Bed, tmp_path: Path) -> None:
    specs = spec_dir(tmp_path)
    before = checks(bed.root, specs)  # the kubelet has written no checkpoint yet
    assert before["kubernetes.device-plugin"].status == "ok"
    assert "no kubelet checkpoint" in text(before["kubernetes.device-plugin-names"])
    pod = allocated(bed, "pod-a", bed.ids[:2])
    write_checkpoint(bed.folder, {GPU: bed.ids}, [pod])
    found = checks(bed.root, specs)
    plugin = found["kubernetes.device-plugin"]
    assert plugin.status == "ok", plugin
    assert f"{SOCKET}: gpuctk's plugin, listening, registered: {GPU} (8 devices)" in text(plugin)
    names = found["kubernetes.device-plugin-names"]
    assert names.status == "ok", names
    assert names.evidence[0].startswith("1 container(s) with GPUs checked")


def test_a_spec_without_uuid_names_fails_the_pod_given_them(bed: Bed, tmp_path: Path) -> None:
    specs = spec_dir(tmp_path, "--device-name-strategy", "index")  # "0".."7": no UUIDs
    write_checkpoint(bed.folder, {GPU: bed.ids}, [allocated(bed, "pod-b", bed.ids[2:4])])
    names = checks(bed.root, specs)["kubernetes.device-plugin-names"]
    assert names.status == "failed"
    problem = f"pod pod-b container cuda ({GPU}): {GPU}={bed.ids[2]}, {GPU}={bed.ids[3]}"
    assert f"{problem} in no CDI spec" in names.evidence
    assert "the specs name no device by UUID" in text(names)
    assert names.fix == "gpuctk cdi generate --output /var/run/cdi/nvidia.yaml"


def test_a_gone_pod_is_not_counted_an_unnamed_advertised_device_warns(
    bed: Bed, tmp_path: Path
) -> None:
    specs = spec_dir(tmp_path, "--device-name-strategy", "index")
    (bed.root / "pods").mkdir(exist_ok=True)
    gone = PodDevices("pod-gone", "cuda", GPU, bed.ids[:1], bed.client.allocate_raw(bed.ids[:1])[0])
    write_checkpoint(bed.folder, {GPU: bed.ids}, [gone])
    names = checks(bed.root, specs)["kubernetes.device-plugin-names"]
    assert names.status == "warning", names
    assert f"gpuctk's plugin advertises {GPU} {bed.ids[0]}," in text(names)
    assert f"{bed.ids[2]}, ... (8 of 8): {GPU}=<ID> is in no CDI spec" in text(names)
    assert "1 checkpoint entr(ies) of pods no longer on the node" in text(names)


@pytest.mark.parametrize(
    ("strategy", "id_strategy", "naming", "status"),
    [
        ("envvar", "uuid", "uuid", "ok"),
        ("envvar", "uuid", "index", "failed"),
        ("envvar", "index", "index", "ok"),  # NVIDIA_VISIBLE_DEVICES=0,1: the shim's index names
        ("volume-mounts", "uuid", "uuid", "ok"),
        ("volume-mounts", "uuid", "index", "failed"),
        ("cdi-annotations", "uuid", "index", "failed"),
    ],
)
def test_each_way_of_handing_over_as_the_shim_reads_it(
    tmp_path: Path, strategy: str, id_strategy: str, naming: str, status: str
) -> None:
    """The answers of the plugin's other --device-list-strategy values (its allocate code),
    resolved as gpuctk-runtime resolves them; no plugin socket: only the allocation counts."""
    units = {u.id: u for u in build_units(load_profile("h100-8"), id_strategy=id_strategy)[GPU]}
    ids = list(units)[:2]
    answer = container_allocation(units, ids, (strategy,))
    raw = wire.decode(wire.allocate_response([answer]))[1][0]
    root = tmp_path / "kubelet"
    (root / "device-plugins").mkdir(parents=True)
    (root / "pods" / "p").mkdir(parents=True)
    write_checkpoint(root / "device-plugins", {}, [PodDevices("p", "c", GPU, ids, raw)])
    names = checks(root, spec_dir(tmp_path, "--device-name-strategy", naming))
    assert names["kubernetes.device-plugin-names"].status == status, names
    if status == "failed":
        assert f"{GPU}={units[ids[0]].uuid}" in text(names["kubernetes.device-plugin-names"])


def test_a_socket_nobody_listens_on_is_a_plugin_that_is_gone(tmp_path: Path) -> None:
    root = tmp_path / "kubelet"
    listen(root / "device-plugins" / SOCKET).close()  # its file stays, as after a crash
    found = checks(root, spec_dir(tmp_path))
    plugin = found["kubernetes.device-plugin"]
    assert plugin.status == "warning"
    assert f"{SOCKET}: gpuctk's plugin, nobody listens" in text(plugin)
    assert plugin.fix == devplugin.RESTART_DS
    (ds,) = yaml.safe_load_all((REPO / "packaging/kubernetes/device-plugin/daemonset.yaml").open())
    meta = ds["metadata"]  # the fix restarts the DaemonSet the repository ships
    assert plugin.fix == f"kubectl -n {meta['namespace']} rollout restart daemonset/{meta['name']}"
    unit = tmp_path / "host/usr/lib/systemd/system/gpuctk-device-plugin.service"
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\n")
    plugin = checks(root, spec_dir(tmp_path), host=tmp_path / "host")["kubernetes.device-plugin"]
    assert plugin.fix == "systemctl restart gpuctk-device-plugin"


def test_listening_but_not_registered_and_no_plugin_at_all(tmp_path: Path) -> None:
    root = tmp_path / "kubelet"
    folder = root / "device-plugins"
    sock = listen(folder / "nvidia-gpu.sock")  # NVIDIA's plugin's name for nvidia.com/gpu
    try:
        write_checkpoint(folder, {"example.com/fpga": ["f0"]})
        plugin = checks(root, spec_dir(tmp_path))["kubernetes.device-plugin"]
        assert plugin.status == "warning"
        assert "NVIDIA's plugin, listening, its resource not registered" in text(plugin)
        assert plugin.fix and "why the kubelet refused it" in plugin.fix
        write_checkpoint(folder, {GPU: ["GPU-1"]})
        plugin = checks(root, spec_dir(tmp_path))["kubernetes.device-plugin"]
        assert plugin.status == "ok" and f"registered: {GPU} (1 devices)" in text(plugin)
    finally:
        sock.close()
    (folder / "nvidia-gpu.sock").unlink()
    (folder / "kubelet_internal_checkpoint").unlink()
    unit = tmp_path / "host/lib/systemd/system/gpuctk-device-plugin.service"
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\n")
    plugin = checks(root, spec_dir(tmp_path), host=tmp_path / "host")["kubernetes.device-plugin"]
    assert plugin.status == "warning" and "Insufficient nvidia.com/gpu" in text(plugin)
    assert plugin.fix and plugin.fix.startswith("systemctl enable --now gpuctk-device-plugin")


def test_through_the_doctor_command(bed: Bed, tmp_path: Path) -> None:
    specs = spec_dir(tmp_path, "--device-name-strategy", "index")
    write_checkpoint(bed.folder, {GPU: bed.ids}, [allocated(bed, "pod-c", bed.ids[:1])])
    done = subprocess.run(
        [str(GPUCTK), "doctor", "--format", "json", "--simulate", "h100-8",
         "--kubelet-root", str(bed.root), "--spec-dir", str(specs),
         "--host-root", str(tmp_path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    report = json.loads(done.stdout)
    by_id = {c["id"]: c for c in report["checks"]}
    assert by_id["kubernetes.device-plugin"]["status"] == "ok"
    names = by_id["kubernetes.device-plugin-names"]
    assert names["status"] == "failed" and names["layer"] == "kubernetes"
    assert names["fix"].startswith("gpuctk cdi generate --simulate h100-8")
    assert done.returncode == 2
