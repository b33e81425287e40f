"""The strict-decode layer: every key known, every value of the right JSON type.

The reference Go loader unmarshals strictly into its spec structs (unknown fields are errors);
the vendored JSON schema does not (it has no `additionalProperties: false`). This layer is the
Go structs as a table (spec 1.1.0 field set), checked exactly: key names are case-sensitive, null
is a type error, booleans are not numbers, integers are range-checked (int64, uint32). Required
keys are the schema's. Every problem is reported, each with its location:

    devices[0].containerEdits.deviceNodes[1].major: must be an integer, not a string
"""

from __future__ import annotations

from typing import Any

# A field type: a scalar name, ("list", item type), ("map", value type) or ("obj", object name).
FieldType = Any

_INT64 = (-(2**63), 2**63 - 1)
_UINT32 = (0, 2**32 - 1)

# object name -> (required keys, {key: field type})
OBJECTS: dict[str, tuple[frozenset[str], dict[str, FieldType]]] = {
    "spec": (
        frozenset({"cdiVersion", "kind", "devices"}),
        {
            "cdiVersion": "string",
            "kind": "string",
            "annotations": ("map", "string"),
            "devices": ("list", ("obj", "device")),
            "containerEdits": ("obj", "edits"),
        },
    ),
    "device": (
        frozenset({"name", "containerEdits"}),
        {
            "name": "string",
            "annotations": ("map", "string"),
            "containerEdits": ("obj", "edits"),
        },
    ),
    "edits": (
        frozenset(),
        {
            "env": ("list", "string"),
            "deviceNodes": ("list", ("obj", "deviceNode")),
            "netDevices": ("list", ("obj", "netDevice")),
            "hooks": ("list", ("obj", "hook")),
            "mounts": ("list", ("obj", "mount")),
            "intelRdt": ("obj", "intelRdt"),
            "additionalGids": ("list", "uint32"),
        },
    ),
    "deviceNode": (
        frozenset({"path"}),
        {
            "path": "string",
            "hostPath": "string",
            "type": "string",
            "major": "int64",
            "minor": "int64",
            "fileMode": "uint32",
            "permissions": "string",
            "uid": "uint32",
            "gid": "uint32",
        },
    ),
    "mount": (
        frozenset({"hostPath", "containerPath"}),
        {
            "hostPath": "string",
            "containerPath": "string",
            "options": ("list", "string"),
            "type": "string",
        },
    ),
    "hook": (
        frozenset({"hookName", "path"}),
        {
            "hookName": "string",
            "path": "string",
            "args": ("list", "string"),
            "env": ("list", "string"),
            "timeout": "uint32",
        },
    ),
    "netDevice": (
        frozenset({"hostInterfaceName", "name"}),
        {"hostInterfaceName": "string", "name": "string"},
    ),
    "intelRdt": (
        frozenset(),
        {
            "closID": "string",
            "l3CacheSchema": "string",
            "memBwSchema": "string",
            "schemata": ("list", "string"),
            "enableMonitoring": "boolean",
            "enableCMT": "boolean",
            "enableMBM": "boolean",
        },
    ),
}


def type_name(value: Any) -> str:
    """How a decoded value is called in messages ("a string", "null", ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _check_scalar(kind: str, value: Any, where: str, problems: list[str]) -> None:
    if kind == "string":
        if not isinstance(value, str):
            hint = " (quote it in YAML)" if isinstance(value, int | float) else ""
            problems.append(f"{where}: must be a string, not {type_name(value)}{hint}")
    elif kind == "boolean":
        if not isinstance(value, bool):
            problems.append(f"{where}: must be true or false, not {type_name(value)}")
    else:  # int64, uint32
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{where}: must be an integer, not {type_name(value)}")
            return
        low, high = _INT64 if kind == "int64" else _UINT32
        if not low <= value <= high:
            problems.append(f"{where}: {value} is out of range for {kind} ({low}..{high})")


def _check(ftype: FieldType, value: Any, where: str, problems: list[str]) -> None:
    if isinstance(ftype, str):
        _check_scalar(ftype, value, where, problems)
        return
    shape, inner = ftype
    if shape == "obj":
        check_object(inner, value, where, problems)
    elif shape == "list":
        if not isinstance(value, list):
            problems.append(f"{where}: must be a list, not {type_name(value)}")
            return
        for i, item in enumerate(value):
            _check(inner, item, f"{where}[{i}]", problems)
    elif shape == "map":
        if not isinstance(value, dict):
            problems.append(f"{where}: must be a mapping, not {type_name(value)}")
            return
        for key, item in value.items():
            if not isinstance(key, str):
                problems.append(f"{where}: key {key!r} must be a string")
                continue
            _check(inner, item, f"{where}[{key!r}]", problems)


def check_object(name: str, value: Any, where: str, problems: list[str]) -> None:
    """Append to `problems` every way `value` differs from the object `name` of the model."""
    required, fields = OBJECTS[name]
    if not isinstance(value, dict):
        problems.append(f"{where or 'spec'}: must be a mapping, not {type_name(value)}")
        return
    for key in sorted(required - value.keys()):
        problems.append(f"{_join(where, key)}: missing (required)")
    for key, item in value.items():
        if not isinstance(key, str):
            problems.append(f"{where or 'spec'}: key {key!r} must be a string")
            continue
        ftype = fields.get(key)
        if ftype is None:
            problems.append(f"{_join(where, key)}: unknown key{_suggest(key, fields)}")
            continue
        _check(ftype, item, _join(where, key), problems)


def _suggest(key: str, fields: dict[str, FieldType]) -> str:
    lowered = key.lower()
    for known in fields:
        if known.lower() == lowered:
            return f" (did you mean {known!r}?)"
    return f" (known keys: {', '.join(fields)})"


def strict_problems(doc: Any) -> list[str]:
    """Every unknown key, missing required key and wrongly typed value in a spec document."""
    problems: list[str] = []
    check_object("spec", doc, "", problems)
    return problems
