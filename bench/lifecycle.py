"""Benchmark: container create+start+delete through gpuctk-runtime against bare runc.

    .venv/bin/python bench/lifecycle.py [--runs 15] [--json out.json]

Each run is `<runtime> create --bundle B --pid-file P NAME`, `start NAME`, a wait for /bin/true to
exit, and `delete NAME`, all through the runtime under test as containerd's runc shim drives it,
timed together, on a fresh overlay of the debian test image (the hook writes into the rootfs;
overlays are mounted before the clock starts and unmounted after). The cases alternate run by
run so that machine noise hits them alike:

- runc            bare runc, no GPU request;
- python shim     a do-nothing Python shim (`python -I`, os.execv of runc): the floor for any
                  Python process on this path;
- gpuctk 1 GPU    gpuctk-runtime, NVIDIA_VISIBLE_DEVICES=0;
- gpuctk 8 GPUs   gpuctk-runtime, NVIDIA_VISIBLE_DEVICES=all.

The spec comes from `gpuctk cdi generate --simulate h100-8` over the Debian 535 driver root and
mknod'ed device nodes. Targets (issue 3): at most 1.9x bare runc at 1 GPU, and 8 GPUs within 10%
of 1 GPU. Builds the fixtures (driver root, device nodes, image) if needed; needs root and runc.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from common import CACHE, installed_bin
from fixtures.driver_root import build_driver_root
from fixtures.gpucheck import generate
from fixtures.images import build_image, make_bundle, overlay, unmount

PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PROFILE = "h100-8"
_names = itertools.count()


def write_floor_shim(path: Path, python: Path, runc: str) -> Path:
    path.write_text(
        f"#!{python} -I\nimport os, sys\nos.execv({runc!r}, [{runc!r}, *sys.argv[1:]])\n"
    )
    path.chmod(0o755)
    return path


def _wait_exit(pid: int) -> None:
    """Until process `pid` (not our child: runc's init, reparented) has exited."""
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] in ("Z", "X"):
                    return
        except (FileNotFoundError, ProcessLookupError):
            return
        time.sleep(0.0002)


def lifecycle(argv: list[str], image: Path, work: Path, env: list[str]) -> float:
    """Seconds for create, start, wait for /bin/true to exit, delete, each through `argv`, as
    containerd's runc shim drives a runtime; the overlay and bundle are set up off the clock."""
    n = next(_names)
    rootfs = overlay(image, work / f"ov-{n}")
    bundle = make_bundle(work / f"bundle-{n}", rootfs, ["/bin/true"], env=[PATH_ENV, *env])
    name = f"gpuctk-bench-{os.getpid()}-{n}"
    pid_file, log = work / f"pid-{n}", work / f"err-{n}"
    try:
        with open(log, "w") as err:
            quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": err}
            start = time.perf_counter()
            steps = [
                subprocess.run(
                    [*argv, "create", "--bundle", str(bundle), "--pid-file", str(pid_file), name],
                    **quiet,
                    timeout=120,
                    check=False,
                ).returncode
            ]
            if steps[0] == 0:
                pid = int(pid_file.read_text())
                steps.append(
                    subprocess.run([*argv, "start", name], **quiet, check=False).returncode
                )
                _wait_exit(pid)
                steps.append(
                    subprocess.run([*argv, "delete", name], **quiet, check=False).returncode
                )
            elapsed = time.perf_counter() - start
    finally:
        subprocess.run([*argv, "delete", "--force", name], capture_output=True, check=False)
        unmount(rootfs)
    if any(steps) or len(steps) != 3:
        raise SystemExit(f"{argv[0]} failed (create, start, delete: {steps}):\n{log.read_text()}")
    shutil.rmtree(work / f"ov-{n}", ignore_errors=True)
    shutil.rmtree(bundle, ignore_errors=True)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (overlay mounts, mknod, runc)")
    runc = shutil.which("runc")
    if runc is None:
        raise SystemExit("runc not installed")

    bindir = installed_bin()
    driver_root = build_driver_root(CACHE)
    image = build_image("debian")
    work = Path(tempfile.mkdtemp(prefix="gpuctk-bench-lifecycle-"))
    spec_dir = generate(work, driver_root, PROFILE, work / "cdi" / "nvidia.json", bindir).spec_dir
    toml = work / "gpuctk.toml"
    toml.write_text(
        f'runtimes = ["{runc}"]\nspec-dirs = ["{spec_dir}"]\nlog-file = "{work}/gpuctk.log"\n'
    )
    os.environ["GPUCTK_CONFIG"] = str(toml)
    shim = str(bindir / "gpuctk-runtime")
    floor = write_floor_shim(work / "floor-shim", bindir.parent / "bin" / "python", runc)
    cases: dict[str, tuple[list[str], list[str]]] = {
        "runc": ([runc], []),
        "python shim (floor)": ([str(floor)], []),
        "gpuctk 1 GPU": ([shim], ["NVIDIA_VISIBLE_DEVICES=0"]),
        "gpuctk 8 GPUs": ([shim], ["NVIDIA_VISIBLE_DEVICES=all"]),
    }

    samples: dict[str, list[float]] = {name: [] for name in cases}
    try:
        for argv, env in cases.values():  # warm-up: page cache, .pyc files
            lifecycle(argv, image, work, env)
        for _ in range(args.runs):
            for name, (argv, env) in cases.items():
                samples[name].append(lifecycle(argv, image, work, env))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    results: dict[str, dict[str, float]] = {
        name: {"median_ms": statistics.median(s) * 1e3, "min_ms": min(s) * 1e3}
        for name, s in samples.items()
    }
    bare = results["runc"]["median_ms"]
    for r in results.values():
        r["x_runc"] = r["median_ms"] / bare
    one, eight = results["gpuctk 1 GPU"]["median_ms"], results["gpuctk 8 GPUs"]["median_ms"]
    ratio_8_1 = eight / one
    print(f"create+start+delete of /bin/true, {args.runs} alternating runs each ({PROFILE} spec)")
    for name, r in results.items():
        print(
            f"  {name:20s} median {r['median_ms']:6.1f} ms  min {r['min_ms']:6.1f} ms"
            f"  ({r['x_runc']:4.2f}x runc)"
        )
    x1 = results["gpuctk 1 GPU"]["x_runc"]
    print(f"  target: 1 GPU at most 1.9x runc -> {x1:.2f}x {'meets' if x1 <= 1.9 else 'MISSES'}")
    verdict = "meets" if ratio_8_1 <= 1.10 else "MISSES"
    print(f"  target: 8 GPUs within 10% of 1 GPU -> {ratio_8_1:.3f}x {verdict}")
    growth = (eight - bare) / (one - bare) if one > bare else float("nan")
    print(f"  (overhead over runc, 8 GPUs vs 1 GPU: {growth:.3f}x)")
    if args.json:
        doc = {
            "runs": args.runs,
            "cases": results,
            "gpu8_vs_gpu1": ratio_8_1,
            "overhead_gpu8_vs_gpu1": growth,
        }
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
