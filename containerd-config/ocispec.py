"""Hook entries and the base OCI spec for `--mode hook` (no shim: the runtime runs the hook).

containerd's CRI plugin starts every container of a handler from that handler's
`base_runtime_spec` file, so a complete default spec that carries `gpuctk-hook prestart` makes
runc run the hook for every container of the handler. The spec below is containerd's own default
Linux spec (what `ctr oci spec` prints) without `cgroupsPath`, which CRI sets per container.

Every hook entry has an explicit, non-empty `env`: runc 1.2 and older give a hook with an empty
env the container's environment (LD_PRELOAD and all). The hook reads /etc/gpuctk/config.toml
(spec dirs and the rest) like the shim; `--hook-config PATH` names another file, which the entry
passes as GPUCTK_CONFIG, since a hook gets no environment but its entry's.
"""

from __future__ import annotations

import json
from typing import Any

HOOK_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
HOOK_VERB = "prestart"
CONFIG_ENV = "GPUCTK_CONFIG"  # gpuctk.hook.config.ENV_VAR (containerd must not import gpuctk.hook)

_CAPS = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
]


def hook_entry(hook_path: str, config: str | None = None) -> dict[str, Any]:
    """The OCI hook entry that runs `gpuctk-hook prestart` (with GPUCTK_CONFIG=config if given)."""
    env = [*HOOK_ENV, f"{CONFIG_ENV}={config}"] if config else list(HOOK_ENV)
    return {"path": hook_path, "args": ["gpuctk-hook", HOOK_VERB], "env": env}


def _mount(destination: str, type_: str, source: str, options: list[str]) -> dict[str, Any]:
    return {"destination": destination, "type": type_, "source": source, "options": options}


def base_spec(hook_path: str, config: str | None = None) -> dict[str, Any]:
    """containerd's default Linux spec with the gpuctk prestart hook."""
    return {
        "ociVersion": "1.0.2-dev",
        "process": {
            "user": {"uid": 0, "gid": 0},
            "cwd": "/",
            "capabilities": {
                "bounding": list(_CAPS),
                "effective": list(_CAPS),
                "permitted": list(_CAPS),
            },
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs"},
        "hooks": {"prestart": [hook_entry(hook_path, config)]},
        "mounts": [
            _mount("/proc", "proc", "proc", ["nosuid", "noexec", "nodev"]),
            _mount("/dev", "tmpfs", "tmpfs", ["nosuid", "strictatime", "mode=755", "size=65536k"]),
            _mount(
                "/dev/pts",
                "devpts",
                "devpts",
                ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
            ),
            _mount(
                "/dev/shm",
                "tmpfs",
                "shm",
                ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
            ),
            _mount("/dev/mqueue", "mqueue", "mqueue", ["nosuid", "noexec", "nodev"]),
            _mount("/sys", "sysfs", "sysfs", ["nosuid", "noexec", "nodev", "ro"]),
            _mount("/run", "tmpfs", "tmpfs", ["nosuid", "strictatime", "mode=755", "size=65536k"]),
        ],
        "linux": {
            "resources": {"devices": [{"allow": False, "access": "rwm"}]},
            "namespaces": [
                {"type": "pid"},
                {"type": "ipc"},
                {"type": "uts"},
                {"type": "mount"},
                {"type": "network"},
            ],
            "maskedPaths": [
                "/proc/acpi",
                "/proc/asound",
                "/proc/kcore",
                "/proc/keys",
                "/proc/latency_stats",
                "/proc/timer_list",
                "/proc/timer_stats",
                "/proc/sched_debug",
                "/sys/firmware",
                "/proc/scsi",
            ],
            "readonlyPaths": [
                "/proc/bus",
                "/proc/fs",
                "/proc/irq",
                "/proc/sys",
                "/proc/sysrq-trigger",
            ],
        },
    }


def dumps(data: Any) -> bytes:
    """JSON as the tool writes it: 4-space indent, key order kept, trailing newline."""
    return (json.dumps(data, indent=4, ensure_ascii=False) + "\n").encode("utf-8")
