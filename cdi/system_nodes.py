"""`gpuctk system create-device-nodes`: nvidia-ctk's command of that name, under its flags.

With --load-kernel-modules it loads nvidia, nvidia-uvm and nvidia-modeset (modprobe, chrooted
into --root when that is not /); with --control-devices it makes the control nodes the loaded
driver serves and that are missing under <dev-root>/dev: nvidiactl and nvidia-modeset (195:255,
195:254), nvidia-uvm and nvidia-uvm-tools (the nvidia-uvm major of /proc/devices), with the
driver's DeviceFileMode, UID and GID (gpuctk.cdi.node.devchar_all). A node already there is
kept as it is, so running it again changes nothing.
"""

from __future__ import annotations

import os

import click

from gpuctk import log
from gpuctk.cdi import cliopts
from gpuctk.clitypes import ABSOLUTE_PATH

CONTROL = ("nvidiactl", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools")


@click.command("create-device-nodes", short_help="Make the NVIDIA control device nodes.")
@click.option(
    "--root",
    "--driver-root",
    type=ABSOLUTE_PATH,
    default="/",
    show_default=True,
    metavar="DIR",
    envvar=["ROOT", "NVIDIA_DRIVER_ROOT", "DRIVER_ROOT"],
    help="Root whose modprobe loads the modules.",
)
@click.option(
    "--dev-root",
    type=ABSOLUTE_PATH,
    metavar="DIR",
    envvar=["NVIDIA_DEV_ROOT", "DEV_ROOT"],
    help="Nodes go in DIR/dev.  [default: --root]",
)
@click.option("--control-devices", is_flag=True, help="Make nvidiactl, -modeset, -uvm(-tools).")
@click.option("--load-kernel-modules", is_flag=True, help="First modprobe the NVIDIA modules.")
@click.option("--dry-run", is_flag=True, envvar="DRY_RUN", help="Say what; change nothing.")
@click.option("--proc-root", default="/proc", show_default=True, help="Where /proc is.")
@cliopts.sys_root("Where /sys is.")
def create_device_nodes(
    root: str,
    dev_root: str | None,
    control_devices: bool,
    load_kernel_modules: bool,
    dry_run: bool,
    proc_root: str,
    sys_root: str,
) -> None:
    """Make the NVIDIA control device nodes (nvidia-ctk's command).

    \b
    Running it again changes nothing; nodes already there are kept.

    \b
    Examples:
      gpuctk system create-device-nodes --control-devices
      gpuctk system create-device-nodes --load-kernel-modules --control-devices
      gpuctk system create-device-nodes --control-devices --dev-root /run/nvidia/driver
    """
    from gpuctk.cdi.node import devchar_all
    from gpuctk.errors import OutputError

    dev_root = dev_root or root
    if not control_devices and not load_kernel_modules:
        log.say(
            "gpuctk: nothing asked: --control-devices makes the nodes, --load-kernel-modules "
            "loads the modules"
        )
        return
    if load_kernel_modules:
        for cmd in devchar_all.modprobe_commands(root):
            if dry_run:
                click.echo(f"would run {' '.join(cmd)}")
        if not dry_run:
            devchar_all.load_modules(root)
    if not control_devices:
        return
    dev = os.path.normpath(os.path.join(dev_root, "dev"))
    wanted = devchar_all.wanted_nodes(proc_root, sys_root, "--control-devices")
    wanted = [w for w in wanted if w.name in CONTROL]
    made, problems = devchar_all.create_missing(dev, wanted, dry_run)
    verb = "would make" if dry_run else "made"
    for w in made:
        click.echo(f"{verb} node {dev}/{w.name} c {w.major}:{w.minor} {w.mode:04o} {w.uid}:{w.gid}")
    kept = len(wanted) - len(made) - len(problems)
    log.say(f"gpuctk: {dev}: {len(made)} {verb}, {kept} there already")
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise OutputError(f"{problems[0]}{more}")
