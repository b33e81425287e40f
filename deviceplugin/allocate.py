"""Allocate: how the allocated devices reach the container (`--device-list-strategy`, NVIDIA's
names; several may be given):

    cdi-cri          the CDI devices in the response (`nvidia.com/gpu=GPU-...`); the kubelet
                     (1.28+) passes them in the CRI's CDI field, and containerd 1.7.2+ / 2.x
                     or CRI-O apply gpuctk's spec themselves: no runtime class needed
    cdi-annotations  the same names in a `cdi.k8s.io/` annotation (older kubelets; the
                     kubelet drops device-plugin annotations from 1.32)
    envvar           NVIDIA_VISIBLE_DEVICES=<IDs>, for gpuctk-runtime (the shim) or NVIDIA's
    volume-mounts    NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices and one
                     /dev/null mount per device under that folder: what the shim reads when it
                     refuses the variable from unprivileged images (accept-nvidia-visible-
                     devices-as-volume-mounts)

The IDs in envvar and volume-mounts are the device IDs (`--device-id-strategy`), which are
names of gpuctk's spec too (uuid or index strategy).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from gpuctk.deviceplugin.resources import Unit
from gpuctk.deviceplugin.wire import ContainerAllocation, Mount
from gpuctk.errors import RequestError

LIST_STRATEGIES = ("cdi-cri", "cdi-annotations", "envvar", "volume-mounts")
DEFAULT_LIST_STRATEGIES = ("cdi-cri",)
VISIBLE = "NVIDIA_VISIBLE_DEVICES"
DEVICE_LIST_DIR = "/var/run/nvidia-container-devices"
ANNOTATION_PREFIX = "cdi.k8s.io/gpuctk-device-plugin_"


def annotation_key(ids: Sequence[str]) -> str:
    """A `cdi.k8s.io/` key of its own per device set (the name part is at most 63 bytes)."""
    digest = hashlib.sha256("\0".join(ids).encode()).hexdigest()[:16]
    return ANNOTATION_PREFIX + digest


def container_allocation(
    units: Mapping[str, Unit], ids: Sequence[str], strategies: Sequence[str]
) -> ContainerAllocation:
    """The answer for one container asking for `ids`; RequestError for an unknown ID."""
    unknown = [i for i in ids if i not in units]
    if unknown:
        raise RequestError(f"Allocate: unknown device ID(s) {', '.join(unknown)}")
    chosen = [units[i] for i in ids]
    names = tuple(u.cdi_name for u in chosen)
    envs: dict[str, str] = {}
    mounts: list[Mount] = []
    annotations: dict[str, str] = {}
    cdi: tuple[str, ...] = ()
    for strategy in strategies:
        if strategy == "cdi-cri":
            cdi = names
        elif strategy == "cdi-annotations":
            annotations[annotation_key(ids)] = ",".join(names)
        elif strategy == "envvar":
            envs[VISIBLE] = ",".join(ids)
        elif strategy == "volume-mounts":
            envs[VISIBLE] = DEVICE_LIST_DIR
            mounts += [Mount(f"{DEVICE_LIST_DIR}/{i}", "/dev/null", True) for i in ids]
    if "volume-mounts" in strategies and "envvar" in strategies:
        envs[VISIBLE] = DEVICE_LIST_DIR  # the mounts are the list; the variable points at them
    return ContainerAllocation(
        envs=tuple(sorted(envs.items())),
        mounts=tuple(mounts),
        annotations=tuple(sorted(annotations.items())),
        cdi_devices=cdi,
    )


def parse_strategies(values: Sequence[str]) -> tuple[str, ...]:
    """--device-list-strategy values (repeated or comma-separated), checked, in order."""
    out: list[str] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            if part not in LIST_STRATEGIES:
                from gpuctk.errors import UsageError

                raise UsageError(
                    f"--device-list-strategy: unknown {part!r} (use {', '.join(LIST_STRATEGIES)})"
                )
            if part not in out:
                out.append(part)
    return tuple(out) or DEFAULT_LIST_STRATEGIES
