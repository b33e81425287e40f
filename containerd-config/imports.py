"""containerd's config loading, re-done in Python for `--config-source file`.

containerd (services/server/config) loads the main file, then each imported file breadth-first,
skipping files already loaded. An import is resolved against the folder of the file naming it
and may be a glob (Go's filepath.Glob: sorted, `*` also matches dot-files). Each file is merged
into the result as it is loaded:

- containerd 1.x: top-level scalars are overridden by a later non-zero value, lists are appended
  (without duplicates), and each `plugins.<id>` table is REPLACED whole by a later file's table.
- containerd 2.x: the same, except that plugin tables are deep-merged key by key.
"""

from __future__ import annotations

import copy
import fnmatch
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from gpuctk.containerd import tomlfiles
from gpuctk.containerd.tomlfiles import Table
from gpuctk.errors import InputError, ValidationError

MergeMode = Literal["replace", "deep"]


@dataclass(frozen=True)
class LoadedConfig:
    """The merged view of a main config and its imports, as containerd would see it."""

    data: Table
    files: tuple[str, ...]
    # every file in containerd's load order, the left-out ones too (where a drop-in falls)
    order: tuple[str, ...] = ()


def string_list(value: Any, path: str, key: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValidationError(f"{path}: `{key}` must be a list of strings")
    return list(value)


def _glob(pattern: str, assume: str | None = None) -> list[str]:
    """Go filepath.Glob for a pattern whose wildcards are in the last element only; `assume`
    is a file counted as present (a drop-in about to be written)."""
    directory, name = os.path.split(pattern)
    if any(c in directory for c in "*?["):
        import glob

        return sorted(glob.glob(pattern, include_hidden=True))
    try:
        entries = set(os.listdir(directory or "."))
    except OSError:
        entries = set()
    if assume is not None and os.path.dirname(assume) == os.path.normpath(directory or "."):
        entries.add(os.path.basename(assume))
    return [os.path.join(directory, e) for e in sorted(entries) if fnmatch.fnmatchcase(e, name)]


def resolve(parent: str, imports: Iterable[str], assume: str | None = None) -> list[str]:
    """Absolute paths of the files an `imports` list names (containerd's resolveImports);
    `assume`: an absolute path that globs match as if it existed."""
    out: list[str] = []
    for entry in imports:
        path = os.path.normpath(entry)
        if not os.path.isabs(path):
            path = os.path.join(os.path.dirname(os.path.abspath(parent)), path)
        if "*" in path:
            out.extend(_glob(path, assume))
        else:
            out.append(path)
    return out


def is_glob(entry: str) -> bool:
    return "*" in entry


def _merge_top(out: Table, new: Table, mode: MergeMode) -> None:
    for key, value in new.items():
        if key == "plugins" and isinstance(value, dict):
            plugins = out.setdefault("plugins", {})
            for pid, table in value.items():
                if (
                    mode == "deep"
                    and isinstance(plugins.get(pid), dict)
                    and isinstance(table, dict)
                ):
                    plugins[pid] = tomlfiles.deep_merge(plugins[pid], table)
                else:
                    plugins[pid] = copy.deepcopy(table)
        elif isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = out[key] + [v for v in value if v not in out[key]]
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = tomlfiles.deep_merge(out[key], value)
        elif value not in ("", 0, False, None) or key not in out:
            out[key] = copy.deepcopy(value)


def load(
    main: str,
    mode: MergeMode,
    exclude: str | None = None,
    main_data: Table | None = None,
    also_exclude: Iterable[str] = (),
) -> LoadedConfig:
    """Load `main` and its imports the way containerd does, leaving out the file `exclude`
    (and the files `also_exclude`: other drop-ins configure is about to disable).

    `main_data` stands in for the main file's content (None: read it; a missing main file is
    an empty config, as for containerd started without one).
    """
    main_path = tomlfiles.abspath(main)
    skips = {tomlfiles.abspath(p) for p in (exclude, *also_exclude) if p}
    skips_first = tomlfiles.abspath(exclude) if exclude else None  # globs match it: `order`
    out: Table = {}
    loaded: list[str] = []
    pending = [main_path]
    while pending:
        path, pending = pending[0], pending[1:]
        if path in loaded:
            continue
        loaded.append(path)
        if path in skips:
            continue
        if path == main_path:
            data = main_data if main_data is not None else (tomlfiles.load(path) or {})
        else:
            found = tomlfiles.load(path)
            if found is None:
                raise InputError(f"{path}: imported by the containerd config but missing")
            data = found
        _merge_top(out, {k: v for k, v in data.items() if k != "imports"}, mode)
        entries = string_list(data.get("imports"), path, "imports")
        pending.extend(resolve(path, entries, skips_first))
    return LoadedConfig(out, tuple(p for p in loaded if p not in skips), tuple(loaded))


def versions(files: Iterable[str]) -> dict[str, int | None]:
    """The `version` each file declares (None when it has none)."""
    out: dict[str, int | None] = {}
    for path in files:
        data = tomlfiles.load(path) or {}
        version = data.get("version")
        out[path] = version if isinstance(version, int) else None
    return out
