"""Benchmark: what `gpuctk-runtime` and `gpuctk-hook` import at container start, and its cost.

    .venv/bin/python bench/imports.py [--runs 5] [--top 12] [--tree] [--format text|json]
                                      [--spec json|yaml]

Runs each entry point as an operator's install runs it (bench/common.py installed_bin: a
regular install with the `-IS` launchers), under `<venv python> -IS -X importtime <launcher>`
(for gpuctk-runtime, whose launcher is a sh front, its Python half: `-c CODE <launcher>`),
and summarises the import tree CPython reports on stderr:

- gpuctk-runtime pass-through  `gpuctk-runtime state x` when its sh front has no usable memo
                               and starts Python (with a memo, no Python runs at all: see
                               gpuctk.install.launchers);
- gpuctk-runtime create        `create --bundle B --pid-file P NAME` of a container that asks
                               for 1 GPU (NVIDIA_VISIBLE_DEVICES=0) on a fresh overlay of the
                               debian test image: requests, CDI registry, apply, the in-root
                               work (gpuctk.hook.shim.shimroot), config.json written back;
- gpuctk-hook createContainer  the hook entry of the generated spec, as runc runs it: its args
                               and env, the OCI state on stdin, on a fresh overlay (from the
                               host's mount namespace: the imports do not depend on it);
- python -IS -c pass           the floor: what any Python start imports here.

The gpuctk config names `/bin/true` as the low-level runtime, so no container runs (the shim
execs /bin/true where it would exec runc). The spec is `gpuctk cdi generate --simulate h100-8`
over the Debian 535 driver root, written as JSON (as bench/lifecycle.py does) or, with
`--spec yaml`, as the YAML the refresh unit writes. Each case runs once to warm up, then
`--runs` times; the run with the median total is the one shown. For each case: the modules in
load order with their cumulative µs, the top N by cumulative and by self time, the total import
time and the module count; `--tree` adds CPython's raw indented tree, `--format json` prints one
JSON document instead. The last line is a verdict: whether any of click, jsonschema, pynvml,
pyroute2, yaml, tomllib, tomlkit was imported (exit status 1 if so). Needs root (overlay
mounts, mknod for the spec's device nodes); builds the fixtures if needed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import CACHE, installed_bin, installed_python
from fixtures.driver_root import build_driver_root
from fixtures.gpucheck import generate
from fixtures.images import build_image, make_bundle, overlay, unmount

PROFILE = "h100-8"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BANNED = ("click", "jsonschema", "pynvml", "pyroute2", "yaml", "tomllib", "tomlkit")
PREFIX = "import time:"


class Module:
    """One line of `-X importtime`: a module's first import, its own and cumulative µs."""

    __slots__ = ("children", "cumulative_us", "depth", "name", "self_us")

    def __init__(self, name: str, depth: int, self_us: int, cumulative_us: int) -> None:
        self.name, self.depth = name, depth
        self.self_us, self.cumulative_us = self_us, cumulative_us
        self.children: list[Module] = []

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "depth": self.depth,
            "self_us": self.self_us,
            "cumulative_us": self.cumulative_us,
        }


def parse_importtime(stderr: str) -> tuple[list[Module], list[str]]:
    """(modules in load order, the raw tree lines) from a process's stderr.

    CPython prints a module when its import ENDS, children before their parent, indented two
    spaces a level: rebuild the tree, then list it parent first, the order imports start in."""
    raw = [line for line in stderr.splitlines() if line.startswith(PREFIX)]
    stack: list[Module] = []
    for line in raw:
        fields = line[len(PREFIX) :].split("|", 2)
        if len(fields) != 3 or not fields[0].strip().isdigit():
            continue  # the header line
        name_field = fields[2][1:]  # "| " then two spaces per level
        name = name_field.lstrip(" ")
        depth = (len(name_field) - len(name)) // 2
        module = Module(name, depth, int(fields[0]), int(fields[1]))
        while stack and stack[-1].depth > depth:
            module.children.insert(0, stack.pop())
        stack.append(module)
    ordered: list[Module] = []

    def visit(module: Module) -> None:
        ordered.append(module)
        for child in module.children:
            visit(child)

    for module in stack:
        visit(module)
    return ordered, raw


def total_us(modules: list[Module]) -> int:
    return sum(m.cumulative_us for m in modules if m.depth == 0)


def banned_in(modules: list[Module]) -> list[str]:
    return sorted({m.name for m in modules if m.name.partition(".")[0] in BANNED})


class Case:
    """One entry point to measure: how to prepare a run, and its argv, env and stdin."""

    def __init__(
        self,
        title: str,
        argv: list[str],
        env: dict[str, str],
        stdin: bytes = b"",
        prepare: Any = None,
    ) -> None:
        self.title, self.argv, self.env, self.stdin = title, argv, env, stdin
        self.prepare = prepare  # called before every run: a fresh root, config.json restored
        self.runs: list[tuple[int, list[Module], list[str]]] = []

    def run_once(self) -> None:
        if self.prepare is not None:
            self.prepare()
        done = subprocess.run(
            self.argv, input=self.stdin, env=self.env, capture_output=True, timeout=120, check=False
        )
        stderr = done.stderr.decode(errors="replace")
        if done.returncode != 0:
            other = "\n".join(x for x in stderr.splitlines() if not x.startswith(PREFIX))
            raise SystemExit(f"{self.title}: exit {done.returncode}\n{other}")
        modules, raw = parse_importtime(stderr)
        if not modules:
            raise SystemExit(f"{self.title}: no -X importtime output on stderr")
        self.runs.append((total_us(modules), modules, raw))

    def shown(self) -> tuple[int, list[Module], list[str]]:
        """The run with the median total (the lower middle one for an even count)."""
        ordered = sorted(self.runs, key=lambda run: run[0])
        return ordered[(len(ordered) - 1) // 2]

    def result(self, top: int, tree: bool) -> dict[str, Any]:
        total, modules, raw = self.shown()
        totals = [run[0] for run in self.runs]
        by = {
            "cumulative": sorted(modules, key=lambda m: -m.cumulative_us)[:top],
            "self": sorted(modules, key=lambda m: -m.self_us)[:top],
        }
        out: dict[str, Any] = {
            "argv": self.argv,
            "total_us": total,
            "total_us_median": statistics.median(totals),
            "total_us_min": min(totals),
            "module_count": len(modules),
            "gpuctk_module_count": sum(1 for m in modules if m.name.startswith("gpuctk")),
            "banned": banned_in(modules),
            "modules": [m.as_dict() for m in modules],
            "top_cumulative": [m.as_dict() for m in by["cumulative"]],
            "top_self": [m.as_dict() for m in by["self"]],
        }
        if tree:
            out["tree"] = raw
        return out


def fresh_root(image: Path, place: Path) -> Path:
    """A new overlay of `image` mounted at place/merged (the previous one there unmounted)."""
    merged = place / "merged"
    if merged.is_dir():
        unmount(merged)
        shutil.rmtree(place)
    return overlay(image, place)


def make_cases(
    bindir: Path, work: Path, image: Path, spec_dir: Path, spec: dict[str, Any]
) -> list[Case]:
    python = str(installed_python(bindir))
    trace = [python, "-IS", "-X", "importtime"]
    toml = work / "gpuctk.toml"
    toml.write_text(
        f'runtimes = ["/bin/true"]\nspec-dirs = ["{spec_dir}"]\nlog-file = "{work}/gpuctk.log"\n'
    )
    env = {"PATH": PATH_ENV.partition("=")[2], "GPUCTK_CONFIG": str(toml)}
    from gpuctk.install.launchers import _RUNTIME_PYTHON  # what the sh front runs with -IS -c

    runtime = str(bindir / "gpuctk-runtime")
    trace_runtime = [*trace, "-c", _RUNTIME_PYTHON, runtime]
    pid_file = str(work / "create.pid")

    # create: one bundle; before each run a fresh overlay at the same path, config.json restored
    create_root = work / "create-root"
    bundle = make_bundle(
        work / "create-bundle",
        create_root / "merged",
        ["/bin/true"],
        env=[PATH_ENV, "NVIDIA_VISIBLE_DEVICES=0"],
    )
    pristine = (bundle / "config.json").read_bytes()

    def prepare_create() -> None:
        fresh_root(image, create_root)
        (bundle / "config.json").write_bytes(pristine)

    # the hook: the spec's own createContainer entry, run on the root as runc would run it
    hook = _spec_hook(spec)
    hook_root = work / "hook-root"
    hook_bundle = make_bundle(work / "hook-bundle", hook_root / "merged", ["/bin/true"])
    state = {
        "ociVersion": "1.0.2",
        "id": "gpuctk-bench-imports",
        "status": "creating",
        "pid": 1,
        "bundle": str(hook_bundle),
    }
    hook_env = dict(e.partition("=")[::2] for e in hook.get("env", []))
    return [
        Case("python -IS -c pass (floor)", [*trace, "-c", "pass"], env),
        Case("gpuctk-runtime pass-through (state x)", [*trace_runtime, "state", "x"], env),
        Case(
            f"gpuctk-runtime create (1 GPU, {PROFILE} spec)",
            [*trace_runtime, "create", "--bundle", str(bundle), "--pid-file", pid_file, "bench"],
            env,
            prepare=prepare_create,
        ),
        Case(
            "gpuctk-hook createContainer (the spec's hook entry)",
            [*trace, hook["path"], *hook["args"][1:]],
            hook_env,
            stdin=json.dumps(state).encode(),
            prepare=lambda: fresh_root(image, hook_root),
        ),
    ]


def _spec_hook(spec: dict[str, Any]) -> dict[str, Any]:
    for hook in spec.get("containerEdits", {}).get("hooks", []):
        if hook.get("hookName") == "createContainer":
            return dict(hook)
    raise SystemExit("the generated spec has no createContainer hook entry")


def fmt_ms(us: float) -> str:
    return f"{us / 1000:6.2f} ms"


def print_text(results: dict[str, dict[str, Any]], runs: int, top: int, tree: bool) -> None:
    floor = results[next(iter(results))]
    print(f"imports at start, -X importtime, the median of {runs} runs shown ({PROFILE} spec)")
    for title, r in results.items():
        print(f"\n== {title}")
        shown = " ".join(a for a in r["argv"][4:] if "\n" not in a)  # no -c CODE
        print(f"   {shown if len(shown) <= 160 else shown[:150] + ' ...'}")
        extra = r["module_count"] - floor["module_count"]
        print(
            f"   {r['module_count']} modules ({r['gpuctk_module_count']} gpuctk, {extra:+d} over"
            f" the floor), total import time {fmt_ms(r['total_us'])}"
            f" (min {fmt_ms(r['total_us_min'])})"
        )
        print("   load order (cumulative µs):")
        line = "     "
        for m in r["modules"]:
            item = f"{'.' * m['depth']}{m['name']} {m['cumulative_us']}"
            if len(line) + len(item) + 2 > 100:
                print(line.rstrip(", "))
                line = "     "
            line += item + ", "
        print(line.rstrip(", "))
        for key, label in (("top_cumulative", "cumulative"), ("top_self", "self")):
            print(f"   top {top} by {label} µs:")
            for m in r[key]:
                print(f"     {m['self_us']:7d} self {m['cumulative_us']:8d} cum  {m['name']}")
        print(f"   banned modules: {', '.join(r['banned']) or 'none'}")
        if tree:
            print("   raw tree (CPython's order: a module after the modules it imported):")
            for raw in r["tree"]:
                print(f"     {raw}")
    found = {t: r["banned"] for t, r in results.items() if r["banned"]}
    print()
    print(verdict(found))


def verdict(found: dict[str, list[str]]) -> str:
    if not found:
        return f"verdict: OK, no entry point imports any of {', '.join(BANNED)}"

    def packages(mods: list[str]) -> str:
        count: dict[str, int] = {}
        for m in mods:
            count[m.partition(".")[0]] = count.get(m.partition(".")[0], 0) + 1
        return ", ".join(f"{t} ({n} module{'s' * (n > 1)})" for t, n in sorted(count.items()))

    where = "; ".join(f"{title}: {packages(mods)}" for title, mods in found.items())
    return f"verdict: BANNED IMPORTS FOUND -- {where}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="measured runs per case (5)")
    parser.add_argument("--top", type=int, default=12, help="modules in each top list (12)")
    parser.add_argument("--tree", action="store_true", help="also print the raw import trees")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument(
        "--spec", choices=("json", "yaml"), default="json", help="format of the CDI spec (json)"
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit(
            "bench/imports.py needs root: the create and hook cases run on overlay mounts of the "
            "test image (mount -t overlay), and the spec's device nodes are mknod'ed"
        )
    if args.runs < 1:
        raise SystemExit("--runs must be at least 1")

    bindir = installed_bin()
    driver_root = build_driver_root(CACHE)
    image = build_image("debian")
    work = Path(tempfile.mkdtemp(prefix="gpuctk-bench-imports-"))
    try:
        out = work / "cdi" / f"nvidia.{args.spec}"
        node = generate(work, driver_root, PROFILE, out, bindir)
        # a spec younger than speccache.SETTLE_NS is parsed every time (coarse timestamps); on
        # a node it was written at boot: let it settle, so the warm-up run caches it
        from gpuctk.cdi.specs.speccache import SETTLE_NS

        time.sleep(SETTLE_NS / 1e9 + 0.1)
        cases = make_cases(bindir, work, image, node.spec_dir, node.spec)
        for case in cases:
            print(f"running {case.title} ...", file=sys.stderr)
            for _ in range(args.runs + 1):
                case.run_once()
            del case.runs[0]  # the warm-up
    finally:
        for place in ("create-root", "hook-root"):
            unmount(work / place / "merged")
        shutil.rmtree(work, ignore_errors=True)

    results = {case.title: case.result(args.top, args.tree) for case in cases}
    found = {t: r["banned"] for t, r in results.items() if r["banned"]}
    if args.format == "json":
        doc = {
            "python": sys.version.split()[0],
            "profile": PROFILE,
            "spec_format": args.spec,
            "runs": args.runs,
            "banned_checked": list(BANNED),
            "cases": results,
            "verdict": {"ok": not found, "found": found, "line": verdict(found)},
        }
        print(json.dumps(doc, indent=2))
    else:
        print_text(results, args.runs, args.top, args.tree)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
