"""`gpuctk cdi generate --nics`: a second CDI spec for the node's RDMA network cards.

The NIC spec (kind `nvidia.com/nic` by default, `--nic-kind`) has, in CDI JSON shape:

- one device per RDMA device, named as the kernel names it (`mlx5_0`): its verbs, MAD and
  issm nodes and /dev/infiniband/rdma_cm as deviceNodes, and its network interfaces;
- per GPU, an "affine" device named `gpu<index>` (and the GPU's UUID under the uuid naming
  strategy): the NIC(s) closest to that GPU by PCI topology (gpuctk.cdi.node.topology), taken only
  when they are at most `--nic-affinity` away (NODE by default: never across sockets); only
  for the GPUs `--device-id` selects, when it is given.
  Ask for both: `--device nvidia.com/gpu=0 --device nvidia.com/nic=gpu0`;
- `all`: every NIC.

Network interfaces reach the container in one of two ways (`--nic-mode`):

- `hook` (default): a createRuntime hook entry `gpuctk-hook createRuntime --netdev IF` that
  moves IF into the container's network namespace, and a poststop entry that moves it back
  from a namespace that outlives the container (a pod's) (gpuctk.hook.verbs.netdev). cdiVersion
  stays low.
- `netdevices`: CDI 1.1 `netDevices` entries; the engine moves them. The spec then says
  cdiVersion 1.1.0, which only engines that know CDI 1.1 accept.

The GPU spec is not changed, so its cdiVersion (0.5.0 for podman 4.3.1) is not raised either.
The spec is built from gpuctk.cdi.specs.spec records, as the GPU spec is. This module's top level
imports only click (for the options), those records and gpuctk.cdi.node.facts (the hook
entry's constants, which the generator imports anyway): `gpuctk cdi generate` without `--nics`
pays nothing more.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from gpuctk import log
from gpuctk.cdi.node import facts
from gpuctk.cdi.specs.spec import ContainerEdits, Device, DeviceNode, Hook, NetDevice, Spec

if TYPE_CHECKING:
    from gpuctk.cdi.discover import Roots
    from gpuctk.cdi.generate import Options
    from gpuctk.cdi.node.machine import Gpu, Machine
    from gpuctk.cdi.node.nics import CharNode, Nic
    from gpuctk.cdi.specs.shape import SpecDoc

NIC_MODES = ("hook", "netdevices")
AFFINITIES = ("PIX", "PXB", "PHB", "NODE", "SYS", "off")
DEFAULT_KIND = "nvidia.com/nic"
HOOK_ENV_PATH = facts.HOOK_ENV_PATH

F = Callable[..., Any]


def nic_options(f: F) -> F:
    """The `--nic*` options of `gpuctk cdi generate`, collected in its **nic argument."""
    options = [
        click.option(
            "--nics",
            is_flag=True,
            help="Also write a spec for the RDMA NICs.",
        ),
        click.option(
            "--nic-kind",
            default=DEFAULT_KIND,
            show_default=True,
            help="NIC spec kind.",
        ),
        click.option(
            "--nic-output",
            metavar="PATH",
            help="NIC spec file. Default: beside --output.",
        ),
        click.option(
            "--nic-mode",
            type=click.Choice(NIC_MODES),
            default="hook",
            show_default=True,
            help="How NICs move in.",
        ),
        click.option(
            "--nic-affinity",
            type=click.Choice(AFFINITIES),
            default="NODE",
            show_default=True,
            metavar="LINK",
            help="Farthest GPU link.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _node(node: CharNode, dev_root: str) -> DeviceNode:
    host = None
    if os.path.realpath(dev_root) != "/":
        host = os.path.join(dev_root, node.path.lstrip("/"))
    return DeviceNode(node.path, host_path=host, type="c", major=node.major, minor=node.minor)


def nic_edits(
    nics: list[Nic],
    rdma_cm: CharNode | None,
    *,
    mode: str = "hook",
    hook_path: str = facts.PACKAGED_HOOK,
    dev_root: str = "/",
) -> ContainerEdits:
    """The container edits that give a container `nics`."""
    nodes = [n for nic in nics for n in nic.nodes]
    if rdma_cm is not None and nics:
        nodes.append(rdma_cm)
    device_nodes = tuple(_node(n, dev_root) for n in nodes)
    netdevs = [name for nic in nics for name in nic.netdevs]
    if netdevs and mode == "netdevices":
        net = tuple(NetDevice(n, n) for n in netdevs)
        return ContainerEdits(device_nodes=device_nodes, net_devices=net)
    hooks: tuple[Hook, ...] = ()
    if netdevs:
        flags = tuple(arg for name in netdevs for arg in ("--netdev", name))
        hooks = tuple(
            Hook(stage, hook_path, args=(facts.HOOK_NAME, stage, *flags), env=(HOOK_ENV_PATH,))
            for stage in ("createRuntime", "poststop")
        )
    return ContainerEdits(device_nodes=device_nodes, hooks=hooks)


def closest(gpu: Gpu, nics: tuple[Nic, ...], sys_root: str, limit: str) -> tuple[str, list[Nic]]:
    """(link type, the NICs at that link) nearest `gpu`; ("", []) when none is within `limit`."""
    from gpuctk.cdi.node import topology

    if limit == "off" or not nics:
        return "", []
    links = [
        (topology.distance(sys_root, gpu.pci_bus_id, gpu.numa_node, n.pci_address, n.numa_node), n)
        for n in nics
    ]
    best = min(links, key=lambda x: topology.rank(x[0]))[0]
    if topology.rank(best) > topology.rank(limit):
        return "", []
    return best, [n for link, n in links if link == best]


def build_doc(
    machine: Machine,
    nics: tuple[Nic, ...],
    rdma_cm: CharNode | None,
    *,
    kind: str = DEFAULT_KIND,
    mode: str = "hook",
    affinity: str = "NODE",
    sys_root: str = "/sys",
    dev_root: str = "/",
    hook_path: str = facts.PACKAGED_HOOK,
    uuid_names: bool = True,
    device_ids: tuple[str, ...] = (),
) -> SpecDoc:
    """The NIC spec as a CDI JSON document, cdiVersion set to the minimum it needs.

    NICs with neither device nodes nor interfaces (a soft-RoCE device before its verbs node
    exists) give a container nothing and are left out; NoDevicesError when none is left."""
    from gpuctk.cdi.specs.version import minimum_version
    from gpuctk.errors import NoDevicesError

    nics = usable(nics)
    if not nics:
        raise NoDevicesError("no RDMA device with device nodes or interfaces: no NIC spec")

    def edits(group: list[Nic]) -> ContainerEdits:
        return nic_edits(group, rdma_cm, mode=mode, hook_path=hook_path, dev_root=dev_root)

    devices = [Device(n.name, edits([n])) for n in nics]
    for gpu in machine.gpus:
        if device_ids and not selected(gpu, device_ids):
            continue
        _, near = closest(gpu, nics, sys_root, affinity)
        if not near:
            continue
        names = [f"gpu{gpu.index}"] + ([gpu.uuid] if uuid_names else [])
        devices += [Device(name, edits(near)) for name in names]
    devices.append(Device("all", edits(list(nics))))
    doc = Spec(kind, tuple(devices)).to_dict()
    doc["cdiVersion"] = minimum_version(doc)
    return doc


def usable(nics: tuple[Nic, ...]) -> tuple[Nic, ...]:
    """The NICs that give a container something: device nodes or network interfaces."""
    return tuple(n for n in nics if n.nodes or n.netdevs)


def selected(gpu: Gpu, device_ids: tuple[str, ...]) -> bool:
    """Whether `--device-id` names this GPU or one of its MIG devices (any naming strategy)."""
    names = {str(gpu.index), gpu.uuid, f"gpu{gpu.index}"}
    for mig in gpu.mig_devices:
        names |= {mig.name, mig.uuid, f"mig{mig.name}"}
    return bool(names & set(device_ids))


def nic_output_path(output: str | None, nic_output: str | None) -> str | None:
    """Where the NIC spec goes: --nic-output, else beside --output with '-nic' added."""
    if nic_output or not output:
        return nic_output
    stem, ext = os.path.splitext(output)
    return f"{stem}-nic{ext}"


class NicOutput:
    """A rendered NIC spec and where it goes; `emit()` after the GPU spec is written."""

    def __init__(self, path: str | None, data: bytes, summary: str) -> None:
        self.path, self.data, self.summary = path, data, summary

    def emit(self) -> None:
        import sys

        from gpuctk.writes import atomic_write

        if self.path:
            atomic_write(self.path, self.data, 0o644)
            log.say(f"gpuctk: wrote {self.path}: {self.summary}")
        else:
            sys.stdout.buffer.write(self.data)
            sys.stdout.flush()
            log.say(f"gpuctk: {self.summary}")


def build(
    machine: Machine,
    opts: Options,
    roots: Roots,
    output: str | None,
    fmt: str,
    nic: dict[str, Any],
) -> NicOutput | None:
    """Discover the NICs and render their spec (nothing written yet); None without --nics."""
    if not nic.get("nics"):
        return None
    from gpuctk.cdi.node import nics as nic_discovery
    from gpuctk.cdi.specs.names import kind_problem
    from gpuctk.errors import OutputError, UsageError

    kind = nic["nic_kind"]
    problem = kind_problem(kind)
    if problem or kind == opts.kind:
        why = problem or f"it is the GPU spec's kind {opts.kind}"
        raise UsageError(f"--nic-kind {kind!r}: {why} (example: --nic-kind nvidia.com/nic)")
    path = nic_output_path(output, nic.get("nic_output"))
    if path is None and fmt == "json":
        raise UsageError("--nics with JSON on standard output: give --output or --nic-output")
    if path:
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise OutputError(f"cannot write {path}: folder {folder} is missing or not writable")
    everything = nic_discovery.discover(roots.sys_root)
    found = usable(everything)
    skipped = [n.name for n in everything if n not in found]
    if skipped:
        log.warning(
            f"--nics: {', '.join(skipped)}: no device nodes and no network interfaces: left out"
        )
    if not found:
        log.warning(
            f"--nics: no usable RDMA device under "
            f"{roots.sys_root}/class/infiniband; no NIC spec written"
        )
        return None
    if nic["nic_mode"] == "hook" and nic_discovery.exclusive_netns_mode(roots.sys_root):
        log.warning(
            "the RDMA subsystem is in exclusive network-namespace mode "
            "(`rdma system set netns exclusive`): gpuctk-hook will refuse to move a netdev "
            "away from its RDMA device; use `rdma system set netns shared`"
        )
    doc = build_doc(
        machine,
        found,
        nic_discovery.rdma_cm_node(roots.sys_root),
        kind=kind,
        mode=nic["nic_mode"],
        affinity=nic["nic_affinity"],
        sys_root=roots.sys_root,
        dev_root=roots.dev_root,
        hook_path=opts.hook_path,
        uuid_names="uuid" in opts.name_strategies,
        device_ids=opts.device_ids,
    )
    affine = sum(1 for d in doc["devices"] if d["name"].startswith("gpu"))
    summary = (
        f"{len(doc['devices'])} NIC devices for {len(found)} RDMA device(s), "
        f"{affine} GPU-affine; cdiVersion {doc['cdiVersion']}"
    )
    return NicOutput(path, render_doc(doc, "yaml" if path is None else fmt), summary)


def render_doc(doc: SpecDoc, fmt: str) -> bytes:
    """YAML (with a leading ---, so that it can follow the GPU spec on stdout) or JSON."""
    if fmt == "json":
        import json

        return (json.dumps(doc, indent=2) + "\n").encode()
    from gpuctk.cdi.specs import yamlout

    return yamlout.dump(doc).encode()
