"""End to end: the devices `gpuctk device-plugin` allocates reach a containerd 2.1 container
through the CRI's CDI field, and the container sees exactly those GPUs.

The test is the kubelet twice over: it plays the kubelet's device manager against the plugin
(a real process on the fake libnvidia-ml.so.1 serving h100-8: Register, GetPreferredAllocation,
Allocate), then hands the CDI device names Allocate returned to containerd 2.1's CRI in
ContainerConfig's CDI_devices field, as the kubelet does (1.28+). containerd applies gpuctk's
own spec (`gpuctk cdi generate --simulate h100-8` over mknod'ed nodes of the profile, written
to its CDI folder): the container lists the /dev/nvidia<N> nodes it got.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures import sidengines
from fixtures.fake_nvml import FakeNvmlEnv
from fixtures.images import ImageError, build_image
from fixtures.kubelet import Kubelet, PluginClient, remove, short_folder, start_plugin, stop_plugin
from fixtures.podman import generate_spec

from gpuctk.cdi.node.profile import load_profile

pytestmark = pytest.mark.integration
pytest.importorskip("grpc")

IMAGE = "gpuctk.test/dp-debian:1"
LIST_GPUS = [
    "/bin/sh",
    "-c",
    "cd /dev && for n in nvidia[0-9]*; do [ -c $n ] && echo GPU $n; done; true",
]
UUIDS = [g.uuid for g in load_profile("h100-8").gpus]


@pytest.fixture(scope="module")
def containerd(
    tmp_path_factory: pytest.TempPathFactory, driver_root: Path
) -> Iterator[sidengines.Containerd2]:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    sidengines.require("containerd2")
    try:
        rootfs = build_image("debian")
    except ImageError as exc:
        if os.environ.get("GPUCTK_REQUIRE_IMAGES") == "1":
            pytest.fail(f"cannot build test images: {exc}")
        pytest.skip(f"cannot build test images: {exc}")
    work = tmp_path_factory.mktemp("dp-e2e")
    generate_spec(work, driver_root, "h100-8", "mounts")  # work/mounts/cdi/nvidia.json
    with sidengines.Containerd2(work, work / "mounts" / "cdi") as engine:
        engine.import_image(rootfs, IMAGE)
        yield engine


@pytest.fixture
def plugin(fake_nvml_env: FakeNvmlEnv) -> Iterator[PluginClient]:
    folder = short_folder()
    kubelet = Kubelet(folder)
    kubelet.start()
    proc = start_plugin(folder, fake_nvml_env("h100-8"))
    try:
        client = kubelet.plugin(kubelet.next_registration()[1])
        yield client
        client.close()
    finally:
        stop_plugin(proc)
        kubelet.stop()
        remove(folder)


def gpus_seen(engine: sidengines.Containerd2, cdi_devices: tuple[str, ...]) -> list[str]:
    code, out = engine.run(sidengines.normalized(IMAGE), LIST_GPUS, cdi_devices=cdi_devices)
    assert code == 0, out + engine.tail()
    return sorted(line.split()[1] for line in out.splitlines() if line.startswith("GPU "))


def test_allocated_gpus_reach_a_containerd_2_container(
    containerd: sidengines.Containerd2, plugin: PluginClient
) -> None:
    pair = plugin.preferred(UUIDS, [], 2)
    assert pair == UUIDS[:2]  # NV18 and one NUMA node
    (answer,) = plugin.allocate(pair)
    assert gpus_seen(containerd, answer.cdi_devices) == ["nvidia0", "nvidia1"]
    other = plugin.preferred(UUIDS[4:], [UUIDS[6]], 2)  # another pod's, on NUMA node 1
    (answer,) = plugin.allocate(other)
    assert gpus_seen(containerd, answer.cdi_devices) == ["nvidia4", "nvidia6"]
    assert gpus_seen(containerd, ()) == []  # the control: no devices, no GPU
