"""What the plugin advertises: resources (`nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`) and their
devices, named as gpuctk's own CDI spec names them.

MIG strategies, with the meanings of NVIDIA's device plugin (so that a node can swap plugins):

    none    every whole GPU as `nvidia.com/gpu`; MIG-enabled GPUs are left out (their memory and
            SMs belong to their MIG devices, which a container could not use as a whole GPU)
    single  every GPU has MIG on, all MIG devices of one profile: they are `nvidia.com/gpu`
            (a machine that is not like that is refused, as NVIDIA's plugin refuses it)
    mixed   whole GPUs as `nvidia.com/gpu`, MIG devices as `nvidia.com/mig-<profile>`

A device's ID (what the kubelet records and hands back in Allocate) is its UUID, or with
`--device-id-strategy index` its index name (`3`, `1:0` for a MIG device): the names of the
spec's uuid and index naming strategies. Its CDI device is always `<kind>=<UUID>`, the name
`gpuctk cdi generate` writes by default, so one spec serves the plugin, the shim and podman.
"""

from __future__ import annotations

from gpuctk.cdi.node.machine import Machine
from gpuctk.errors import UsageError
from gpuctk.records import record

MIG_STRATEGIES = ("none", "single", "mixed")
ID_STRATEGIES = ("uuid", "index")
DEFAULT_KIND = "nvidia.com/gpu"


@record
class Unit:
    """One device the plugin advertises."""

    id: str  # the ID the kubelet sees
    resource: str  # "nvidia.com/gpu", "nvidia.com/mig-1g.10gb"
    uuid: str  # "GPU-..." or "MIG-..."
    index_name: str  # "3", "1:0"
    gpu: int  # the (parent) GPU's index
    numa_node: int | None
    pci_bus_id: str  # the (parent) GPU's
    gi: int | None = None  # MIG devices: GPU instance id
    cdi_kind: str = DEFAULT_KIND

    @property
    def cdi_name(self) -> str:
        return f"{self.cdi_kind}={self.uuid}"

    @property
    def is_mig(self) -> bool:
        return self.gi is not None


def resource_prefix(resource_name: str) -> str:
    """`nvidia.com/gpu` -> `nvidia.com`: the domain MIG resources are named in."""
    return resource_name.split("/", 1)[0]


def build_units(
    machine: Machine,
    *,
    mig_strategy: str = "none",
    id_strategy: str = "uuid",
    resource_name: str = DEFAULT_KIND,
    cdi_kind: str = DEFAULT_KIND,
) -> dict[str, list[Unit]]:
    """resource name -> its units, in index order. UsageError for a `single` machine that is
    not one; an empty result when there is nothing to advertise."""
    if mig_strategy not in MIG_STRATEGIES:
        raise UsageError(f"unknown MIG strategy {mig_strategy!r}: use none, single or mixed")
    if id_strategy not in ID_STRATEGIES:
        raise UsageError(f"unknown device ID strategy {id_strategy!r}: use uuid or index")
    domain = resource_prefix(resource_name)
    out: dict[str, list[Unit]] = {}

    def add(resource: str, uuid: str, index_name: str, gpu: int, gi: int | None) -> None:
        g = machine.gpus[position[gpu]]
        unit = Unit(
            id=uuid if id_strategy == "uuid" else index_name,
            resource=resource,
            uuid=uuid,
            index_name=index_name,
            gpu=gpu,
            numa_node=g.numa_node,
            pci_bus_id=g.pci_bus_id,
            gi=gi,
            cdi_kind=cdi_kind,
        )
        out.setdefault(resource, []).append(unit)

    position = {g.index: i for i, g in enumerate(machine.gpus)}
    if mig_strategy == "single":
        profiles = {m.profile for m in machine.mig_devices}
        whole = [g.index for g in machine.gpus if not g.mig_enabled]
        if whole or len(profiles) != 1:
            raise UsageError(
                "--mig-strategy single needs MIG on every GPU with one profile everywhere; "
                f"this machine has {len(whole)} GPU(s) without MIG and the MIG profiles "
                f"{', '.join(sorted(profiles)) or 'none'}: use --mig-strategy mixed"
            )
    for g in machine.gpus:
        if not g.mig_enabled:
            add(resource_name, g.uuid, str(g.index), g.index, None)
        elif mig_strategy != "none":
            for m in g.mig_devices:
                resource = (
                    resource_name if mig_strategy == "single" else f"{domain}/mig-{m.profile}"
                )
                add(resource, m.uuid, m.name, g.index, m.gi)
    return out


def socket_name(resource: str) -> str:
    """The plugin's socket file for a resource: `gpuctk-nvidia.com-mig-1g.10gb.sock`."""
    return "gpuctk-" + resource.replace("/", "-") + ".sock"
