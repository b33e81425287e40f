"""`gpuctk cdi generate --mode management`: one `all` device with every NVIDIA device node.

For monitoring pods (the DCGM exporter, nvidia-smi dashboards) that see every GPU without
being scheduled on one, as the reference toolkit's management mode: kind
`management.nvidia.com/gpu`, the `all` device holds the GPUs' nodes, the control nodes, the
capability nodes and the IMEX channels found under the dev root (NVSwitch, NVLink and
nvidia-fs nodes are left out); the common edits mount the utility driver files (NVML,
nvidia-smi) only, unless --driver-capabilities names more.
"""

from __future__ import annotations

import os
import re
import stat

from gpuctk.cdi.generate import NodeLookup, Options, common_edits
from gpuctk.cdi.node.devnodes import NodeInfo
from gpuctk.cdi.node.driverfiles import DriverFiles
from gpuctk.cdi.node.machine import Machine
from gpuctk.cdi.specs.spec import ContainerEdits, Device, DeviceNode, Spec
from gpuctk.errors import NoDevicesError
from gpuctk.records import replace

VENDOR = "management.nvidia.com"
# (folder under /dev, node names taken from it)
PATTERNS = (
    ("/dev", re.compile(r"nvidia(?:[0-9]{1,4}|ctl|-modeset|-uvm|-uvm-tools)")),
    ("/dev/nvidia-caps", re.compile(r"nvidia-cap[0-9]{1,7}")),
    ("/dev/nvidia-caps-imex-channels", re.compile(r"channel[0-9]{1,7}")),
)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def scan_nodes(dev_root: str) -> tuple[NodeInfo, ...]:
    """Every NVIDIA character device under `dev_root` that a management container gets."""
    found: list[NodeInfo] = []
    for folder, pattern in PATTERNS:
        host_folder = os.path.join(dev_root, folder.lstrip("/"))
        for name in sorted(n for n in _listdir(host_folder) if pattern.fullmatch(n)):
            host = os.path.normpath(os.path.join(host_folder, name))
            try:
                st = os.stat(host, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode):
                found.append(
                    NodeInfo(
                        f"{folder}/{name}", host, "c", os.major(st.st_rdev),
                        os.minor(st.st_rdev), stat.S_IMODE(st.st_mode),
                    )
                )  # fmt: skip
    return tuple(found)


def lookup_nodes(machine: Machine, nodes: NodeLookup) -> tuple[NodeInfo, ...]:
    """The nodes a NodeLookup (the simulated one) gives: control, every GPU, every MIG device."""
    out: dict[str, NodeInfo] = {n.path: n for n in nodes.control()}
    for gpu in machine.gpus:
        for n in nodes.gpu(gpu):
            out.setdefault(n.path, n)
        for mig in gpu.mig_devices:
            for n in nodes.mig(gpu, mig):
                out.setdefault(n.path, n)
    return tuple(out.values())


def build(machine: Machine, files: DriverFiles, opts: Options, found: tuple[NodeInfo, ...]) -> Spec:
    """The management spec: `all` with `found`, and the common edits of `files`."""
    from gpuctk.cdi.specs.version import minimum_version

    if not any(n.path.startswith("/dev/nvidia") for n in found):
        raise NoDevicesError(
            "no NVIDIA device node found under the dev root (is the driver loaded, "
            "and is --dev-root right?); no spec written"
        )
    nodes = tuple(
        DeviceNode(
            n.path, n.host_path if n.host_path != n.path else None, n.type, n.major, n.minor,
            n.file_mode,
        )
        for n in found
    )  # fmt: skip
    none = NodeLookup(control=lambda: (), gpu=lambda g: (), mig=lambda g, m: ())
    spec = Spec(
        kind=opts.kind,
        devices=(Device("all", ContainerEdits(device_nodes=nodes)),),
        edits=common_edits(machine, files, opts, none),
    )
    return replace(spec, version=minimum_version(spec.to_dict()))
