"""`gpuctk system ...`: node set-up beside the CDI spec (the /dev/char links for NVIDIA nodes)."""

from __future__ import annotations

import os

import click

from gpuctk import log
from gpuctk.cdi import cliopts
from gpuctk.cdi.node.devchar import DEV_CHAR, Change, Node
from gpuctk.cdi.system_nodes import create_device_nodes
from gpuctk.clitypes import ABSOLUTE_PATH


@click.group("system", context_settings={"help_option_names": ["-h", "--help"]})
def system() -> None:
    """Node set-up that container engines rely on, beside the CDI spec.

    \b
      gpuctk system create-dev-char-symlinks     # /dev/char links for the NVIDIA nodes
      gpuctk system create-device-nodes --control-devices   # nvidiactl, nvidia-uvm, ...
    """


system.add_command(create_device_nodes)


def _refuse_watch(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value:
        raise click.UsageError(
            "--watch is nvidia-ctk's: gpuctk keeps no watch loop; its udev rule "
            "(71-gpuctk-dev-char.rules) runs this command with --create-all when the driver "
            "loads, and running it again is safe"
        )
    return value


def _report(changes: list[Change], made: list[str], dev: str, dev_char: str) -> None:
    for line in made:
        click.echo(line)
    for c in changes:
        if c.status == "unchanged":
            continue
        was = f" (was {c.was})" if c.was else ""
        click.echo(f"{c.status} {c.link} -> {c.target}{was}")
    counts: dict[str, int] = {}
    for c in changes:
        counts[c.status] = counts.get(c.status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    log.say(f"gpuctk: {dev_char}: {summary} ({len(changes)} NVIDIA nodes in {dev})")


def _json(changes: list[Change], made: list[str], dev: str, dev_char: str) -> None:
    import json

    def node(n: Node) -> dict[str, object]:
        return {"path": os.path.join(dev, n.name), "major": n.major, "minor": n.minor}

    doc = {
        "devCharPath": dev_char,
        "madeNodes": made,
        "links": [
            {**node(c.node), "link": c.link, "target": c.target, "status": c.status}
            | ({"was": c.was} if c.was else {})
            for c in changes
        ],
    }
    click.echo(json.dumps(doc, indent=2))


@system.command("create-dev-char-symlinks", short_help="Link the NVIDIA device nodes in /dev/char.")
@click.option(
    "--dev-char-path",
    type=ABSOLUTE_PATH,
    default=DEV_CHAR,
    show_default=True,
    metavar="DIR",
    envvar="DEV_CHAR_PATH",
    help="Where the links go.",
)
@click.option(
    "--driver-root",
    type=ABSOLUTE_PATH,
    default="/",
    show_default=True,
    metavar="DIR",
    envvar=["NVIDIA_DRIVER_ROOT", "DRIVER_ROOT"],
    help="Root whose dev/ holds the NVIDIA nodes.",
)
@click.option(
    "--create-all",
    is_flag=True,
    envvar="CREATE_ALL",
    help="First make the missing NVIDIA nodes.",
)
@click.option("--dry-run", is_flag=True, help="Say what would change; change nothing.")
@click.option(
    "--proc-root",
    default="/proc",
    show_default=True,
    help="Where /proc is.",
)
@cliopts.sys_root("Where /sys is.")
@cliopts.table_or_json("json: every link.")
@click.option("--load-kernel-modules", is_flag=True, envvar="LOAD_KERNEL_MODULES", hidden=True)
@click.option("--create-device-nodes", is_flag=True, envvar="CREATE_DEVICE_NODES", hidden=True)
@click.option("--watch", is_flag=True, envvar="WATCH", hidden=True, expose_value=False,
              callback=_refuse_watch)  # fmt: skip
def create_dev_char_symlinks(
    dev_char_path: str,
    driver_root: str,
    create_all: bool,
    dry_run: bool,
    proc_root: str,
    sys_root: str,
    fmt: str,
    load_kernel_modules: bool,
    create_device_nodes: bool,
) -> None:
    """Link /dev/char/MAJOR:MINOR to every NVIDIA device node.

    \b
    runc's systemd cgroup driver needs these links: without them a `systemctl
    daemon-reload` takes the GPUs from running containers. Running it again
    changes nothing.

    \b
    Examples:
      gpuctk system create-dev-char-symlinks
      gpuctk system create-dev-char-symlinks --create-all      # also make missing nodes
      gpuctk system create-dev-char-symlinks --dry-run --format json
      gpuctk system create-dev-char-symlinks --driver-root /run/nvidia/driver
    """
    from gpuctk.cdi.node import devchar, devchar_all
    from gpuctk.errors import GpuctkError, OutputError

    dev = os.path.normpath(os.path.join(driver_root, "dev"))
    dev_char = os.path.normpath(dev_char_path)
    made: list[str] = []
    wanted: list[devchar_all.Wanted] = []
    problems: list[str] = []  # the nodes that exist are linked all the same, then they are told
    error: type[GpuctkError] = OutputError
    for flag, on in (("--load-kernel-modules", load_kernel_modules),
                     ("--create-device-nodes", create_device_nodes)):  # fmt: skip
        if on and not create_all:  # nvidia-ctk's hidden flags: as it does, ignored
            log.say(f"gpuctk: note: {flag} applies with --create-all only: ignored")
    if create_all and load_kernel_modules:
        if dry_run:
            click.echo("\n".join(f"would run {' '.join(c)}"
                                 for c in devchar_all.modprobe_commands(driver_root)))  # fmt: skip
        else:
            devchar_all.load_modules(driver_root)
    if create_all:
        try:
            wanted = devchar_all.wanted_nodes(proc_root, sys_root)
        except GpuctkError as exc:
            problems.append(exc.message)
            error = type(exc)
        done, failed = devchar_all.create_missing(dev, wanted, dry_run)
        problems += failed
        verb = "would make" if dry_run else "made"
        made = [
            f"{verb} node {dev}/{w.name} c {w.major}:{w.minor} {w.mode:04o} {w.uid}:{w.gid}"
            for w in done
        ]
    majors = devchar.nvidia_majors(devchar.read_char_majors(proc_root))
    nodes = devchar.find_nodes(dev, majors)
    if dry_run and made:  # the nodes that would be made, as if they were
        planned = [Node(w.name, w.major, w.minor) for w in wanted]
        nodes = sorted({(n.major, n.minor): n for n in [*planned, *nodes]}.values(),
                       key=lambda n: (n.major, n.minor))  # fmt: skip
    if not nodes and fmt != "json":
        log.say(f"gpuctk: no NVIDIA device nodes in {dev}: nothing to link")
    else:
        changes = devchar.update_links(dev, dev_char, nodes, dry_run)
        (_json if fmt == "json" else _report)(changes, made, dev, dev_char)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        first = problems[0].removeprefix("--create-all: ")
        raise error(f"--create-all: {first}{more}; the nodes that exist are linked")
