"""`gpuctk cdi ...`: generate, list and validate CDI specs."""

from __future__ import annotations

from typing import Any

import click

from gpuctk import helpdoc
from gpuctk.cdi import cliopts, nvctk
from gpuctk.cdi.discover import Roots
from gpuctk.cdi.generate import HOOK_ACTIONS, LIBRARY_MODES, NAME_STRATEGIES
from gpuctk.cdi.nicspec import nic_options
from gpuctk.cdi.node import capabilities
from gpuctk.cdi.specs.names import class_name_problem, vendor_name_problem
from gpuctk.clitypes import ABSOLUTE_PATH, Checked

NAMES_HINT = "example: --vendor nvidia.com --class gpu"


class _InspectCommands(click.Group):
    """`list`, `validate` and `transform` load their module only when invoked (generate never
    pays)."""

    _lazy = {"list": "list_cmd", "validate": "validate_cmd", "transform": "transform"}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._lazy))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == "transform":
            from gpuctk.cdi.transform import transform

            return helpdoc.attach(transform, helpdoc.command_path(ctx, cmd_name))
        if cmd_name in self._lazy:
            from gpuctk.cdi import cli_inspect

            command = getattr(cli_inspect, self._lazy[cmd_name])
            assert isinstance(command, click.Command)
            return helpdoc.attach(command, helpdoc.command_path(ctx, cmd_name))
        return super().get_command(ctx, cmd_name)


@click.group("cdi", cls=_InspectCommands)
def cdi() -> None:
    """Generate, list and validate CDI specs for NVIDIA GPUs.

    \b
    A CDI spec tells a container engine (podman, containerd, CRI-O) which device nodes,
    driver files and hooks give a container a GPU. Write one per node:
      gpuctk cdi generate --output /var/run/cdi/nvidia.yaml
    then ask for GPUs by name:
      podman run --device nvidia.com/gpu=0 ...
    """


@cdi.command("generate")
@nvctk.generate_spellings  # nvidia-ctk's flags, values and NVIDIA_CTK_* variables (hidden)
@click.option(
    "--mode",
    type=nvctk.Choice(("nvml", "management", "imex"), nvctk.SAME_MODES, nvctk.REFUSED_MODES),
    default="nvml",
    show_default=True,
    help="GPUs, monitoring or IMEX.",
)
@click.option("--output", "-o", metavar="PATH", help="Write it here (atomically). Default: stdout.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["yaml", "json"]),
    help="Default: by --output's extension, else yaml.",
)
@click.option(
    "--vendor",
    type=Checked(vendor_name_problem, NAMES_HINT),
    default="nvidia.com",
    show_default=True,
    help="The kind's vendor.",
)
@click.option(
    "--class", "device_class", type=Checked(class_name_problem, NAMES_HINT), default="gpu",
    show_default=True, help="The kind's class.",
)  # fmt: skip
@click.option(
    "--device-name-strategy",
    "strategies",
    multiple=True,
    type=click.Choice(NAME_STRATEGIES),
    metavar="NAME",
    help=f"{', '.join(NAME_STRATEGIES)}; repeatable.",
)
@click.option("--no-all-device", is_flag=True, help="Do not add the `all` device.")
@click.option(
    "--device-id",
    "device_ids",
    multiple=True,
    metavar="ID",
    help="Only these (index, 0:1, UUID); repeatable.",
)
@click.option(
    "--hook-path",
    type=ABSOLUTE_PATH,
    default=None,
    help="Host gpuctk-hook. Default: beside gpuctk.",
)
@click.option(
    "--library-mode",
    type=click.Choice(("auto", *LIBRARY_MODES)),
    default="auto",
    show_default=True,
    metavar="MODE",
    help=f"auto (folder, else hook), {', '.join(LIBRARY_MODES)}.",
)
@click.option(
    "--staging-dir",
    type=ABSOLUTE_PATH,
    default="/var/lib/gpuctk/driver",
    show_default=True,
    metavar="DIR",
    help="Folder mode's stage folder.",
)
@click.option(
    "--prune-stages",
    is_flag=True,
    help="Remove stages that no spec or container uses.",
)
@click.option(
    "--keep-spec-dir",
    multiple=True,
    metavar="DIR",
    type=click.Path(file_okay=False, path_type=str),
    help="With --prune-stages: specs to keep too.",
)
@click.option(
    "--loader-folders",
    default="triplet,lib64",
    show_default=True,
    metavar="LIST",
    help="Loader folders.",
)
@click.option(
    "--driver-capabilities",
    type=Checked(capabilities.list_problem),
    default="all",
    show_default=True,
    metavar="LIST",
    help="Files of these capabilities.",
)
@cliopts.driver_root("Root of the driver files.")
@cliopts.dev_root("Root of /dev/nvidia*.")
@click.option("--proc-root", default="/proc", show_default=True, help="Where /proc is.")
@cliopts.sys_root("Where /sys is.")
@cliopts.nvml_library
@cliopts.simulate("A machine profile, not NVML (no GPU needed).")
@click.option(
    "--additional-gids",
    is_flag=True,
    help="Node groups for non-root users (CDI 0.7.0).",
)
@click.option(
    "--disable-hook",
    "disable_hooks",
    multiple=True,
    type=nvctk.Choice((*HOOK_ACTIONS, "all"), noop=nvctk.NVIDIA_ONLY_HOOKS),
    metavar="NAME",
    help="Skip a hook action (repeatable; all).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Overwrite nvidia-ctk's spec at --output.",
)
@click.option(  # the refresh unit's (docs/commands.md); hidden: --help stays one screen
    "--if-exists",
    is_flag=True,
    hidden=True,
    help="Only refresh an existing --output; remove it when no device is left.",
)
@nic_options
def generate(
    output: str | None,
    fmt: str | None,
    vendor: str,
    device_class: str,
    strategies: tuple[str, ...],
    no_all_device: bool,
    device_ids: tuple[str, ...],
    hook_path: str | None,
    library_mode: str,
    staging_dir: str,
    prune_stages: bool,
    keep_spec_dir: tuple[str, ...],
    loader_folders: str,
    driver_capabilities: str,
    driver_root: str,
    dev_root: str,
    proc_root: str,
    sys_root: str,
    nvml_library: str | None,
    simulate: str | None,
    mode: str,
    additional_gids: bool,
    disable_hooks: tuple[str, ...],
    force: bool,
    if_exists: bool,
    ldconfig_path: str = "",  # nvidia-ctk's --ldconfig-path (gpuctk.cdi.nvctk)
    **nic: Any,
) -> None:
    """\b
    Write a CDI spec for every GPU and MIG device on this node.
    """
    from gpuctk.cdi.generate_cmd import GenerateArgs, run

    run(
        GenerateArgs(
            output, fmt, vendor, device_class, strategies, no_all_device, device_ids,
            hook_path, library_mode, staging_dir, prune_stages, keep_spec_dir,
            loader_folders, driver_capabilities,
            Roots(driver_root, dev_root, proc_root, sys_root), nvml_library, simulate, nic,
            mode, additional_gids=additional_gids, disable_hooks=disable_hooks, force=force,
            ldconfig_path=ldconfig_path,
            if_exists=if_exists,
        )
    )  # fmt: skip
