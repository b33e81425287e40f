"""Health that recovers, through the API: the fake libnvidia-ml.so.1 raises an XID event on GPU 3
(its control file, FAKE_NVML_EVENTS) and the kubelet's ListAndWatch stream drops GPU 3 from the
healthy set; a later healthy reading (the GPU answers NVML again) brings it back, with no
restart. The waits are generous bounds on a loop, not measurements.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.fake_nvml import FakeNvmlEnv
from fixtures.kubelet import Kubelet, healthy, remove, short_folder, start_plugin, stop_plugin

from gpuctk.cdi.node.profile import load_profile
from gpuctk.deviceplugin.health import ignored_xids

pytest.importorskip("grpc")

UUIDS = [g.uuid for g in load_profile("h100-8").gpus]


class Bed:
    def __init__(self, folder: Path, control: Path) -> None:
        self.folder = folder
        self.control = control

    def say(self, *lines: str) -> None:
        with open(self.control, "a") as f:
            f.write("".join(line + "\n" for line in lines))


@pytest.fixture
def bed(fake_nvml_env: FakeNvmlEnv, tmp_path: Path) -> Iterator[tuple[Bed, Kubelet, str]]:
    folder = short_folder()
    control = tmp_path / "nvml-events"
    control.write_text("")
    kubelet = Kubelet(folder)
    kubelet.start()
    env = fake_nvml_env("h100-8", events=control)
    proc = start_plugin(folder, env, "--health-interval", "0.1", "--health-recovery", "0")
    output = ""
    try:
        yield Bed(folder, control), kubelet, kubelet.next_registration()[1]
    finally:
        output = stop_plugin(proc)
        kubelet.stop()
        remove(folder)
    print(output)


def test_an_xid_takes_gpu_3_out_and_a_healthy_reading_brings_it_back(
    bed: tuple[Bed, Kubelet, str],
) -> None:
    control, kubelet, endpoint = bed
    watch = kubelet.plugin(endpoint).watch()
    watch.wait_for(lambda d: healthy(d) == set(UUIDS))
    control.say("xid gpu=3 code=79", "lost gpu=3")  # fell off the bus: NVML says GPU is lost
    devices = watch.wait_for(lambda d: UUIDS[3] not in healthy(d), timeout=30)
    assert healthy(devices) == set(UUIDS) - {UUIDS[3]}
    assert len(devices) == 8  # still listed, as Unhealthy
    control.say("found gpu=3")  # answers again: the next probe reads it healthy
    watch.wait_for(lambda d: healthy(d) == set(UUIDS), timeout=30)
    watch.cancel()


def test_an_xid_alone_recovers_and_an_ignored_xid_changes_nothing(
    bed: tuple[Bed, Kubelet, str],
) -> None:
    control, kubelet, endpoint = bed
    watch = kubelet.plugin(endpoint).watch()
    watch.wait_for(lambda d: healthy(d) == set(UUIDS))
    control.say("xid gpu=5 code=13")  # an application's fault (ignored by default)
    control.say("xid gpu=6 code=48")  # a double-bit ECC error: counts
    watch.wait_for(lambda d: UUIDS[6] not in healthy(d), timeout=30)
    watch.wait_for(lambda d: healthy(d) == set(UUIDS), timeout=30)  # recovery 0: next probe
    assert all(UUIDS[5] in healthy(d) for d in watch.lists)
    watch.cancel()


def test_a_lost_gpu_without_an_event_is_found_by_the_probe(bed: tuple[Bed, Kubelet, str]) -> None:
    control, kubelet, endpoint = bed
    watch = kubelet.plugin(endpoint).watch()
    watch.wait_for(lambda d: healthy(d) == set(UUIDS))
    control.say("lost gpu=0")
    watch.wait_for(lambda d: healthy(d) == set(UUIDS[1:]), timeout=30)
    control.say("found gpu=0")
    watch.wait_for(lambda d: healthy(d) == set(UUIDS), timeout=30)
    watch.cancel()


def test_which_xids_count() -> None:
    assert ignored_xids(None) == (True, frozenset({13, 31, 43, 45, 68, 109}))
    check, ignored = ignored_xids("48, 79", (94,))
    assert check and {48, 79, 94, 13} <= ignored
    assert ignored_xids("xids")[0] is False
