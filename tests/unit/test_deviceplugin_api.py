"""`gpuctk device-plugin` driven through its gRPC API exactly as the kubelet drives it: the test
is the kubelet (a Registration server on a temporary kubelet.sock), the plugin a real process
reading the simulated machines through the fake libnvidia-ml.so.1 and the real pynvml.

Register, then ListAndWatch, GetDevicePluginOptions, GetPreferredAllocation, Allocate and
PreStartContainer on the socket it registered; the kubelet restarting (its sockets removed,
kubelet.sock made anew) makes the plugin register again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fixtures.fake_nvml import FakeNvmlEnv
from fixtures.kubelet import Kubelet, healthy, remove, short_folder, start_plugin, stop_plugin

from gpuctk.cdi.node.profile import load_profile

pytest.importorskip("grpc")

Started = tuple[Kubelet, Callable[[], str]]


@pytest.fixture
def folder() -> Iterator[Path]:
    path = short_folder()
    yield path
    remove(path)


@pytest.fixture
def plugin(folder: Path, fake_nvml_env: FakeNvmlEnv) -> Iterator[Callable[..., Started]]:
    """plugin(profile, *args): the kubelet started, then the plugin process."""
    started: list[tuple[Kubelet, object]] = []

    def start(profile: str, *args: str) -> Started:
        kubelet = Kubelet(folder)
        kubelet.start()
        proc = start_plugin(folder, fake_nvml_env(profile), "--health-interval", "0.2", *args)
        started.append((kubelet, proc))
        return kubelet, lambda: stop_plugin(proc)

    yield start
    for kubelet, proc in started:
        stop_plugin(proc)  # type: ignore[arg-type]
        kubelet.stop()


def test_registers_and_advertises_the_eight_gpus(plugin: Callable[..., Started]) -> None:
    kubelet, stop = plugin("h100-8")
    version, endpoint, resource, options = kubelet.next_registration()
    assert (version, endpoint, resource) == ("v1beta1", "gpuctk-nvidia.com-gpu.sock",
                                             "nvidia.com/gpu")  # fmt: skip
    assert options == (False, True)  # no PreStartContainer needed; preferred allocation on
    client = kubelet.plugin(endpoint)
    assert client.options() == (False, True)
    devices = client.watch().wait_for(lambda d: len(d) == 8)
    machine = load_profile("h100-8")
    assert [d.id for d in devices] == [g.uuid for g in machine.gpus]
    assert healthy(devices) == {g.uuid for g in machine.gpus}
    assert [d.numa_nodes for d in devices] == [(g.numa_node,) for g in machine.gpus]
    client.close()
    assert "registered nvidia.com/gpu" in stop()


def test_two_of_eight_by_nvlink_then_allocated_as_cdi_devices(
    plugin: Callable[..., Started],
) -> None:
    """h100-8: every pair is NV18 over the NVSwitch fabric, so the pair also shares a NUMA node;
    Allocate answers with the spec's UUID-named CDI devices, nothing else (cdi-cri)."""
    kubelet, _ = plugin("h100-8")
    client = kubelet.plugin(kubelet.next_registration()[1])
    uuids = [g.uuid for g in load_profile("h100-8").gpus]
    assert client.preferred(uuids, [], 2) == [uuids[0], uuids[1]]
    assert client.preferred(uuids, [uuids[5]], 2) == [uuids[5], uuids[4]]  # NUMA 1's
    (answer,) = client.allocate([uuids[0], uuids[1]])
    assert answer.cdi_devices == (f"nvidia.com/gpu={uuids[0]}", f"nvidia.com/gpu={uuids[1]}")
    assert (answer.envs, answer.mounts, answer.annotations) == ((), (), ())
    assert client.prestart([uuids[0], uuids[1]]) == b""
    client.close()


def test_bridged_pairs_are_preferred_over_pcie_neighbours(plugin: Callable[..., Started]) -> None:
    """h100nvl-8 (mixed links): only the bridged pairs 0-2, 1-3, 4-6, 5-7 are NVLink
    neighbours; the first two free GPUs would be a PCIe pair."""
    kubelet, _ = plugin("h100nvl-8")
    client = kubelet.plugin(kubelet.next_registration()[1])
    uuids = [g.uuid for g in load_profile("h100nvl-8").gpus]
    assert client.preferred(uuids, [], 2) == [uuids[0], uuids[2]]
    free = [uuids[i] for i in (1, 2, 3, 5, 6)]  # 0, 4 and 7 allocated: 1-3 is the only pair
    assert client.preferred(free, [], 2) == [uuids[1], uuids[3]]
    client.close()


def test_mig_profiles_are_resources_of_their_own(plugin: Callable[..., Started]) -> None:
    """--mig-strategy mixed on a100-mig: the whole GPU as nvidia.com/gpu, each MIG profile as
    nvidia.com/mig-<profile>, one registration (and socket) per resource."""
    kubelet, _ = plugin("a100-mig", "--mig-strategy", "mixed")
    machine = load_profile("a100-mig")
    expected = {"nvidia.com/gpu"} | {f"nvidia.com/mig-{m.profile}" for m in machine.mig_devices}
    got = {kubelet.next_registration()[2:3][0]: None for _ in expected}
    assert set(got) == expected
    client = kubelet.plugin("gpuctk-nvidia.com-mig-1g.5gb.sock")
    devices = client.watch().wait_for(lambda d: len(d) > 0)
    ones = [m for m in machine.mig_devices if m.profile == "1g.5gb"]
    assert [d.id for d in devices] == [m.uuid for m in ones]
    (answer,) = client.allocate([ones[0].uuid])
    assert answer.cdi_devices == (f"nvidia.com/gpu={ones[0].uuid}",)
    client.close()


def test_index_ids_and_the_shim_strategies(plugin: Callable[..., Started]) -> None:
    kubelet, _ = plugin("h100-8", "--device-id-strategy", "index",
                        "--device-list-strategy", "envvar,cdi-annotations")  # fmt: skip
    client = kubelet.plugin(kubelet.next_registration()[1])
    devices = client.watch().wait_for(lambda d: len(d) == 8)
    assert [d.id for d in devices] == [str(i) for i in range(8)]
    (answer,) = client.allocate(["6", "7"])
    uuids = [g.uuid for g in load_profile("h100-8").gpus]
    assert answer.envs == (("NVIDIA_VISIBLE_DEVICES", "6,7"),)
    ((key, value),) = answer.annotations
    assert key.startswith("cdi.k8s.io/") and len(key.split("/", 1)[1]) <= 63
    assert value == f"nvidia.com/gpu={uuids[6]},nvidia.com/gpu={uuids[7]}"
    assert answer.cdi_devices == ()
    client.close()


def test_registers_again_when_the_kubelet_restarts(plugin: Callable[..., Started]) -> None:
    kubelet, stop = plugin("l4")
    endpoint = kubelet.next_registration()[1]
    kubelet.restart()  # every socket removed, kubelet.sock made anew
    assert kubelet.next_registration()[1] == endpoint
    client = kubelet.plugin(endpoint)
    devices = client.watch().wait_for(lambda d: len(d) == 1)
    assert healthy(devices) == {load_profile("l4").gpus[0].uuid}
    client.close()
    assert "registering again" in stop()


def test_list_without_a_gpu_or_kubelet(tmp_path: Path) -> None:
    from gpuctk.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["device-plugin", "--simulate", "h100-8-mig7", "--mig-strategy", "none",
              "--plugin-dir", str(tmp_path)])  # fmt: skip
    assert exc.value.code == 6  # NoDevicesError: every GPU has MIG on
