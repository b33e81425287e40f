"""The request author: bytes on the device plugin's socket that no kubelet sends.

gpuctk.deviceplugin.wire decodes every request itself (no generated code), so it must refuse
what protobuf refuses, at once and with bounded work: a varint longer than ten bytes (each
extra byte would make Python's int longer, and the decode of one 4 MiB request quadratic), a
fixed-width field cut short. The plugin answers such a request INVALID_ARGUMENT, allocates
nothing, and serves the next one.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, NoReturn

import pytest

from gpuctk.deviceplugin import wire
from gpuctk.deviceplugin.health import Health
from gpuctk.deviceplugin.resources import Unit
from gpuctk.deviceplugin.server import Plugin, Servers
from gpuctk.deviceplugin.topology import Topology

pytest.importorskip("grpc")

GPU = Unit("GPU-0", "nvidia.com/gpu", "GPU-0", "0", 0, None, "0000:01:00.0")


class Aborted(Exception):
    pass


class Context:
    """What a handler sees of grpc's ServicerContext: abort raises, as grpc's does."""

    def __init__(self) -> None:
        self.code: Any = None

    def abort(self, code: Any, details: str) -> NoReturn:
        self.code = code
        raise Aborted(details)


@pytest.mark.parametrize(
    "data",
    [
        b"\x08" + b"\xff" * 10 + b"\x01",  # an eleven-byte value
        b"\xff" * 11 + b"\x01\x00",  # an eleven-byte key
        b"\x08" + b"\xff" * 4096 + b"\x01",
    ],
    ids=["value", "key", "long"],
)
def test_a_varint_over_ten_bytes_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError, match="varint"):
        wire.decode(data)


@pytest.mark.parametrize("data", [b"\x09\x01\x02\x03", b"\x0d\x01"], ids=["fixed64", "fixed32"])
def test_a_fixed_width_field_cut_short_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError, match="truncated"):
        wire.decode(data)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"\x0a\x0d" + b"\x08" + b"\xff" * 11 + b"\x01",  # container_requests{ bad varint }
        wire.allocate_request([["GPU-0"]])[:-2],  # cut inside the ID
        b"\x0a\x03\x0a\x01\xff",  # an ID that is not UTF-8
    ],
    ids=["varint", "truncated", "utf8"],
)
def test_a_malformed_request_is_invalid_argument_and_the_plugin_goes_on(
    request_bytes: bytes,
) -> None:
    import grpc

    plugin = Plugin("nvidia.com/gpu", [GPU], Health(["GPU-0"]), Topology(), ["cdi-cri"])
    for call in (plugin.allocate, plugin.get_preferred):
        context = Context()
        with pytest.raises(Aborted):
            call(request_bytes, context)
        assert context.code == grpc.StatusCode.INVALID_ARGUMENT
    answer = plugin.allocate(wire.allocate_request([["GPU-0"]]), None)
    assert [a.cdi_devices for a in wire.decode_allocate_response(answer)] == [
        ("nvidia.com/gpu=GPU-0",)
    ]


def test_the_plugin_socket_is_root_s_alone_whatever_the_umask(tmp_path: Path) -> None:
    """A local user who could connect could hold every worker thread with ListAndWatch
    streams (the kubelet's Allocate then waits) or read the node's device list."""
    plugin = Plugin("nvidia.com/gpu", [GPU], Health(["GPU-0"]), Topology(), ["cdi-cri"])
    servers = Servers({"nvidia.com/gpu": plugin}, str(tmp_path))
    old = os.umask(0)
    try:
        servers.start()
    finally:
        os.umask(old)
    try:
        (sock,) = servers.sockets
        assert stat.S_ISSOCK(os.stat(sock).st_mode)
        assert stat.S_IMODE(os.stat(sock).st_mode) & 0o077 == 0
    finally:
        servers.stop()
    assert os.umask(old) == old  # the process's umask is given back
