"""The schema layer: a CDI spec checked against a JSON schema (Draft 7) with `jsonschema`.

By default the schema is gpuctk's own, shipped in the package beside this module as
`cdi-schema.json`: one self-contained file, written for gpuctk and stricter than the CDI
project's (no unknown keys at any level; kind, device name, path, env, device node, hook,
mount and interface name patterns; fields a cdiVersion lacks refused). Another schema, such as
the CDI project's schema.json + defs.json, is chosen with, in order:

1. the directory given by the caller (`--schema-dir`); it must hold schema.json;
2. the environment variable GPUCTK_CDI_SCHEMA_DIR; it must hold schema.json when set.

The shipped file is found with os.path beside this module (an installed package is plain
files, never a zip), as gpuctk.cdi.node.profile finds its profiles. `jsonschema` is imported
only here, and only when a check runs (load_checker).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuctk.errors import InputError, UsageError

ENV_VAR = "GPUCTK_CDI_SCHEMA_DIR"
SCHEMA_FILE = "schema.json"
DEFS_FILE = "defs.json"
SHIPPED_SCHEMA = Path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "cdi-schema.json"))


def find_schema_dir(schema_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The directory of another schema to use, or None for the shipped one."""
    if schema_dir is not None:
        path = Path(schema_dir)
        if not (path / SCHEMA_FILE).is_file():
            raise UsageError(f"--schema-dir {path}: no {SCHEMA_FILE} there")
        return path
    env = os.environ.get(ENV_VAR)
    if env:
        path = Path(env)
        if not (path / SCHEMA_FILE).is_file():
            raise UsageError(f"{ENV_VAR}={env}: no {SCHEMA_FILE} there")
        return path
    return None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read the CDI schema: {exc}") from None


def _error_path(error: Any) -> list[Any]:
    """Where a schema error is, as a path; a finding about one key is placed at that key."""
    path = list(error.absolute_path)
    instance = error.instance
    if "propertyNames" in error.relative_schema_path:
        path.append(instance)  # the instance is the offending key itself
    elif error.validator == "required" and isinstance(instance, dict):
        # Locate a missing property at the property itself, as the strict layer does.
        for key in error.validator_value:
            if key not in instance and error.message.startswith(repr(key)):
                path.append(key)
                break
    return path


@dataclass(frozen=True)
class SchemaChecker:
    """Checks documents against one schema file (defs.json beside it registered, if any)."""

    path: Path  # the schema file
    _validator: Any

    @property
    def shipped(self) -> bool:
        """True for gpuctk's own schema, False for one chosen with --schema-dir or the env."""
        return self.path == SHIPPED_SCHEMA

    def problems(self, doc: Any) -> list[tuple[str, str]]:
        """(location, message) for each schema violation, location in `a.b[0].c` form."""
        found = []
        for error in self._validator.iter_errors(doc):
            if error.validator == "additionalProperties" and isinstance(error.instance, dict):
                # One finding per unknown key, at the key, as the strict layer reports it.
                known = error.schema.get("properties", {})
                for key in error.instance:
                    if key not in known:
                        where = location([*error.absolute_path, key])
                        found.append((where, f"unknown key {key!r}"))
                continue
            found.append((location(_error_path(error)), error.message))
        return sorted(found)


def location(path: Any) -> str:
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def load_checker(directory: Path | None = None) -> SchemaChecker:
    """A checker for the schema.json in `directory`, or the shipped schema (imports
    jsonschema)."""
    import jsonschema
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT7

    path = SHIPPED_SCHEMA if directory is None else directory / SCHEMA_FILE
    schema = _read_json(path)
    registry: Registry[Any] = Registry()
    if directory is not None and (directory / DEFS_FILE).is_file():
        defs = Resource.from_contents(
            _read_json(directory / DEFS_FILE), default_specification=DRAFT7
        )
        registry = registry.with_resource(DEFS_FILE, defs)
    validator = jsonschema.Draft7Validator(schema, registry=registry)
    return SchemaChecker(path, validator)
