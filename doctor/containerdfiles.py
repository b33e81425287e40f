"""`gpuctk doctor`: containerd config files that stop containerd, or every pod of a handler.

- engine.containerd.versions: no file containerd loads declares a `version` above the main
  config's (a main config without one counts as 2), nor above what the installed containerd
  reads. Such a file makes containerd exit at start: 1.6.32+/1.7.17+ with "unsupported config
  version `3`", 2.0-2.2 with "expected containerd config version equal to or less than `3`,
  got `4`". It is read from the files, never from `config dump`, which fails on the same file.
- engine.containerd.runtime-type: every handler in the effective config has `runtime_type`;
  without it CRI creates containers with no runtime name, and every sandbox of that handler
  fails with "container.Runtime.Name must be set".

Both name the file that holds the problem, whoever wrote it: gpuctk's own drop-in is fixed by
running configure again, any other file by the one line to change.

- engine.containerd.binary, when the handler runs another program than gpuctk-runtime
  (`check_handler_owner`): which file sets it, last in containerd's load order. NVIDIA's
  `conf.d/99-nvidia.toml` sorts after `99-gpuctk.toml` and wins; configure refuses to leave it
  winning, so the fix is `configure --take-over` (it disables that file), never plain
  configure again. A handler set only by the main config is fixed by plain configure.
"""

from __future__ import annotations

from typing import Any

from gpuctk.doctor.report import Result, failed, ok, skipped, warning
from gpuctk.errors import GpuctkError

VERSIONS = ("engine.containerd.versions", "no containerd config file is newer than it may be")
RUNTIME_TYPE = ("engine.containerd.runtime-type", "every containerd handler has runtime_type")
RESTART = "systemctl restart containerd"
RUNC_V2 = "io.containerd.runc.v2"


def _loaded_files(config: str) -> tuple[str, ...]:
    """The main config and every file it imports, in containerd's load order."""
    from gpuctk.containerd import imports

    return imports.load(config, "replace").files


def _is_gpuctk(path: str) -> bool:
    from gpuctk.containerd import state, tomlfiles

    try:
        text = tomlfiles.read_text(path)
    except GpuctkError:
        return False
    return text is not None and state.parse(text) is not None


def _newest_read(binary: str | None) -> tuple[int, str] | None:
    """(newest config version the containerd binary reads, "containerd X.Y (path)")."""
    if binary is None:
        return None
    from gpuctk.containerd import engine, versions

    try:
        found = engine.version(binary)
    except GpuctkError:
        return None
    return versions.newest_read_by(found), f"containerd {found.major}.{found.minor} ({binary})"


def check_versions(config: str, binary: str | None, configure_fix: str) -> Result:
    """engine.containerd.versions: each file's `version` against the main's and the binary's."""
    from gpuctk.containerd import imports, tomlfiles

    id_, title = VERSIONS
    try:
        files = _loaded_files(config)
        found = imports.versions(files)
    except GpuctkError as exc:
        return skipped(id_, title, exc.message)
    main = tomlfiles.abspath(config)
    root = found.get(main) or 2
    reader = _newest_read(binary)
    evidence: list[str] = []
    targets: list[tuple[str, int]] = []
    for path, version in found.items():
        if version is None:
            continue
        if path != main and version > root:
            evidence.append(
                f"{path}: version {version}, above the main config's version {root} ({main}): "
                f"a containerd that reads only version {root} exits at start"
            )
            targets.append((path, root))
        elif reader is not None and version > reader[0]:
            evidence.append(
                f"{path}: version {version}, but {reader[1]} reads up to version {reader[0]}: "
                "it exits at start (1.6 before 1.6.32 ignores the newer plugin tables instead)"
            )
            targets.append((path, reader[0]))
    if not evidence:
        newest = max((v for v in found.values() if v is not None), default=root)
        return ok(id_, title, f"{len(files)} file(s), main version {root}, newest {newest}")
    path, target = targets[0]
    if _is_gpuctk(path) and target == root:
        fix = configure_fix
    else:
        fix = f"set `version = {target}` in {path} (and that version's plugin names) && {RESTART}"
    return failed(id_, title, evidence, fix)


def _defined_in(files: tuple[str, ...], name: str) -> list[tuple[str, str, Any]]:
    """(file, CRI plugin id, table) for each file whose handler `name` lacks runtime_type."""
    from gpuctk.containerd import tomlfiles, versions

    out = []
    for path in files:
        data = tomlfiles.load(path) or {}
        for plugin in dict.fromkeys(versions.CRI_PLUGIN.values()):
            table = tomlfiles.get_table(data, "plugins", plugin, "containerd", "runtimes", name)
            if table is not None and not table.get("runtime_type"):
                out.append((path, plugin, table))
    return out


def check_runtime_types(
    config: str, runtimes: dict[str, Any], source: str, configure_fix: str
) -> Result:
    """engine.containerd.runtime-type: each effective handler has runtime_type, by file."""
    id_, title = RUNTIME_TYPE
    missing = sorted(
        n for n, t in runtimes.items() if isinstance(t, dict) and not t.get("runtime_type")
    )
    if not missing:
        return ok(id_, title, f"{source}: {len(runtimes)} handler(s), each with runtime_type")
    try:
        files = _loaded_files(config)
    except GpuctkError:
        files = ()
    evidence: list[str] = []
    fix = ""
    for name in missing:
        why = f'every pod of handler {name!r} fails ("container.Runtime.Name must be set")'
        places = _defined_in(files, name) if files else []
        if not places:
            evidence.append(f"{source}: handler {name!r} has no runtime_type: {why}")
            continue
        for path, plugin, _ in places:
            header = f'[plugins."{plugin}".containerd.runtimes.{name}]'
            evidence.append(f"{path}: {header} has no runtime_type: {why}")
            if not fix:
                fix = (
                    configure_fix
                    if _is_gpuctk(path)
                    else f'add runtime_type = "{RUNC_V2}" to {header} in {path} && {RESTART}'
                )
    if not fix:
        fix = f'set runtime_type = "{RUNC_V2}" for {missing[0]!r} in {config} && {RESTART}'
    return failed(id_, title, evidence, fix)


def _sets_handler(path: str, name: str) -> bool:
    from gpuctk.containerd import tomlfiles, versions

    try:
        data = tomlfiles.load(path) or {}
    except GpuctkError:
        return False
    return any(
        tomlfiles.get_table(data, "plugins", plugin, "containerd", "runtimes", name) is not None
        for plugin in dict.fromkeys(versions.CRI_PLUGIN.values())
    )


def check_handler_owner(
    id_: str,
    title: str,
    config: str,
    name: str,
    binary: str,
    fixes: tuple[str, str],
) -> Result:
    """engine.containerd.binary for a handler whose BinaryName is not gpuctk-runtime: the file
    that sets it and the command that makes gpuctk's drop-in win. `fixes`: (plain configure,
    configure --take-over)."""
    import os
    import shutil

    from gpuctk.containerd import tomlfiles

    resolved = binary if os.path.isabs(binary) else shutil.which(binary)
    missing = resolved is None or not (os.path.isfile(resolved) and os.access(resolved, os.X_OK))
    what = (
        "missing or not executable: every container of the handler fails to start"
        if missing
        else "not gpuctk-runtime (another toolkit's runtime)"
    )
    evidence = [f"BinaryName = {binary!r}: {what}"]
    try:
        files = _loaded_files(config)
    except GpuctkError:
        files = ()
    setter = ours = None
    for path in files:
        if _sets_handler(path, name):
            setter = path
        if ours is None and path != tomlfiles.abspath(config) and _is_gpuctk(path):
            ours = path
    fix = fixes[0]
    if setter is not None and not _is_gpuctk(setter):
        if setter == tomlfiles.abspath(config):
            evidence.append(f"set in the main config {setter}; no gpuctk drop-in overrides it")
        else:
            after = f", loaded after gpuctk's {ours}, so it wins" if ours else ""
            evidence.append(f"{setter} sets handler {name!r}{after}")
            fix = fixes[1]
    return (failed if missing or ours else warning)(id_, title, evidence, fix)
