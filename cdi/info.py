"""`gpuctk info`: the machine as gpuctk sees it: driver, GPUs, MIG devices, RDMA NICs, topology.

The same discovery as `gpuctk cdi generate` (NVML through pynvml, or `--simulate PROFILE`), plus
sysfs for the PCI topology (gpuctk.cdi.node.topology) and the RDMA cards (gpuctk.cdi.node.nics). The
topology matrix names links as `nvidia-smi topo -m` does (X, PIX, PXB, PHB, NODE, SYS; PCIe only:
NVLink is not read). Output: tables, or one JSON document (`--format json`, stable keys).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

import click

from gpuctk.cdi import cliopts

if TYPE_CHECKING:
    from gpuctk.cdi.node.machine import Machine
    from gpuctk.cdi.node.nics import Nic


def _gpu_dict(gpu: Any, dev_root: str) -> dict[str, Any]:
    node = f"/dev/nvidia{gpu.minor}"
    return {
        "index": gpu.index,
        "name": gpu.name,
        "uuid": gpu.uuid,
        "pci_bus_id": gpu.pci_bus_id,
        "numa_node": gpu.numa_node,
        "architecture": gpu.architecture,
        "compute_capability": gpu.compute_capability_str,
        "memory_mib": gpu.memory_mib,
        "mig_enabled": gpu.mig_enabled,
        "device_node": node,
        "device_node_present": os.path.exists(os.path.join(dev_root, node.lstrip("/"))),
    }


def _nic_dict(nic: Nic, dev_root: str) -> dict[str, Any]:
    return {
        "name": nic.name,
        "pci_address": nic.pci_address,
        "numa_node": nic.numa_node,
        "netdevs": list(nic.netdevs),
        "link_layers": list(nic.link_layers),
        "device_nodes": [
            {
                "path": n.path,
                "major": n.major,
                "minor": n.minor,
                "present": os.path.exists(os.path.join(dev_root, n.path.lstrip("/"))),
            }
            for n in nic.nodes
        ],
    }


def describe(
    machine: Machine, nics: tuple[Nic, ...], *, sys_root: str, dev_root: str, source: str
) -> dict[str, Any]:
    """The whole report as a JSON-ready dict (pure over its inputs and the sysfs tree)."""
    from gpuctk.cdi.node import topology
    from gpuctk.cdi.node.nics import exclusive_netns_mode

    units: list[tuple[str, str | None, int | None]] = [
        (f"GPU{g.index}", g.pci_bus_id, g.numa_node) for g in machine.gpus
    ]
    units += [(f"NIC{i}", n.pci_address, n.numa_node) for i, n in enumerate(nics)]
    matrix = [
        ["X" if a == b else topology.distance(sys_root, pa, na, pb, nb) for (b, pb, nb) in units]
        for (a, pa, na) in units
    ]
    return {
        "source": source,
        "driver_version": machine.driver_version,
        "cuda_driver_version": machine.cuda_driver_version,
        "gpus": [_gpu_dict(g, dev_root) for g in machine.gpus],
        "mig_devices": [
            {
                "name": m.name,
                "parent_index": m.parent_index,
                "uuid": m.uuid,
                "profile": m.profile,
                "gi": m.gi,
                "ci": m.ci,
                "memory_mib": m.memory_mib,
            }
            for m in machine.mig_devices
        ],
        "nics": [_nic_dict(n, dev_root) for n in nics],
        "rdma_netns_mode": (
            None if not nics else "exclusive" if exclusive_netns_mode(sys_root) else "shared"
        ),
        "topology": {
            "devices": [u[0] for u in units],
            "numa_nodes": [u[2] for u in units],
            "matrix": matrix,
            "legend": dict(topology.LINK_HELP),
        },
    }


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=False)]
    return [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in (headers, *rows)
    ]


def _mib(record: dict[str, Any]) -> str:
    return f"{record['memory_mib']} MiB"


def _opt(value: object) -> str:
    return "-" if value is None or value == [] else str(value)


def render_text(report: dict[str, Any]) -> str:
    """Human-readable tables of `report` (the dict from describe)."""
    out = [
        f"Driver {report['driver_version']}  CUDA {report['cuda_driver_version']}  "
        f"(source: {report['source']})",
        "",
        "GPUs",
    ]
    out += _table(
        ["IDX", "NAME", "UUID", "PCI", "NUMA", "CC", "MEMORY", "MIG", "NODE"],
        [
            [
                str(g["index"]),
                g["name"],
                g["uuid"],
                g["pci_bus_id"],
                _opt(g["numa_node"]),
                g["compute_capability"],
                _mib(g),
                "on" if g["mig_enabled"] else "off",
                g["device_node"] + ("" if g["device_node_present"] else " (missing)"),
            ]
            for g in report["gpus"]
        ],
    )
    if report["mig_devices"]:
        out += ["", "MIG devices"]
        out += _table(
            ["NAME", "PROFILE", "UUID", "GI", "CI", "MEMORY"],
            [
                [m["name"], m["profile"], m["uuid"], str(m["gi"]), str(m["ci"]), _mib(m)]
                for m in report["mig_devices"]
            ],
        )
    if report["nics"]:
        out += ["", f"RDMA NICs (netns mode: {report['rdma_netns_mode']})"]
        out += _table(
            ["NIC", "NAME", "PCI", "NUMA", "LINK", "NETDEVS", "NODES"],
            [
                [
                    f"NIC{i}",
                    n["name"],
                    _opt(n["pci_address"]),
                    _opt(n["numa_node"]),
                    ",".join(n["link_layers"]) or "-",
                    ",".join(n["netdevs"]) or "-",
                    " ".join(os.path.basename(d["path"]) for d in n["device_nodes"]) or "-",
                ]
                for i, n in enumerate(report["nics"])
            ],
        )
    topo = report["topology"]
    out += ["", "Topology (PCIe, as nvidia-smi topo -m)"]
    out += _table(
        ["", *topo["devices"], "NUMA"],
        [
            [name, *row, _opt(numa)]
            for name, row, numa in zip(
                topo["devices"], topo["matrix"], topo["numa_nodes"], strict=True
            )
        ],
    )
    out += ["", "Legend:"]
    out += [f"  {k:<4}  {v}" for k, v in topo["legend"].items()]
    return "\n".join(out) + "\n"


@click.command("info")
@cliopts.table_or_json("Tables for people, or one JSON document for scripts.")
@cliopts.simulate(
    "Use an embedded machine profile instead of NVML (h100-8, h100-8-mig7, a100-mig, l4, "
    "or a profile .yaml path)."
)
@cliopts.driver_root("Root of the driver files and the NVML library (e.g. /run/nvidia/driver).")
@cliopts.dev_root("Root under which /dev/nvidia* and /dev/infiniband/* are looked for.")
@cliopts.sys_root("Where /sys is (PCI topology, RDMA devices).")
@cliopts.nvml_library
def info(
    fmt: str,
    simulate: str | None,
    driver_root: str,
    dev_root: str,
    sys_root: str,
    nvml_library: str | None,
) -> None:
    """Show the GPUs, MIG devices, driver, RDMA NICs and PCI topology gpuctk finds.

    \b
    The topology matrix uses nvidia-smi's names: PIX (same PCIe switch), PXB (several
    switches), PHB (through the CPU's host bridge), NODE (same NUMA node), SYS (across
    sockets). A GPU and a NIC at PIX or PXB suit GPUDirect RDMA best.

    \b
    Examples:
      gpuctk info
      gpuctk info --format json | jq '.topology'
      gpuctk info --simulate h100-8          # no GPU needed
    """
    import json

    from gpuctk.cdi import discover
    from gpuctk.cdi.discover import Roots
    from gpuctk.cdi.node import nics

    discover.check_dir(driver_root, "driver root", "--driver-root")
    if simulate:
        from gpuctk.cdi.node.profile import load_profile

        machine = load_profile(simulate)
        source = f"simulated profile {simulate}"
    else:
        machine = discover.machine_from_nvml(
            Roots(driver_root, dev_root, sys_root=sys_root), nvml_library
        )
        source = "NVML"
    found = nics.discover(sys_root)
    report = describe(machine, found, sys_root=sys_root, dev_root=dev_root, source=source)
    if fmt == "json":
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        sys.stdout.write(render_text(report))
