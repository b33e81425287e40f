"""What `gpuctk runtime configure` / `unconfigure` are asked to do, validated once."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Literal

from gpuctk.errors import UsageError

Engine = Literal["containerd", "crio", "docker", "podman"]
Mode = Literal["shim", "hook"]
Source = Literal["auto", "file", "command"]

ENGINES: tuple[Engine, ...] = ("containerd", "crio", "docker", "podman")
DEFAULT_RUNTIME_NAME = "nvidia"
DEFAULT_RUNTIME_PATH = "/usr/bin/gpuctk-runtime"
DEFAULT_HOOK_PATH = "/usr/bin/gpuctk-hook"
DEFAULT_CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")

DEFAULT_CONFIG: dict[Engine, str] = {
    "containerd": "/etc/containerd/config.toml",
    "crio": "/etc/crio/crio.conf",
    "docker": "/etc/docker/daemon.json",
    "podman": "",
}
DEFAULT_DROP_IN: dict[Engine, str] = {
    "containerd": "/etc/containerd/conf.d/99-gpuctk.toml",
    "crio": "/etc/crio/crio.conf.d/99-gpuctk.conf",
    "docker": "",
    "podman": "/etc/containers/oci/hooks.d/99-gpuctk.json",
}
# CRI-O's default `hooks_dir` (podman reads it too, below /etc/containers/oci/hooks.d)
CRIO_HOOKS_FILE = "/usr/share/containers/oci/hooks.d/99-gpuctk.json"
SYSTEMD_UNIT: dict[Engine, str] = {
    "containerd": "containerd",
    "crio": "crio",
    "docker": "docker",
    "podman": "",
}

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class Options:
    engine: Engine = "containerd"
    config: str = ""
    drop_in: str = ""
    runtime_name: str = DEFAULT_RUNTIME_NAME
    runtime_path: str = DEFAULT_RUNTIME_PATH
    hook_path: str = DEFAULT_HOOK_PATH
    hook_config: str | None = None
    mode: Mode = "shim"
    set_as_default: bool = False
    cdi_enabled: bool = False
    cdi_spec_dirs: tuple[str, ...] = field(default=DEFAULT_CDI_SPEC_DIRS)
    config_source: Source = "auto"
    executable_path: str | None = None
    take_over: bool = False  # containerd: disable other files that set the handler after ours


def make(
    engine: Engine,
    config: str | None = None,
    drop_in: str | None = None,
    **kwargs: object,
) -> Options:
    """Fill in the engine's default paths and check every value; UsageError (exit 2) if bad."""
    mode = kwargs.get("mode", "shim")
    opts = Options(
        engine=engine,
        config=config or DEFAULT_CONFIG[engine],
        drop_in=drop_in if drop_in is not None else default_drop_in(engine, mode),
        **kwargs,  # type: ignore[arg-type]
    )
    validate(opts)
    return opts


def default_drop_in(engine: Engine, mode: object) -> str:
    """The file gpuctk owns for `engine` in `mode`: CRI-O's hook mode writes a hooks.d file."""
    return CRIO_HOOKS_FILE if engine == "crio" and mode == "hook" else DEFAULT_DROP_IN[engine]


def runtime_name_problem(name: str) -> str | None:
    """Why `name` cannot be the handler's name (a RuntimeClass handler), or None."""
    if not _NAME.match(name) or len(name) > 63:
        return (
            f"{name!r}: use lower-case letters, digits and '-' (a Kubernetes RuntimeClass "
            "handler is a DNS label)"
        )
    if name in ("runc", "crun", "runsc", "kata"):
        return f"{name!r} names an existing runtime"
    return None


def validate(opts: Options) -> None:
    if opts.engine not in ENGINES:
        raise UsageError(f"unknown --runtime {opts.engine!r}: use one of {', '.join(ENGINES)}")
    if opts.hook_config is not None and opts.mode != "hook":
        raise UsageError("--hook-config is for --mode hook (the shim reads GPUCTK_CONFIG)")
    if opts.engine == "docker":
        if opts.drop_in:
            raise UsageError("Docker has no drop-in folder: daemon.json itself is edited")
        if opts.mode == "hook":
            raise UsageError("Docker needs a runtime: --mode hook is for containerd and podman")
    if opts.take_over and opts.engine != "containerd":
        raise UsageError("--take-over is for containerd (its conf.d drop-ins)")
    if opts.engine != "podman" and not opts.config:
        raise UsageError("--config must not be empty")
    if opts.engine != "docker" and not opts.drop_in:
        raise UsageError("--drop-in must not be empty")
    if opts.drop_in and os.path.abspath(opts.drop_in) == os.path.abspath(opts.config):
        raise UsageError("--drop-in and --config must be different files")


def check_folders(opts: Options, create: bool) -> None:
    """Refuse paths whose folders are missing (a typo writes a config the engine never reads).

    The engine's default paths are what it reads, so their folders are created as needed. A
    drop-in's own folder (conf.d) is created when its parent exists; --create allows the rest.
    """
    if create:
        return
    if opts.config and opts.config != DEFAULT_CONFIG[opts.engine]:
        folder = os.path.dirname(os.path.abspath(opts.config))
        if not os.path.isdir(folder):
            raise UsageError(
                f"--config {opts.config}: folder {folder} does not exist: "
                "fix the path, or add --create to make it"
            )
    if opts.drop_in and opts.drop_in != default_drop_in(opts.engine, opts.mode):
        folder = os.path.dirname(os.path.abspath(opts.drop_in))
        if not os.path.isdir(folder) and not os.path.isdir(os.path.dirname(folder)):
            raise UsageError(
                f"--drop-in {opts.drop_in}: folder {os.path.dirname(folder)} does not exist: "
                "fix the path, or add --create to make it"
            )
