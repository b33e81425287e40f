"""`gpuctk cdi generate --mode imex`: one device per IMEX channel, as the reference toolkit.

IMEX channels (/dev/nvidia-caps-imex-channels/channelN) let containers on several nodes of a
multi-node NVLink domain share GPU memory. The spec's kind is `nvidia.com/imex-channel`; each
channel node found under --dev-root is a device named by its number, plus `all`. A node whose
major is not the one /proc/devices gives `nvidia-caps-imex-channels` is not a channel, nor is
any node when /proc/devices names no such driver (left over from an earlier load).
"""

from __future__ import annotations

import os
import re
import stat

from gpuctk.cdi.specs.spec import ContainerEdits, Device, DeviceNode, Spec
from gpuctk.errors import NoDevicesError, UsageError
from gpuctk.records import replace

CLASS = "imex-channel"
FOLDER = "/dev/nvidia-caps-imex-channels"
DRIVER = "nvidia-caps-imex-channels"  # its name in /proc/devices
MAX_CHANNEL = (1 << 20) - 1  # the minor number of a dev_t
_CHANNEL = re.compile(r"channel([0-9]{1,7})")


def channel_nodes(dev_root: str, proc_root: str) -> dict[int, DeviceNode]:
    """Channel number -> its node, for every channel node under `dev_root`."""
    from gpuctk.cdi.node.devchar import read_char_majors

    majors = read_char_majors(proc_root)
    major = majors.get(DRIVER)
    if majors and major is None:  # read, without the IMEX driver: any node there is stale
        return {}
    folder = os.path.join(dev_root, FOLDER.lstrip("/"))
    try:
        names = os.listdir(folder)
    except OSError:
        names = []
    out: dict[int, DeviceNode] = {}
    for name in names:
        m = _CHANNEL.fullmatch(name)
        if not m or int(m.group(1)) > MAX_CHANNEL:
            continue
        host = os.path.normpath(os.path.join(folder, name))
        try:
            st = os.stat(host, follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISCHR(st.st_mode) or major not in (None, os.major(st.st_rdev)):
            continue
        path = f"{FOLDER}/{name}"
        out[int(m.group(1))] = DeviceNode(
            path, host if host != path else None, "c", os.major(st.st_rdev),
            os.minor(st.st_rdev), stat.S_IMODE(st.st_mode),
        )  # fmt: skip
    return out


def _wanted(device_ids: tuple[str, ...]) -> set[int]:
    out: set[int] = set()
    for raw in device_ids:
        digits = raw.removeprefix("channel")
        if not re.fullmatch(r"[0-9]{1,7}", digits) or int(digits) > MAX_CHANNEL:
            raise UsageError(
                f"--device-id {raw!r} is no IMEX channel (use a number 0..{MAX_CHANNEL} "
                "or channelN)"
            )
        out.add(int(digits))
    return out


def build(
    kind: str, channels: dict[int, DeviceNode], device_ids: tuple[str, ...], all_device: bool
) -> Spec:
    """The IMEX channel spec; NoDevicesError without channels, UsageError for a wrong id."""
    from gpuctk.cdi.specs.version import minimum_version

    wanted = _wanted(device_ids)
    missing = sorted(wanted - set(channels))
    if missing:
        raise UsageError(
            f"--device-id: no IMEX channel node {FOLDER}/channel{missing[0]} under the dev root "
            "(check --dev-root, or create the channel)"
        )
    chosen = sorted(c for c in channels if not wanted or c in wanted)
    if not chosen:
        raise NoDevicesError(
            f"no IMEX channel node in {FOLDER} under the dev root (load nvidia with "
            "NVreg_CreateImexChannel0=1, or check --dev-root); no spec written"
        )
    devices = [Device(str(c), ContainerEdits(device_nodes=(channels[c],))) for c in chosen]
    if all_device:
        nodes = tuple(channels[c] for c in chosen)
        devices.append(Device("all", ContainerEdits(device_nodes=nodes)))
    spec = Spec(
        kind=kind,
        devices=tuple(devices),
        edits=ContainerEdits(env=("NVIDIA_VISIBLE_DEVICES=void",)),
    )
    return replace(spec, version=minimum_version(spec.to_dict()))
