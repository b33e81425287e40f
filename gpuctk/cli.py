"""The `gpuctk` command: root click group, lazy subcommands, one error edge.

Subcommand groups live in their own packages and are imported only when invoked, so
`gpuctk cdi generate` never pays for engine-configuration code and vice versa.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from gpuctk import __version__, helpdoc, log
from gpuctk.errors import EXIT_FAILURE, EXIT_USAGE, GpuctkError, UsageError

# the root flags' environment variables: nvidia-ctk's, so that an operator's settings carry over
DEBUG_ENV = ("GPUCTK_DEBUG", "NVIDIA_CTK_DEBUG")
QUIET_ENV = ("GPUCTK_QUIET", "NVIDIA_CTK_QUIET")

# name -> ("module", "attribute", "one-line help")
_SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "cdi": ("gpuctk.cdi.cli", "cdi", "Generate, list and validate CDI specs for NVIDIA GPUs."),
    "migrate": (
        "gpuctk.install.config_cli",
        "migrate",
        "Carry nvidia-ctk's config.toml over to gpuctk's.",
    ),
    "runtime": (
        "gpuctk.containerd.cli",
        "runtime",
        "Register gpuctk-runtime with containerd, CRI-O, Docker or podman.",
    ),
    "config": (
        "gpuctk.install.config_cli",
        "config_group",
        "Show, set and print the defaults of gpuctk's config.toml.",
    ),
    "device-plugin": (
        "gpuctk.deviceplugin.cli",
        "device_plugin",
        "Advertise the GPUs to the kubelet (Device Plugin API) as gpuctk's CDI devices.",
    ),
    "doctor": (
        "gpuctk.doctor.cli",
        "doctor",
        "Diagnose a GPU node layer by layer: driver, NVML, CDI, runtime, engine.",
    ),
    "info": ("gpuctk.cdi.info", "info", "Show the GPUs, MIG devices, driver and topology found."),
    "install": (
        "gpuctk.install.cli",
        "install",
        "Install gpuctk onto a host root (the DaemonSet entrypoint).",
    ),
    "system": (
        "gpuctk.cdi.system_cli",
        "system",
        "Node set-up for the engines: /dev/char links for the NVIDIA device nodes.",
    ),
    "uninstall": (
        "gpuctk.install.cli",
        "uninstall",
        "Undo `gpuctk install` on a host root.",
    ),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(_SUBCOMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in _SUBCOMMANDS:
            module, attr, _ = _SUBCOMMANDS[cmd_name]
            command = getattr(importlib.import_module(module), attr)
            assert isinstance(command, click.Command)
            return helpdoc.attach(command, helpdoc.command_path(ctx, cmd_name))
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_) for name, (_, _, help_) in sorted(_SUBCOMMANDS.items())]
        for name in super().list_commands(ctx):
            cmd = super().get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(80)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(sorted(rows))


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--debug",
    "-d",
    is_flag=True,
    envvar=DEBUG_ENV,
    help="Log debug detail and show tracebacks on errors.",
)
@click.option(
    "--quiet",
    is_flag=True,
    envvar=QUIET_ENV,
    help="Print errors only (no notes, warnings or debug lines); wins over --debug.",
)
@click.option(
    "--config",
    "config_file",
    metavar="PATH",
    help="gpuctk's config.toml for the commands that read it (sets GPUCTK_CONFIG).",
)
@click.version_option(
    __version__, "--version", "-v", prog_name="gpuctk", message="%(prog)s version %(version)s"
)
@click.pass_context
def cli(ctx: click.Context, debug: bool, quiet: bool, config_file: str | None) -> None:
    """gpuctk gives containers NVIDIA GPUs.

    \b
    Typical node set-up:
      gpuctk cdi generate --output /var/run/cdi/nvidia.yaml
      gpuctk runtime configure --runtime containerd
    Try it without a GPU:
      gpuctk cdi generate --simulate h100-8
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    log.set_debug(debug)
    log.set_quiet(quiet)
    if config_file is not None:
        _use_config(config_file)


def _use_config(path: str) -> None:
    """The root's --config: gpuctk's config file for every command that reads one (doctor,
    config, the hooks a command runs), as GPUCTK_CONFIG names it. Each reader refuses
    nvidia-ctk's config.toml (what nvidia-ctk's --config names) with `gpuctk migrate`."""
    if not os.path.isfile(path):
        raise UsageError(f"--config {path}: no such file")
    os.environ["GPUCTK_CONFIG"] = os.path.abspath(path)


helpdoc.attach(cli, "gpuctk")  # the root's Details line; subcommands get theirs as loaded


@cli.command(
    "hook",
    hidden=True,
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
@click.pass_context
def nvidia_ctk_hook(ctx: click.Context) -> None:
    """Refused: nvidia-ctk's `hook` verbs are run by the specs nvidia-ctk writes.

    gpuctk's specs run gpuctk-cdi-hook and gpuctk-hook.
    """
    given = " ".join(["hook", *ctx.args])
    raise UsageError(
        f"`{given}`: `hook` is nvidia-ctk's, run by the specs it writes: gpuctk's specs run "
        "gpuctk-cdi-hook and gpuctk-hook; regenerate the spec with `gpuctk cdi generate` (a spec "
        "nvidia-ctk wrote needs nvidia-ctk's own binaries)"
    )


def command_path(args: list[str]) -> str:
    """The command that `args` name ("gpuctk cdi generate"), read as click reads them."""
    ctx = cli.make_context("gpuctk", list(args), resilient_parsing=True)
    command: click.Command = cli
    while isinstance(command, click.Group):
        protected = getattr(ctx, "_protected_args", None)  # click 8.2+; 8.1: protected_args
        rest = [*(ctx.protected_args if protected is None else protected), *ctx.args]
        name, sub, rest = command.resolve_command(ctx, rest) if rest else (None, None, [])
        if name is None or sub is None:
            break
        ctx = sub.make_context(name, rest, parent=ctx, resilient_parsing=True)
        command = sub
    return ctx.command_path


def _hint_path(args: list[str]) -> str:
    try:
        return command_path(args)
    except Exception:  # the hint is a courtesy: never let it hide the error
        return "gpuctk"


def usage_error(message: str, path: str) -> None:
    """Every usage error: one line, then where the help is; exit 2."""
    line = " ".join(message.split())
    click.echo(f"gpuctk: error: {line}\nTry '{path} --help'.", err=True)
    sys.exit(EXIT_USAGE)


def _wants_debug(args: list[str]) -> bool:
    """Whether the root's --debug/-d (before the first command name) or its variables ask for
    tracebacks; a subcommand's own -d is not the root's."""
    for arg in args:
        if arg in ("--debug", "-d"):
            return "--quiet" not in args
        if not arg.startswith("-"):
            break
    on = any(os.environ.get(name, "").lower() in ("1", "true", "yes", "on") for name in DEBUG_ENV)
    return on and not any(os.environ.get(name) for name in QUIET_ENV)


def main(argv: list[str] | None = None) -> Any:
    """Entry point: run the CLI and turn errors into one stderr line and an exit code. Usage
    errors, click's and gpuctk's, get a second line: `Try 'gpuctk COMMAND --help'.`"""
    args = sys.argv[1:] if argv is None else argv
    debug = _wants_debug(args)
    try:
        return cli.main(args=args, prog_name="gpuctk", standalone_mode=False)
    except click.exceptions.UsageError as exc:
        path = exc.ctx.command_path if exc.ctx else _hint_path(args)
        usage_error(exc.format_message(), path)
    except UsageError as exc:
        usage_error(exc.message, _hint_path(args))
    except GpuctkError as exc:
        if debug:
            import traceback  # only here: it imports linecache and tokenize

            traceback.print_exc()
        click.echo(f"gpuctk: error: {exc.message}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("gpuctk: aborted", err=True)
        sys.exit(EXIT_FAILURE)
    except click.exceptions.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        if debug:
            import traceback  # only here: it imports linecache and tokenize

            traceback.print_exc()
        else:
            click.echo(
                f"gpuctk: internal error: {exc.__class__.__name__}: {exc} "
                "(rerun with --debug for a traceback, and report it)",
                err=True,
            )
        sys.exit(EXIT_FAILURE)
