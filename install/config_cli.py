"""`gpuctk config` (set, default, show) and `gpuctk migrate`, under nvidia-ctk's conventions.

`gpuctk config --set KEY[=VALUE]` edits gpuctk's config.toml (gpuctk.install.config_edit) and
writes it to stdout, --output or in place; `config default` prints the defaults' one text;
`config show` reads the file the runtime reads, as it reads it (gpuctk.hook.config.read:
root's alone, or refused). `gpuctk migrate` carries NVIDIA's config.toml over, by the one
table of gpuctk.install.nvctk_config, through the same setter.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from gpuctk import log
from gpuctk.errors import InputError, UsageError, ValidationError
from gpuctk.hook import config
from gpuctk.install import config_edit, nvctk_config

NVIDIA_DEFAULT = "/etc/nvidia-container-runtime/config.toml"
FORMAT = click.Choice(["text", "json"])


def default_path() -> str:
    return config.config_path(os.environ)[0]


def emit(text: str, output: str | None) -> None:
    if output is None or output == "-":
        sys.stdout.write(text)
    else:
        config_edit.write(output, text)


@click.group(
    "config",
    invoke_without_command=True,
    short_help="Show, set and print the defaults of gpuctk's config.toml.",
)
@click.option(
    "--config-file",
    "--config",
    "-c",
    "config_file",
    metavar="PATH",
    help="The file to read.  [default: $GPUCTK_CONFIG, else /etc/gpuctk/config.toml]",
)
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY[=VALUE]",
    help="Set a key (repeatable; a true/false key alone is true; a list is comma-separated).",
)
@click.option(
    "--set-list-separator",
    default=",",
    show_default=True,
    metavar="SEP",
    help="What separates a list's entries in --set.",
)
@click.option("--in-place", "-i", is_flag=True, help="Write the result back to the file.")
@click.option("--output", "-o", metavar="FILE", help="Write the result to FILE.  [default: stdout]")
@click.pass_context
def config_group(
    ctx: click.Context,
    config_file: str | None,
    sets: tuple[str, ...],
    set_list_separator: str,
    in_place: bool,
    output: str | None,
) -> None:
    """Edit gpuctk's config.toml (nvidia-ctk config's flags).

    Reads the file (a missing one is the defaults), sets each --set key, checks the result as
    gpuctk-runtime does (nothing is written when a key or value is wrong) and writes it,
    comments kept, to stdout, --output or the file itself (--in-place; atomic, mode 0644,
    owner kept).

    \b
    Examples:
      gpuctk config -i --set log-level=debug --set log-file=/var/log/gpuctk.log
      gpuctk config -i --set runtimes=crun,runc --set accept-volume-mounts
      gpuctk config show
      gpuctk config default -o /etc/gpuctk/config.toml
    """
    ctx.ensure_object(dict)
    ctx.obj["config_file"] = config_file
    if ctx.invoked_subcommand is not None:
        given = [
            f for f, v in (("--set", sets), ("--in-place", in_place), ("--output", output)) if v
        ]
        if given:
            raise UsageError(
                f"{', '.join(given)}: options of `gpuctk config` itself, not of "
                f"`gpuctk config {ctx.invoked_subcommand}`"
            )
        return
    if in_place and output:
        raise UsageError("--in-place and --output: give one (where the result goes)")
    path = config_file or default_path()
    updates = config_edit.parse_sets(sets, set_list_separator)
    text = config_edit.apply_sets(config_edit.load_for_edit(path), updates, path)
    emit(text, path if in_place else output)


@config_group.command("default", short_help="Print the default config.toml.")
@click.option("--output", "-o", metavar="FILE", help="Write it to FILE.  [default: stdout]")
def default(output: str | None) -> None:
    """Print the default config.toml: every key at its default, with what it does.

    The deb ships this text as /etc/gpuctk/config.toml with every key commented out.
    """
    emit(config_edit.default_text(), output)


for _alias in ("create-default", "generate-default"):  # nvidia-ctk's other names of `default`
    config_group.add_command(
        click.Command(_alias, callback=default.callback, params=default.params, hidden=True)
    )


def _effective(settings: config.Settings) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in config.DEFAULTS:
        value = getattr(settings, key.replace("-", "_"))
        out[key] = (
            config.AUTO if value is None else list(value) if isinstance(value, tuple) else value
        )
    return out


@config_group.command("show", short_help="Show the settings gpuctk-runtime reads.")
@click.option("--format", "fmt", type=FORMAT, default="text", show_default=True)
@click.pass_context
def show(ctx: click.Context, fmt: str) -> None:
    """Show the settings in force and the file they come from.

    The file is read as gpuctk-runtime reads it: one that someone other than root could
    write is refused, and that refusal is the error shown. --config-file (of `gpuctk
    config`) reads another file, as GPUCTK_CONFIG does.
    """
    environ = dict(os.environ)
    if ctx.obj and ctx.obj.get("config_file"):
        environ[config.ENV_VAR] = ctx.obj["config_file"]
    path, text, _ = config.read(environ)
    in_file: list[str] = []
    settings = config.Settings()
    if text is not None:
        table = config.parse_table(text, path)
        config_edit.refuse_nvidia(table, path)
        settings = config.parse(text, path)
        in_file = [k for k in config.DEFAULTS if k in table]
    values = _effective(settings)
    if fmt == "json":
        doc = {"file": path, "exists": text is not None, "settings": values, "set_in_file": in_file}
        click.echo(json.dumps(doc, indent=2))
        return
    import tomlkit

    click.echo(f"# {path}" if text is not None else f"# {path}: absent, the defaults apply")
    for key, value in values.items():
        line = f"{key} = {tomlkit.item(value).as_string()}"
        click.echo(f"{line:<48} # {'from the file' if key in in_file else 'default'}")


@click.command("migrate", short_help="Carry nvidia-ctk's config.toml over to gpuctk's.")
@click.option(
    "--from",
    "source",
    default=NVIDIA_DEFAULT,
    show_default=True,
    metavar="PATH",
    envvar=["NVIDIA_CTK_CONFIG", "NVIDIA_CTK_CONFIG_FILE_PATH"],
    help="NVIDIA's config.toml (env NVIDIA_CTK_CONFIG).",
)
@click.option(
    "--config-file",
    "config_file",
    metavar="PATH",
    help="gpuctk's file to write.  [default: $GPUCTK_CONFIG, else /etc/gpuctk/config.toml]",
)
@click.option("--dry-run", is_flag=True, help="Show what would be written; write nothing.")
@click.option("--format", "fmt", type=FORMAT, default="text", show_default=True)
def migrate(source: str, config_file: str | None, dry_run: bool, fmt: str) -> None:
    """Carry nvidia-ctk's settings over to gpuctk's config.toml.

    Lists every setting NVIDIA's file holds, its value, and the gpuctk key it became or why
    it has none (and what to use instead). The carried keys are set in gpuctk's file as
    `gpuctk config --set` sets them (comments kept, checked, atomic); other keys stay.

    \b
    Examples:
      gpuctk migrate --dry-run
      gpuctk migrate && gpuctk config show
      gpuctk migrate --from /srv/nvidia/config.toml --config-file /etc/gpuctk/config.toml
    """
    import tomllib

    text = config_edit.read_text(source)
    if text is None:
        raise InputError(f"{source}: no such file (name NVIDIA's config.toml with --from)")
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValidationError(f"{source}: invalid TOML: {exc}") from None
    rows, updates, problems = nvctk_config.carry(table)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ValidationError(f"{source}: {problems[0]}{more}; nothing written", problems)
    if all(nvctk_config.row_of(r.nvidia).nvidia == "*" for r in rows):  # none of NVIDIA's keys
        raise ValidationError(f"{source}: no nvidia-ctk settings in it (is it NVIDIA's file?)")
    if updates.get("accept-envvar-unprivileged") is True:
        log.warning(
            "accept-envvar-unprivileged = true carried over: in Kubernetes a pod granted no GPU "
            "can then take every GPU with NVIDIA_VISIBLE_DEVICES=all; gpuctk's default refuses "
            "that there: gpuctk config -i --set accept-envvar-unprivileged=auto"
        )
    target = config_file or default_path()
    result = config_edit.apply_sets(
        config_edit.load_for_edit(target), updates, target, f"{source}: "
    )
    changed = result != (config_edit.read_text(target) or "")
    written = bool(updates) and changed and not dry_run
    if written:
        config_edit.write(target, result)
    if fmt == "json":
        doc = {
            "from": source,
            "config_file": target,
            "written": written,
            "settings": [r._asdict() for r in rows],
            "config": result,
        }
        click.echo(json.dumps(doc, indent=2, default=str))  # TOML dates as text
        return
    for line in nvctk_config.text_table(rows):
        click.echo(line)
    if dry_run:
        click.echo(f"# --- would write {target} ---")
        click.echo(result, nl=False)
    elif written:
        click.echo(f"gpuctk: wrote {len(updates)} setting(s) to {target}", err=True)
    elif not updates:
        click.echo(f"gpuctk: no setting has a gpuctk key: {target} unchanged", err=True)
    else:
        click.echo(f"gpuctk: {target} already holds these settings: unchanged", err=True)
