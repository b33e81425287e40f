"""Device health that recovers: XID events and failed handle lookups mark a device unhealthy with
the reason; a later healthy reading marks it healthy again, with no restart.

`Health` is the shared state: unit ID -> reason ("" when healthy), and a generation number
that every change bumps (ListAndWatch streams wait on it). `monitor` is the loop one thread
runs: it waits for NVML XID events (nvmlEventSetWait) at most `interval` seconds at a time and
then probes every device (nvmlDeviceGetHandleByUUID, and a query through the handle).

- An XID that counts (not in `ignored`) marks the GPU's units unhealthy (`XID 79`); on a MIG
  GPU, only the units of the GPU instance the event names (all of them when it names none).
- A failed probe marks the device unhealthy with NVML's error
  (`nvmlDeviceGetHandleByUUID: GPU is lost (15)`).
- A device is healthy again at the first probe that succeeds at least `recovery` seconds after
  its last bad reading: one XID with a GPU that still answers clears after `recovery`; a GPU
  that fell off the bus stays out until it answers again.

The ignored XIDs by default are those NVIDIA's device plugin skips, the application errors
that say nothing of the GPU (13, 31, 43, 45, 68, 109); DP_DISABLE_HEALTHCHECKS (its variable:
`all`, `xids`, or XIDs to ignore as well) is honoured the same way.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from gpuctk import log
from gpuctk.deviceplugin.resources import Unit

DEFAULT_IGNORED = (13, 31, 43, 45, 68, 109)


class Health:
    """unit ID -> reason ("" = healthy), with a generation counter to wait on."""

    def __init__(self, ids: Iterable[str]) -> None:
        self._reasons = dict.fromkeys(ids, "")
        self._bad_since: dict[str, float] = {}
        self._cond = threading.Condition()
        self.generation = 0
        self.closed = False

    def snapshot(self) -> tuple[int, dict[str, str]]:
        with self._cond:
            return self.generation, dict(self._reasons)

    def mark(self, ids: Iterable[str], reason: str, now: float | None = None) -> None:
        """Mark `ids` unhealthy (reason) or, with reason "", healthy."""
        stamp = time.monotonic() if now is None else now
        with self._cond:
            changed = False
            for i in ids:
                if i not in self._reasons:
                    continue
                if reason:
                    self._bad_since[i] = stamp
                if self._reasons[i] != reason:
                    self._reasons[i] = reason
                    changed = True
                    if reason:
                        log.warning(f"device-plugin: {i} unhealthy: {reason}")
                    else:
                        log.say(f"device-plugin: {i} healthy again")
            if changed:
                self.generation += 1
                self._cond.notify_all()

    def last_bad(self, unit_id: str) -> float | None:
        with self._cond:
            return self._bad_since.get(unit_id)

    def wait(self, generation: int, timeout: float) -> int:
        """Wait until the generation differs from `generation` (or close, or timeout)."""
        with self._cond:
            self._cond.wait_for(lambda: self.generation != generation or self.closed, timeout)
            return self.generation

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()


class Source(Protocol):
    """What the monitor asks of NVML (gpuctk.deviceplugin.nvmlwatch.Watcher)."""

    def event_set(self, uuids: list[str]) -> tuple[object, list[str]]: ...
    def wait(self, events: object, timeout_ms: int) -> object | None: ...
    def free(self, events: object) -> None: ...
    def probe(self, uuid: str) -> str: ...


def ignored_xids(env_value: str | None, extra: Sequence[int] = ()) -> tuple[bool, frozenset[int]]:
    """(XID events checked at all, the XIDs that do not count) from DP_DISABLE_HEALTHCHECKS and
    --ignore-xid."""
    ignored = set(DEFAULT_IGNORED) | set(extra)
    check = True
    for part in (env_value or "").replace(",", " ").split():
        if part.lower() in ("all", "xids"):
            check = False
        elif part.isdigit():
            ignored.add(int(part))
    return check, frozenset(ignored)


def units_hit(
    units: Sequence[Unit], gpu_uuid: str, gi: int | None, gpu_of: dict[str, int]
) -> list[str]:
    """The units an event on GPU `gpu_uuid` (GPU instance `gi`, if known) concerns."""
    index = gpu_of.get(gpu_uuid)
    if index is None:
        return [u.id for u in units if u.uuid == gpu_uuid]  # a MIG device's own UUID
    return [u.id for u in units if u.gpu == index and (gi is None or u.gi in (None, gi))]


def monitor(
    health: Health,
    units: Sequence[Unit],
    source: Source,
    gpu_uuids: dict[str, int],
    *,
    interval: float = 5.0,
    recovery: float = 30.0,
    ignored: frozenset[int] = frozenset(DEFAULT_IGNORED),
    check_xids: bool = True,
    stop: Callable[[], bool] = lambda: False,
) -> None:
    """Watch until `stop()` says so (checked at least every `interval` seconds)."""
    events: object | None = None
    if check_xids:
        events, missing = source.event_set(sorted(gpu_uuids, key=gpu_uuids.__getitem__))
        for uuid in missing:
            log.warning(f"device-plugin: GPU {uuid} gives no XID events: probes only")
    next_probe = 0.0
    try:
        while not stop() and not health.closed:
            now = time.monotonic()
            if now >= next_probe:
                _probe(health, units, source, recovery, now)
                next_probe = now + interval
            wait_ms = max(1, int((next_probe - time.monotonic()) * 1000))
            if events is None:
                health.wait(health.generation, wait_ms / 1000)  # returns early on close
                continue
            try:
                event = source.wait(events, min(wait_ms, 1000))
            except Exception as exc:  # NVML's error: the probes go on, events after a pause
                log.warning(f"device-plugin: waiting for XID events failed: {exc}")
                health.wait(health.generation, wait_ms / 1000)
                continue
            xid = getattr(event, "xid", None)
            if event is None or xid is None or xid in ignored:
                continue
            hit = units_hit(
                units, str(getattr(event, "gpu_uuid", "")), getattr(event, "gi", None), gpu_uuids
            )
            health.mark(hit, f"XID {xid}")
    finally:
        if events is not None:
            source.free(events)


def _probe(
    health: Health, units: Sequence[Unit], source: Source, recovery: float, now: float
) -> None:
    _, reasons = health.snapshot()
    for unit in units:
        failure = source.probe(unit.uuid)
        if failure:
            health.mark([unit.id], failure, now)
        elif reasons.get(unit.id):
            since = health.last_bad(unit.id)
            if since is None or now - since >= recovery:
                health.mark([unit.id], "", now)
