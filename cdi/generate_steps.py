"""The steps of `gpuctk cdi generate` (gpuctk.cdi.generate_cmd runs them in this order):
check the flags, make the output's folder, discover the node, choose the library mode and
the options, build the spec, stage the driver (folder mode: after the spec, so that its
errors come before the copy), build the NIC spec. Each takes what the earlier
ones gave and returns what the later ones need; none writes the spec (generate_cmd.emit)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from gpuctk import log
from gpuctk.cdi.generate import DEFAULT_STRATEGIES, NodeLookup, Options
from gpuctk.errors import OutputError, UsageError
from gpuctk.records import record, replace

if TYPE_CHECKING:
    from gpuctk.cdi.generate_cmd import GenerateArgs
    from gpuctk.cdi.node.driverfiles import DriverFiles
    from gpuctk.cdi.node.machine import Machine
    from gpuctk.cdi.node.manifest import Manifest
    from gpuctk.cdi.specs.spec import Spec


@record
class Checked:
    """The flags, checked: what the later steps read instead of the raw ones."""

    output: str | None  # None: standard output
    fmt: str
    kind: str  # vendor/class
    hook_path: str
    selected: frozenset[str]  # the driver capabilities


@record
class Found:
    """The node: its machine, device nodes and the driver files the spec may carry."""

    machine: Machine
    nodes: NodeLookup
    files: DriverFiles
    simulated: Manifest | None  # a simulated install's files (no such driver here)


def check_flags(a: GenerateArgs, vendor: str, device_class: str) -> Checked:
    """Every check of the flags alone (UsageError), before anything is read or written."""
    from gpuctk.cdi.generate_cmd import default_hook_path, output_format
    from gpuctk.cdi.node.capabilities import UTILITY, parse_strict

    hook_path = a.hook_path
    if hook_path is None:
        hook_path = default_hook_path(note=a.library_mode in ("hook", "auto"))
    selected = parse_strict(a.driver_capabilities)  # checked where click read it
    if a.mode == "management" and a.driver_capabilities == "all":
        selected = frozenset((UTILITY,))  # NVML and nvidia-smi: what monitoring needs
    output = None if a.output == "-" else a.output  # "-": standard output
    fmt = output_format(a.fmt, output)
    return Checked(output, fmt, f"{vendor}/{device_class}", hook_path, selected)


def prepare_output(output: str | None, force: bool) -> None:
    """Fail on an unwritable destination before any discovery work; its folder is made as
    nvidia-ctk makes it (/var/run/cdi does not exist on a fresh node)."""
    if not output:
        return
    from gpuctk.cdi.generate_cmd import check_foreign

    folder = os.path.dirname(os.path.abspath(output))
    try:
        os.makedirs(folder, 0o755, exist_ok=True)
    except OSError as exc:
        raise OutputError(
            f"cannot create the folder {folder} for {output}: {exc.strerror} (choose "
            "another --output)"
        ) from None
    if not os.access(folder, os.W_OK):
        raise OutputError(f"cannot write {output}: folder {folder} is not writable")
    check_foreign(output, force)


def discover(a: GenerateArgs, selected: frozenset[str]) -> Found:
    """The machine (NVML or --simulate's profile), its device nodes and the selected driver
    files; a simulated install's files when --simulate names a driver this host lacks."""
    from gpuctk.cdi import discover as disc
    from gpuctk.cdi.node.driverfiles import select_capabilities

    roots = a.roots
    disc.check_dir(roots.driver_root, "driver root", "--driver-root")
    if a.simulate:
        from gpuctk.cdi.node.profile import load_profile

        machine = load_profile(a.simulate)
        if roots.dev_root == "/":  # the profile's own nodes: never this host's /dev
            from gpuctk.cdi.simulate import simulated_nodes

            nodes = simulated_nodes(machine)
        else:
            nodes = disc.real_nodes(roots)
    else:
        machine = disc.machine_from_nvml(roots, a.nvml_library)
        nodes = disc.real_nodes(roots)
    disc.trace(roots, machine, f"profile {a.simulate}" if a.simulate else "NVML")
    discovered, simulated = disc.driver_files(roots, machine), None
    # No such driver on this host: a real install's files. Only for the host's own root: a
    # --driver-root named on purpose gets what it holds, and the warning generate_cmd gives.
    if a.simulate and not discovered.libraries and os.path.realpath(roots.driver_root) == "/":
        from gpuctk.cdi.node import manifest

        simulated = manifest.load(machine.driver_version, roots.driver_root)
        if simulated is not None and a.library_mode == "folder":
            raise UsageError(
                f"--library-mode folder copies the driver's files, and {roots.driver_root} has "
                f"none of driver {machine.driver_version}: set --driver-root, or pick another "
                "mode to see the simulated spec"
            )
        if simulated is not None:
            discovered = simulated.files
    files = select_capabilities(discovered, selected)
    return Found(machine, nodes, files, simulated)


def options(a: GenerateArgs, checked: Checked, found: Found) -> Options:
    """The spec's options: the library mode chosen (auto: folder where a stage can be built
    from real files), the device nodes of the capabilities, the flags' values checked."""
    from gpuctk.cdi.generate import check_options

    library_mode = a.library_mode
    if library_mode == "auto":
        real = found.simulated is None and found.files.libraries and a.mode == "nvml"
        library_mode = "folder" if real else "hook"
    log.debug(f"--mode {a.mode}, library mode {library_mode} (asked: {a.library_mode}); "
              f"{len(found.files.libraries)} libraries of {a.driver_capabilities}")  # fmt: skip
    opts = Options(
        kind=checked.kind,
        name_strategies=tuple(dict.fromkeys(a.strategies or DEFAULT_STRATEGIES)),
        all_device=not a.no_all_device,
        device_ids=a.device_ids,
        hook_path=checked.hook_path,
        library_mode=library_mode,
        loader_folders=tuple(
            dict.fromkeys(w.strip() for w in a.loader_folders.split(",") if w.strip())
        ),
        additional_gids=a.additional_gids,
        disabled_hooks=tuple(dict.fromkeys(a.disable_hooks)),
        ldconfig_path=a.ldconfig_path,
    )
    check_options(opts)
    if a.prune_stages and library_mode != "folder":
        raise UsageError("--prune-stages goes with --library-mode folder (no other mode stages)")
    if a.keep_spec_dir and not a.prune_stages:
        raise UsageError("--keep-spec-dir goes with --prune-stages")
    return opts


def report(line: str) -> None:
    """The stage's and the prune's lines."""
    log.say(f"gpuctk: {line}")


def planned_stage(a: GenerateArgs, opts: Options, found: Found) -> Options:
    """Folder mode: the options with the stage's folder as stage_driver will name it, and
    nothing written yet: the spec is built, and its errors found, before the copy."""
    if opts.library_mode != "folder":
        return opts
    from gpuctk.cdi.node.facts import compiled_beside
    from gpuctk.cdi.stage import stage_path_of

    path = stage_path_of(found.files, found.machine.driver_version, a.staging_dir)
    return replace(opts, stage_path=path, front_path=compiled_beside(opts.hook_path))


def stage(a: GenerateArgs, opts: Options, found: Found) -> Options:
    """Folder mode: the stage planned_stage named, built (gpuctk.cdi.stage). The options
    returned differ only when the spec must be built again: a stage that cannot be built
    under --library-mode auto falls back to hook mode, with a note; a driver file replaced
    since the plan gives another folder."""
    if opts.library_mode != "folder":
        return opts
    from gpuctk.cdi.stage import stage_driver

    log.debug(f"staging the driver in {a.staging_dir} (an identical stage is reused)")
    try:
        path = stage_driver(found.files, found.machine.driver_version, a.staging_dir, report)
    except OutputError as exc:
        if a.library_mode != "auto":
            raise
        log.say(f"gpuctk: note: {exc.message}: writing a hook-mode spec (--library-mode hook)")
        return replace(opts, library_mode="hook", stage_path="", front_path="")
    return opts if path == opts.stage_path else replace(opts, stage_path=path)


def build(a: GenerateArgs, opts: Options, found: Found, selected: frozenset[str]) -> Spec:
    """The spec of the mode (the GPUs' DRM nodes only for the capabilities that open them)."""
    from gpuctk.cdi.generate import build_spec, without_drm
    from gpuctk.cdi.node.capabilities import DRM_USERS

    nodes = found.nodes if selected & DRM_USERS else without_drm(found.nodes)
    if a.mode == "management":
        from gpuctk.cdi import management
        from gpuctk.cdi.simulate import simulated_nodes

        if a.simulate and a.roots.dev_root == "/":
            present = management.lookup_nodes(found.machine, simulated_nodes(found.machine))
        else:
            present = management.scan_nodes(a.roots.dev_root)
        spec = management.build(found.machine, found.files, opts, present)
    else:
        spec = build_spec(found.machine, found.files, opts, nodes)
    return spec


def nics(a: GenerateArgs, opts: Options, found: Found, checked: Checked) -> Any:
    """The RDMA cards' spec (gpuctk.cdi.nicspec; nothing written yet), None without --nics."""
    if not a.nic["nics"]:
        return None
    from gpuctk.cdi import nicspec

    return nicspec.build(found.machine, opts, a.roots, checked.output, checked.fmt, a.nic)


def prune(a: GenerateArgs, opts: Options, output: str | None) -> None:
    """--prune-stages: the stages no spec names and no container mounts go."""
    from gpuctk.cdi.specs.registry import DEFAULT_SPEC_DIRS
    from gpuctk.cdi.stageprune import prune_stages

    mine = (os.path.dirname(os.path.abspath(output)),) if output else ()
    keep = tuple(os.path.abspath(d) for d in a.keep_spec_dir)
    where = tuple(dict.fromkeys(DEFAULT_SPEC_DIRS + mine + keep))
    prune_stages(os.path.dirname(opts.stage_path), opts.stage_path, where, report)
