"""The kubelet's Device Plugin API, v1beta1, as protobuf bytes: encoders and decoders of our own.

Written from the API's documentation (k8s.io/kubelet, pkg/apis/deviceplugin/v1beta1): the
services `v1beta1.Registration` (the kubelet's: Register) and `v1beta1.DevicePlugin` (ours:
GetDevicePluginOptions, ListAndWatch, GetPreferredAllocation, Allocate, PreStartContainer), and
the few messages they carry. No generated code: grpcio's generic handlers take these functions
as (de)serializers, so the product needs grpcio only, and only for `gpuctk device-plugin`.

Field numbers (proto3; a field at its default value is not written):

    RegisterRequest        1 version, 2 endpoint, 3 resource_name, 4 options
    DevicePluginOptions    1 pre_start_required, 2 get_preferred_allocation_available
    ListAndWatchResponse   1 devices (Device: 1 ID, 2 health, 3 topology)
    TopologyInfo           1 nodes (NUMANode: 1 ID)
    PreferredAllocationRequest   1 container_requests (1 available_deviceIDs,
                                 2 must_include_deviceIDs, 3 allocation_size)
    PreferredAllocationResponse  1 container_responses (1 deviceIDs)
    AllocateRequest        1 container_requests (1 devices_ids)
    AllocateResponse       1 container_responses (1 envs map, 2 mounts, 3 devices,
                           4 annotations map, 5 cdi_devices)
    Mount                  1 container_path, 2 host_path, 3 read_only
    DeviceSpec             1 container_path, 2 host_path, 3 permissions
    CDIDevice              1 name
    PreStartContainerRequest     1 devices_ids
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuctk.records import record

VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
REGISTRATION = "/v1beta1.Registration/Register"
SERVICE = "v1beta1.DevicePlugin"

Fields = dict[int, list[Any]]


# --- the wire format ----------------------------------------------------------------------


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int32/int64 go out as ten-byte two's complement
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def message(*fields: tuple[int, object]) -> bytes:
    """(field, value) pairs: str/bytes length-delimited, bool/int varint; None, 0, "" omitted."""
    out = bytearray()
    for field, value in fields:
        if value is None:
            continue
        if isinstance(value, bool | int):
            if value:
                out += _varint(field << 3) + _varint(int(value))
            continue
        data = value.encode() if isinstance(value, str) else value
        assert isinstance(data, bytes)
        if data or isinstance(value, bytes):  # an empty sub-message is still present
            out += _varint(field << 3 | 2) + _varint(len(data)) + data
    return bytes(out)


def decode(data: bytes) -> Fields:
    """One message level: field number -> its values (int for varints, bytes otherwise).
    ValueError for what protobuf refuses: a varint over ten bytes (the work per byte stays
    bounded, whatever a request holds), a field cut short."""
    out: Fields = {}
    pos = 0

    def varint() -> int:
        nonlocal pos
        shift = value = 0
        while True:
            if pos >= len(data):
                raise ValueError("truncated protobuf message")
            if shift >= 70:
                raise ValueError("malformed protobuf varint (over ten bytes)")
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value & ((1 << 64) - 1)

    def take(length: int) -> bytes:
        nonlocal pos
        if pos + length > len(data):
            raise ValueError("truncated protobuf message")
        pos += length
        return data[pos - length : pos]

    while pos < len(data):
        key = varint()
        field, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value = varint()
        elif wire == 2:
            value = take(varint())
        elif wire == 1:
            value = take(8)
        elif wire == 5:
            value = take(4)
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        out.setdefault(field, []).append(value)
    return out


def _strings(fields: Fields, number: int) -> list[str]:
    return [bytes(v).decode() for v in fields.get(number, [])]


def _int(fields: Fields, number: int) -> int:
    values = fields.get(number) or [0]
    value = int(values[-1])
    return value - (1 << 64) if value >= 1 << 63 else value


def map_field(number: int, items: Mapping[str, str]) -> list[tuple[int, object]]:
    return [(number, message((1, k), (2, v))) for k, v in sorted(items.items())]


def _read_map(fields: Fields, number: int) -> dict[str, str]:
    out = {}
    for entry in fields.get(number, []):
        kv = decode(entry)
        out[(_strings(kv, 1) or [""])[0]] = (_strings(kv, 2) or [""])[0]
    return out


# --- the messages -------------------------------------------------------------------------


@record
class Device:
    """One advertised device: its ID, health and NUMA nodes (empty: unknown)."""

    id: str
    health: str = HEALTHY
    numa_nodes: tuple[int, ...] = ()


@record
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@record
class ContainerAllocation:
    """One container's answer to Allocate."""

    envs: tuple[tuple[str, str], ...] = ()
    mounts: tuple[Mount, ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    cdi_devices: tuple[str, ...] = ()


@record
class PreferredRequest:
    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int


def options(pre_start: bool = False, preferred: bool = True) -> bytes:
    return message((1, pre_start), (2, preferred))


def decode_options(data: bytes) -> tuple[bool, bool]:
    f = decode(data)
    return bool(_int(f, 1)), bool(_int(f, 2))


def register_request(endpoint: str, resource: str, opts: bytes) -> bytes:
    return message((1, VERSION), (2, endpoint), (3, resource), (4, opts))


def decode_register_request(data: bytes) -> tuple[str, str, str, tuple[bool, bool]]:
    """(version, endpoint, resource name, (pre_start_required, preferred allocation))."""
    f = decode(data)
    first = [(_strings(f, n) or [""])[0] for n in (1, 2, 3)]
    opts = decode_options(f[4][0]) if 4 in f else (False, False)
    return first[0], first[1], first[2], opts


def list_and_watch(devices: Iterable[Device]) -> bytes:
    out = []
    for d in devices:
        topology = message(*[(1, message((1, n)) or b"") for n in d.numa_nodes])
        out.append((1, message((1, d.id), (2, d.health), (3, topology if d.numa_nodes else None))))
    return message(*out)


def decode_list_and_watch(data: bytes) -> list[Device]:
    out = []
    for raw in decode(data).get(1, []):
        f = decode(raw)
        nodes: tuple[int, ...] = ()
        if 3 in f:
            nodes = tuple(_int(decode(n), 1) for n in decode(f[3][0]).get(1, []))
        out.append(Device((_strings(f, 1) or [""])[0], (_strings(f, 2) or [""])[0], nodes))
    return out


def preferred_request(requests: Sequence[PreferredRequest]) -> bytes:
    return message(
        *[
            (
                1,
                message(
                    *[(1, i) for i in r.available],
                    *[(2, i) for i in r.must_include],
                    (3, r.size),
                )
                or b"",
            )
            for r in requests
        ]
    )


def decode_preferred_request(data: bytes) -> list[PreferredRequest]:
    out = []
    for raw in decode(data).get(1, []):
        f = decode(raw)
        out.append(PreferredRequest(tuple(_strings(f, 1)), tuple(_strings(f, 2)), _int(f, 3)))
    return out


def preferred_response(answers: Sequence[Sequence[str]]) -> bytes:
    return message(*[(1, message(*[(1, i) for i in ids]) or b"") for ids in answers])


def decode_preferred_response(data: bytes) -> list[list[str]]:
    return [_strings(decode(raw), 1) for raw in decode(data).get(1, [])]


def allocate_request(containers: Sequence[Sequence[str]]) -> bytes:
    return message(*[(1, message(*[(1, i) for i in ids]) or b"") for ids in containers])


def decode_allocate_request(data: bytes) -> list[list[str]]:
    return [_strings(decode(raw), 1) for raw in decode(data).get(1, [])]


def allocate_response(containers: Sequence[ContainerAllocation]) -> bytes:
    out = []
    for c in containers:
        fields: list[tuple[int, object]] = map_field(1, dict(c.envs))
        fields += [
            (2, message((1, m.container_path), (2, m.host_path), (3, m.read_only)))
            for m in c.mounts
        ]
        fields += map_field(4, dict(c.annotations))
        fields += [(5, message((1, name))) for name in c.cdi_devices]
        out.append((1, message(*fields) or b""))
    return message(*out)


def decode_allocate_response(data: bytes) -> list[ContainerAllocation]:
    out = []
    for raw in decode(data).get(1, []):
        f = decode(raw)
        mounts = []
        for m in f.get(2, []):
            mf = decode(m)
            paths = [(_strings(mf, n) or [""])[0] for n in (1, 2)]
            mounts.append(Mount(paths[0], paths[1], bool(_int(mf, 3))))
        out.append(
            ContainerAllocation(
                envs=tuple(sorted(_read_map(f, 1).items())),
                mounts=tuple(mounts),
                annotations=tuple(sorted(_read_map(f, 4).items())),
                cdi_devices=tuple((_strings(decode(d), 1) or [""])[0] for d in f.get(5, [])),
            )
        )
    return out


def prestart_request(ids: Sequence[str]) -> bytes:
    return message(*[(1, i) for i in ids])


def decode_prestart_request(data: bytes) -> list[str]:
    return _strings(decode(data), 1)


def empty(_: object = None) -> bytes:
    return b""


def identity(data: bytes) -> bytes:
    return data
