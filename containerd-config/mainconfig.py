"""Edits of containerd's main config.toml that keep the operator's comments and layout.

configure adds at most two things to the main file: the drop-in's path in `imports` and, when
the file has none, a `version` line. A new top-level key is inserted as one line of text (after
`version`, else at the top: always valid TOML, and nothing else moves); an entry is appended to
an existing `imports` array with tomlkit. unconfigure takes out exactly those lines/entries.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass

import tomlkit
from tomlkit.exceptions import TOMLKitError

from gpuctk.containerd import imports, tomlfiles
from gpuctk.errors import ValidationError

_TABLE_HEADER = re.compile(r"^\s*\[")
_VERSION_LINE = re.compile(r"^version\s*=.*$")


@dataclass(frozen=True)
class Edit:
    """The new main config text and which top-level keys configure added to it."""

    text: str
    added: tuple[str, ...]


def _line(key: str, value: object) -> str:
    return f"{key} = {tomlkit.item(value).as_string()}\n"


def _insert_top_level(text: str, line: str) -> str:
    """Insert a key line after a top-level `version` line, else after the leading comments."""
    lines = text.splitlines(keepends=True)
    for i, current in enumerate(lines):
        if _TABLE_HEADER.match(current):
            break
        if _VERSION_LINE.match(current.rstrip("\n")):
            if not current.endswith("\n"):  # last line: keep the file's missing final newline
                lines[i] = current + "\n" + line.rstrip("\n")
            else:
                lines.insert(i + 1, line)
            return "".join(lines)
    return _after_leading_comments(text, line)


def _after_leading_comments(text: str, line: str) -> str:
    """Insert after the comment block a file starts with (at the top when there is none)."""
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines) and lines[i].startswith("#") and lines[i].endswith("\n"):
        i += 1
    return "".join([*lines[:i], line, *lines[i:]])


def _take_out(text: str, line: str) -> str | None:
    """`text` without an inserted `line` (as _insert_top_level put it), or None if not found."""
    match = re.search("^" + re.escape(line), text, re.MULTILINE)
    if match:
        return text[: match.start()] + text[match.end() :]
    tail = "\n" + line.rstrip("\n")
    if text.endswith(tail):
        return text[: -len(tail)]
    return None


def covers(main: str, entries: list[str], drop_in: str) -> bool:
    """Whether an existing `imports` entry already names the drop-in (literally or by glob)."""
    target = tomlfiles.abspath(drop_in)
    base = os.path.dirname(tomlfiles.abspath(main))
    for entry in entries:
        path = os.path.normpath(entry if os.path.isabs(entry) else os.path.join(base, entry))
        if path == target or (imports.is_glob(path) and fnmatch.fnmatchcase(target, path)):
            return True
    return False


def add_import(main: str, text: str | None, drop_in: str, version: int) -> Edit:
    """Main config text that imports the drop-in (created when `text` is None)."""
    entry = tomlfiles.abspath(drop_in)
    if text is None:
        return Edit(_line("version", version) + _line("imports", [entry]), ("version", "imports"))
    data = tomlfiles.parse(text, main)
    current = imports.string_list(data.get("imports"), main, "imports")
    added: list[str] = []
    new = text
    if not covers(main, current, drop_in):
        if "imports" in data:
            new = _append_entry(main, new, entry)
        else:
            new = _insert_top_level(new, _line("imports", [entry]))
            added.append("imports")
    if "version" not in data:
        new = _after_leading_comments(new, _line("version", version))
        added.append("version")
    return Edit(new, tuple(added))


def _append_entry(main: str, text: str, entry: str) -> str:
    try:
        doc = tomlkit.parse(text)
        array = doc["imports"]
        array.append(entry)
        return tomlkit.dumps(doc)
    except (TOMLKitError, AttributeError) as exc:
        raise ValidationError(f"{main}: cannot add to `imports`: {exc}") from None


def remove_import(main: str, text: str, drop_in: str, added: tuple[str, ...]) -> str:
    """Main config text without what add_import put in (keys only if configure added them)."""
    entry = tomlfiles.abspath(drop_in)
    data = tomlfiles.parse(text, main)
    new = text
    current = imports.string_list(data.get("imports"), main, "imports")
    base = os.path.dirname(tomlfiles.abspath(main))
    ours = [e for e in current if tomlfiles.abspath(os.path.join(base, e)) == entry]
    if ours:
        rest = [e for e in current if e not in ours]
        taken = _take_out(new, _line("imports", [entry])) if not rest else None
        if taken is not None and "imports" in added:
            new = taken
        else:
            doc = tomlkit.parse(new)
            array = doc["imports"]
            for e in ours:
                array.remove(e)
            if not rest and "imports" in added:
                del doc["imports"]
            new = tomlkit.dumps(doc)
    if "version" in added:
        after = tomlfiles.parse(new, main)
        if "plugins" not in after:
            taken = _take_out(new, _line("version", after.get("version")))
            if taken is not None:
                new = taken
    return new
