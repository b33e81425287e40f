"""The gRPC side: one DevicePlugin server per resource on a unix socket in the kubelet's
device-plugins folder, registered with the kubelet, and registered again when the kubelet
restarts.

grpcio is imported here only (the `gpuctk[device-plugin]` extra), through its generic handlers
with gpuctk.deviceplugin.wire's functions as (de)serializers: no generated code.

The kubelet, starting, removes every socket in its folder and makes kubelet.sock anew; `run`
notices (kubelet.sock replaced, or our socket gone) within a second and starts its servers and
registrations again, as the API asks of a plugin.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from typing import Any, NoReturn

from gpuctk import log
from gpuctk.deviceplugin import wire
from gpuctk.deviceplugin.allocate import container_allocation
from gpuctk.deviceplugin.health import Health
from gpuctk.deviceplugin.resources import Unit, socket_name
from gpuctk.deviceplugin.topology import Topology, preferred
from gpuctk.errors import GpuctkError, InputError

KUBELET_SOCKET = "kubelet.sock"
STREAM_POLL = 1.0  # seconds between a ListAndWatch stream's checks that the kubelet is there


class Plugin:
    """The DevicePlugin service of one resource."""

    def __init__(
        self,
        resource: str,
        units: Sequence[Unit],
        health: Health,
        topo: Topology,
        strategies: Sequence[str],
        use_nics: bool = False,
    ) -> None:
        self.resource = resource
        self.units = {u.id: u for u in units}
        self.order = [u.id for u in units]
        self.health = health
        self.topo = topo
        self.strategies = tuple(strategies)
        self.use_nics = use_nics

    def devices(self) -> list[wire.Device]:
        _, reasons = self.health.snapshot()
        return [
            wire.Device(
                i,
                wire.UNHEALTHY if reasons.get(i) else wire.HEALTHY,
                () if self.units[i].numa_node is None else (int(self.units[i].numa_node),),  # type: ignore[arg-type]
            )
            for i in self.order
        ]

    # --- the RPCs ---

    def get_options(self, request: bytes, context: Any) -> bytes:
        return wire.options(pre_start=False, preferred=True)

    def list_and_watch(self, request: bytes, context: Any) -> Iterator[bytes]:
        generation, _ = self.health.snapshot()
        yield wire.list_and_watch(self.devices())
        while context.is_active() and not self.health.closed:
            now = self.health.wait(generation, STREAM_POLL)
            if now != generation:
                generation = now
                yield wire.list_and_watch(self.devices())

    def get_preferred(self, request: bytes, context: Any) -> bytes:
        try:
            requests = wire.decode_preferred_request(request)
        except ValueError as exc:  # UnicodeDecodeError too
            _refuse(context, f"GetPreferredAllocation: malformed request: {exc}")
        answers = []
        for r in requests:
            answers.append(
                preferred(self.units, r.available, r.must_include, r.size, self.topo, self.use_nics)
            )
        return wire.preferred_response(answers)

    def allocate(self, request: bytes, context: Any) -> bytes:
        try:
            out = [
                container_allocation(self.units, ids, self.strategies)
                for ids in wire.decode_allocate_request(request)
            ]
        except GpuctkError as exc:
            _refuse(context, exc.message)
        except ValueError as exc:  # UnicodeDecodeError too
            _refuse(context, f"Allocate: malformed request: {exc}")
        return wire.allocate_response(out)

    def prestart(self, request: bytes, context: Any) -> bytes:
        return b""  # nothing to do before a container starts (pre_start_required is false)

    def handler(self) -> Any:
        import grpc

        def unary(fn: Callable[[bytes, Any], bytes]) -> Any:
            return grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=wire.identity, response_serializer=wire.identity
            )

        return grpc.method_handlers_generic_handler(
            wire.SERVICE,
            {
                "GetDevicePluginOptions": unary(self.get_options),
                "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                    self.list_and_watch,
                    request_deserializer=wire.identity,
                    response_serializer=wire.identity,
                ),
                "GetPreferredAllocation": unary(self.get_preferred),
                "Allocate": unary(self.allocate),
                "PreStartContainer": unary(self.prestart),
            },
        )


def _refuse(context: Any, message: str) -> NoReturn:
    """End the call with INVALID_ARGUMENT (grpc's abort raises)."""
    import grpc

    context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
    raise AssertionError("unreachable: grpc's abort raises")


def register(kubelet_socket: str, endpoint: str, resource: str, timeout: float = 10) -> None:
    """Register one resource with the kubelet; InputError saying why it refused."""
    import grpc

    with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
        call = channel.unary_unary(
            wire.REGISTRATION, request_serializer=wire.identity, response_deserializer=wire.identity
        )
        try:
            call(wire.register_request(endpoint, resource, wire.options()), timeout=timeout)
        except grpc.RpcError as exc:
            detail = exc.details() if hasattr(exc, "details") else str(exc)
            raise InputError(
                f"the kubelet at {kubelet_socket} refused {resource}: {detail} (is it running, "
                "and is the resource name free?)"
            ) from None


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_ctime_ns


class Servers:
    """The running servers of every resource (start, stop)."""

    def __init__(self, plugins: Mapping[str, Plugin], folder: str) -> None:
        self.plugins = plugins
        self.folder = folder
        self.servers: list[Any] = []
        self.sockets: list[str] = []

    def start(self) -> None:
        import grpc

        for resource, plugin in self.plugins.items():
            path = os.path.join(self.folder, socket_name(resource))
            if os.path.lexists(path):
                os.unlink(path)
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
            server.add_generic_rpc_handlers((plugin.handler(),))
            old = os.umask(0o077)  # the socket is root's alone (the kubelet runs as root)
            try:
                server.add_insecure_port(f"unix://{path}")
            finally:
                os.umask(old)
            server.start()
            self.servers.append(server)
            self.sockets.append(path)

    def stop(self) -> None:
        for server in self.servers:
            server.stop(grace=1).wait()
        for path in self.sockets:
            if os.path.lexists(path):
                os.unlink(path)
        self.servers, self.sockets = [], []

    def intact(self) -> bool:
        return all(os.path.exists(p) for p in self.sockets)


def run(
    plugins: Mapping[str, Plugin],
    folder: str,
    stop: threading.Event,
    retry: float = 5.0,
) -> None:
    """Serve and stay registered until `stop` is set."""
    kubelet = os.path.join(folder, KUBELET_SOCKET)
    servers = Servers(plugins, folder)
    registered_with: tuple[int, int] | None = None
    try:
        while not stop.is_set():
            current = _identity(kubelet)
            if registered_with is not None and (current != registered_with or not servers.intact()):
                log.say("device-plugin: the kubelet restarted: registering again")
                servers.stop()
                registered_with = None
            if registered_with is None and current is not None:
                if not servers.servers or not servers.intact():
                    servers.stop()  # a socket the kubelet removed: serve on a new one
                    servers.start()
                try:
                    for resource in plugins:
                        register(kubelet, socket_name(resource), resource)
                        log.say(f"device-plugin: registered {resource} ({socket_name(resource)})")
                    registered_with = current
                except InputError as exc:
                    log.warning(f"device-plugin: {exc.message}; retrying in {retry:g} s")
                    stop.wait(retry)
                    continue
            stop.wait(1.0 if registered_with is not None else 0.5)
    finally:
        servers.stop()
        for plugin in plugins.values():
            plugin.health.close()
        time.sleep(0)  # let streams see the close
