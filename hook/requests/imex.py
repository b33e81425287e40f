"""The IMEX channels a container asks for: NVIDIA_IMEX_CHANNELS and `imex/` device mounts.

IMEX channels (/dev/nvidia-caps-imex-channels/channelN, the devices of the spec that
`gpuctk cdi generate --mode imex` writes, kind `nvidia.com/imex-channel`) are asked for beside
GPUs, as the reference toolkit reads them (internal/config/image/cuda_image.go):

- only beside GPUs granted by the device list (NVIDIA_VISIBLE_DEVICES naming GPUs, or device
  mounts): the reference's hook reads them only when the container gets GPUs, and its CDI
  mode only with the devices it generates itself. `NVIDIA_VISIBLE_DEVICES=none` (the driver
  files, no GPU) takes no channel, nor does an env request the config does not honour. A
  request from CDI annotations is the orchestrator's, which names IMEX channels there as CDI
  devices too, so the image cannot add channels to it;
- when `accept-volume-mounts` is on, `/dev/null` mounts at
  `/var/run/nvidia-container-devices/imex/<N>` come first;
- else NVIDIA_IMEX_CHANNELS (the last value wins), honoured for an unprivileged container only
  as `accept-envvar-unprivileged` says (gpuctk.hook.requests.devices.env_allowed: never in an
  unprivileged Kubernetes container by default), as NVIDIA_VISIBLE_DEVICES: a comma-separated
  list of channel numbers (`0,1`, or `channel0`), `all` for every channel of the spec;
  `none`, `void`, empty or unset: none. Unlike NVIDIA_VISIBLE_DEVICES, an unset variable on
  a legacy image (CUDA_VERSION without NVIDIA_REQUIRE_CUDA) never means `all`.

A channel number is 0..MAX_CHANNEL (a dev_t minor); anything else is a RequestError naming the
value, and nothing is changed. A channel the specs lack is the registry's unknown-device error.
"""

from __future__ import annotations

from gpuctk.errors import RequestError
from gpuctk.hook.requests.devices import IMEX_ENV as ENV
from gpuctk.hook.requests.devices import IMEX_MOUNTS as MOUNT_FOLDER
from gpuctk.hook.requests.devices import asks, ignored_note

KIND = "nvidia.com/imex-channel"
MAX_CHANNEL = (1 << 20) - 1
MAX_CHANNELS = 1024
MAX_VALUE_LEN = 64 * 1024
_NONE = frozenset(("none", "void"))


def _channel(raw: str, where: str) -> str:
    """The channel number in `raw` (`7` or `channel7`) as a device name."""
    digits = raw.removeprefix("channel")
    if not (0 < len(digits) <= 7 and digits.isascii() and digits.isdigit()):
        shown = raw if len(raw) <= 40 else raw[:40] + "..."
        raise RequestError(
            f"{where}: {shown!r} is no IMEX channel (expected channel numbers "
            f"0..{MAX_CHANNEL} separated by commas, `all` or `none`)"
        )
    number = int(digits)
    if number > MAX_CHANNEL:
        raise RequestError(f"{where}: IMEX channel {number} is out of range 0..{MAX_CHANNEL}")
    return str(number)


def from_env(value: str | None) -> list[str]:
    """Qualified channel names for a NVIDIA_IMEX_CHANNELS value (see the module docstring)."""
    if value is None:
        return []
    if len(value) > MAX_VALUE_LEN:
        raise RequestError(f"{ENV}: longer than {MAX_VALUE_LEN} characters")
    names = [n.strip() for n in value.split(",")]
    names = [n for n in names if n]
    if len(names) > MAX_CHANNELS:
        raise RequestError(f"{ENV}: {len(names)} channels requested; at most {MAX_CHANNELS}")
    words = _NONE.union(("all",))
    channels = dict.fromkeys(_channel(n, ENV) for n in names if n not in words)  # all checked
    if not names or _NONE.intersection(names):
        return []
    if "all" in names:
        return [f"{KIND}=all"]
    return [f"{KIND}={c}" for c in channels]


def from_mounts(rels: list[str]) -> list[str]:
    """Qualified channel names for the `imex/<N>` device mounts (relative to the mounts root)."""
    if len(rels) > MAX_CHANNELS:
        raise RequestError(f"IMEX mounts: {len(rels)} requested; at most {MAX_CHANNELS}")
    channels = dict.fromkeys(
        _channel(rel.removeprefix(MOUNT_FOLDER), f"mount {rel!r}") for rel in rels
    )
    return [f"{KIND}={c}" for c in channels]


def requested(
    env_value: str | None, mounts: list[str], *, refused: str = ""
) -> tuple[list[str], list[str]]:
    """(qualified channel names, notes) for a container that gets GPUs from the device list:
    `mounts` (the `imex/...` mount names, empty unless volume mounts are accepted) first, else
    `env_value` unless `refused` says why the env is not honoured
    (gpuctk.hook.requests.devices.env_allowed)."""
    if mounts:
        return from_mounts(mounts), []
    if refused:
        return [], [ignored_note(ENV, env_value or "", refused)] if asks(env_value) else []
    return from_env(env_value), []
