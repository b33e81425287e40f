"""NVIDIA device nodes: control nodes, each GPU's nodes, MIG capability nodes.

Nodes are found under a dev root (`/` on the host, or where a containerised driver keeps them)
and described from the host node itself (os.stat: st_rdev, S_IMODE), so the spec carries what
the kernel really assigned. A GPU's DRM nodes come from sysfs
(`<sys>/bus/pci/devices/<bdf>/drm/{cardN,renderDN}`); MIG capability minors from
`<proc>/driver/nvidia-caps/mig-minors`.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from types import MappingProxyType

from gpuctk.cdi.node.machine import Gpu
from gpuctk.errors import InputError
from gpuctk.records import record

StrPath = str | os.PathLike[str]

CONTROL_NODES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)
MIG_MINORS = "driver/nvidia-caps/mig-minors"  # under the proc root
MAX_MIG_MINORS_SIZE = 4 << 20  # the full table for 32 GPUs is about 110 KB

_MIG_CAP = re.compile(r"(?:config|monitor|gpu\d{1,4}/gi\d{1,4}(?:/ci\d{1,4})?/access)")
_DRM_NODE = re.compile(r"(?:card|renderD)\d{1,6}")


@record
class NodeInfo:
    """One device node: its path in the container, its path on the host, and its identity."""

    path: str  # /dev/nvidia0
    host_path: str  # the same node under the dev root
    type: str  # "c"
    major: int
    minor: int
    file_mode: int  # permission bits of the host node, e.g. 0o666
    gid: int = 0  # the host node's group (--additional-gids: gpuctk.cdi.generate.group_gids)
    uid: int = 0  # the host node's owner


def _join(root: StrPath, path: str) -> str:
    return os.path.join(os.fspath(root), path.lstrip("/"))


def _node(dev_root: StrPath, path: str) -> NodeInfo | None:
    """The char device `path` (container form) under `dev_root`, or None if absent."""
    host = _join(dev_root, path)
    try:
        st = os.stat(host)
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        return None
    return NodeInfo(
        path=path,
        host_path=os.path.normpath(host),
        type="c",
        major=os.major(st.st_rdev),
        minor=os.minor(st.st_rdev),
        file_mode=stat.S_IMODE(st.st_mode),
        gid=st.st_gid,
        uid=st.st_uid,
    )


def _required(dev_root: StrPath, path: str, what: str) -> NodeInfo:
    node = _node(dev_root, path)
    if node is None:
        raise InputError(
            f"{what}: device node {_join(dev_root, path)} is missing or not a character "
            "device (is the NVIDIA driver loaded, and is --dev-root right?)"
        )
    return node


def control_nodes(dev_root: StrPath) -> tuple[NodeInfo, ...]:
    """nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset: those present, in that order."""
    return tuple(n for n in (_node(dev_root, p) for p in CONTROL_NODES) if n is not None)


def sysfs_bus_id(pci_bus_id: str) -> str:
    """NVML's "00000000:18:00.0" as sysfs spells it, "0000:18:00.0" (lower case)."""
    bus_id = pci_bus_id.strip().lower()
    domain, sep, rest = bus_id.partition(":")
    if not sep or not re.fullmatch(r"[0-9a-f]{1,8}", domain):
        raise InputError(f"malformed PCI bus id {pci_bus_id!r}")
    return f"{int(domain, 16):04x}:{rest}"


def drm_nodes(dev_root: StrPath, sys_root: StrPath, pci_bus_id: str) -> tuple[NodeInfo, ...]:
    """The DRM card and render nodes of the GPU at `pci_bus_id`, as sysfs lists them."""
    drm = os.path.join(os.fspath(sys_root), "bus/pci/devices", sysfs_bus_id(pci_bus_id), "drm")
    try:
        names = sorted(n for n in os.listdir(drm) if _DRM_NODE.fullmatch(n))
    except OSError:
        return ()
    found = (_node(dev_root, f"/dev/dri/{n}") for n in names)
    return tuple(n for n in found if n is not None)


def gpu_nodes(dev_root: StrPath, sys_root: StrPath, gpu: Gpu) -> tuple[NodeInfo, ...]:
    """/dev/nvidia<minor> (required) then the GPU's DRM card and render nodes (if present)."""
    main = _required(dev_root, f"/dev/nvidia{gpu.minor}", f"GPU {gpu.index} ({gpu.uuid})")
    return (main, *drm_nodes(dev_root, sys_root, gpu.pci_bus_id))


def parse_mig_minors(text: str) -> dict[str, int]:
    """The mig-minors table, `{"gpu0/gi1/access": 12, "config": 1, ...}`.

    Lines that do not have the driver's form (`<cap> <minor>`) are skipped, as the reference
    toolkit does; the file is small and read whole, so nothing here is unbounded.
    """
    table: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2 or not _MIG_CAP.fullmatch(parts[0]):
            continue
        if not parts[1].isdigit() or len(parts[1]) > 9:
            continue
        table[parts[0]] = int(parts[1])
    return table


_cache: dict[tuple[str, int, int, int], Mapping[str, int]] = {}


def read_mig_minors(proc_root: StrPath) -> Mapping[str, int]:
    """`parse_mig_minors` of `<proc_root>/driver/nvidia-caps/mig-minors`, memoised per file."""
    path = os.path.join(os.fspath(proc_root), MIG_MINORS)
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            key = (path, st.st_ino, st.st_mtime_ns, st.st_size)
            if key in _cache:
                return _cache[key]
            data = f.read(MAX_MIG_MINORS_SIZE + 1)
    except OSError as exc:
        raise InputError(
            f"cannot read the MIG capability table {path}: {exc.strerror or exc} "
            "(MIG devices need the nvidia-caps driver; is --proc-root right?)"
        ) from exc
    if len(data) > MAX_MIG_MINORS_SIZE:
        raise InputError(
            f"{path} is larger than {MAX_MIG_MINORS_SIZE} bytes: not a mig-minors file"
        )
    table = MappingProxyType(parse_mig_minors(data.decode("ascii", "replace")))
    if len(_cache) > 16:
        _cache.clear()
    _cache[key] = table
    return table


def mig_nodes(
    dev_root: StrPath, proc_root: StrPath, gpu_minor: int, gi: int, ci: int
) -> tuple[NodeInfo, ...]:
    """The GPU-instance and compute-instance capability nodes of one MIG device."""
    table = read_mig_minors(proc_root)
    nodes = []
    for cap in (f"gpu{gpu_minor}/gi{gi}/access", f"gpu{gpu_minor}/gi{gi}/ci{ci}/access"):
        minor = table.get(cap)
        if minor is None:
            raise InputError(
                f"{os.path.join(os.fspath(proc_root), MIG_MINORS)} has no entry {cap} "
                "(is the MIG device still there?)"
            )
        path = f"/dev/nvidia-caps/nvidia-cap{minor}"
        nodes.append(_required(dev_root, path, f"MIG capability {cap}"))
    return tuple(nodes)
