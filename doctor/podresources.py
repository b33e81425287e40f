"""The kubelet's pod resources API (v1), read for `gpuctk doctor --pod`: which pods the kubelet
runs and the devices each container was given.

`<kubelet-root>/pod-resources/kubelet.sock` serves `v1.PodResourcesLister`; only List is called
here, with the messages encoded and decoded by hand (gpuctk.deviceplugin.wire's wire format).
Written from the API's documentation (k8s.io/kubelet, pkg/apis/podresources/v1). Field numbers:

    ListPodResourcesResponse  1 pod_resources (PodResources)
    PodResources              1 name, 2 namespace, 3 containers (ContainerResources)
    ContainerResources        1 name, 2 devices (ContainerDevices), 3 cpu_ids, 4 memory,
                              5 dynamic_resources (DynamicResource)
    ContainerDevices          1 resource_name, 2 device_ids, 3 topology
    DynamicResource           1 class_name, 2 claim_name, 3 claim_namespace,
                              4 claim_resources (ClaimResource: 1 cdi_devices)
    CDIDevice                 1 name

grpcio is imported lazily, only here in the doctor: without it, Unavailable says so and the
doctor falls back to the kubelet's checkpoint.
"""

from __future__ import annotations

import os

from gpuctk.deviceplugin.wire import Fields, decode
from gpuctk.records import record

SOCKET = "pod-resources/kubelet.sock"  # under the kubelet root
LIST = "/v1.PodResourcesLister/List"
TIMEOUT_S = 5.0
MAX_BYTES = 16 << 20  # a List answer larger than this is refused by the client


@record
class Devices:
    """One resource's devices of one container."""

    resource: str
    ids: tuple[str, ...]


@record
class Container:
    name: str
    devices: tuple[Devices, ...] = ()
    cdi_devices: tuple[str, ...] = ()  # from resource claims (DRA)


@record
class Pod:
    namespace: str
    name: str
    containers: tuple[Container, ...] = ()


class Unavailable(Exception):
    """The API could not be read: the one-line reason."""


def _text(fields: Fields, number: int) -> str:
    values = fields.get(number) or [b""]
    return bytes(values[0]).decode()


def _texts(fields: Fields, number: int) -> tuple[str, ...]:
    return tuple(bytes(v).decode() for v in fields.get(number, []) if isinstance(v, bytes))


def _messages(fields: Fields, number: int) -> list[Fields]:
    return [decode(v) for v in fields.get(number, []) if isinstance(v, bytes)]


def _container(f: Fields) -> Container:
    devices = tuple(Devices(_text(d, 1), _texts(d, 2)) for d in _messages(f, 2))
    cdi = tuple(
        _text(name, 1)
        for dynamic in _messages(f, 5)
        for claim in _messages(dynamic, 4)
        for name in _messages(claim, 1)
    )
    return Container(_text(f, 1), devices, cdi)


def decode_list_response(data: bytes) -> list[Pod]:
    """The pods of a ListPodResourcesResponse; ValueError when the bytes are not one."""
    try:
        return [
            Pod(_text(p, 2), _text(p, 1), tuple(_container(c) for c in _messages(p, 3)))
            for p in _messages(decode(data), 1)
        ]
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8: {exc}") from None


def list_pods(path: str, timeout: float = TIMEOUT_S) -> list[Pod]:
    """Every pod the kubelet listening on `path` lists; Unavailable with the reason when
    there is no socket, no grpcio, or the call fails (bounded by `timeout`)."""
    if not os.path.exists(path):
        raise Unavailable(f"{path}: absent (kubelet older than 1.15 or not running)")
    try:
        import grpc
    except ImportError:
        raise Unavailable("grpcio is not installed (pip install 'gpuctk[device-plugin]')") from None
    folder, name = os.path.split(path)
    try:
        dir_fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise Unavailable(f"{folder}: {exc.strerror or exc}") from None
    try:  # through the folder's descriptor: a socket path is limited to 107 bytes
        via = f"/proc/self/fd/{dir_fd}/{name}"
        target = via if os.path.isdir(f"/proc/self/fd/{dir_fd}") else path
        options = [("grpc.max_receive_message_length", MAX_BYTES)]
        with grpc.insecure_channel(f"unix://{target}", options=options) as channel:
            call = channel.unary_unary(LIST, request_serializer=bytes, response_deserializer=bytes)
            answer = bytes(call(b"", timeout=timeout))
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        detail = exc.details() if hasattr(exc, "details") else str(exc)
        raise Unavailable(f"{path}: List failed: {getattr(code, 'name', code)}: {detail}") from None
    finally:
        os.close(dir_fd)
    try:
        return decode_list_response(answer)
    except ValueError as exc:
        raise Unavailable(f"{path}: List answered something not a pod list: {exc}") from None
