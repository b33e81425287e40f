"""Discovery orchestration: where the machine, the driver files and the device nodes come from."""

from __future__ import annotations

import os
import sys

from gpuctk import log
from gpuctk.cdi.generate import NodeLookup
from gpuctk.cdi.node.driverfiles import DriverFiles, discover_driver_files
from gpuctk.cdi.node.driverpaths import PREFIXES
from gpuctk.cdi.node.driverroot import resolve_in_root
from gpuctk.cdi.node.machine import Machine
from gpuctk.errors import InputError
from gpuctk.records import record

NVML_NAME = "libnvidia-ml.so.1"
# Where libnvidia-ml.so.1 sits under a driver root (Debian's nvidia/current layout included, and
# the driver prefixes of GKE and COS: <prefix>/lib64), after the root's own ld cache.
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
    *(f"{p.lstrip('/')}/lib64" for p in PREFIXES),
)

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: --simulate runs never import typing here
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeVar

    T = TypeVar("T")


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


def find_nvml(driver_root: str) -> tuple[str | None, tuple[str, ...]]:
    """(the host path of the driver root's libnvidia-ml.so.1, or None; where it looked).

    The root's own ld cache first (<root>/etc/ld.so.cache, its paths resolved inside the root,
    as the root's loader would), then NVML_DIRS. Only a real file of this process's word size
    counts (a 32-bit compat NVML cannot be loaded here); symlinks are followed inside the root.
    """
    from gpuctk.cdi.node.elf import elf_info
    from gpuctk.cdi.node.ldcache import read_ld_cache

    root = os.path.abspath(driver_root)
    prefix = "" if root == "/" else root.rstrip("/")
    bits = 64 if sys.maxsize > 2**32 else 32

    def usable(path: str) -> str | None:
        real = resolve_in_root(root, path)
        if real is None:
            return None
        info = elf_info(prefix + real)
        return prefix + real if info is not None and info.elf_class == bits else None

    cache_path = f"{prefix}/etc/ld.so.cache"
    looked = [cache_path]
    cache = resolve_in_root(root, "/etc/ld.so.cache")
    try:
        entries = read_ld_cache(prefix + cache) if cache is not None else ()
    except (OSError, ValueError):
        entries = ()
    for entry in entries:
        if entry.key == NVML_NAME:
            found = usable(entry.value)
            if found is not None:
                return found, tuple(looked)
    for folder in NVML_DIRS:
        looked.append(f"{prefix}/{folder}")
        found = usable(f"/{folder}/{NVML_NAME}")
        if found is not None:
            return found, tuple(looked)
    return None, tuple(looked)


def nvml_library_under(driver_root: str) -> str | None:
    """The NVML library inside a driver root other than /, for a containerised or prefixed
    driver (find_nvml); None for / (the loader's own search comes first there)."""
    if os.path.realpath(driver_root) == "/":
        return None
    return find_nvml(driver_root)[0]


def load_nvml(roots: Roots, nvml_library: str | None,
              read: Callable[[str | None], T]) -> tuple[T, str]:  # fmt: skip
    """(`read(library)`, the library's name): `read` gets the NVML library for the driver root.

    --nvml-library when given; else, for a root other than /, the root's own (find_nvml); else
    the one this process's loader finds; else, for /, a driver prefix's (find_nvml: a GKE or
    COS node whose loader does not list the prefix's lib64). NvmlError saying where it looked,
    and what to pass, when there is none anywhere.
    """
    from gpuctk.cdi.node.nvml import LIBRARY_NAME, LibraryNotFound

    if nvml_library:
        log.debug(f"NVML: loading {nvml_library} (--nvml-library)")
        return read(nvml_library), nvml_library
    host = os.path.realpath(roots.driver_root) == "/"
    looked: tuple[str, ...] = ()
    if not host:
        found, looked = find_nvml(roots.driver_root)
        if found is not None:
            log.debug(f"NVML: loading {found} (found under the driver root {roots.driver_root})")
            return read(found), found
    try:
        log.debug(f"NVML: loading {LIBRARY_NAME} (the loader's search: ld cache, system folders)")
        return read(None), LIBRARY_NAME
    except LibraryNotFound:
        pass
    if host:
        found, looked = find_nvml("/")
        if found is not None:
            log.debug(f"NVML: loading {found} (the loader has none; found in a driver prefix)")
            return read(found), found
    where = f"{looked[0]}, the folders {', '.join(looked[1:])}" if looked else "nowhere"
    hint = "use --driver-root for a containerised driver (/run/nvidia/driver), or " if host else ""
    raise LibraryNotFound(
        f"NVML library {NVML_NAME} not found: is the NVIDIA driver installed? looked in "
        f"{where} and the loader's own paths; {hint}pass --nvml-library PATH (the driver's "
        f"{NVML_NAME})"
    )


def machine_from_nvml(roots: Roots, nvml_library: str | None) -> Machine:
    from gpuctk.cdi.node import nvml

    return load_nvml(roots, nvml_library, nvml.discover)[0]


def trace(roots: Roots, machine: Machine, source: str) -> None:
    """--debug: the roots used and each device found (`source`: NVML or a profile)."""
    log.debug(f"driver root {roots.driver_root}, dev root {roots.dev_root}, proc root "
              f"{roots.proc_root}, sys root {roots.sys_root}")  # fmt: skip
    log.debug(f"{source}: driver {machine.driver_version}, CUDA {machine.cuda_driver_version}, "
              f"{len(machine.gpus)} GPU(s)")  # fmt: skip
    for g in machine.gpus:
        mig = f", MIG on ({len(g.mig_devices)} device(s))" if g.mig_enabled else ""
        log.debug(f"GPU {g.index}: {g.name} {g.uuid} /dev/nvidia{g.minor} {g.pci_bus_id}{mig}")
        for m in g.mig_devices:
            log.debug(f"MIG device {m.name}: {m.profile} {m.uuid} gi {m.gi} ci {m.ci}")


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
