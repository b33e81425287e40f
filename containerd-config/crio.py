"""`--runtime crio`: a drop-in in /etc/crio/crio.conf.d with a `[crio.runtime.runtimes.<name>]`.

CRI-O reads every file of crio.conf.d (in name order) over crio.conf, table by table, and a new
key in `crio.runtime.runtimes` adds a handler without touching the others: the drop-in holds only
the new handler (and `default_runtime` with --set-as-default). The handler copies the default
OCI runtime's table (monitor_path, monitor_cgroup, monitor_env, ...) except the runtime-specific
runtime_path, runtime_root and runtime_config_path, and points runtime_path at the shim.

`--mode hook` writes no handler: a hooks.d file (gpuctk.containerd.hooksd) in CRI-O's default
`hooks_dir` instead, that runs `gpuctk-hook prestart` for containers with a CDI annotation.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile

from gpuctk import log
from gpuctk.containerd import engine, hooksd, state, tomlfiles
from gpuctk.containerd import plan as planmod
from gpuctk.containerd.options import Options
from gpuctk.containerd.plan import FileChange, Plan
from gpuctk.containerd.tomlfiles import Table
from gpuctk.errors import InputError

_NOT_COPIED = ("runtime_path", "runtime_root", "runtime_config_path")


def _drop_ins(directory: str, exclude: str) -> list[str]:
    try:
        names = sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        raise InputError(f"cannot list {directory}: {exc.strerror}") from None
    skip = tomlfiles.abspath(exclude)
    paths = [os.path.join(directory, n) for n in names if not n.startswith(".")]
    return [p for p in paths if os.path.isfile(p) and tomlfiles.abspath(p) != skip]


def _from_files(opts: Options) -> Table:
    main = tomlfiles.load(opts.config)
    merged: Table = main or {}
    others = _drop_ins(os.path.dirname(tomlfiles.abspath(opts.drop_in)), opts.drop_in)
    for path in others:
        merged = tomlfiles.deep_merge(merged, tomlfiles.load(path) or {})
    log.debug(
        f"CRI-O config from the files: {opts.config} ({'absent' if main is None else 'read'}), "
        f"{len(others)} other drop-in(s): {', '.join(others) or 'none'}"
    )
    return merged


def _from_command(opts: Options, exe: str) -> Table:
    """`crio config` over the main file and the other drop-ins (ours left out)."""
    with tempfile.TemporaryDirectory(prefix="gpuctk-crio-") as tmp:
        directory = os.path.dirname(tomlfiles.abspath(opts.drop_in))
        for path in _drop_ins(directory, opts.drop_in):
            shutil.copyfile(path, os.path.join(tmp, os.path.basename(path)))
        argv = [exe]
        if os.path.exists(opts.config):
            argv += ["--config", opts.config]
        text = engine.run([*argv, "--config-dir", tmp, "config"])
    log.debug(f"CRI-O config from `{exe} config` (the drop-in left out)")
    return tomlfiles.parse(text, f"{exe} config")


def _effective(opts: Options) -> Table:
    if opts.config_source == "file":
        return _from_files(opts)
    exe = engine.find(opts.executable_path, "crio")
    if exe is None:
        if opts.config_source == "command":
            raise InputError(
                "crio not found on PATH: give --executable-path, or --config-source file"
            )
        return _from_files(opts)
    return _from_command(opts, exe)


def handler_table(effective: Table, opts: Options) -> tuple[Table, list[str]]:
    runtime = tomlfiles.get_table(effective, "crio", "runtime") or {}
    runtimes = runtime.get("runtimes") if isinstance(runtime.get("runtimes"), dict) else {}
    assert isinstance(runtimes, dict)
    default = runtime.get("default_runtime")
    notes: list[str] = []
    base: Table = {}
    for name in [default, "crun", "runc"]:
        if (
            isinstance(name, str)
            and name != opts.runtime_name
            and isinstance(runtimes.get(name), dict)
        ):
            base = copy.deepcopy(runtimes[name])
            if name != "runc":
                notes.append(
                    f"CRI-O's default runtime is {name!r}: list it first in `runtimes` in "
                    "/etc/gpuctk/config.toml so that gpuctk-runtime executes it"
                )
            break
    table: Table = {"runtime_path": opts.runtime_path, "runtime_type": "oci"}
    table.update((k, v) for k, v in base.items() if k not in (*_NOT_COPIED, "runtime_type"))
    return table, notes


HOOKS_WHAT = "CRI-O hooks.d file"
HOOKS_NOTE = (
    "CRI-O reads hooks from crio.conf's hooks_dir (default /usr/share/containers/oci/hooks.d): "
    "if it names other folders, re-run with --drop-in <one of them>/99-gpuctk.json"
)


def plan_configure(opts: Options) -> Plan:
    if opts.mode == "hook":
        notes = [HOOKS_NOTE]
        if opts.set_as_default or opts.cdi_enabled:
            notes.append("--mode hook adds no handler: --set-as-default and --cdi-enabled ignored")
        return hooksd.plan_configure(opts, HOOKS_WHAT, tuple(notes))
    _, previous = state.read_owned(opts.drop_in, "drop-in")  # refuses a foreign file
    effective = _effective(opts)
    table, notes = handler_table(effective, opts)
    runtime: Table = {}
    if opts.set_as_default:
        runtime["default_runtime"] = opts.runtime_name
    log.debug(
        f"drop-in {opts.drop_in}: crio.runtime.runtimes.{opts.runtime_name} "
        f"({len(table)} key(s))" + (", crio.runtime.default_runtime" * opts.set_as_default)
    )
    runtime["runtimes"] = {opts.runtime_name: table}
    record = state.State(dirs=tuple(planmod.missing_dirs(opts.drop_in)))
    if previous is not None:
        record = previous.merged(record)
    header = [
        f"Written by `gpuctk runtime configure`: CRI-O runtime handler {opts.runtime_name!r}.",
        "`gpuctk runtime unconfigure --runtime crio` removes this file; do not edit.",
        record.line(),
    ]
    text = tomlfiles.dumps_tables({"crio": {"runtime": runtime}}, header)
    if opts.cdi_enabled:
        notes.append(
            "CRI-O always reads CDI specs (cdi_spec_dirs in crio.conf): --cdi-enabled ignored"
        )
    return Plan((FileChange(opts.drop_in, text.encode(), "CRI-O drop-in"),), tuple(notes))


def plan_unconfigure(opts: Options) -> Plan:
    if opts.mode == "hook":
        return hooksd.plan_unconfigure(opts, HOOKS_WHAT)
    text, record = state.read_owned(opts.drop_in, "drop-in")
    if text is None or record is None:
        return Plan(())
    removal = FileChange(opts.drop_in, None, "CRI-O drop-in")
    return Plan((removal, *planmod.removable_dirs(record.dirs, [opts.drop_in])))
