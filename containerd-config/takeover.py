"""Other tools' containerd files that set gpuctk's handler after gpuctk's drop-in does.

containerd loads the main config, then its imports in order (a glob's matches sorted by name),
and a later file wins: `nvidia-ctk runtime configure --drop-in-config` writes
`conf.d/99-nvidia.toml`, which sorts after `99-gpuctk.toml` and sets the same `nvidia` handler
to /usr/bin/nvidia-container-runtime. gpuctk's drop-in would then be written, reported, and
never used. So configure finds every file loaded after its drop-in that names the handler
(a "rival") and either refuses with one line naming it, or with `--take-over` disables it the
way a package manager would: renamed to `<file>.gpuctk-disabled` (a name no `*.toml` glob
matches), recorded in gpuctk's drop-in, and renamed back by `gpuctk runtime unconfigure`.

The main config is never a rival: it is loaded first, so the drop-in's handler replaces (1.x)
or is merged over (2.x) whatever the main file says. A rival that some file imports by its
own name (not through a glob) cannot be renamed away (containerd would refuse the missing
import): that one is refused even with --take-over, naming the import to remove.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from gpuctk.containerd import imports, tomlfiles, versions
from gpuctk.containerd.plan import FileChange, file_mode
from gpuctk.containerd.tomlfiles import Table
from gpuctk.errors import InputError, ValidationError

DISABLED_SUFFIX = ".gpuctk-disabled"


@dataclass(frozen=True)
class Rival:
    """A file loaded after gpuctk's drop-in that sets the handler too."""

    path: str
    binary: str | None  # the handler's options.BinaryName there, if it sets one
    named_by: str | None  # a file importing it by its own name (not by a glob), if any
    whole_table: bool = False  # containerd 1.x: its CRI table replaces ours, handler or not


def _handler_in(data: Table, name: str) -> Table | None:
    for plugin in dict.fromkeys(versions.CRI_PLUGIN.values()):
        table = tomlfiles.get_table(data, "plugins", plugin, "containerd", "runtimes", name)
        if table is not None:
            return table
    return None


def _named_by(order: Iterable[str], main: str, main_data: Table, path: str) -> str | None:
    """The first loaded file whose `imports` names `path` literally (not by a glob)."""
    for file in order:
        data = main_data if file == tomlfiles.abspath(main) else tomlfiles.load(file) or {}
        entries = imports.string_list(data.get("imports"), file, "imports")
        literal = [e for e in entries if not imports.is_glob(e)]
        if any(tomlfiles.abspath(p) == path for p in imports.resolve(file, literal)):
            return file
    return None


def rivals(
    main: str, main_data: Table, drop_in: str, name: str, merge: imports.MergeMode
) -> list[Rival]:
    """The files containerd loads after `drop_in` (imported by `main_data`, the main config as
    configure leaves it) that set handler `name`, in load order; with containerd 1.x
    (`merge` "replace") also those with any table of the CRI plugin: it replaces ours whole."""
    ours = tomlfiles.abspath(drop_in)
    order = imports.load(main, "deep", exclude=drop_in, main_data=main_data).order
    if ours not in order:
        return []
    found: list[Rival] = []
    for path in order[order.index(ours) + 1 :]:
        try:
            data = tomlfiles.load(path) or {}
        except InputError:
            continue
        table = _handler_in(data, name)
        whole = merge == "replace" and tomlfiles.get_table(data, "plugins", versions.CRI_V2)
        if table is None and not whole:
            continue
        table = table or {}
        options = table.get("options")
        binary = options.get("BinaryName") if isinstance(options, dict) else None
        found.append(
            Rival(
                path,
                binary if isinstance(binary, str) else None,
                _named_by(order, main, main_data, path),
                bool(whole) and not table,
            )
        )
    return found


def _what(rival: Rival, name: str) -> str:
    if rival.whole_table:
        return (
            f"{rival.path} has a CRI plugin table, which containerd 1.x puts in place of the "
            f"drop-in's whole, handler {name!r} included"
        )
    runs = f" (BinaryName = {rival.binary})" if rival.binary else ""
    return f"{rival.path} also sets runtime handler {name!r}{runs}"


def refusal(found: list[Rival], name: str, drop_in: str, command: str) -> ValidationError:
    """The one line configure says when rivals win and --take-over was not given."""
    first = found[0]
    more = f" (and {len(found) - 1} more file(s))" if len(found) > 1 else ""
    return ValidationError(
        f"{_what(first, name)}{more}; containerd loads it after {drop_in}, so it wins: "
        f"run `{command} --take-over` to disable it (renamed to "
        f"{os.path.basename(first.path)}{DISABLED_SUFFIX}; unconfigure restores it), "
        + ("or remove it" if first.whole_table else "or remove it, or give another --runtime-name")
    )


def disable(found: list[Rival], name: str) -> list[FileChange]:
    """The renames --take-over makes (a copy under the disabled name, then the removal)."""
    changes: list[FileChange] = []
    for rival in found:
        if rival.named_by is not None:
            raise ValidationError(
                f"{_what(rival, name)}, and {rival.named_by} imports it by name, so it cannot "
                f"be renamed away: remove that `imports` entry (or the file), then run "
                "configure again"
            )
        with open(rival.path, "rb") as f:
            data = f.read()
        mode = file_mode(rival.path)
        what = f"{os.path.basename(rival.path)}, disabled by --take-over"
        changes.append(FileChange(rival.path + DISABLED_SUFFIX, data, what, mode))
        changes.append(FileChange(rival.path, None, f"{what} (it set handler {name!r})"))
    return changes


def restore(disabled: Iterable[str]) -> tuple[list[FileChange], list[str]]:
    """unconfigure: rename each disabled drop-in back; a note when its name is taken again."""
    changes: list[FileChange] = []
    notes: list[str] = []
    for path in disabled:
        saved = path + DISABLED_SUFFIX
        if not os.path.isfile(saved):
            continue
        if os.path.lexists(path):
            notes.append(f"{path} exists again: {saved} left in place (not restored)")
            continue
        with open(saved, "rb") as f:
            data = f.read()
        changes.append(
            FileChange(path, data, "restored (disabled by --take-over)", file_mode(saved))
        )
        changes.append(FileChange(saved, None, "its disabled copy"))
    return changes, notes
