"""Layering, stated by package: spine <- cdi <- hook; containerd depends only on the spine and
install on containerd; the doctor on top of them all.

    gpuctk              the spine: imports only itself
    gpuctk.cdi.specs    the spine (the CDI library)
    gpuctk.cdi.node     the spine and gpuctk.cdi.specs (what the node has)
    gpuctk.cdi          the spine and its subpackages (generation and its commands)
    gpuctk.hook         the spine and gpuctk.cdi (what the shim and the hook share: the config,
                        the bundle and OCI state readers, the compiled hook's build)
    gpuctk.hook.requests    that, and gpuctk.hook (what a container asks for)
    gpuctk.hook.verbs   that, and gpuctk.hook.requests (gpuctk-hook's verbs, the in-root work)
    gpuctk.hook.shim    that, and gpuctk.hook.verbs (gpuctk-runtime; it does the hook's in-root
                        work itself)
    gpuctk.containerd   the spine
    gpuctk.install      the spine, gpuctk.containerd and gpuctk.hook with its subpackages (the
                        launchers it writes, the config file the runtime reads)
    gpuctk.deviceplugin the spine and gpuctk.cdi (the kubelet's device plugin: discovery, NVML)
    gpuctk.doctor       every layer (it diagnoses them all); no other package imports it: the
                        CLI (gpuctk.cli) reaches it by name, through its lazy command table

The packages and their folders come from pyproject.toml. Checked structurally from the source
(every `import` / `from ... import` statement, at any depth, so a lazy import inside a function
counts too), with no exemption for any file.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest
from fixtures.layout import package_dirs, setuptools_table

PACKAGES = package_dirs()
# subpackages inside a package's folder, each a layer of its own
SUBPACKAGES = {"gpuctk.cdi.specs": PACKAGES["gpuctk.cdi"] / "specs",
               "gpuctk.cdi.node": PACKAGES["gpuctk.cdi"] / "node",
               "gpuctk.hook.requests": PACKAGES["gpuctk.hook"] / "requests",
               "gpuctk.hook.verbs": PACKAGES["gpuctk.hook"] / "verbs",
               "gpuctk.hook.shim": PACKAGES["gpuctk.hook"] / "shim"}  # fmt: skip
LAYERS = {**PACKAGES, **SUBPACKAGES}
CDI = {"gpuctk.cdi", "gpuctk.cdi.specs", "gpuctk.cdi.node"}
HOOK = {"gpuctk.hook", "gpuctk.hook.requests", "gpuctk.hook.verbs", "gpuctk.hook.shim"}
SPINE = "gpuctk"
TOP = "gpuctk.doctor"
CLI = "gpuctk.cli"  # its lazy command table names the top layer's command module
# layer -> the gpuctk layers it may import
ALLOWED = {
    "gpuctk": {"gpuctk"},
    "gpuctk.cdi.specs": {"gpuctk", "gpuctk.cdi.specs"},
    "gpuctk.cdi.node": {"gpuctk", "gpuctk.cdi.specs", "gpuctk.cdi.node"},
    "gpuctk.cdi": {"gpuctk", *CDI},
    "gpuctk.hook": {"gpuctk", *CDI, "gpuctk.hook"},
    "gpuctk.hook.requests": {"gpuctk", *CDI, "gpuctk.hook", "gpuctk.hook.requests"},
    "gpuctk.hook.verbs": {"gpuctk", *CDI, *HOOK - {"gpuctk.hook.shim"}},
    "gpuctk.hook.shim": {"gpuctk", *CDI, *HOOK},
    "gpuctk.containerd": {"gpuctk", "gpuctk.containerd"},
    "gpuctk.install": {"gpuctk", "gpuctk.containerd", *HOOK, "gpuctk.install"},
    "gpuctk.deviceplugin": {"gpuctk", *CDI, "gpuctk.deviceplugin"},
    TOP: set(LAYERS),
}
# import names that would reach a package's folder without the gpuctk. prefix
BARE = {p.rpartition(".")[2] for p in PACKAGES if p != SPINE} | {
    f.name for f in PACKAGES.values() if f.name.isidentifier() and f.name != SPINE
}
TOP_MODULE = re.compile(re.escape(TOP) + r"(\.\w+)*")


def layer_of(module: str) -> str | None:
    """The package a gpuctk module belongs to (the longest one that holds it), else None."""
    holding = [p for p in LAYERS if module == p or module.startswith(p + ".")]
    return max(holding, key=len) if holding else None


def module_of(layer: str, path: Path) -> str:
    return layer if path.stem == "__init__" else f"{layer}.{path.stem}"


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


def top_layer_names(path: Path) -> list[tuple[int, str]]:
    """String constants that name a module of the top layer (what importlib would be given)."""
    tree = ast.parse(path.read_text(), str(path))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and TOP_MODULE.fullmatch(node.value)
    ]


def problems(layer: str, path: Path) -> list[str]:
    """Every way the module at `path`, in package `layer`, breaks the layering."""
    bad = []
    for line, name in imports_of(path):
        if name.split(".")[0] in BARE:
            bad.append(f"{path.name}:{line}: bare import {name} (use the gpuctk. name)")
        target = layer_of(name)
        if target == TOP and layer != TOP:
            bad.append(f"{path.name}:{line}: {name} is the top layer: only the CLI reaches it")
        elif target is not None and target not in ALLOWED[layer]:
            bad.append(f"{path.name}:{line}: {layer} must not import {name}")
    if layer != TOP and module_of(layer, path) != CLI:
        bad += [
            f"{path.name}:{line}: names {name}: only the CLI's command table may"
            for line, name in top_layer_names(path)
        ]
    return bad


def sources() -> list[tuple[str, Path]]:
    out = []
    for layer, folder in LAYERS.items():
        out += [(layer, p) for p in sorted(folder.glob("*.py"))]
    return out


@pytest.mark.parametrize(("layer", "path"), sources(), ids=lambda v: str(v))
def test_module_respects_layers(layer: str, path: Path) -> None:
    bad = problems(layer, path)
    assert not bad, "\n".join(bad)


def test_every_package_has_a_layer() -> None:
    """A package added to pyproject.toml must be placed here; setuptools' package list and the
    folder map name the same packages."""
    assert set(ALLOWED) == set(LAYERS)
    assert set(setuptools_table()["packages"]) == set(LAYERS)
    for layer, folder in LAYERS.items():
        assert (folder / "__init__.py").is_file(), layer
    nested = {p.parent for folder in PACKAGES.values() for p in folder.glob("*/__init__.py")}
    assert nested == set(SUBPACKAGES.values())  # no subpackage without a layer


def test_the_cli_table_is_the_way_in_to_the_top_layer() -> None:
    """The CLI's lazy command table names modules that exist, the top layer's among them."""
    from gpuctk.cli import _SUBCOMMANDS

    modules = {module for module, _, _ in _SUBCOMMANDS.values()}
    assert any(layer_of(m) == TOP for m in modules), modules
    for module in sorted(modules):
        assert importlib.util.find_spec(module) is not None, module


def test_the_check_sees_a_violation(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text(
        "import importlib\n"
        "def f():\n"
        "    from gpuctk.hook.shim import runtime_main\n"
        "    from gpuctk.doctor import report\n"
        "    import hook.config\n"
        "    return importlib.import_module('gpuctk.doctor.cli')\n"
    )
    assert (3, "gpuctk.hook.shim") in imports_of(sample)
    assert layer_of("gpuctk.hook.shim.runtime_main") == "gpuctk.hook.shim"
    assert layer_of("gpuctk.hook.config") == "gpuctk.hook"
    assert layer_of("gpuctk.errors") == SPINE and layer_of("click") is None
    found = problems("gpuctk.cdi", sample)
    assert any(":3: gpuctk.cdi must not import gpuctk.hook.shim" in p for p in found), found
    assert any(":4: gpuctk.doctor is the top layer" in p for p in found), found
    assert any(":5: bare import hook.config" in p for p in found), found
    assert any(":6: names gpuctk.doctor.cli" in p for p in found), found
    assert not [p for p in problems(TOP, sample) if "bare" not in p]


def test_the_cdi_library_imports_nothing_above_it(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text("from gpuctk.cdi.node import elf\nfrom gpuctk.cdi import generate\n")

    def lines(layer: str) -> set[str]:
        return {b.split(":")[1] for b in problems(layer, sample)}

    assert lines("gpuctk.cdi.specs") == {"1", "2"}  # the library imports neither
    assert lines("gpuctk.cdi.node") == {"2"}  # the node may use the library, not generation
    assert lines("gpuctk.cdi") == set()


def test_the_hook_layers_import_only_down(tmp_path: Path) -> None:
    """gpuctk.hook (shared) <- requests <- verbs <- shim: each imports only the ones below it."""
    sample = tmp_path / "x.py"
    sample.write_text(
        "from gpuctk.hook import config\n"
        "from gpuctk.hook.requests import cdiedits\n"
        "from gpuctk.hook.verbs import actions\n"
        "from gpuctk.hook.shim import runtime_main\n"
    )

    def lines(layer: str) -> set[str]:
        return {b.split(":")[1] for b in problems(layer, sample)}

    assert lines("gpuctk.hook") == {"2", "3", "4"}
    assert lines("gpuctk.hook.requests") == {"3", "4"}
    assert lines("gpuctk.hook.verbs") == {"4"}
    assert lines("gpuctk.hook.shim") == set()
    assert lines("gpuctk.install") == set()
