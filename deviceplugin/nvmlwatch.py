"""The NVML calls the plugin adds to discovery's: NVLinks, XID events, handle probes.

`Watcher` extends gpuctk.cdi.node.nvmlbindings.PynvmlAdapter (the one place pynvml is called)
by the queries a long-running agent needs; each method is one NVML call (or a loop of them)
and raises NvmlCallError, as discovery's do. The library is the one discovery chose, so the
plugin reads the same NVML as `gpuctk cdi generate`.
"""

from __future__ import annotations

from gpuctk.cdi.node.machine import Machine
from gpuctk.cdi.node.nvml import NOT_SUPPORTED, NvmlCallError, normalize_bus_id
from gpuctk.cdi.node.nvmlbindings import PynvmlAdapter
from gpuctk.deviceplugin.topology import nvlink_pairs
from gpuctk.records import record

INVALID_ARGUMENT = 2
TIMEOUT = 10
XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS (18 before NVML 12.x)
NO_INSTANCE = 0xFFFFFFFF


@record
class XidEvent:
    gpu_uuid: str
    xid: int
    gi: int | None  # the GPU instance it hit, if NVML says


def _address(handle: object) -> int | None:
    import ctypes

    return ctypes.cast(handle, ctypes.c_void_p).value  # type: ignore[arg-type]


class Watcher(PynvmlAdapter):
    """NVML for the device plugin (init() first, shutdown() at the end)."""

    def __init__(self, library_path: str | None = None) -> None:
        super().__init__(library_path)
        self._uuids: dict[int | None, str] = {}  # handle address -> GPU UUID

    def handle_by_uuid(self, uuid: str) -> object:
        return self._call("nvmlDeviceGetHandleByUUID", uuid)

    def nvlinks(self, machine: Machine) -> dict[tuple[int, int], int]:
        """Active NVLinks per GPU pair: links whose far end is another GPU count for that
        pair; links to anything else (an NVSwitch) count as switch links (nvlink_pairs)."""
        by_bus = {normalize_bus_id(g.pci_bus_id): g.index for g in machine.gpus}
        direct: dict[tuple[int, int], int] = {}
        switch: dict[int, int] = {}
        for g in machine.gpus:
            handle = self.handle_by_uuid(g.uuid)
            for link in range(MAX_LINKS):
                try:
                    if not self._call("nvmlDeviceGetNvLinkState", handle, link):
                        continue
                    remote = self._call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
                except NvmlCallError as exc:
                    if exc.code in (NOT_SUPPORTED, INVALID_ARGUMENT):
                        break  # no NVLink on this GPU, or past its last link
                    raise
                bus = remote.busId.decode() if isinstance(remote.busId, bytes) else remote.busId
                peer = by_bus.get(normalize_bus_id(str(bus)))
                if peer is None:
                    switch[g.index] = switch.get(g.index, 0) + 1
                elif peer != g.index:
                    key = (min(g.index, peer), max(g.index, peer))
                    direct[key] = direct.get(key, 0) + 1
        # each direct link was seen from both ends
        return nvlink_pairs({k: (n + 1) // 2 for k, n in direct.items()}, switch)

    def event_set(self, uuids: list[str]) -> tuple[object, list[str]]:
        """(an event set with XID events registered for every GPU that supports them, the
        UUIDs that do not)."""
        events = self._call("nvmlEventSetCreate")
        missing = []
        for uuid in uuids:
            try:
                handle = self.handle_by_uuid(uuid)
                self._uuids[_address(handle)] = uuid  # an event's GPU may not answer any more
                supported = int(self._call("nvmlDeviceGetSupportedEventTypes", handle))
                if not supported & XID_EVENT:
                    raise NvmlCallError("nvmlDeviceGetSupportedEventTypes", NOT_SUPPORTED)
                self._call("nvmlDeviceRegisterEvents", handle, XID_EVENT, events)
            except NvmlCallError:
                missing.append(uuid)
        return events, missing

    def wait(self, events: object, timeout_ms: int) -> XidEvent | None:
        """The next XID event, or None when none came within `timeout_ms`."""
        try:
            data = self._call("nvmlEventSetWait_v2", events, timeout_ms)
        except NvmlCallError as exc:
            if exc.code == TIMEOUT:
                return None
            raise
        if not int(data.eventType) & XID_EVENT:
            return None
        uuid = self._uuids.get(_address(data.device)) or str(
            self._call("nvmlDeviceGetUUID", data.device)
        )
        gi = int(data.gpuInstanceId)
        return XidEvent(uuid, int(data.eventData), None if gi == NO_INSTANCE else gi)

    def free(self, events: object) -> None:
        self._call("nvmlEventSetFree", events)

    def probe(self, uuid: str) -> str:
        """ "" when the device answers (its handle, by UUID, and its UUID through it), else
        what failed, as one line."""
        try:
            handle = self.handle_by_uuid(uuid)
            self.uuid(handle)
        except NvmlCallError as exc:
            return f"{exc.function}: {exc.text or 'NVML error'} ({exc.code})"
        return ""
