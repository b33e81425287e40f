"""Device nodes for `--simulate` when no real nodes exist: the numbers a real node would have.

Majors follow the driver: 195 for /dev/nvidia*, and the dynamic majors of nvidia-uvm and
nvidia-caps as commonly assigned; MIG capability minors follow the driver's mig-minors layout
(`config 1`, `monitor 2`, then 135 entries per GPU: 15 GPU instances of 1 + 8 compute instances).
"""

from __future__ import annotations

from gpuctk.cdi.generate import NodeLookup
from gpuctk.cdi.node.devnodes import NodeInfo
from gpuctk.cdi.node.machine import Gpu, Machine, MigDevice

NVIDIA_MAJOR = 195
UVM_MAJOR = 510
CAPS_MAJOR = 511
MODE = 0o666


def _node(path: str, major: int, minor: int) -> NodeInfo:
    return NodeInfo(path=path, host_path=path, type="c", major=major, minor=minor, file_mode=MODE)


def mig_cap_minors(gpu_minor: int, gi: int, ci: int) -> tuple[int, int]:
    """(GI access minor, CI access minor) in the driver's mig-minors enumeration."""
    gi_minor = 3 + gpu_minor * 135 + gi * 9
    return gi_minor, gi_minor + 1 + ci


def simulated_nodes(machine: Machine) -> NodeLookup:
    del machine  # the numbers depend only on each GPU's own fields

    def control() -> tuple[NodeInfo, ...]:
        return (
            _node("/dev/nvidiactl", NVIDIA_MAJOR, 255),
            _node("/dev/nvidia-uvm", UVM_MAJOR, 0),
            _node("/dev/nvidia-uvm-tools", UVM_MAJOR, 1),
            _node("/dev/nvidia-modeset", NVIDIA_MAJOR, 254),
        )

    def gpu(g: Gpu) -> tuple[NodeInfo, ...]:
        return (_node(f"/dev/nvidia{g.minor}", NVIDIA_MAJOR, g.minor),)

    def mig(g: Gpu, m: MigDevice) -> tuple[NodeInfo, ...]:
        gi_minor, ci_minor = mig_cap_minors(g.minor, m.gi, m.ci)
        return (
            _node(f"/dev/nvidia{g.minor}", NVIDIA_MAJOR, g.minor),
            _node(f"/dev/nvidia-caps/nvidia-cap{gi_minor}", CAPS_MAJOR, gi_minor),
            _node(f"/dev/nvidia-caps/nvidia-cap{ci_minor}", CAPS_MAJOR, ci_minor),
        )

    return NodeLookup(control=control, gpu=gpu, mig=mig)
