"""A small block-style YAML writer for generated specs, so that `cdi generate` never imports PyYAML.

PyYAML's import alone (its reader and resolver compile dozens of regular expressions) is a
tenth of the generator's time budget (docs/benchmarks.md), to write a document made of mappings,
lists, strings, integers and booleans. This writer covers exactly those types, in the layout
PyYAML's `dump(default_flow_style=False, sort_keys=False)` uses, and is conservative about
strings: a string is written plain only when it starts with a letter, `_` or `/`, uses only
`[A-Za-z0-9_./@+=:-]`, does not end with `:` and is not one of YAML 1.1's boolean or null
words; everything else is double-quoted with every character outside printable ASCII escaped,
so that no YAML 1.1 or 1.2 reader can take it for a number, boolean, date or null, or fold a
line break in it. Tests check that PyYAML reads back exactly the document written.
"""

from __future__ import annotations

from typing import Any

_PLAIN_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_/")
_PLAIN_REST = _PLAIN_FIRST | frozenset("0123456789.@+=:-")
_RESERVED = frozenset(
    [
        "yes",
        "Yes",
        "YES",
        "no",
        "No",
        "NO",
        "true",
        "True",
        "TRUE",
        "false",
        "False",
        "FALSE",
        "on",
        "On",
        "ON",
        "off",
        "Off",
        "OFF",
        "y",
        "Y",
        "n",
        "N",
        "null",
        "Null",
        "NULL",
    ]
)
_MAX_IMPLICIT_KEY = 1000  # YAML allows at most 1024 characters in an implicit `key:`
_ESCAPES = {'"': '\\"', "\\": "\\\\"}


def dump(document: Any) -> str:
    """`document` as a YAML document beginning with `---`."""
    lines = ["---"]
    if isinstance(document, dict) and document:
        _mapping(document, "", lines)
    elif isinstance(document, list) and document:
        _sequence(document, "", lines)
    else:
        lines.append(_scalar(document))
    return "\n".join(lines) + "\n"


def _mapping(mapping: dict[Any, Any], indent: str, lines: list[str]) -> None:
    for key, value in mapping.items():
        if not isinstance(key, str):
            raise TypeError(f"mapping keys must be strings, not {type(key).__name__}")
        head = f"{indent}{_string(key)}:"
        if len(head) - len(indent) > _MAX_IMPLICIT_KEY:
            lines.append(f"{indent}? {_string(key)}")
            _item(value, indent, ": ", lines)
        elif isinstance(value, dict) and value:
            lines.append(head)
            _mapping(value, indent + "  ", lines)
        elif isinstance(value, list) and value:
            lines.append(head)
            _sequence(value, indent, lines)
        else:
            lines.append(f"{head} {_scalar(value)}")


def _sequence(items: list[Any], indent: str, lines: list[str]) -> None:
    for item in items:
        _item(item, indent, "- ", lines)


def _item(value: Any, indent: str, marker: str, lines: list[str]) -> None:
    """`value` after `marker` (`- ` for a list item, `: ` for an explicit key's value)."""
    if isinstance(value, (dict, list)) and value:
        start = len(lines)
        if isinstance(value, dict):
            _mapping(value, indent + "  ", lines)
        else:
            _sequence(value, indent + "  ", lines)
        lines[start] = f"{indent}{marker}{lines[start][len(indent) + 2 :]}"
    else:
        lines.append(f"{indent}{marker}{_scalar(value)}")


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        return _string(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    raise TypeError(f"cannot write a {type(value).__name__} in a spec")


def _string(text: str) -> str:
    written = _written.get(text)
    if written is None:
        if (
            text
            and text[0] in _PLAIN_FIRST
            and text[-1] != ":"
            and text not in _RESERVED
            and _PLAIN_REST.issuperset(text)
        ):
            written = text
        else:
            written = '"' + "".join(_escape(c) for c in text) + '"'
        _written[text] = written
    return written


_written: dict[str, str] = {}  # a spec repeats its paths and keys many times


def _escape(char: str) -> str:
    if char in _ESCAPES:
        return _ESCAPES[char]
    code = ord(char)
    if 0x20 <= code < 0x7F:
        return char
    if code < 0x100:
        return f"\\x{code:02x}"
    if 0xD800 <= code < 0xE000:
        raise ValueError(f"cannot write a lone surrogate (U+{code:04X}) in a spec")
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
