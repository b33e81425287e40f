"""The import graph of the container-start entry points, checked from the source.

`gpuctk-runtime` (gpuctk.hook.shim.runtime_main) and `gpuctk-hook` (gpuctk.hook.verbs.hook_main) run
at every container start: they must never import click, jsonschema, pynvml, pyroute2, PyYAML,
tomlkit or tomllib. This walks the STATIC graph: every `import` / `from ... import` statement
of every gpuctk module reached, at any depth (a lazy import inside a function counts like one at
the top), resolved with importlib.util.find_spec so that the folder mapping (gpuctk.hook <-
hook/, ...) is the one the interpreter uses. Not followed: statements under `if TYPE_CHECKING:`
(they never run), and the edges of LAZY_DOORS, each a function-level import that only a mode
off the usual container start takes, with its reason. Those doors are checked too: each must
exist, be lazy, and be the only way in to what it guards.

Timing is bench/imports.py's job; the modules a real `create` loads are checked at run time by
tests/unit/test_shim.py::test_hot_path_imports. A self-check on a synthetic package proves the
walker sees lazy imports, so this test cannot pass with a blind walker.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from collections import deque
from pathlib import Path

import pytest

ENTRIES = ("gpuctk.hook.shim.runtime_main", "gpuctk.hook.verbs.hook_main")
WALKED = ("gpuctk",)  # import roots whose source is walked; everything else is a leaf
BANNED = ("click", "jsonschema", "pynvml", "pyroute2", "yaml", "tomlkit", "tomllib")

# (importer, imported) -> why the edge is not followed. Each must be a function-level import.
LAZY_DOORS: dict[tuple[str, str], str] = {
    ("gpuctk.hook.verbs.hook_main", "gpuctk.hook.verbs.netdev"): (
        "only `gpuctk-hook createRuntime|poststop --netdev` (a NIC spec's entry) moves network "
        "interfaces, through pyroute2; GPU containers never take it"
    ),
    ("gpuctk.cdi.specs.specfile", "gpuctk.cdi.specs.specyaml"): (
        "PyYAML only for a spec file that is not JSON; a JSON spec (generate --output *.json) "
        "never loads it. NOTE: a .yaml spec in the spec dirs puts PyYAML (~10 ms) on every "
        "create the shim resolves, and the refresh unit writes /var/run/cdi/nvidia.yaml"
    ),
    ("gpuctk.hook.config", "tomllib"): (
        "only for a config.toml beyond the small exact subset config.py parses itself"
    ),
}
# banned module -> the only gpuctk module that may import it (behind a door above)
BANNED_VIA = {
    "pyroute2": "gpuctk.hook.verbs.netdev",
    "yaml": "gpuctk.cdi.specs.specyaml",
    "tomllib": "gpuctk.hook.config",
}


class Edge:
    """One import statement's effect: `importer` (line `line`) loads `target`."""

    __slots__ = ("importer", "lazy", "line", "target")

    def __init__(self, importer: str, target: str, line: int, lazy: bool) -> None:
        self.importer, self.target, self.line, self.lazy = importer, target, line, lazy

    def __repr__(self) -> str:
        return f"{self.importer}:{self.line} -> {self.target}{' (lazy)' if self.lazy else ''}"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_statements(source: str, filename: str) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement that can run, with whether it sits inside a function."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append((node, lazy))
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.orelse:  # the body never runs; `else:` does
                visit(stmt, lazy)
            return
        inner = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(source, filename), False)
    return found


def dynamic_imports(source: str, filename: str) -> list[int]:
    """Lines calling importlib.import_module or __import__: imports the walk cannot see."""
    lines = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__"):
                lines.append(node.lineno)
    return lines


class Graph:
    """The static import graph below some roots, built lazily by `walk`."""

    def __init__(self, walked: tuple[str, ...] = WALKED) -> None:
        self.walked = walked
        self.edges: dict[str, list[Edge]] = {}  # importer -> its edges (walked modules only)
        self.origins: dict[str, str] = {}  # walked module -> source file
        self._packages: dict[str, bool] = {}

    def is_walked(self, name: str) -> bool:
        return any(name == r or name.startswith(r + ".") for r in self.walked)

    def _spec_origin(self, name: str) -> tuple[str | None, bool]:
        """(source file, is a package) of a walked module; (None, False) when none."""
        try:
            spec = importlib.util.find_spec(name)
        except (ModuleNotFoundError, ValueError):
            return None, False
        if spec is None:
            return None, False
        return spec.origin, spec.submodule_search_locations is not None

    def is_package(self, name: str) -> bool:
        if name not in self._packages:
            self._packages[name] = self.is_walked(name) and self._spec_origin(name)[1]
        return self._packages[name]

    def _targets(self, module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
        """What one statement loads: the named modules and the packages above them."""
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                package = module if self.is_package(module) else module.rpartition(".")[0]
                base = importlib.util.resolve_name("." * node.level + base, package)
            names = [base]
            if self.is_package(base):  # `from pkg import sub`: sub may be a module
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if alias.name != "*" and self._spec_origin(sub)[0] is not None:
                        names.append(sub)
        out: list[str] = []
        for name in names:
            parts = name.split(".")
            for i in range(1, len(parts) + 1):  # importing a.b.c runs a and a.b first
                if ".".join(parts[:i]) not in out:
                    out.append(".".join(parts[:i]))
        return out

    def edges_of(self, module: str) -> list[Edge]:
        if module not in self.edges:
            origin, _ = self._spec_origin(module)
            if origin is None or not origin.endswith(".py"):
                raise AssertionError(f"cannot find the source of {module} (find_spec: {origin})")
            self.origins[module] = origin
            source = Path(origin).read_text()
            self.edges[module] = [
                Edge(module, target, node.lineno, lazy)
                for node, lazy in import_statements(source, origin)
                for target in self._targets(module, node)
                if target != module
            ]
        return self.edges[module]

    def walk(
        self, entries: tuple[str, ...], cut: frozenset[tuple[str, str]] = frozenset()
    ) -> dict[str, Edge | None]:
        """Every module reachable from `entries` without the `cut` edges -> the edge that first
        reached it (None for an entry): follow `.importer` back for the chain."""
        reached: dict[str, Edge | None] = {}
        queue: deque[str] = deque()
        for entry in entries:
            for parent in self._targets(entry, ast.Import(names=[ast.alias(name=entry)])):
                if parent not in reached:
                    reached[parent] = None
                    queue.append(parent)
        while queue:
            module = queue.popleft()
            if not self.is_walked(module):
                continue
            for edge in self.edges_of(module):
                if (edge.importer, edge.target) in cut or edge.target in reached:
                    continue
                reached[edge.target] = edge
                queue.append(edge.target)
        return reached


def chain(reached: dict[str, Edge | None], module: str) -> str:
    """`a:12 -> b:40 -> module`: how the walk got to `module`."""
    steps = []
    edge = reached[module]
    while edge is not None:
        steps.append(f"{edge.importer}:{edge.line}{' (lazy)' if edge.lazy else ''}")
        edge = reached[edge.importer]
    return " -> ".join([*reversed(steps), module])


def top(name: str) -> str:
    return name.partition(".")[0]


@pytest.fixture(scope="module")
def graph() -> Graph:
    return Graph()


DOORS = frozenset(LAZY_DOORS)


# --- the walker itself, on a package made for it -------------------------------------------


SAMPLE = {
    "__init__.py": "",
    "main.py": (
        "import os\n"
        "TYPE_CHECKING = False\n"
        "if TYPE_CHECKING:\n"
        "    import jsonschema\n"
        "else:\n"
        "    import posixpath\n"
        "def run():\n"
        "    from . import helper\n"
        "    return helper\n"
        "def rare():\n"
        "    from walkersample import plugin\n"
    ),
    "helper.py": "class C:\n    def m(self):\n        from walkersample.deep import leaf\n",
    "deep/__init__.py": "",
    "deep/leaf.py": "def f():\n    return lambda: __import__('x')\nimport click\n",
    "plugin.py": "def g():\n    import pyroute2\n",
}


def test_the_walker_sees_lazy_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If the walker missed function-level or relative imports, every check below would pass
    vacuously: prove it finds click three lazy hops away, in a package of its own."""
    for rel, text in SAMPLE.items():
        path = tmp_path / "walkersample" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    try:
        sample = Graph(walked=("walkersample",))
        reached = sample.walk(("walkersample.main",))
        assert "click" in reached, reached
        assert chain(reached, "click") == (
            "walkersample.main:8 (lazy) -> walkersample.helper:3 (lazy) -> "
            "walkersample.deep.leaf:3 -> click"
        )
        assert {"os", "posixpath", "pyroute2", "walkersample.deep"} <= set(reached)
        assert "jsonschema" not in reached  # TYPE_CHECKING body: never runs
        cut = sample.walk(("walkersample.main",), frozenset({("walkersample.main", "pyroute2")}))
        assert "pyroute2" in cut  # a cut edge that does not exist cuts nothing
        cut = sample.walk(
            ("walkersample.main",), frozenset({("walkersample.main", "walkersample.plugin")})
        )
        assert "pyroute2" not in cut and "click" in cut
        leaf = Path(sample.origins["walkersample.deep.leaf"])
        assert dynamic_imports(leaf.read_text(), str(leaf)) == [2]
    finally:
        for name in [n for n in sys.modules if top(n) == "walkersample"]:
            del sys.modules[name]


# --- the real entry points -----------------------------------------------------------------


def test_the_walk_covers_the_create_path(graph: Graph) -> None:
    """The walk goes through the folder mapping and into the lazy create path."""
    reached = graph.walk(ENTRIES, DOORS)
    for module in (
        "gpuctk.errors",
        "gpuctk.hook.config",  # lazy, in runtime_main.main
        "gpuctk.hook.requests.cdiedits",  # lazy, in inject
        "gpuctk.cdi.specs.apply",
        "gpuctk.cdi.specs.registry",
        "gpuctk.cdi.specs.specfile",
        "gpuctk.hook.shim.shimroot",
        "gpuctk.cdi.node.ldcache",
        "gpuctk.hook.verbs.actions",  # lazy, in hook_main._run
        "gpuctk.hook.verbs.prestart",
    ):
        assert module in reached, f"the walk missed {module}"
    assert graph.origins["gpuctk.cdi.specs.apply"].endswith("/cdi/specs/apply.py")
    assert graph.origins["gpuctk.hook.shim.runtime_main"].endswith("/hook/shim/runtime_main.py")


def test_the_packages_on_the_path_run_no_code(graph: Graph) -> None:
    """Every package the entries pass through below the root (gpuctk.hook, gpuctk.hook.shim,
    gpuctk.cdi.specs, ...) is a docstring alone: a split by concern costs the create path one
    small file per package, never an import."""
    reached = graph.walk(ENTRIES, DOORS)
    packages = sorted(m for m in reached if "." in m and graph.is_package(m))
    assert {"gpuctk.hook.requests", "gpuctk.hook.verbs", "gpuctk.hook.shim"} <= set(packages)
    busy = []
    for package in packages:
        origin = graph._spec_origin(package)[0]
        assert origin is not None and origin.endswith("__init__.py"), package
        body = ast.parse(Path(origin).read_text(), origin).body
        if not (len(body) == 1 and isinstance(body[0], ast.Expr)):
            busy.append(f"{origin}: more than a docstring")
    assert not busy, busy


@pytest.mark.parametrize("entry", ENTRIES)
def test_no_banned_module_at_container_start(graph: Graph, entry: str) -> None:
    reached = graph.walk((entry,), DOORS)
    banned = sorted(m for m in reached if top(m) in BANNED)
    assert not banned, "\n".join(f"{entry} reaches {m}: {chain(reached, m)}" for m in banned)


@pytest.mark.parametrize("entry", ENTRIES)
def test_only_the_standard_library_and_gpuctk(graph: Graph, entry: str) -> None:
    """Stricter than the list: any third-party import on the path fails, not just the known."""
    reached = graph.walk((entry,), DOORS)
    foreign = sorted(
        m
        for m in reached
        if not graph.is_walked(m) and top(m) not in sys.stdlib_module_names and m != "__future__"
    )
    assert not foreign, "\n".join(f"{m}: {chain(reached, m)}" for m in foreign)


def test_no_dynamic_imports_on_the_path(graph: Graph) -> None:
    """The walk sees statements only: an importlib.import_module would be a hole in it."""
    reached = graph.walk(ENTRIES, DOORS)
    holes = []
    for module in sorted(m for m in reached if graph.is_walked(m)):
        origin = graph.origins[module]
        holes += [f"{origin}:{line}" for line in dynamic_imports(Path(origin).read_text(), origin)]
    assert not holes, holes


@pytest.mark.parametrize(("importer", "target"), sorted(LAZY_DOORS))
def test_each_door_exists_and_is_lazy(graph: Graph, importer: str, target: str) -> None:
    edges = [e for e in graph.edges_of(importer) if e.target == target]
    assert edges, f"{importer} no longer imports {target}: drop the door from LAZY_DOORS"
    eager = [e for e in edges if not e.lazy]
    assert not eager, f"{eager}: a module-level import puts it on every start"


def _all_edges(graph: Graph) -> list[Edge]:
    """Every import edge of every gpuctk module the entries reach, doors followed."""
    reached = graph.walk(ENTRIES)
    return [e for m in reached if graph.is_walked(m) for e in graph.edges_of(m)]


def test_banned_modules_have_one_importer_each(graph: Graph) -> None:
    """With every edge followed, each banned module that is reachable at all is imported by its
    one listed module (pyroute2 only by gpuctk.hook.verbs.netdev, ...), and by nothing else."""
    edges = _all_edges(graph)
    imported = {e.target for e in edges}
    assert {"pyroute2", "yaml", "tomllib"} <= imported  # BANNED_VIA is not stale
    problems = []
    for module in sorted(m for m in imported if top(m) in BANNED):
        importers = {e.importer for e in edges if e.target == module}
        allowed = BANNED_VIA.get(top(module))
        if allowed is None or importers != {allowed}:
            problems.append(f"{module} imported by {sorted(importers)} (allowed: {allowed})")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("door", sorted(LAZY_DOORS), ids="->".join)
def test_a_door_is_the_only_way_in(graph: Graph, door: tuple[str, str]) -> None:
    """Every import of a door's target (gpuctk.hook.verbs.netdev, ...) anywhere on the entries'
    graph is a listed door and lazy: a second, eager importer would bypass it."""
    target = door[1]
    ways_in = [e for e in _all_edges(graph) if e.target == target]
    bad = [e for e in ways_in if (e.importer, e.target) not in LAZY_DOORS or not e.lazy]
    assert not bad, f"{target} is also reached by {bad}"


# The createContainer hook (what podman, CRI-O and containerd's own CDI run on every GPU start):
# modules that cost milliseconds per start and that its work does not need. gpuctk.libc falls
# back to ctypes only on a CPython without the _ctypes internals it uses; gpuctk.jsonfast imports
# json only to word the message for malformed JSON (error paths: both lazy, checked below).
HOOK_AVOIDS = ("ctypes", "signal", "re", "enum", "contextlib", "typing", "json", "dataclasses")
ERROR_PATHS = frozenset({("gpuctk.libc", "ctypes"), ("gpuctk.jsonfast", "json")})


def test_the_create_container_hook_stays_lean(graph: Graph) -> None:
    for importer, target in ERROR_PATHS:
        edges = [e for e in graph.edges_of(importer) if e.target == target]
        assert edges and all(e.lazy for e in edges), (importer, target)
    reached = graph.walk(("gpuctk.hook.verbs.actions",), DOORS | ERROR_PATHS)
    assert "gpuctk.hook.verbs.ldconfig" in reached and "gpuctk.hook.verbs.mounts" in reached
    heavy = sorted(m for m in reached if m in HOOK_AVOIDS)
    assert not heavy, "\n".join(f"{m}: {chain(reached, m)}" for m in heavy)
