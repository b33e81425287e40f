"""The discovered machine: frozen records, the one thing discovery hands to generation.

Both sources of truth produce these records: NVML through pynvml (gpuctk.cdi.node.nvml) and the
embedded machine profiles used by --simulate (gpuctk.cdi.node.profile). Tests check that the two
agree
for every profile, through a fake libnvidia-ml.so.1.
"""

from __future__ import annotations

from gpuctk.records import record


@record
class MigDevice:
    """One MIG device (a GPU instance + compute instance pair) of a parent GPU."""

    parent_index: int  # index of the parent GPU
    index: int  # position among the parent's MIG devices (NVML's MIG handle index)
    gi: int  # GPU instance id
    ci: int  # compute instance id
    uuid: str  # "MIG-..."
    profile: str  # "1g.10gb", or "1c.2g.20gb" when the CI is smaller than its GI
    memory_mib: int

    @property
    def name(self) -> str:
        """The index-strategy name, `<gpu>:<mig>`."""
        return f"{self.parent_index}:{self.index}"


@record
class Gpu:
    """One physical GPU as NVML reports it."""

    index: int
    minor: int  # /dev/nvidia<minor>
    uuid: str  # "GPU-..."
    pci_bus_id: str  # "00000000:18:00.0" (NVML's busId form, lower case)
    name: str  # "NVIDIA H100 80GB HBM3"
    architecture: str  # "hopper", "ampere", "ada", ...
    compute_capability: tuple[int, int]  # (9, 0)
    memory_mib: int
    numa_node: int | None
    mig_enabled: bool
    mig_devices: tuple[MigDevice, ...] = ()

    @property
    def compute_capability_str(self) -> str:
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"


@record
class Machine:
    """Everything NVML says about the node that the spec depends on."""

    driver_version: str  # "535.309.01"
    cuda_driver_version: str  # "12.2"
    gpus: tuple[Gpu, ...]

    @property
    def mig_devices(self) -> tuple[MigDevice, ...]:
        return tuple(m for g in self.gpus for m in g.mig_devices)
