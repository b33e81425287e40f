"""`gpuctk cdi generate` as one function over one options record (the click command in
gpuctk.cdi.cli only gathers the flags): check the flags, discover the node (NVML or a
profile, the driver files, the device nodes), build the spec (gpuctk.cdi.generate), stage
the driver for folder mode, and write the spec only when its bytes changed."""

from __future__ import annotations

import os
import sys
from typing import Any

from gpuctk import log
from gpuctk.cdi.discover import Roots
from gpuctk.cdi.generate import DEFAULT_STRATEGIES, Options
from gpuctk.cdi.node.facts import PACKAGED_HOOK
from gpuctk.cdi.specs.spec import Spec
from gpuctk.errors import NoDevicesError, OutputError, UsageError
from gpuctk.records import record


@record
class GenerateArgs:
    """The flags of `gpuctk cdi generate`, as click parsed them (see its --help)."""

    output: str | None
    fmt: str | None
    vendor: str
    device_class: str
    strategies: tuple[str, ...]
    no_all_device: bool
    device_ids: tuple[str, ...]
    hook_path: str | None  # None: default_hook_path()
    library_mode: str
    staging_dir: str
    prune_stages: bool
    keep_spec_dir: tuple[str, ...]
    loader_folders: str
    driver_capabilities: str
    roots: Roots
    nvml_library: str | None
    simulate: str | None
    nic: dict[str, Any]  # the NIC spec's flags (gpuctk.cdi.nicspec.nic_options)
    mode: str = "nvml"  # one of MODES
    additional_gids: bool = False  # gpuctk.cdi.generate.group_gids
    disable_hooks: tuple[str, ...] = ()  # gpuctk.cdi.generate.HOOK_ACTIONS, "all"
    force: bool = False  # replace another tool's spec at --output (gpuctk.cdi.foreignspec)
    ldconfig_path: str = ""  # the host ldconfig the hook runs (nvidia-ctk's --ldconfig-path)
    if_exists: bool = False  # refresh only an existing --output; remove it when no device is left


MODES = ("nvml", "management", "imex")  # --mode (gpuctk.cdi.management, gpuctk.cdi.imex)


def default_hook_path(note: bool = True) -> str:
    """The gpuctk-hook of the running install: the one beside this `gpuctk` launcher (a venv's
    bin/, the package's /usr/bin), else the packaged path, with a note when that is absent."""
    beside = os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "gpuctk-hook")
    if os.path.basename(sys.argv[0]) == "gpuctk" and os.path.isfile(beside):
        return beside
    if note and not os.path.exists(PACKAGED_HOOK):
        say(
            f"gpuctk: note: the spec names {PACKAGED_HOOK}, where the package installs it "
            "(not here); set --hook-path to name another"
        )
    return PACKAGED_HOOK


def front_beside(hook_path: str) -> str:
    """gpuctk-cdi-hook (hook/cdihook.c) beside `hook_path` when it is installed there, else ""
    (the spec then names gpuctk-hook itself)."""
    front = os.path.join(os.path.dirname(hook_path), "gpuctk-cdi-hook")
    return front if os.path.isfile(front) and os.access(front, os.X_OK) else ""


def say(line: str) -> None:
    log.say(line)


def simulation_comment(profile: str, install: str) -> str:
    """The first line of a simulated YAML spec: what it is, so that nobody installs it."""
    shown = "".join(c if c.isprintable() else "?" for c in profile)
    return (
        f"# simulated (gpuctk cdi generate --simulate {shown}): host paths are those of "
        f"{install}, not a spec for this node"
    )


def render(spec: Spec, fmt: str, comment: str | None = None) -> bytes:
    """`spec` as `fmt`; a YAML spec starts with `comment` (one line) when one is given."""
    doc = spec.to_dict()
    if fmt == "json":
        import json

        return (json.dumps(doc, indent=2) + "\n").encode()
    from gpuctk.cdi.specs import yamlout

    head = f"{comment}\n" if comment else ""
    return (head + yamlout.dump(doc)).encode()


def same_file(path: str, data: bytes, mode: int) -> bool:
    """Whether `path` is already a regular file (not a symlink) with exactly `data` and `mode`:
    then it is left alone, inode and mtime too, so a periodic refresh costs no write and
    wakes no watcher of the spec folder."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if (st.st_mode & 0o170000) != 0o100000 or st.st_mode & 0o7777 != mode:
            return False
        if st.st_size != len(data):
            return False
        from gpuctk.fs import read_limited

        return read_limited(fd, len(data)) == data
    except OSError:
        return False
    finally:
        os.close(fd)


def check_foreign(output: str, force: bool) -> None:
    """Refuse to replace another tool's spec at `output` (nvidia-ctk's, which its refresh unit
    writes again): OutputError naming the file, its writer and the fix. With `force`, or when
    the programs its hooks run are gone (a removed toolkit's leftover), replace it with a note."""
    from gpuctk.cdi.foreignspec import owner

    found = owner(output)
    if found is None:
        return
    if force or not found.installed:
        why = "--force" if force else f"{', '.join(found.programs)} no longer exists"
        say(f"gpuctk: note: replacing {output}, written by {found.writer} ({why})")
        return
    raise OutputError(found.refusal())


def output_format(fmt: str | None, output: str | None) -> str:
    if fmt:
        return fmt
    if output and output.endswith(".json"):
        return "json"
    return "yaml"


def emit(spec: Spec, fmt: str, output: str | None, summary: str,
         comment: str | None = None) -> None:  # fmt: skip
    """Write `spec` to `output` (only when its bytes changed), or to standard output."""
    from gpuctk.writes import atomic_write

    data = render(spec, fmt, comment)
    log.debug(f"{len(data)} bytes of {fmt} for {output or 'standard output'}")
    if output:
        if same_file(output, data, 0o644):
            say(f"gpuctk: {output} unchanged: {summary}")
        else:
            atomic_write(output, data, 0o644)
            say(f"gpuctk: wrote {output}: {summary}")
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        say(f"gpuctk: {summary}")


def mode_defaults(a: GenerateArgs) -> tuple[str, str]:
    """(vendor, class): the reference's defaults for the mode where the flags keep theirs."""
    if a.mode not in MODES:
        raise UsageError(f"--mode must be one of {', '.join(MODES)}, got {a.mode!r}")
    if a.mode != "nvml" and a.nic["nics"]:
        raise UsageError(f"--nic goes with --mode nvml, not {a.mode}")
    if a.mode == "management":
        if a.device_ids or a.no_all_device:
            raise UsageError(
                "--mode management has one device, all: drop --device-id and --no-all-device"
            )
        from gpuctk.cdi.management import VENDOR

        return (VENDOR if a.vendor == "nvidia.com" else a.vendor), a.device_class
    if a.mode == "imex":
        from gpuctk.cdi.imex import CLASS

        return a.vendor, (CLASS if a.device_class == "gpu" else a.device_class)
    return a.vendor, a.device_class


def run(a: GenerateArgs) -> None:
    """Generate the spec `a` asks for; UsageError, OutputError and the discovery errors.
    With `if_exists` (a refresh unit's run): nothing when --output does not exist, and when
    no device is left (an IMEX driver reloaded without channels, or with another major), the
    file is removed: a spec must not outlive its devices, whose numbers another device may
    take."""
    if not a.if_exists:
        _run(a)
        return
    if not a.output or a.output == "-":
        raise UsageError("--if-exists needs --output FILE (the spec to refresh)")
    if not os.path.lexists(a.output):
        say(f"gpuctk: {a.output} does not exist: nothing to refresh")
        return
    try:
        _run(a)
    except NoDevicesError as exc:
        check_foreign(a.output, a.force)
        os.unlink(a.output)
        say(f"gpuctk: removed {a.output}, no device left: {exc.message}")


def _run(a: GenerateArgs) -> None:
    output, fmt = (None if a.output == "-" else a.output), a.fmt  # "-": standard output
    vendor, device_class = mode_defaults(a)
    strategies, no_all_device, device_ids = a.strategies, a.no_all_device, a.device_ids
    hook_path, library_mode, staging_dir = a.hook_path, a.library_mode, a.staging_dir
    prune_stages, keep_spec_dir, loader_folders = a.prune_stages, a.keep_spec_dir, a.loader_folders
    driver_capabilities, nvml_library, simulate, nic = (
        a.driver_capabilities, a.nvml_library, a.simulate, a.nic,
    )  # fmt: skip
    from gpuctk.cdi import discover
    from gpuctk.cdi.generate import build_spec, check_options, without_drm
    from gpuctk.cdi.specs.names import class_name_problem, vendor_name_problem
    from gpuctk.records import replace

    for check, value, flag in (
        (vendor_name_problem, vendor, "--vendor"),
        (class_name_problem, device_class, "--class"),
    ):
        problem = check(value)
        if problem:
            raise UsageError(f"{flag}: {problem} (example: --vendor nvidia.com --class gpu)")
    if hook_path is None:
        hook_path = default_hook_path(note=library_mode in ("hook", "auto"))
    elif not os.path.isabs(hook_path):
        raise UsageError(f"--hook-path must be an absolute path, got {hook_path!r}")
    from gpuctk.cdi.node.capabilities import DRM_USERS, UTILITY, parse_strict

    try:
        selected = parse_strict(driver_capabilities)
    except ValueError as exc:
        raise UsageError(f"--driver-capabilities: {exc}") from None
    fmt = output_format(fmt, output)
    if output:
        # Fail on an unwritable destination before any discovery work.
        folder = os.path.dirname(os.path.abspath(output))
        try:  # made as nvidia-ctk makes it: /var/run/cdi does not exist on a fresh node
            os.makedirs(folder, 0o755, exist_ok=True)
        except OSError as exc:
            raise OutputError(
                f"cannot create the folder {folder} for {output}: {exc.strerror} (choose "
                "another --output)"
            ) from None
        if not os.access(folder, os.W_OK):
            raise OutputError(f"cannot write {output}: folder {folder} is not writable")
        check_foreign(output, a.force)
    roots = a.roots
    driver_root, dev_root = roots.driver_root, roots.dev_root
    if a.mode == "imex":
        from gpuctk.cdi import imex

        discover.check_dir(dev_root, "device root", "--dev-root")
        channels = imex.channel_nodes(dev_root, roots.proc_root)
        spec = imex.build(f"{vendor}/{device_class}", channels, device_ids, not no_all_device)
        summary = f"{len(spec.devices)} devices for {len(channels)} IMEX channel(s)"
        emit(spec, fmt, output, f"{summary}; cdiVersion {spec.version}")
        return
    if a.mode == "management" and driver_capabilities == "all":
        selected = frozenset((UTILITY,))  # NVML and nvidia-smi: what monitoring needs
    discover.check_dir(driver_root, "driver root", "--driver-root")
    if simulate:
        from gpuctk.cdi.node.profile import load_profile

        machine = load_profile(simulate)
        if dev_root == "/":  # the profile's own nodes: never this host's /dev
            from gpuctk.cdi.simulate import simulated_nodes

            nodes = simulated_nodes(machine)
        else:
            nodes = discover.real_nodes(roots)
    else:
        machine = discover.machine_from_nvml(roots, nvml_library)
        nodes = discover.real_nodes(roots)
    discover.trace(roots, machine, f"profile {simulate}" if simulate else "NVML")
    from gpuctk.cdi.node.driverfiles import select_capabilities

    discovered, simulated = discover.driver_files(roots, machine), None
    # No such driver on this host: a real install's files. Only for the host's own root: a
    # --driver-root named on purpose gets what it holds, and the warning below.
    if simulate and not discovered.libraries and os.path.realpath(driver_root) == "/":
        from gpuctk.cdi.node import manifest

        simulated = manifest.load(machine.driver_version, driver_root)
        if simulated is not None and library_mode == "folder":
            raise UsageError(
                f"--library-mode folder copies the driver's files, and {driver_root} has none "
                f"of driver {machine.driver_version}: set --driver-root, or pick another mode "
                "to see the simulated spec"
            )
        if simulated is not None:
            discovered = simulated.files
    files = select_capabilities(discovered, selected)
    if library_mode == "auto":  # folder where its stage can be built from real files
        real = simulated is None and files.libraries and a.mode == "nvml"
        library_mode = "folder" if real else "hook"
    log.debug(f"--mode {a.mode}, library mode {library_mode} (asked: {a.library_mode}); "
              f"{len(files.libraries)} libraries of {driver_capabilities}")  # fmt: skip
    if not selected & DRM_USERS:
        nodes = without_drm(nodes)
    opts = Options(
        kind=f"{vendor}/{device_class}",
        name_strategies=tuple(dict.fromkeys(strategies or DEFAULT_STRATEGIES)),
        all_device=not no_all_device,
        device_ids=device_ids,
        hook_path=hook_path,
        library_mode=library_mode,
        loader_folders=tuple(
            dict.fromkeys(w.strip() for w in loader_folders.split(",") if w.strip())
        ),
        additional_gids=a.additional_gids,
        disabled_hooks=tuple(dict.fromkeys(a.disable_hooks)),
        ldconfig_path=a.ldconfig_path,
    )
    check_options(opts)
    if prune_stages and library_mode != "folder":
        raise UsageError("--prune-stages goes with --library-mode folder (no other mode stages)")
    if keep_spec_dir and not prune_stages:
        raise UsageError("--keep-spec-dir goes with --prune-stages")
    keep_spec_dir = tuple(os.path.abspath(d) for d in keep_spec_dir)

    def report(line: str) -> None:
        print(f"gpuctk: {line}", file=sys.stderr, flush=True)

    if library_mode == "folder":
        from gpuctk.cdi.stage import stage_driver

        if not os.path.isabs(staging_dir):
            raise UsageError(f"--staging-dir must be an absolute path, got {staging_dir!r}")
        log.debug(f"staging the driver in {staging_dir} (an identical stage is reused)")
        try:
            stage_path = stage_driver(files, machine.driver_version, staging_dir, report)
        except OutputError as exc:
            if a.library_mode != "auto":
                raise
            say(f"gpuctk: note: {exc.message}: writing a hook-mode spec (--library-mode hook)")
            opts = replace(opts, library_mode="hook")
            library_mode = "hook"
        else:
            opts = replace(opts, stage_path=stage_path, front_path=front_beside(hook_path))
    if a.mode == "management":
        from gpuctk.cdi import management
        from gpuctk.cdi.simulate import simulated_nodes

        if simulate and dev_root == "/":
            found = management.lookup_nodes(machine, simulated_nodes(machine))
        else:
            found = management.scan_nodes(dev_root)
        spec = management.build(machine, files, opts, found)
    else:
        spec = build_spec(machine, files, opts, nodes)
    nic_spec = None
    if nic["nics"]:  # RDMA cards: a second spec (gpuctk.cdi.nicspec)
        from gpuctk.cdi import nicspec

        nic_spec = nicspec.build(machine, opts, roots, output, fmt, nic)
    simulated_note, comment = "", None
    if simulated is not None:
        simulated_note = f" (simulated: {simulated.install})"
        comment = simulation_comment(simulate or "", simulated.install)
    summary = (
        f"{len(spec.devices)} devices for {len(machine.gpus)} GPU(s), "
        f"{len(machine.mig_devices)} MIG device(s); driver {machine.driver_version}; "
        f"{len(spec.edits.mounts)} mounts{simulated_note}; cdiVersion {spec.version}"
    )
    if not files.libraries and simulated is None:
        say(
            f"gpuctk: warning: no driver libraries for {machine.driver_version} under "
            f"{driver_root} (set --driver-root); the spec mounts none"
        )
    emit(spec, fmt, output, summary, comment)
    if a.additional_gids and spec.version != "0.5.0":
        say(
            f"gpuctk: note: --additional-gids needs cdiVersion {spec.version}, which older "
            "engines refuse (Debian 12's podman 4.3.1 reads up to 0.5.0): run gpuctk doctor"
        )
    if prune_stages:
        from gpuctk.cdi.specs.registry import DEFAULT_SPEC_DIRS
        from gpuctk.cdi.stageprune import prune_stages as prune

        mine = (os.path.dirname(os.path.abspath(output)),) if output else ()
        where = tuple(dict.fromkeys(DEFAULT_SPEC_DIRS + mine + keep_spec_dir))
        prune(os.path.dirname(opts.stage_path), opts.stage_path, where, report)
    if nic_spec is not None:
        nic_spec.emit()
