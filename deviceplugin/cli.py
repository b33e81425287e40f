"""`gpuctk device-plugin`: the kubelet's Device Plugin API (v1beta1) over gpuctk's own CDI spec.

Wiring only: discovery (gpuctk.cdi: NVML or `--simulate`), the resources
(gpuctk.deviceplugin.resources), topology (.topology, NVLinks from .nvmlwatch), health
(.health, one monitor thread) and the gRPC servers (.server, which alone imports grpcio).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from typing import Any

import click

from gpuctk import log
from gpuctk.cdi import cliopts
from gpuctk.clitypes import Checked
from gpuctk.deviceplugin.allocate import LIST_STRATEGIES, parse_strategies
from gpuctk.deviceplugin.resources import DEFAULT_KIND, ID_STRATEGIES, MIG_STRATEGIES
from gpuctk.errors import NoDevicesError

PLUGIN_DIR = "/var/lib/kubelet/device-plugins"


def _machine(
    simulate: str | None, driver_root: str, sys_root: str, nvml_library: str | None
) -> tuple[Any, dict[tuple[int, int], int], str | None]:
    """(Machine, NVLinks per GPU pair, the NVML library to watch or None when simulated)."""
    from gpuctk.cdi import discover

    if simulate:
        from gpuctk.cdi.node.profile import load_profile_document, machine_from_document
        from gpuctk.deviceplugin.topology import document_nvlinks

        machine = machine_from_document(load_profile_document(simulate))
        return machine, document_nvlinks(load_profile_document(simulate), machine), None
    from gpuctk.cdi.node import nvml
    from gpuctk.cdi.node.nvml import LIBRARY_NAME
    from gpuctk.deviceplugin.nvmlwatch import Watcher

    discover.check_dir(driver_root, "driver root", "--driver-root")
    machine, library = discover.load_nvml(
        discover.Roots(driver_root, sys_root=sys_root), nvml_library, nvml.discover
    )
    watcher = Watcher(None if library == LIBRARY_NAME else library)
    watcher.init()
    try:
        links = watcher.nvlinks(machine)
    except nvml.NvmlCallError as exc:
        log.warning(f"device-plugin: NVLinks not read ({exc}): PCIe topology only")
        links = {}
    finally:
        watcher.shutdown()
    return machine, links, library


@click.command("device-plugin")
@click.option(
    "--resource-name",
    type=Checked(lambda name: None if "/" in name else f"{name!r} must be DOMAIN/NAME"),
    default=DEFAULT_KIND,
    help="Whole GPUs' resource [nvidia.com/gpu].",
)
@click.option(
    "--mig-strategy",
    type=click.Choice(MIG_STRATEGIES),
    default="none",
    envvar="MIG_STRATEGY",
    help="MIG devices: left out, as the GPU resource, or nvidia.com/mig-<profile> [none].",
)
@click.option(
    "--device-list-strategy",
    "list_strategy",
    multiple=True,
    envvar="DEVICE_LIST_STRATEGY",
    metavar="|".join(LIST_STRATEGIES),
    help="How Allocate hands devices over [cdi-cri].",
)
@click.option(
    "--device-id-strategy",
    type=click.Choice(ID_STRATEGIES),
    default="uuid",
    envvar="DEVICE_ID_STRATEGY",
    help="Device IDs: UUIDs or index names [uuid].",
)
@click.option("--cdi-kind", default=DEFAULT_KIND, help="The spec's kind [nvidia.com/gpu].")
@click.option("--nics", is_flag=True, help="Prefer GPUs nearest a free RDMA NIC.")
@click.option(
    "--plugin-dir", default=PLUGIN_DIR, metavar="DIR", help="The kubelet's device-plugins folder."
)
@click.option(
    "--health-interval",
    type=click.FloatRange(min=0.05),
    default=5.0,
    metavar="SECONDS",
    help="Between probes of every device [5].",
)
@click.option(
    "--health-recovery",
    type=click.FloatRange(min=0),
    default=30.0,
    metavar="SECONDS",
    help="Fault-free time before reuse [30].",
)
@click.option(
    "--ignore-xid",
    type=int,
    multiple=True,
    metavar="XID",
    help="An XID that is no fault (as 13, 31, 43, 45, 68, 109).",
)
@click.option("--list", "list_only", is_flag=True, help="Print what it would advertise (JSON).")
@cliopts.simulate("A machine profile, not NVML (no health).")
@cliopts.driver_root("Root of the driver files and the NVML library.")
@cliopts.sys_root("Where /sys is (PCI topology, RDMA NICs).")
@cliopts.nvml_library
def device_plugin(
    resource_name: str,
    mig_strategy: str,
    list_strategy: tuple[str, ...],
    device_id_strategy: str,
    cdi_kind: str,
    nics: bool,
    plugin_dir: str,
    health_interval: float,
    health_recovery: float,
    ignore_xid: tuple[int, ...],
    list_only: bool,
    simulate: str | None,
    driver_root: str,
    sys_root: str,
    nvml_library: str | None,
) -> None:
    """Advertise the GPUs to the kubelet (Device Plugin API v1beta1) as gpuctk's CDI devices.

    \b
    Health from XID events and NVML probes (recovered GPUs come back); multi-GPU pods get
    the best NVLink/PCIe set. Needs the spec `gpuctk cdi generate` writes (UUID names).

    \b
    Examples:
      gpuctk device-plugin --mig-strategy mixed --nics
      gpuctk device-plugin --device-list-strategy envvar   # gpuctk-runtime
      gpuctk device-plugin --simulate h100nvl-8 --list     # no GPU, no kubelet
    """
    from gpuctk.cdi.node import nics as nic_discovery
    from gpuctk.deviceplugin import topology
    from gpuctk.deviceplugin.health import Health, ignored_xids
    from gpuctk.deviceplugin.resources import build_units

    strategies = parse_strategies(list_strategy)
    machine, links, library = _machine(simulate, driver_root, sys_root, nvml_library)
    resources = build_units(
        machine,
        mig_strategy=mig_strategy,
        id_strategy=device_id_strategy,
        resource_name=resource_name,
        cdi_kind=cdi_kind,
    )
    if not resources:
        raise NoDevicesError(
            "no devices to advertise: every GPU has MIG on (use --mig-strategy mixed or single)"
            if machine.gpus
            else "no GPUs found"
        )
    found = nic_discovery.discover(sys_root) if nics else ()
    topo = topology.build(machine, links, sys_root, found)
    if list_only:
        sys.stdout.write(json.dumps(_listing(resources, topo, machine), indent=2) + "\n")
        return
    units = [u for group in resources.values() for u in group]
    health = Health(u.id for u in units)
    check, ignored = ignored_xids(os.environ.get("DP_DISABLE_HEALTHCHECKS"), ignore_xid)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    watcher = None
    if library is not None and os.environ.get("DP_DISABLE_HEALTHCHECKS", "").lower() != "all":
        watcher = _start_monitor(
            library, machine, units, health, stop, check, ignored, health_interval, health_recovery
        )
    from gpuctk.deviceplugin.server import Plugin, run

    plugins = {
        r: Plugin(r, group, health, topo, strategies, nics) for r, group in resources.items()
    }
    log.say(
        f"device-plugin: {', '.join(f'{len(g)} {r}' for r, g in resources.items())}; "
        f"waiting for the kubelet at {plugin_dir}"
    )
    try:
        run(plugins, plugin_dir, stop)
    finally:
        stop.set()
        if watcher is not None:
            watcher.join(timeout=5)


def _start_monitor(
    library: str,
    machine: Any,
    units: list[Any],
    health: Any,
    stop: threading.Event,
    check: bool,
    ignored: frozenset[int],
    interval: float,
    recovery: float,
) -> threading.Thread:
    from gpuctk.cdi.node.nvml import LIBRARY_NAME
    from gpuctk.deviceplugin.health import monitor
    from gpuctk.deviceplugin.nvmlwatch import Watcher

    watcher = Watcher(None if library == LIBRARY_NAME else library)

    def body() -> None:
        try:
            watcher.init()
            monitor(
                health,
                units,
                watcher,
                {g.uuid: g.index for g in machine.gpus},
                interval=interval,
                recovery=recovery,
                ignored=ignored,
                check_xids=check,
                stop=stop.is_set,
            )
            watcher.shutdown()
        except Exception as exc:  # the plugin goes on; every device stays as last read
            log.warning(f"device-plugin: health checks stopped: {exc}")

    thread = threading.Thread(target=body, name="gpuctk-health", daemon=True)
    thread.start()
    return thread


def _listing(resources: dict[str, list[Any]], topo: Any, machine: Any) -> dict[str, Any]:
    gpus = [g.index for g in machine.gpus]
    return {
        "resources": {
            r: [
                {"id": u.id, "cdi": u.cdi_name, "gpu": u.gpu, "numa_node": u.numa_node}
                for u in group
            ]
            for r, group in resources.items()
        },
        "topology": {
            "gpus": [f"GPU{i}" for i in gpus],
            "matrix": [[topo.label(a, b) for b in gpus] for a in gpus],
            "nearest_nic": {f"GPU{g}": n for g, n in topo.nearest_nic},
        },
    }
