"""The kubelet's device-manager checkpoint, read for `gpuctk doctor`.

`<kubelet-root>/device-plugins/kubelet_internal_checkpoint` is JSON the kubelet rewrites when
a device plugin's device list changes and at each allocation:

    {"Data": {"PodDeviceEntries": [{"PodUID": "...", "ContainerName": "cuda",
                                    "ResourceName": "nvidia.com/gpu",
                                    "DeviceIDs": {"0": ["GPU-..."]},
                                    "AllocResp": "<base64: the plugin's answer>"}],
              "RegisteredDevices": {"nvidia.com/gpu": ["GPU-...", "GPU-..."]}},
     "Checksum": 1234}

DeviceIDs maps a NUMA node to IDs (a plain list before kubelet 1.20). AllocResp is the
protobuf ContainerAllocateResponse the plugin gave Allocate (decoded with
gpuctk.deviceplugin.wire: CDI devices, annotations, env, mounts).

Read defensively: opened without following a link or blocking, only when a regular file, at
most MAX_BYTES; a part of an unexpected shape is left out, never trusted.
"""

from __future__ import annotations

import base64
import json
import os
import stat
from typing import Any

from gpuctk.deviceplugin.wire import ContainerAllocation
from gpuctk.records import record

NAME = "kubelet_internal_checkpoint"
MAX_BYTES = 4 << 20
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


@record
class Entry:
    """One container's devices of one resource."""

    pod_uid: str
    container: str
    resource: str
    device_ids: tuple[str, ...]
    answer: ContainerAllocation | None = None  # the plugin's Allocate answer, when readable


@record
class Checkpoint:
    path: str
    registered: tuple[tuple[str, tuple[str, ...]], ...]  # (resource, device IDs), sorted
    entries: tuple[Entry, ...]

    def registered_ids(self, resource: str) -> tuple[str, ...] | None:
        """The IDs registered for `resource`, or None when it is not registered."""
        for name, ids in self.registered:
            if name == resource:
                return ids
        return None


class Unreadable(Exception):
    """The file is there but cannot be used: the one-line reason."""


def _bytes(path: str) -> bytes | None:
    try:
        fd = os.open(path, _FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise Unreadable(f"{path}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Unreadable(f"{path}: not a regular file")
        data = b""
        while len(data) <= MAX_BYTES:
            chunk = os.read(fd, MAX_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise Unreadable(f"{path}: over {MAX_BYTES >> 20} MiB, not read")
    return data


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def _device_ids(value: Any) -> tuple[str, ...]:
    """DeviceIDs: {"<NUMA node>": [IDs]} (kubelet 1.20+) or [IDs], in order, once each."""
    if isinstance(value, dict):
        ids = [i for key in sorted(value, key=str) for i in _strings(value[key])]
        return tuple(dict.fromkeys(ids))
    return _strings(value)


def _answer(value: Any) -> ContainerAllocation | None:
    from gpuctk.deviceplugin import wire

    if not isinstance(value, str) or not value:
        return None
    try:
        raw = base64.b64decode(value, validate=True)
        (answer,) = wire.decode_allocate_response(wire.message((1, raw)))
    except ValueError:  # not base64, not protobuf, not UTF-8 strings
        return None
    return answer


def _entry(item: Any) -> Entry | None:
    if not isinstance(item, dict):
        return None
    fields = [item.get(k) for k in ("PodUID", "ContainerName", "ResourceName")]
    if not all(isinstance(f, str) and f for f in fields):
        return None
    pod, container, resource = (str(f) for f in fields)
    ids = _device_ids(item.get("DeviceIDs"))
    return Entry(pod, container, resource, ids, _answer(item.get("AllocResp")))


def parse(data: bytes, path: str) -> Checkpoint:
    """The checkpoint in `data`; Unreadable when it is not JSON with a `Data` object."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        raise Unreadable(f"{path}: not JSON") from None
    body = doc.get("Data") if isinstance(doc, dict) else None
    if not isinstance(body, dict):
        raise Unreadable(f"{path}: no Data object (not a kubelet checkpoint)")
    devices = body.get("RegisteredDevices")
    registered = tuple(
        sorted(
            (name, _strings(ids))
            for name, ids in (devices.items() if isinstance(devices, dict) else ())
            if isinstance(name, str)
        )
    )
    items = body.get("PodDeviceEntries")
    entries = (_entry(item) for item in (items if isinstance(items, list) else ()))
    return Checkpoint(path, registered, tuple(e for e in entries if e is not None))


def read(folder: str) -> Checkpoint | None:
    """The checkpoint in the kubelet's device-plugins `folder`; None when there is none,
    Unreadable when it cannot be used."""
    path = os.path.join(folder, NAME)
    data = _bytes(path)
    return None if data is None else parse(data, path)
