"""`gpuctk --debug doctor`: what each layer reads and what each check found, as debug lines.

The runner (gpuctk.doctor.cli.run_checks) prints one line of inputs before each layer (the roots,
files, sockets and binaries its checks look at, and where each came from: an option, an
environment variable, the runtime config or a default) and one line per check after it (its
status and evidence, the paths it looked at among them). The lines go to stderr through
gpuctk.log.debug, so the report on stdout is the same with or without --debug.
"""

from __future__ import annotations

import os

from gpuctk import log
from gpuctk.doctor.context import Context, Findings
from gpuctk.doctor.report import Result

SHOWN = 4  # evidence entries per check line; the rest are counted


def _state(path: str) -> str:
    if os.path.isdir(path):
        return "a folder"
    return "exists" if os.path.lexists(path) else "absent"


def _runtime(ctx: Context, found: Findings) -> str:
    from gpuctk.doctor.runtime import config_path

    path, explicit = config_path(ctx)
    how = "--runtime-config" if ctx.runtime_config else "$GPUCTK_CONFIG" if explicit else "default"
    return f"runtime config {path} ({how}, {_state(path)}); PATH {ctx.path}"


def _cdi(ctx: Context, found: Findings) -> str:
    if ctx.spec_dirs:
        how = "--spec-dir"
    elif found.settings and found.settings.spec_dirs:
        source = found.settings_source
        how = f"spec-dirs in {source}" if source.startswith("/") else f"gpuctk's {source}"
    else:
        how = "default"
    dirs = ", ".join(f"{d} ({_state(d)})" for d in found.spec_dirs)
    return f"spec dirs {dirs} (from {how}); kind {ctx.kind}"


def _engine(ctx: Context, found: Findings) -> str:
    import shutil

    binary = ctx.containerd or shutil.which("containerd", path=ctx.path)
    main = ctx.containerd_config or ctx.host("/etc/containerd/config.toml")
    crio = ctx.crio_config or ctx.host("/etc/crio/crio.conf")
    docker = ctx.docker_config or ctx.host("/etc/docker/daemon.json")
    return (
        f"containerd binary {binary or 'none on PATH'}, config {main} ({_state(main)}), "
        f"--config-source {ctx.config_source}; CRI-O config {crio} ({_state(crio)}); "
        f"Docker config {docker} ({_state(docker)}); handler {ctx.runtime_name!r}"
    )


def _kubernetes(ctx: Context, found: Findings) -> str:
    root = ctx.kubelet_root or ctx.host("/var/lib/kubelet")
    files = ", ".join(ctx.runtimeclass_files) or "none"
    return f"kubelet root {root} ({_state(root)}); RuntimeClass files {files}"


def inputs(layer: str, ctx: Context, found: Findings) -> None:
    """One debug line: what the checks of `layer` read."""
    if not log.debugging():
        return
    if layer == "driver":
        text = (
            f"driver root {ctx.driver_root}, dev root {ctx.dev_root}, proc root "
            f"{ctx.proc_root}, sys root {ctx.sys_root}, host root {ctx.host_root}"
        )
    elif layer == "nvml":
        if ctx.simulate:
            text = f"machine profile {ctx.simulate} (--simulate), NVML not loaded"
        elif ctx.nvml_library:
            text = f"NVML library {ctx.nvml_library} (--nvml-library)"
        else:
            text = f"NVML library found under driver root {ctx.driver_root}, else the loader's"
    elif layer == "runtime":
        text = _runtime(ctx, found)
    elif layer == "cdi":
        text = _cdi(ctx, found)
    elif layer == "engine":
        text = _engine(ctx, found)
    elif layer == "kubernetes":
        text = _kubernetes(ctx, found)
    else:
        asked = "asked" if ctx.probe else "not asked (--probe)"
        text = f"{asked}; rootfs {ctx.probe_rootfs}, CDI device {ctx.probe_device}"
    log.debug(f"doctor: {layer} layer reads: {text}")


def results(found: list[Result]) -> None:
    """One debug line per check: its status and evidence."""
    for r in found:
        shown = list(r.evidence[:SHOWN])
        if len(r.evidence) > SHOWN:
            shown.append(f"(+{len(r.evidence) - SHOWN} more)")
        log.debug(f"doctor: {r.id}: {r.status}: {'; '.join(shown) or 'no evidence'}")
