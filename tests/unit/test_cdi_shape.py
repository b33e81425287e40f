"""The CDI shape is declared once, in the strict decoder's table
(gpuctk.cdi.specs.strict.OBJECTS): the TypedDicts mypy checks the code with are written from it
(gpuctk.cdi.specs.shapegen), and the shipped JSON schema names the same keys and required keys,
object by object; what the generators build passes it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuctk.cdi.specs import shapegen
from gpuctk.cdi.specs.strict import OBJECTS, strict_problems

SPECS = Path(__file__).resolve().parents[2] / "cdi" / "specs"
# the strict table's objects -> the schema's definitions (the spec itself is the schema's top)
SCHEMA_NAMES = {
    "device": "device",
    "edits": "containerEdits",
    "deviceNode": "deviceNode",
    "mount": "mount",
    "hook": "hook",
    "netDevice": "netDevice",
    "intelRdt": "intelRdt",
}


def test_shape_py_is_the_tables_text() -> None:
    assert (SPECS / "shape.py").read_text() == shapegen.text(), (
        "cdi/specs/shape.py is not what the strict table says: "
        "python -m gpuctk.cdi.specs.shapegen > cdi/specs/shape.py"
    )


def test_every_object_of_the_table_has_its_typeddict() -> None:
    assert set(shapegen.CLASSES) == set(OBJECTS)


@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_the_schema_names_the_tables_keys(name: str) -> None:
    schema: dict[str, Any] = json.loads((SPECS / "cdi-schema.json").read_text())
    node = schema if name == "spec" else schema["definitions"][SCHEMA_NAMES[name]]
    required, fields = OBJECTS[name]
    assert set(node["properties"]) == set(fields), name
    assert set(node.get("required", ())) == required, name
    assert node["additionalProperties"] is False, name


def test_a_generated_spec_is_the_tables_shape() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpuctk", "cdi", "generate", "--simulate", "h100-8-mig7",
         "--format", "json", "--library-mode", "mounts"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert strict_problems(json.loads(done.stdout)) == []
