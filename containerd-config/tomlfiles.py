"""TOML helpers: strict reading, dotted-path access, merging, and a deterministic writer.

Files the tool *edits* (a main config.toml) are changed with small text edits or tomlkit so that
comments and layout survive; files the tool *owns* (drop-ins) are written by `dumps_tables`, whose
output depends only on the data, so that running configure twice writes the same bytes.
"""

from __future__ import annotations

import copy
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

import tomlkit

from gpuctk.errors import InputError, ValidationError

Table = dict[str, Any]

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def read_text(path: str) -> str | None:
    """The file's text, or None when it does not exist."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise InputError(f"cannot read {path}: it is a directory") from None
    except UnicodeDecodeError as exc:
        raise ValidationError(f"{path}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None


def parse(text: str, path: str) -> Table:
    """Parse TOML strictly; a syntax error names the file and the line."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValidationError(f"{path}: not valid TOML: {exc}") from None


def load(path: str) -> Table | None:
    """Parse a TOML file, or None when it does not exist."""
    text = read_text(path)
    return None if text is None else parse(text, path)


def get(table: Mapping[str, Any], *keys: str) -> Any:
    """The value at a dotted path, or None when any step is missing or not a table."""
    node: Any = table
    for key in keys:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def get_table(table: Mapping[str, Any], *keys: str) -> Table | None:
    value = get(table, *keys)
    return value if isinstance(value, dict) else None


def set_path(table: Table, keys: Sequence[str], value: Any) -> None:
    """Set a value at a dotted path, creating intermediate tables."""
    node = table
    for key in keys[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[keys[-1]] = value


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> Table:
    """containerd 2.x import semantics: tables merge key by key, any other value is replaced.

    Arrays are replaced, not appended (containerd's own tests: two drop-ins that both set a
    runtime's pod_annotations end with the later file's list).
    """
    out: Table = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else tomlkit.key(key).as_string()


def _value(value: Any) -> str:
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        tables = []
        for item in value:
            inline = tomlkit.inline_table()
            inline.update(item)
            tables.append(inline.as_string())
        return "[" + ", ".join(tables) + "]"
    return str(tomlkit.item(value).as_string())


def _emit(lines: list[str], prefix: list[str], table: Mapping[str, Any], depth: int) -> None:
    """Emit `table`'s keys at `depth`, then its sub-tables (header at `depth`, keys one deeper).

    A table holding only sub-tables gets no header line and adds no indentation.
    """
    indent = "  " * depth
    for key, value in table.items():
        if not isinstance(value, Mapping):
            lines.append(f"{indent}{_key(key)} = {_value(value)}")
    for key, value in table.items():
        if not isinstance(value, Mapping):
            continue
        path = [*prefix, key]
        if _needs_header(value):
            if lines and lines[-1] != "":
                lines.append("")
            lines.append(f"{indent}[{'.'.join(_key(k) for k in path)}]")
            _emit(lines, path, value, depth + 1)
        else:
            _emit(lines, path, value, depth)


def _needs_header(table: Mapping[str, Any]) -> bool:
    """A table that holds only sub-tables needs no header line of its own."""
    return not table or any(not isinstance(v, Mapping) for v in table.values())


def dumps_tables(data: Mapping[str, Any], header: Sequence[str] = ()) -> str:
    """Deterministic TOML: comment header, top-level keys, then every table with a full header.

    Key order is the order of `data` (insertion order), so the caller decides the layout.
    """
    lines = [f"# {line}" if line else "#" for line in header]
    if lines:
        lines.append("")
    _emit(lines, [], data, 0)
    return "\n".join(lines).rstrip("\n") + "\n"


def abspath(path: str) -> str:
    return os.path.normpath(os.path.abspath(path))
