"""The CDI shape's one declaration, gpuctk.cdi.specs.strict.OBJECTS, written out as the
TypedDicts of gpuctk.cdi.specs.shape, so that the types mypy checks the create path with cannot
drift from what the strict decoder accepts.

    python -m gpuctk.cdi.specs.shapegen > cdi/specs/shape.py

A test regenerates the text and compares it with the file; another holds the shipped JSON schema
(cdi-schema.json) to the same keys and required keys, object by object.
"""

from __future__ import annotations

from gpuctk.cdi.specs.strict import OBJECTS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpuctk.cdi.specs.strict import FieldType

# the strict table's object names -> the TypedDicts' names, in the order they are written
CLASSES = {
    "deviceNode": "DeviceNodeDoc",
    "mount": "MountDoc",
    "hook": "HookDoc",
    "netDevice": "NetDeviceDoc",
    "intelRdt": "IntelRdtDoc",
    "edits": "EditsDoc",
    "device": "DeviceDoc",
    "spec": "SpecDoc",
}
SCALARS = {"string": "str", "int64": "int", "uint32": "int", "boolean": "bool"}
NOTES = {  # what a reader of the types would otherwise look up
    ("deviceNode", "type"): '"c", "b", "u", "p"',
    ("deviceNode", "permissions"): 'cgroup access: a combination of "rwm", or "none"',
    ("hook", "hookName"): 'an OCI hook stage: "createContainer", "prestart", ...',
}
HEADER = '''"""The CDI JSON shape, as types: what a spec file holds, key for key.

Written by gpuctk.cdi.specs.shapegen from the strict decoder's table
(gpuctk.cdi.specs.strict.OBJECTS), the shape's one declaration: edit that table, then run
`python -m gpuctk.cdi.specs.shapegen > cdi/specs/shape.py`.

One model for both sides. The generators build gpuctk.cdi.specs.spec records, whose `to_dict()`
returns these shapes; the create path (the registry, merge, apply and the host-path checks)
reads specs as these shapes. TypedDicts cost nothing at run time: modules on the create path
import this module only under TYPE_CHECKING, so mypy checks every key while the shim never
loads `typing`. A spec read from a file is held to the shape by gpuctk.cdi.specs.validate (strict
decoding, then every edit rule) before anything reads it as one.
"""

from __future__ import annotations

from typing import TypedDict

# total=False: every key is optional in the JSON (required ones are checked by validation)
'''


def annotation(ftype: FieldType) -> str:
    """The Python type of a field of the strict table."""
    if isinstance(ftype, str):
        return SCALARS[ftype]
    shape, inner = ftype
    if shape == "obj":
        return CLASSES[inner]
    if shape == "list":
        return f"list[{annotation(inner)}]"
    return f"dict[str, {annotation(inner)}]"  # map


def text() -> str:
    """cdi/specs/shape.py as it must read."""
    out = [HEADER]
    for name, cls in CLASSES.items():
        out.append(f"\n\nclass {cls}(TypedDict, total=False):\n")
        for key, ftype in OBJECTS[name][1].items():
            note = NOTES.get((name, key))
            out.append(f"    {key}: {annotation(ftype)}{f'  # {note}' if note else ''}\n")
    return "".join(out)


if __name__ == "__main__":
    import sys

    sys.stdout.write(text())
