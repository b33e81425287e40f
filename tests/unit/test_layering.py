"""Layering: spine <- cdi <- hook; containerd depends only on the spine.

One exception on top of them all: `gpuctk doctor` (cdi/doctor*.py) diagnoses every layer, so it
may import any of them (the runtime config of gpuctk.hook, the engine parsing of
gpuctk.containerd), and no other module may import it (it is reached only through the CLI's
lazy command table).

Checked structurally from the source (every `import` / `from ... import` statement, at any
depth, so a lazy import inside a function counts too).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {
    "gpuctk": REPO / "gpuctk",
    "gpuctk.cdi": REPO / "cdi",
    "gpuctk.hook": REPO / "hook",
    "gpuctk.containerd": REPO / "containerd-config",
}
# layer -> the gpuctk layers it may import
ALLOWED = {
    "gpuctk": {"gpuctk"},
    "gpuctk.cdi": {"gpuctk", "gpuctk.cdi"},
    "gpuctk.hook": {"gpuctk", "gpuctk.cdi", "gpuctk.hook"},
    "gpuctk.containerd": {"gpuctk", "gpuctk.containerd"},
}


TOP_PREFIX = "gpuctk.cdi.doctor"  # the doctor's modules: cdi/doctor.py, cdi/doctor_*.py


def is_top(layer: str, path: Path) -> bool:
    return layer == "gpuctk.cdi" and path.name.startswith("doctor")


def layer_of(module: str) -> str | None:
    if not (module == "gpuctk" or module.startswith("gpuctk.")):
        return None
    parts = module.split(".")
    if len(parts) >= 2 and f"gpuctk.{parts[1]}" in PACKAGES:
        return f"gpuctk.{parts[1]}"
    return "gpuctk"


def imports_of(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def sources() -> list[tuple[str, Path]]:
    out = []
    for layer, folder in PACKAGES.items():
        out += [(layer, p) for p in sorted(folder.glob("*.py"))]
    return out


@pytest.mark.parametrize(("layer", "path"), sources(), ids=lambda v: str(v))
def test_module_respects_layers(layer: str, path: Path) -> None:
    bad = []
    for line, name in imports_of(path):
        if name.split(".")[0] in ("cdi", "hook") and not name.startswith("gpuctk"):
            bad.append(f"{path.name}:{line}: bare import {name} (use gpuctk.{name})")
        if name.startswith(TOP_PREFIX) and not is_top(layer, path):
            bad.append(f"{path.name}:{line}: only the CLI may import {name} (gpuctk doctor)")
        target = layer_of(name)
        if target is not None and target not in ALLOWED[layer] and not is_top(layer, path):
            bad.append(f"{path.name}:{line}: {layer} must not import {name}")
    assert not bad, "\n".join(bad)


def test_the_check_sees_a_violation(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text("def f():\n    from gpuctk.hook import runtime_main\n")
    assert (2, "gpuctk.hook") in imports_of(sample)
    assert layer_of("gpuctk.hook.runtime_main") == "gpuctk.hook"
    assert "gpuctk.hook" not in ALLOWED["gpuctk.cdi"]
