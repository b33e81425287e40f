"""Benchmark: wall time of `gpuctk cdi generate`, a fresh process each time.

    .venv/bin/python bench/generate.py [--runs 30] [--json out.json]
    python3 bench/generate.py --node [--gpuctk /usr/bin/gpuctk] [--runs 30] [-- FLAGS...]

Default: through the fake NVML on the Debian driver root, for the 8-GPU H100 profile and for
8 GPUs with 7 MIG devices each, from a regular install of this checkout with the isolated
launchers (bench/common.py installed_bin), as an operator runs it. Builds the fixtures (fake
libnvidia-ml.so.1, driver root, device nodes) if needed: that needs the test suite's
environment. Target: under 100 ms for the 8-GPU node.

`--node`: this node's own GPUs, through the installed `gpuctk` (default: the one on PATH) and
the real NVML, with nothing but the product installed (no test fixture, no pytest); FLAGS
after `--` are added to every `gpuctk cdi generate` (`--driver-root /run/nvidia/driver`).

Cases alternate run by run, so that machine noise hits them alike; the medians print beside
the floor of any Python CLI here (`python -I -c pass`, `python -I -c "import click"`, with the
interpreter gpuctk runs on). Each run writes its spec, and folder mode its driver stage
(`--staging-dir`), into a temporary folder removed at the end: the node's
/var/lib/gpuctk/driver and spec folders are never touched.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(
        argv, env=env, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stderr.decode()}")
    return took


def interpreter(launcher: str) -> str:
    """The Python a gpuctk launcher starts (its `#!` line's program)."""
    with open(launcher, "rb") as f:
        first = f.readline().decode(errors="replace")
    if not first.startswith("#!") or not first[2:].split():
        raise SystemExit(f"{launcher}: not a Python launcher (no #! line)")
    return first[2:].split()[0]


def fixture_cases(work: Path) -> tuple[str, dict[str, list[str]], dict[str, dict[str, str]]]:
    """The fake NVML cases (the test fixtures, imported only here): (python, cases, envs)."""
    from common import CACHE, installed_bin, installed_python
    from fixtures.devroot import make_node_roots
    from fixtures.driver_root import build_driver_root
    from fixtures.fake_nvml import build_fake_nvml, write_fake_profile

    from gpuctk.cdi.node.profile import load_profile

    bindir = installed_bin()
    gpuctk = str(bindir / "gpuctk")
    lib = build_fake_nvml(CACHE)
    driver_root = build_driver_root(CACHE)
    cases: dict[str, list[str]] = {}
    envs: dict[str, dict[str, str]] = {}
    for profile in ("h100-8", "h100-8-mig7"):
        roots = make_node_roots(work / profile, load_profile(profile))
        envs[profile] = dict(
            os.environ, FAKE_NVML_PROFILE=str(write_fake_profile(profile, work / f"{profile}.txt"))
        )
        cases[profile] = [
            gpuctk, "cdi", "generate", "--nvml-library", str(lib),
            "--driver-root", str(driver_root), "--dev-root", str(roots.dev_root),
            "--proc-root", str(roots.proc_root), "--sys-root", str(roots.sys_root),
            "--output", str(work / f"{profile}.yaml"), "--staging-dir", str(work / "stages"),
        ]  # fmt: skip
    return str(installed_python(bindir)), cases, envs


def node_cases(
    work: Path, gpuctk: str | None, flags: list[str]
) -> tuple[str, dict[str, list[str]], dict[str, dict[str, str]]]:
    """This node through the installed gpuctk and the real NVML: (python, cases, envs)."""
    found = gpuctk or shutil.which("gpuctk")
    if not found:
        raise SystemExit("no gpuctk on PATH: install the package, or name it with --gpuctk")
    argv = [found, "cdi", "generate", "--output", str(work / "node.yaml"),
            "--staging-dir", str(work / "stages"), *flags]  # fmt: skip
    return interpreter(found), {"this node": argv}, {"this node": dict(os.environ)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    parser.add_argument("--node", action="store_true", help="this node's GPUs (real NVML)")
    parser.add_argument("--gpuctk", metavar="PATH", help="--node: the gpuctk launcher to time")
    parser.add_argument("flags", nargs="*", help="--node: more `cdi generate` flags, after --")
    args = parser.parse_args()
    if args.flags and not args.node:
        parser.error("generate flags after -- go with --node")

    work = Path(tempfile.mkdtemp(prefix="gpuctk-bench-"))
    try:
        if args.node:
            python, cases, envs = node_cases(work, args.gpuctk, args.flags)
        else:
            python, cases, envs = fixture_cases(work)
        run(args, python, cases, envs)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(
    args: argparse.Namespace,
    python: str,
    cases: dict[str, list[str]],
    envs: dict[str, dict[str, str]],
) -> None:
    cases["python -c pass"] = [python, "-I", "-c", "pass"]
    envs["python -c pass"] = dict(os.environ)
    cases["python -c 'import click'"] = [python, "-I", "-c", "import click"]
    envs["python -c 'import click'"] = dict(os.environ)

    samples: dict[str, list[float]] = {name: [] for name in cases}
    for name in cases:  # warm-up: page cache, .pyc files
        timed(cases[name], envs[name])
    for _ in range(args.runs):
        for name in cases:
            samples[name].append(timed(cases[name], envs[name]))
    results = {
        name: {"median_ms": statistics.median(s) * 1e3, "min_ms": min(s) * 1e3}
        for name, s in samples.items()
    }
    floor = results["python -c pass"]["median_ms"]
    where = "this node, its NVML" if args.node else "driver 535 root, fake NVML"
    print(f"gpuctk cdi generate, {args.runs} alternating runs each ({where})")
    for name, r in results.items():
        print(
            f"  {name:28s} median {r['median_ms']:6.1f} ms  min {r['min_ms']:6.1f} ms"
            f"  ({r['median_ms'] / floor:4.1f}x python -c pass)"
        )
    if "h100-8" in results:
        verdict = "meets" if results["h100-8"]["median_ms"] < 100 else "MISSES"
        print(f"  target: 8-GPU node under 100 ms -> {verdict}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
