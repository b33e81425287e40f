"""Benchmark: wall time of `gpuctk cdi generate` through the fake NVML on the Debian driver root.

    .venv/bin/python bench/generate.py [--runs 30] [--json out.json]

Times the whole command as an operator runs it (a fresh process each time) for the 8-GPU
H100 profile and for 8 GPUs with 7 MIG devices each, alternating the cases run by run so that
machine noise hits them alike, and prints medians beside the floor of any Python CLI here
(`python -I -c pass`, and `python -I -c "import click"`). Everything runs from a regular
install of this checkout with the isolated launchers (bench/common.py installed_bin), as an
operator runs it. Target: under 100 ms for the 8-GPU node. Builds the fixtures
(fake libnvidia-ml.so.1, driver root, device nodes) if needed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from common import CACHE, installed_bin, installed_python
from fixtures.devroot import make_node_roots
from fixtures.driver_root import build_driver_root
from fixtures.fake_nvml import build_fake_nvml, write_fake_profile

from gpuctk.cdi.node.profile import load_profile


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    args = parser.parse_args()

    bindir = installed_bin()
    gpuctk = str(bindir / "gpuctk")
    python = str(installed_python(bindir))
    lib = build_fake_nvml(CACHE)
    driver_root = build_driver_root(CACHE)
    work = Path(tempfile.mkdtemp(prefix="gpuctk-bench-"))
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
            "--output", str(work / f"{profile}.yaml"),
        ]  # fmt: skip
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
    print(f"gpuctk cdi generate, {args.runs} alternating runs each (driver 535 root, fake NVML)")
    for name, r in results.items():
        print(
            f"  {name:28s} median {r['median_ms']:6.1f} ms  min {r['min_ms']:6.1f} ms"
            f"  ({r['median_ms'] / floor:4.1f}x python -c pass)"
        )
    verdict = "meets" if results["h100-8"]["median_ms"] < 100 else "MISSES"
    print(f"  target: 8-GPU node under 100 ms -> {verdict}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
