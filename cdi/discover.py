"""Discovery orchestration: where the machine, the driver files and the device nodes come from."""

from __future__ import annotations

import os

from gpuctk.cdi.generate import NodeLookup
from gpuctk.cdi.node.driverfiles import DriverFiles, discover_driver_files
from gpuctk.cdi.node.machine import Machine
from gpuctk.errors import InputError
from gpuctk.records import record

# Where libnvidia-ml.so.1 sits under a driver root (Debian's nvidia/current layout included).
NVML_DIRS = (
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/x86_64-linux-gnu/nvidia/current",
    "lib/x86_64-linux-gnu",
    "usr/lib64",
    "lib64",
    "usr/lib",
    "lib",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib/aarch64-linux-gnu/nvidia/current",
)


@record
class Roots:
    driver_root: str = "/"
    dev_root: str = "/"
    proc_root: str = "/proc"
    sys_root: str = "/sys"


def check_dir(path: str, what: str, flag: str) -> None:
    if not os.path.isdir(path):
        raise InputError(f"{what} {path} is not a directory (check {flag})")
    if not os.access(path, os.R_OK | os.X_OK):
        raise InputError(f"{what} {path} is not readable (check {flag} and permissions)")


def nvml_library_under(driver_root: str) -> str | None:
    """The NVML library inside a driver root other than /, for a containerised driver."""
    if os.path.realpath(driver_root) == "/":
        return None
    for d in NVML_DIRS:
        candidate = os.path.join(driver_root, d, "libnvidia-ml.so.1")
        if os.path.exists(candidate):
            return candidate
    return None


def machine_from_nvml(roots: Roots, nvml_library: str | None) -> Machine:
    from gpuctk.cdi.node import nvml

    return nvml.discover(nvml_library or nvml_library_under(roots.driver_root))


def driver_files(roots: Roots, machine: Machine) -> DriverFiles:
    return discover_driver_files(roots.driver_root, machine.driver_version)


def real_nodes(roots: Roots) -> NodeLookup:
    from gpuctk.cdi.node import devnodes as df

    check_dir(roots.dev_root, "device root", "--dev-root")
    return NodeLookup(
        control=lambda: df.control_nodes(roots.dev_root),
        gpu=lambda g: df.gpu_nodes(roots.dev_root, roots.sys_root, g),
        mig=lambda g, m: (
            df.gpu_nodes(roots.dev_root, roots.sys_root, g)[0],  # the parent's /dev/nvidiaN
            *df.mig_nodes(roots.dev_root, roots.proc_root, g.minor, m.gi, m.ci),
        ),
    )
