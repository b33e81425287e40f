"""`gpuctk runtime configure|unconfigure --runtime containerd`: plan the drop-in and the imports.

The drop-in is written at the main config's own version (gpuctk.containerd.versions: never the
version `config dump` prints), in that version's CRI plugin table. How containerd combines it
with the rest:

- version 2 (plugin `io.containerd.grpc.v1.cri`) read by containerd 1.x: an imported file
  REPLACES each plugin table it names, so the drop-in carries the CRI table the files set (the
  main config and the imports before it; never `config dump`'s defaults) plus the new handler
  (and the built-in runc when no file names a runtimes table): runc and every other CRI
  setting survive, and a key the main config sets later takes effect. A key the main config
  already set is pinned by the copy: changing it needs configure again, and
  `gpuctk doctor` (engine.containerd.shadowed) fails naming each such key.
- version 3 or 4 (plugin `io.containerd.cri.v1.runtime`), or any version read by containerd
  2.x: imported files are deep-merged, so the drop-in holds only what gpuctk adds.

Every handler table carries `runtime_type`: without it CRI creates containers with no runtime
name and every sandbox fails ("container.Runtime.Name must be set").
"""

from __future__ import annotations

import copy
import os

from gpuctk import log
from gpuctk.containerd import (
    engine,
    handler,
    imports,
    mainconfig,
    ocispec,
    state,
    takeover,
    tomlfiles,
    versions,
)
from gpuctk.containerd import plan as planmod
from gpuctk.containerd.options import Options
from gpuctk.containerd.plan import FileChange, Plan
from gpuctk.containerd.tomlfiles import Table
from gpuctk.errors import InputError, ValidationError

BACKUP_SUFFIX = ".gpuctk-backup"

# containerd 1.6/1.7's built-in runc handler (`containerd config default`): what a drop-in that
# names a runtimes table must carry for runc to stay exactly as it was.
DEFAULT_RUNC: Table = {
    "runtime_type": handler.RUNC_V2,
    "options": {
        "BinaryName": "",
        "CriuImagePath": "",
        "CriuPath": "",
        "CriuWorkPath": "",
        "IoGid": 0,
        "IoUid": 0,
        "NoNewKeyring": False,
        "NoPivotRoot": False,
        "Root": "",
        "ShimCgroup": "",
        "SystemdCgroup": False,
    },
}


def base_spec_path(drop_in: str) -> str:
    """Where --mode hook writes the handler's base OCI spec: beside the drop-in."""
    return os.path.splitext(tomlfiles.abspath(drop_in))[0] + ".base-spec.json"


def _binary(opts: Options) -> engine.Binary | None:
    if opts.config_source == "file":
        log.debug("containerd binary: not asked (--config-source file): the files alone count")
        return None
    path = engine.find(opts.executable_path)
    if path is None:
        if opts.config_source == "command":
            raise InputError(
                "containerd not found on PATH: give --executable-path, or use --config-source file"
            )
        log.debug("containerd binary: none on PATH: the config is read from the files")
        return None
    binary = engine.version(path)
    log.debug(f"containerd binary: {path}, version {binary.major}.{binary.minor} ({binary.text})")
    return binary


def _effective_cri(
    opts: Options,
    data: Table | None,
    version: int,
    merge: imports.MergeMode,
    binary: engine.Binary | None,
    disabled: tuple[str, ...] = (),
) -> tuple[Table, int]:
    """The CRI plugin table the drop-in starts from, and the version of its layout.

    containerd 2.x (deep): the table containerd sees without our drop-in (`config dump` when
    the binary is there), whose runtimes the handler is built from. containerd 1.x (replace):
    the table the FILES set (main config and the imports before ours), never the dump's
    defaults: the drop-in then pins only the keys the admin wrote, and a key added to the main
    config later takes effect. The dump still tells the version of the layout it reads. The
    dump's version is the newest the binary knows, whatever the files say: it picks the table
    to read here and nothing else. `disabled`: files --take-over is about to disable.
    """
    layout = version
    if binary is not None:
        dumped = engine.dump(binary.path, opts.config, data, opts.drop_in, version, disabled)
        layout = dumped.get("version", version)
        layout = layout if layout in versions.CRI_PLUGIN else version
        log.debug(f"`{binary.path} config dump` (the drop-in left out): layout version {layout}")
        if merge == "deep":
            return copy.deepcopy(
                tomlfiles.get_table(dumped, "plugins", versions.CRI_PLUGIN[layout]) or {}
            ), layout
    loaded = imports.load(
        opts.config, merge, exclude=opts.drop_in, main_data=data or {}, also_exclude=disabled
    )
    cri = copy.deepcopy(
        tomlfiles.get_table(loaded.data, "plugins", versions.CRI_PLUGIN[version]) or {}
    )
    added_runc = merge == "replace" and tomlfiles.get_table(cri, "containerd", "runtimes") is None
    if added_runc:
        # containerd 1.x keeps its built-in runc only while no file names a runtimes table;
        # the drop-in names one, so it must carry runc too.
        tomlfiles.set_path(cri, ["containerd", "runtimes", "runc"], copy.deepcopy(DEFAULT_RUNC))
    log.debug(
        f"CRI table from {len(loaded.files)} file(s) (main config, imports; not the drop-in): "
        f"{len(cri)} key(s)" + ("; the built-in runc added (no file names runtimes)" * added_runc)
    )
    return cri, layout


def _header(opts: Options, merge: imports.MergeMode, record: state.State) -> list[str]:
    lines = [
        f"Written by `gpuctk runtime configure`: runtime handler {opts.runtime_name!r} "
        f"({opts.mode} mode).",
        "`gpuctk runtime unconfigure` removes this file and its `imports` entry; do not edit.",
    ]
    if merge == "replace":
        lines += [
            "containerd 1.x replaces a whole plugin table from an imported file, so this file",
            "carries a copy of the CRI table the main config sets: after changing CRI settings",
            "there, run `gpuctk runtime configure` again (`gpuctk doctor` names a stale key).",
        ]
    else:
        lines.append(
            "containerd 2.x merges imported files key by key: only gpuctk's keys are here."
        )
    return [*lines, record.line()]


def _drop_in_data(
    opts: Options, cri: Table, version: int, merge: imports.MergeMode
) -> tuple[Table, tuple[str, ...]]:
    """The drop-in's data at `version` (the main config's): the whole CRI table plus the
    handler (replace), or only the handler."""
    spec = base_spec_path(opts.drop_in) if opts.mode == "hook" else None
    runtimes = tomlfiles.get_table(cri, "containerd", "runtimes") or {}
    default_name = tomlfiles.get(cri, "containerd", "default_runtime_name")
    built = handler.build(runtimes, default_name if default_name else "runc", opts, spec)
    if merge == "replace":
        out = copy.deepcopy(cri)
        table = out.setdefault("containerd", {})
        table["runtimes"] = {k: v for k, v in runtimes.items() if k != opts.runtime_name}
        table["runtimes"][opts.runtime_name] = built.table
    else:
        out = {"containerd": {"runtimes": {opts.runtime_name: built.table}}}
    if opts.set_as_default:
        out["containerd"]["default_runtime_name"] = opts.runtime_name
    if opts.cdi_enabled:
        out["enable_cdi"] = True
        out["cdi_spec_dirs"] = list(opts.cdi_spec_dirs)
    keys = [f"containerd.runtimes.{opts.runtime_name}"]
    keys += ["containerd.default_runtime_name"] * opts.set_as_default
    keys += ["enable_cdi", "cdi_spec_dirs"] * opts.cdi_enabled
    whole = f"a copy of the CRI table ({len(cri)} key(s)) with " if merge == "replace" else ""
    log.debug(
        f"drop-in {opts.drop_in}: version {version}, plugins.{versions.CRI_PLUGIN[version]}: "
        f"{whole}{', '.join(keys)} (options from handler {built.base_name or 'none'!r})"
    )
    return {"version": version, "plugins": {versions.CRI_PLUGIN[version]: out}}, built.notes


def _command(opts: Options) -> str:
    """The configure command line for these options (the flags that differ from defaults)."""
    import shlex

    from gpuctk.containerd import options as optmod

    argv = ["gpuctk", "runtime", "configure", "--runtime", "containerd"]
    if opts.config != optmod.DEFAULT_CONFIG["containerd"]:
        argv += ["--config", opts.config]
    if opts.drop_in != optmod.default_drop_in("containerd", opts.mode):
        argv += ["--drop-in", opts.drop_in]
    if opts.runtime_name != optmod.DEFAULT_RUNTIME_NAME:
        argv += ["--runtime-name", opts.runtime_name]
    if opts.mode != "shim":
        argv += ["--mode", opts.mode]
    return shlex.join(argv)


def plan_configure(opts: Options) -> Plan:
    """Everything configure writes for containerd, computed without writing anything."""
    main_text = tomlfiles.read_text(opts.config)
    data = tomlfiles.parse(main_text, opts.config) if main_text is not None else None
    _, previous = state.read_owned(opts.drop_in, "drop-in")
    binary = _binary(opts)
    version = versions.main_version(opts.config, data, binary)
    merge: imports.MergeMode = "deep" if versions.deep_merges(version, binary) else "replace"
    how = "deep merge, containerd 2.x" if merge == "deep" else "tables replaced, containerd 1.x"
    log.debug(
        f"main config {opts.config}: {'absent' if data is None else 'read'}, version {version}, "
        f"imports {how}; drop-in {opts.drop_in}: {'absent' if previous is None else 'exists'}"
    )
    edit = mainconfig.add_import(opts.config, main_text, opts.drop_in, version)
    keys = f" (new keys: {', '.join(edit.added)})" if edit.added else ""
    change = "none, it imports the drop-in" if edit.text == main_text else "import the drop-in"
    log.debug(f"main config edit: {change}{keys}")
    # Files loaded after the drop-in that set the same handler win over it (99-nvidia.toml)
    found = takeover.rivals(
        opts.config,
        tomlfiles.parse(edit.text, opts.config),
        opts.drop_in,
        opts.runtime_name,
        merge,
    )
    if found:
        log.debug(
            f"files after the drop-in that set {opts.runtime_name!r}: "
            + ", ".join(r.path for r in found)
        )
    if found and not opts.take_over:
        raise takeover.refusal(found, opts.runtime_name, opts.drop_in, _command(opts))
    disabled = tuple(r.path for r in found)
    loaded = imports.load(
        opts.config, merge, exclude=opts.drop_in, main_data=data or {}, also_exclude=disabled
    )
    versions.check_imports(opts.config, loaded.files, version, tomlfiles.abspath(opts.config))
    cri, layout = _effective_cri(opts, data, version, merge, binary, disabled)
    if merge == "replace" and layout != version:
        raise ValidationError(
            f"containerd printed a version {layout} config for a version {version} main config"
        )
    drop_in_data, handler_notes = _drop_in_data(opts, cri, version, merge)

    spec = base_spec_path(opts.drop_in) if opts.mode == "hook" else None
    targets = [p for p in (spec, opts.drop_in, opts.config) if p is not None]
    dirs = dict.fromkeys(d for p in targets for d in planmod.missing_dirs(p))
    record = state.State(
        edit.added, main_text is None, (spec,) if spec else (), tuple(dirs), disabled
    )
    if previous is not None:
        record = previous.merged(record)
    text = tomlfiles.dumps_tables(drop_in_data, _header(opts, merge, record))

    changes: list[FileChange] = takeover.disable(found, opts.runtime_name)
    if spec is not None:
        changes.append(
            FileChange(
                spec,
                ocispec.dumps(ocispec.base_spec(opts.hook_path, opts.hook_config)),
                "base OCI spec",
                0o644,
            )
        )
    # The drop-in may carry the main config's registry credentials: give it the main's mode.
    main_mode = planmod.file_mode(opts.config)
    drop_in_mode = main_mode if main_mode is not None else 0o644
    changes.append(FileChange(opts.drop_in, text.encode(), "containerd drop-in", drop_in_mode))
    if edit.text != main_text:
        backup = opts.config + BACKUP_SUFFIX
        if main_text is not None and not os.path.exists(backup):
            changes.append(
                FileChange(backup, main_text.encode(), "backup of the main config", main_mode)
            )
        target = planmod.write_target(opts.config)
        changes.append(FileChange(target, edit.text.encode(), "containerd main config"))
    notes = list(handler_notes)
    if opts.mode == "shim" and not os.path.exists(opts.runtime_path):
        notes.append(f"{opts.runtime_path} does not exist yet (--runtime-path)")
    if opts.cdi_enabled and binary is not None and (binary.major, binary.minor) < (1, 7):
        notes.append(
            f"containerd {binary.major}.{binary.minor} ignores enable_cdi (CDI needs 1.7+); "
            "gpuctk-runtime applies CDI requests itself"
        )
    return Plan(tuple(changes), tuple(notes))


def plan_unconfigure(opts: Options) -> Plan:
    """Everything unconfigure removes or restores for containerd."""
    _, record = state.read_owned(opts.drop_in, "drop-in")
    log.debug(f"drop-in {opts.drop_in}: " + (record.line() if record else "absent"))
    record = record or state.State()
    changes: list[FileChange] = []
    main_text = tomlfiles.read_text(opts.config)
    log.debug(f"main config {opts.config}: {'absent' if main_text is None else 'read'}")
    if main_text is not None:
        new = mainconfig.remove_import(opts.config, main_text, opts.drop_in, record.added)
        if record.created and not new.strip():
            changes.append(
                FileChange(opts.config, None, "containerd main config (created by gpuctk)")
            )
        elif new != main_text:
            target = planmod.write_target(opts.config)
            changes.append(FileChange(target, new.encode(), "containerd main config"))
        backup = opts.config + BACKUP_SUFFIX
        backup_text = tomlfiles.read_text(backup)
        if backup_text is not None and backup_text == new:
            changes.append(FileChange(backup, None, "backup of the main config (now equal)"))
    if os.path.lexists(opts.drop_in):
        changes.append(FileChange(opts.drop_in, None, "containerd drop-in"))
    for path in record.files:
        if os.path.lexists(path):
            changes.append(FileChange(path, None, "base OCI spec"))
    restored, notes = takeover.restore(record.disabled)
    changes += restored
    removed = [c.path for c in changes if c.data is None]
    changes += planmod.removable_dirs(record.dirs, removed)
    return Plan(tuple(changes), tuple(notes))
