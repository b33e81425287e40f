"""Benchmark: what a gpuctk spec adds to a container start in an engine that applies CDI itself.

    .venv/bin/python bench/podman.py [--runs 30] [--json out.json] [--against REV]

`podman run --rm --network none --device nvidia.com/gpu=0 IMAGE /bin/true` (podman 4.3.1 with
runc, its own store, overlay, cgroupfs; the debian test image) alternated round by round with:

- no device          the same command without --device: the baseline;
- hook spec          `gpuctk cdi generate --library-mode hook` (the default): the driver
                     files at their host paths and one gpuctk-hook process for the SONAME
                     links and the ld cache;
- mounts spec        `--library-mode mounts`: each library at its SONAME in the loader's
                     own folders, no hook process;
- mounts, compute    the mounts spec of `--driver-capabilities utility,compute` (a compute-only
                     node: the utility and compute files and the firmware, ~30 mounts not 81);
- compute, triplet   the same with `--loader-folders triplet`: the libraries in the Debian/Ubuntu
                     loader folder only (a node whose images are all of that family), ~19
                     mounts;
- compute, folder    `--library-mode folder` of the same capabilities: the libraries and
                     binaries staged in one host folder, mounted at /usr/local/nvidia (the
                     CUDA images' LD_LIBRARY_PATH) and its lib64/ in both families'
                     glibc-hwcaps/x86-64-v2 folders (gpuctk.cdi.stage), 6 mounts; no
                     /dev/dri nodes, as in every compute-only spec;
- mounts, no libs    the hook spec with its hook removed: what the mounts and device nodes
                     alone cost (its libraries are not loadable: a reference, not a choice).

podman reads specs only from /etc/cdi and /var/run/cdi: each run is wrapped in a private mount
namespace with the case's spec folder on /run/cdi (the no-device case too, so all pay the
wrapper). Prints medians and, per round, each spec's paired difference from no device (the
median of the differences: what the spec adds). One simulated L4 over the Debian 535 driver
root. The NVIDIA Container Toolkit cannot be installed here (not in Debian's archive or on
PyPI), so its spec is not measured side by side; +48 ms is quoted for it in podman on its
authors' machines. Needs root and podman.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from common import CACHE, installed_bin, installed_bin_at
from fixtures.devroot import make_node_roots
from fixtures.driver_root import build_driver_root
from fixtures.podman import private_podman

from gpuctk.cdi.node.profile import load_profile

IMAGE = "localhost/gpuctk-bench-debian:latest"
PRIVATE = (
    'mount --bind "$1" /run/cdi || exit 97; '
    'if [ -d /etc/cdi ]; then mount -t tmpfs tmpfs /etc/cdi; fi; shift; exec "$@"'
)


def make_specs(
    work: Path, bindir: Path, against: tuple[str, Path] | None = None
) -> dict[str, Path]:
    driver_root = build_driver_root(CACHE)
    roots = make_node_roots(work / "node", load_profile("l4"))
    specs: dict[str, Path] = {"no device": work / "empty"}
    specs["no device"].mkdir()
    for case, mode, caps, folders in (
        ("hook spec", "hook", "all", "triplet,lib64"),
        ("mounts spec", "mounts", "all", "triplet,lib64"),
        ("mounts, compute", "mounts", "utility,compute", "triplet,lib64"),
        ("compute, triplet", "mounts", "utility,compute", "triplet"),
        ("compute, folder", "folder", "utility,compute", ""),
    ):
        folder = work / case.replace(" ", "-").replace(",", "")
        folder.mkdir()
        where = ["--staging-dir", str(work / "staging")] if mode == "folder" else []
        subprocess.run(
            [str(bindir / "gpuctk"), "cdi", "generate", "--simulate", "l4",
             "--driver-root", str(driver_root), "--dev-root", str(roots.dev_root),
             "--proc-root", str(roots.proc_root), "--sys-root", str(roots.sys_root),
             "--hook-path", str(bindir / "gpuctk-hook"), "--library-mode", mode,
             "--driver-capabilities", caps, *where,
             *(["--loader-folders", folders] if folders else []),
             "--output", str(folder / "nvidia.json")],
            check=True, capture_output=True,
        )  # fmt: skip
        specs[case] = folder
    doc = json.loads((work / "hook-spec" / "nvidia.json").read_text())
    doc["containerEdits"].pop("hooks", None)
    (work / "bare").mkdir()
    (work / "bare" / "nvidia.json").write_text(json.dumps(doc))
    specs["mounts, no libs"] = work / "bare"
    if against is not None:  # the hook spec with REV's gpuctk-hook in its hook entry
        rev, other = against
        doc = json.loads((work / "hook-spec" / "nvidia.json").read_text())
        for hook in doc["containerEdits"]["hooks"]:
            hook["path"] = str(other / "gpuctk-hook")
        (work / "hook-rev").mkdir()
        (work / "hook-rev" / "nvidia.json").write_text(json.dumps(doc))
        specs[f"hook spec @{rev}"] = work / "hook-rev"
    return specs


def measure(
    work: Path, bindir: Path, runs: int, against: tuple[str, Path] | None = None
) -> dict[str, list[float]]:
    """Seconds of each `podman run --rm` per case (make_specs' cases, over a private podman):
    a warm-up run of each, then `runs` rounds, the order reversed every other round.
    `against` (REV, its launchers' folder) adds the hook spec with REV's gpuctk-hook."""
    specs = make_specs(work, bindir, against)
    Path("/run/cdi").mkdir(parents=True, exist_ok=True)  # the private namespace's mount point
    with private_podman(work, IMAGE, "overlay") as base:

        def run(case: str) -> float:
            device = [] if case == "no device" else ["--device", "nvidia.com/gpu=0"]
            argv = [
                "unshare", "-m", "--propagation", "private", "sh", "-c", PRIVATE, "sh",
                str(specs[case]), *base, "run", "--rm", "--network", "none",
                "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",  # root's
                *device, IMAGE, "/bin/true",  # hard limits here are below podman's asks
            ]  # fmt: skip
            start = time.perf_counter()
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            elapsed = time.perf_counter() - start
            if done.returncode != 0:
                raise SystemExit(f"{case}: podman failed: {done.stderr}")
            return elapsed

        cases = list(specs)
        for case in cases:  # warm-up
            run(case)
        times: dict[str, list[float]] = {case: [] for case in cases}
        for i in range(runs):
            for case in cases if i % 2 == 0 else cases[::-1]:
                times[case].append(run(case))
    return times


def summarize(times: dict[str, list[float]]) -> dict[str, float]:
    """Print each case's median and each spec's paired difference from no device; returns
    those differences (ms)."""
    added: dict[str, float] = {}
    for case, samples in times.items():
        ms = [t * 1e3 for t in samples]
        line = f"  {case:16s} median {statistics.median(ms):6.1f} ms  min {min(ms):6.1f} ms"
        if case != "no device":
            diffs = [1e3 * (a - b) for a, b in zip(samples, times["no device"], strict=True)]
            added[case] = statistics.median(diffs)
            line += f"  adds {added[case]:+6.1f} ms (paired median)"
        print(line)
    saved = added["hook spec"] - added["mounts spec"]
    print(f"  the mounts spec saves {saved:.1f} ms per start against the hook spec")
    for case in times:
        if case.startswith("hook spec @"):
            diffs = [1e3 * (a - b) for a, b in zip(times["hook spec"], times[case], strict=True)]
            print(f"  this checkout's hook against {case[len('hook spec ') :]}:"
                  f" {statistics.median(diffs):+.1f} ms per start (paired median)")  # fmt: skip
    return added


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    parser.add_argument(
        "--against",
        metavar="REV",
        help="also time the hook spec with gpuctk-hook as of git revision REV (built once into "
        "its own venv) and print this checkout's hook over REV's, paired",
    )
    args = parser.parse_args()
    if shutil.which("podman") is None:
        raise SystemExit("podman not installed")
    bindir = installed_bin()
    against = (args.against, installed_bin_at(args.against)) if args.against else None
    work = Path(tempfile.mkdtemp(prefix="gpuctk-bench-podman-"))
    try:
        times = measure(work, bindir, args.runs, against)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"podman run --rm /bin/true, {args.runs} alternating rounds (1 simulated L4)")
    added = summarize(times)
    if args.json:
        doc = {"runs": args.runs, "median_ms": {c: statistics.median(t) * 1e3 for c, t in
               times.items()}, "added_ms": added}  # fmt: skip
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
