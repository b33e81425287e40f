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
from gpuctk.cdi.node.facts import HOOK_NAME, PACKAGED_HOOK
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
    beside = os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), HOOK_NAME)
    if os.path.basename(sys.argv[0]) == "gpuctk" and os.path.isfile(beside):
        return beside
    if note and not os.path.exists(PACKAGED_HOOK):
        log.say(
            f"gpuctk: note: the spec names {PACKAGED_HOOK}, where the package installs it "
            "(not here); set --hook-path to name another"
        )
    return PACKAGED_HOOK


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
        log.say(f"gpuctk: note: replacing {output}, written by {found.writer} ({why})")
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
            log.say(f"gpuctk: {output} unchanged: {summary}")
        else:
            atomic_write(output, data, 0o644)
            log.say(f"gpuctk: wrote {output}: {summary}")
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        log.say(f"gpuctk: {summary}")


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
        log.say(f"gpuctk: {a.output} does not exist: nothing to refresh")
        return
    try:
        _run(a)
    except NoDevicesError as exc:
        check_foreign(a.output, a.force)
        os.unlink(a.output)
        log.say(f"gpuctk: removed {a.output}, no device left: {exc.message}")


def _run(a: GenerateArgs) -> None:
    """The steps (gpuctk.cdi.generate_steps), in order: no file is touched before every flag
    is checked, no discovery is done before the output's folder can be written."""
    from gpuctk.cdi import generate_steps as step

    checked = step.check_flags(a, *mode_defaults(a))
    step.prepare_output(checked.output, a.force)
    if a.mode == "imex":
        _imex(a, checked)
        return
    found = step.discover(a, checked.selected)
    opts = step.planned_stage(a, step.options(a, checked, found), found)
    spec = step.build(a, opts, found, checked.selected)  # its errors before the copy
    staged = step.stage(a, opts, found)
    if staged != opts:  # hook mode after all, or a driver file replaced meanwhile
        opts, spec = staged, step.build(a, staged, found, checked.selected)
    nic_spec = step.nics(a, opts, found, checked)
    machine, simulated = found.machine, found.simulated
    simulated_note, comment = "", None
    if simulated is not None:
        simulated_note = f" (simulated: {simulated.install})"
        comment = simulation_comment(a.simulate or "", simulated.install)
    summary = (
        f"{len(spec.devices)} devices for {len(machine.gpus)} GPU(s), "
        f"{len(machine.mig_devices)} MIG device(s); driver {machine.driver_version}; "
        f"{len(spec.edits.mounts)} mounts{simulated_note}; cdiVersion {spec.version}"
    )
    if not found.files.libraries and simulated is None:
        log.warning(
            f"no driver libraries for {machine.driver_version} under "
            f"{a.roots.driver_root} (set --driver-root); the spec mounts none"
        )
    emit(spec, checked.fmt, checked.output, summary, comment)
    if a.additional_gids and spec.version != "0.5.0":
        log.say(
            f"gpuctk: note: --additional-gids needs cdiVersion {spec.version}, which older "
            "engines refuse (Debian 12's podman 4.3.1 reads up to 0.5.0): run gpuctk doctor"
        )
    if a.prune_stages and opts.stage_path:
        step.prune(a, opts, checked.output)
    if nic_spec is not None:
        nic_spec.emit()


def _imex(a: GenerateArgs, checked: Any) -> None:
    """--mode imex: one device per IMEX channel (gpuctk.cdi.imex)."""
    from gpuctk.cdi import discover, imex

    discover.check_dir(a.roots.dev_root, "device root", "--dev-root")
    channels = imex.channel_nodes(a.roots.dev_root, a.roots.proc_root)
    spec = imex.build(checked.kind, channels, a.device_ids, not a.no_all_device)
    summary = f"{len(spec.devices)} devices for {len(channels)} IMEX channel(s)"
    emit(spec, checked.fmt, checked.output, f"{summary}; cdiVersion {spec.version}")
