"""`gpuctk runtime ...`: configure, unconfigure, runtimeclass.

Flag names follow `nvidia-ctk runtime configure` (its long names are accepted as aliases), so
that scripts written for the NVIDIA Container Toolkit need only the command name changed.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from gpuctk import log
from gpuctk.clitypes import ABSOLUTE_PATH, Checked
from gpuctk.containerd import options as optmod
from gpuctk.containerd import plan as planmod
from gpuctk.containerd.options import ENGINES, Options
from gpuctk.errors import UsageError

F = TypeVar("F", bound=Callable[..., Any])


def _planner(engine: str) -> Any:
    """The engine's module (plan_configure, plan_unconfigure), imported on use."""
    return importlib.import_module(f"gpuctk.containerd.{engine}")


def _common(func: F) -> F:
    decorators = [
        click.option(
            "--runtime",
            "engine",
            type=click.Choice(ENGINES),
            default="containerd",
            show_default=True,
            metavar="ENGINE",
            help="The engine to configure.",
        ),
        click.option(
            "--config",
            metavar="PATH",
            help="The engine's main config.",
        ),
        click.option(
            "--drop-in",
            "--drop-in-config",
            "drop_in",
            metavar="PATH",
            help="The file gpuctk owns.",
        ),
        click.option(
            "--runtime-name",
            "--nvidia-runtime-name",
            "runtime_name",
            type=Checked(optmod.runtime_name_problem),
            default=optmod.DEFAULT_RUNTIME_NAME,
            show_default=True,
            help="Handler name.",
        ),
        click.option("--dry-run", is_flag=True, help="Print what would change; write nothing."),
        click.option("--restart", is_flag=True, help="Restart the engine after a change."),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


@click.group("runtime", context_settings={"help_option_names": ["-h", "--help"]})
def runtime() -> None:
    """Register gpuctk-runtime with containerd, CRI-O, Docker or podman.

    \b
      gpuctk runtime configure --runtime containerd     # then restart containerd
      gpuctk runtime runtimeclass | kubectl apply -f -
      gpuctk runtime unconfigure --runtime containerd
    """


def _run(opts: Options, planned: planmod.Plan, dry_run: bool, restart: bool) -> None:
    differ = planned.effective()
    for change in planned.changes:
        verb = "remove" if change.data is None else "write"
        state = "" if change in differ else ": unchanged, skipped"
        log.debug(f"plan: {verb} {change.path} ({change.what}){state}")
    done = [] if dry_run else planmod.apply(planned.changes)
    for note in planned.notes:
        log.say(f"gpuctk: note: {note}")
    if dry_run:
        click.echo(planmod.render(planned), nl=False)
        return
    if not done:
        click.echo("nothing to change: the configuration is already in place")
        return
    for change in done:
        verb = "removed" if change.data is None else "wrote"
        click.echo(f"{verb} {change.path} ({change.what})")
    unit = optmod.SYSTEMD_UNIT[opts.engine]
    if not unit:
        return
    if not restart:
        click.echo(f"restart {opts.engine} to apply: systemctl restart {unit}")
        return
    planmod.restart_service(["systemctl", "restart", unit], "files written")
    click.echo(f"restarted {unit}")


@runtime.command("configure")
@_common
@click.option(
    "--runtime-path",
    "--nvidia-runtime-path",
    "runtime_path",
    type=ABSOLUTE_PATH,
    default=optmod.DEFAULT_RUNTIME_PATH,
    show_default=True,
    help="The shim the handler runs (--mode shim).",
)
@click.option(
    "--hook-path",
    "--nvidia-runtime-hook-path",
    "hook_path",
    type=ABSOLUTE_PATH,
    default=optmod.DEFAULT_HOOK_PATH,
    show_default=True,
    help="The OCI hook binary (--mode hook, podman).",
)
@click.option(
    "--hook-config",
    "hook_config",
    type=ABSOLUTE_PATH,
    metavar="PATH",
    help="The gpuctk config the hook reads.",
)
@click.option(
    "--mode",
    type=click.Choice(["shim", "hook"]),
    default="shim",
    show_default=True,
    help="Run gpuctk-runtime, or gpuctk-hook.",
)
@click.option(
    "--set-as-default", "--nvidia-set-as-default", is_flag=True, help="Make it the default."
)
@click.option(
    "--cdi-enabled",
    "--enable-cdi",
    "--cdi.enabled",
    "--cdi.enable",
    "cdi_enabled",
    is_flag=True,
    help="Turn on the engine's own CDI support.",
)
@click.option(
    "--cdi-spec-dir",
    "cdi_spec_dirs",
    type=ABSOLUTE_PATH,
    multiple=True,
    metavar="DIR",
    help="Its spec folders (repeatable).",
)
@click.option(
    "--config-source",
    type=click.Choice(["auto", "file", "command"]),
    default="auto",
    show_default=True,
    metavar="SOURCE",
    help="auto, file or command.",
)
@click.option("--executable-path", metavar="PATH", help="The engine binary (for command).")
@click.option(
    "--create",
    is_flag=True,
    help="Create missing folders.",
)
@click.option(
    "--take-over",
    "--replace",
    "take_over",
    is_flag=True,
    help="Disable other drop-ins that set the handler after ours (unconfigure restores).",
)
@click.option(
    "--config-mode",
    type=click.Choice(["toml", "oci-hook"]),
    hidden=True,
    help="nvidia-ctk's spelling: oci-hook is --mode hook, toml the engine's own config.",
)
@click.option(
    "--oci-hook-path",
    metavar="PATH",
    hidden=True,
    help="nvidia-ctk's spelling: the hooks.d file of --mode hook (gpuctk's --drop-in).",
)
def configure(
    engine: optmod.Engine,
    config: str | None,
    drop_in: str | None,
    dry_run: bool,
    restart: bool,
    cdi_spec_dirs: tuple[str, ...],
    create: bool,
    config_mode: str | None,
    oci_hook_path: str | None,
    **kwargs: Any,
) -> None:
    """Add the gpuctk runtime handler to a container engine's configuration.

    \b
    Nothing is written when anything is wrong. Running it again changes nothing.
    """
    if cdi_spec_dirs:
        kwargs["cdi_spec_dirs"] = tuple(cdi_spec_dirs)
    drop_in = _nvidia_ctk_mode(config_mode, oci_hook_path, drop_in, kwargs)
    if engine == "podman":
        kwargs["mode"] = "hook"
    opts = optmod.make(engine, config, drop_in, **kwargs)
    _trace("configure", opts)
    optmod.check_folders(opts, create)
    _run(opts, _planner(engine).plan_configure(opts), dry_run, restart)


def _trace(verb: str, opts: Options) -> None:
    parts = [f"engine {opts.engine}", f"handler {opts.runtime_name!r} ({opts.mode} mode)"]
    parts += [f"main config {opts.config}"] * bool(opts.config)
    parts += [f"drop-in {opts.drop_in}"] * bool(opts.drop_in)
    parts += [f"config source {opts.config_source}"] * (verb == "configure")
    log.debug(f"runtime {verb}: {', '.join(parts)}")


def _nvidia_ctk_mode(
    config_mode: str | None, oci_hook_path: str | None, drop_in: str | None, kwargs: Any
) -> str | None:
    """nvidia-ctk's `--config-mode oci-hook` and `--oci-hook-path` in gpuctk's terms: --mode
    hook and the hooks.d file as --drop-in. Returns the drop-in; sets kwargs["mode"]."""
    if config_mode == "oci-hook" or oci_hook_path:
        if config_mode == "toml":
            raise UsageError("--oci-hook-path needs --config-mode oci-hook (gpuctk: --mode hook)")
        kwargs["mode"] = "hook"
    if oci_hook_path:
        if drop_in and drop_in != oci_hook_path:
            raise UsageError("--oci-hook-path and --drop-in name two files: give one")
        return oci_hook_path
    return drop_in


@runtime.command("unconfigure")
@_common
@click.option(
    "--mode",
    type=click.Choice(["shim", "hook"]),
    default="shim",
    show_default=True,
    help="What configure added (CRI-O: hook is the hooks.d file).",
)
def unconfigure(
    engine: optmod.Engine,
    config: str | None,
    drop_in: str | None,
    runtime_name: str,
    dry_run: bool,
    restart: bool,
    mode: optmod.Mode,
) -> None:
    """Remove exactly what configure added (drop-in, imports entry, default runtime)."""
    if engine == "podman":
        mode = "hook"
    opts = optmod.make(engine, config, drop_in, runtime_name=runtime_name, mode=mode)
    _trace("unconfigure", opts)
    _run(opts, _planner(engine).plan_unconfigure(opts), dry_run, restart)


@runtime.command("runtimeclass")
@click.option("--name", default="nvidia", show_default=True, help="RuntimeClass name.")
@click.option(
    "--handler", default="nvidia", show_default=True, help="Handler (the --runtime-name)."
)
@click.option(
    "--gpu-node-selector",
    is_flag=True,
    help="Schedule only onto GPU nodes (nodeSelector nvidia.com/gpu.present=true).",
)
@click.option("--node-selector", multiple=True, metavar="KEY=VALUE", help="Add a node label.")
@click.option("--output", metavar="PATH", help="Write the manifest to a file, not stdout.")
def runtimeclass(
    name: str,
    handler: str,
    gpu_node_selector: bool,
    node_selector: tuple[str, ...],
    output: str | None,
) -> None:
    """Print the Kubernetes RuntimeClass (node.k8s.io/v1) that selects the handler."""
    from gpuctk.containerd import runtimeclass as rc

    selector = [rc.GPU_NODE_LABEL] if gpu_node_selector else []
    selector += rc.parse_selector(node_selector)
    text = rc.manifest(name, handler, selector)
    if output is None:
        sys.stdout.write(text)
        return
    planmod.apply([planmod.FileChange(output, text.encode(), "RuntimeClass manifest")])
