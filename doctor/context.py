"""What `gpuctk doctor` looks at (every root and file an option can move) and what layers learn.

`Context` is fixed for a run: the roots of the node's files, so that tests (and a doctor run from
inside a container with the host mounted somewhere) can point every check at a fake tree.
`Findings` carries what a lower layer found to the layers above it (the kernel module's version,
the machine NVML describes, the runtime settings), so that each fact is read once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuctk.cdi.node.machine import Machine
    from gpuctk.hook.config import Settings

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Context:
    driver_root: str = "/"
    dev_root: str = "/"
    proc_root: str = "/proc"
    sys_root: str = "/sys"
    host_root: str = "/"  # prefix of /etc, /var/run, /var/lib/kubelet, /dev/char (not below)
    spec_dirs: tuple[str, ...] = ()  # empty: the runtime config's spec-dirs
    kind: str = "nvidia.com/gpu"
    nvml_library: str | None = None
    simulate: str | None = None
    runtime_config: str | None = None  # None: $GPUCTK_CONFIG, else <host>/etc/gpuctk/config.toml
    runtime_name: str = "nvidia"  # the engine handler name a RuntimeClass selects
    containerd_config: str | None = None
    containerd: str | None = None  # the containerd binary (None: search PATH)
    config_source: str = "auto"  # auto | command | file
    crio_config: str | None = None
    docker_config: str | None = None
    kubelet_root: str | None = None
    runtimeclass_files: tuple[str, ...] = ()
    path: str = field(default_factory=lambda: os.environ.get("PATH") or DEFAULT_PATH)
    probe: bool = False
    probe_rootfs: str = "/"
    probe_device: str = "0"

    def host(self, path: str) -> str:
        """`path` (absolute, host terms) under the host root."""
        if self.host_root in ("", "/"):
            return path
        return os.path.join(self.host_root, path.lstrip("/"))

    def dev(self, path: str) -> str:
        """A /dev path under the dev root."""
        return os.path.normpath(os.path.join(self.dev_root, path.lstrip("/")))

    def proc(self, path: str) -> str:
        """A path relative to /proc (e.g. "driver/nvidia/version") under the proc root."""
        return os.path.join(self.proc_root, path)


@dataclass
class Findings:
    """Facts a layer hands to the layers above it (None: unknown, that layer failed)."""

    kernel_version: str | None = None
    char_majors: dict[str, int] = field(default_factory=dict)  # /proc/devices
    machine: Machine | None = None
    machine_source: str = ""  # "NVML (<library>)" or "profile <name>"
    persistence: tuple[bool | None, ...] = ()  # NVML's persistence mode per GPU (None: unknown)
    settings: Settings | None = None
    settings_source: str = ""
    spec_dirs: tuple[str, ...] = ()
    active_spec: dict[str, Any] | None = None  # the spec document serving the kind
    cdi_devices: frozenset[str] | None = None  # every "<kind>=<name>" the specs resolve
    handlers: dict[str, set[str]] = field(default_factory=dict)  # engine -> handler names
