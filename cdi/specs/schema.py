"""The schema layer: the CDI project's own JSON schema (Draft 7), when it can be found.

The schema files are not shipped in the package (they are vendored test data of the project,
under ../shared/vendor-data/cdi-schema). Where to look, in order:

1. the directory given by the caller (`--schema-dir`); it must exist;
2. the environment variable GPUCTK_CDI_SCHEMA_DIR; it must exist when set;
3. <repository>/../shared/vendor-data/cdi-schema, relative to this source file, if it exists.

When none is found the layer is skipped with a note: the strict layer checks a superset of what
the schema checks. `jsonschema` is imported only here, and only when a check runs.
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
_REPO_DEFAULT = Path(__file__).resolve().parents[3] / "shared/vendor-data/cdi-schema"


def find_schema_dir(schema_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The schema directory to use, or None when there is none (the layer is then skipped)."""
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
    if (_REPO_DEFAULT / SCHEMA_FILE).is_file():
        return _REPO_DEFAULT
    return None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read the CDI schema: {exc}") from None


@dataclass(frozen=True)
class SchemaChecker:
    """Checks documents against schema.json, with defs.json registered under its relative URI."""

    directory: Path
    _validator: Any

    def problems(self, doc: Any) -> list[tuple[str, str]]:
        """(location, message) for each schema violation, location in `a.b[0].c` form."""
        found = []
        for error in self._validator.iter_errors(doc):
            path = list(error.absolute_path)
            if error.validator == "required" and isinstance(error.instance, dict):
                # Locate a missing property at the property itself, as the strict layer does.
                for key in error.validator_value:
                    if key not in error.instance and error.message.startswith(repr(key)):
                        path.append(key)
                        break
            found.append((location(path), error.message))
        return sorted(found)


def location(path: Any) -> str:
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def load_checker(directory: Path) -> SchemaChecker:
    """A checker for the schema in `directory` (imports jsonschema)."""
    import jsonschema
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT7

    schema = _read_json(directory / SCHEMA_FILE)
    registry: Registry[Any] = Registry()
    defs_path = directory / DEFS_FILE
    if defs_path.is_file():
        defs = Resource.from_contents(_read_json(defs_path), default_specification=DRAFT7)
        registry = registry.with_resource(DEFS_FILE, defs)
    validator = jsonschema.Draft7Validator(schema, registry=registry)
    return SchemaChecker(directory, validator)
