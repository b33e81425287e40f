"""gpuctk.doctor.checkpoint: the kubelet's device-manager checkpoint, read defensively.

Both shapes of DeviceIDs (per NUMA node since kubelet 1.20, a list before), the plugin's answer
decoded from AllocResp, entries of other shapes left out; a FIFO, a link, an oversized file,
something not JSON (or nested past the parser's depth) is one Unreadable line, never a hang,
a traceback or a file followed elsewhere. And what a container was given, as the shim reads
it, from an entry without an answer: IDs, NVIDIA's replica suffix dropped.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from fixtures.kubelet import PodDevices, write_checkpoint

from gpuctk.deviceplugin import wire
from gpuctk.doctor import checkpoint
from gpuctk.doctor.checkpoint import Entry, Unreadable
from gpuctk.doctor.devplugin import handed

GPU = "nvidia.com/gpu"


def test_the_kubelets_format(tmp_path: Path) -> None:
    answer = wire.ContainerAllocation(cdi_devices=(f"{GPU}=GPU-a",))
    raw = wire.decode(wire.allocate_response([answer]))[1][0]
    write_checkpoint(
        tmp_path,
        {GPU: ["GPU-a", "GPU-b"], "example.com/x": []},
        [PodDevices("uid-1", "cuda", GPU, ["GPU-a"], raw)],
    )
    cp = checkpoint.read(str(tmp_path))
    assert cp is not None
    assert cp.registered == (("example.com/x", ()), (GPU, ("GPU-a", "GPU-b")))
    assert cp.registered_ids(GPU) == ("GPU-a", "GPU-b") and cp.registered_ids("x/y") is None
    assert cp.entries == (Entry("uid-1", "cuda", GPU, ("GPU-a",), answer),)
    assert checkpoint.read(str(tmp_path / "none")) is None


def test_odd_entries_are_left_out_never_trusted(tmp_path: Path) -> None:
    entries = [
        {"PodUID": "old", "ContainerName": "c", "ResourceName": GPU, "DeviceIDs": ["GPU-a", 7]},
        {"PodUID": "numa", "ContainerName": "c", "ResourceName": GPU,
         "DeviceIDs": {"1": ["GPU-b"], "0": ["GPU-a", "GPU-b"]}, "AllocResp": "!!not base64"},
        {"PodUID": "", "ContainerName": "c", "ResourceName": GPU},
        {"PodUID": "bad-proto", "ContainerName": "c", "ResourceName": GPU,
         "AllocResp": base64.b64encode(b"\x0a\xff").decode()},  # a length past the end
        "a string",
        {"PodUID": ["x"], "ContainerName": "c", "ResourceName": GPU},
    ]  # fmt: skip
    doc = {"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {GPU: "GPU-a", "7": [1]}}}
    path = tmp_path / checkpoint.NAME
    path.write_text(json.dumps(doc))
    cp = checkpoint.read(str(tmp_path))
    assert cp is not None
    assert [(e.pod_uid, e.device_ids, e.answer) for e in cp.entries] == [
        ("old", ("GPU-a",), None),
        ("numa", ("GPU-a", "GPU-b"), None),  # each ID once, the NUMA nodes in order
        ("bad-proto", (), None),
    ]
    assert cp.registered == (("7", ()), (GPU, ()))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "not JSON"),
        (b"[" * 200_000 + b"]" * 200_000, "not JSON"),  # deeper than the parser goes
        (b'{"Data": []}', "no Data object"),
        (b"[]", "no Data object"),
        (b" " * (checkpoint.MAX_BYTES + 1), "over 4 MiB, not read"),
    ],
)
def test_unusable_content_is_one_line(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / checkpoint.NAME).write_bytes(content)
    with pytest.raises(Unreadable, match=message):
        checkpoint.read(str(tmp_path))


def test_a_fifo_or_a_link_is_never_read(tmp_path: Path) -> None:
    path = tmp_path / checkpoint.NAME
    os.mkfifo(path)  # opened without blocking, then refused: no writer would ever come
    with pytest.raises(Unreadable, match="not a regular file"):
        checkpoint.read(str(tmp_path))
    path.unlink()
    (tmp_path / "elsewhere").write_text('{"Data": {}}')
    path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(Unreadable):
        checkpoint.read(str(tmp_path))


def test_without_an_answer_the_ids_are_the_names() -> None:
    replicas = Entry("p", "c", GPU, ("GPU-a::0", "GPU-a::1", "GPU-b::0"))  # time-slicing
    assert handed(replicas, GPU) == [f"{GPU}=GPU-a", f"{GPU}=GPU-b"]
    assert handed(Entry("p", "c", GPU, ("0", "1:0")), GPU) == [f"{GPU}=0", f"{GPU}=1:0"]
    assert handed(Entry("p", "c", GPU, ()), GPU) == []
    env = wire.ContainerAllocation(envs=(("NVIDIA_VISIBLE_DEVICES", "all"),))
    assert handed(Entry("p", "c", GPU, ("GPU-a",), env), GPU) == [f"{GPU}=all"]
