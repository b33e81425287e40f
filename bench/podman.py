"""Benchmark: what a gpuctk spec adds to a container start in an engine that applies CDI itself.

    .venv/bin/python bench/podman.py [--runs 30] [--json out.json] [--against REV]
        [--nvidia-ctk-bin DIR]

`podman run --rm --network none --device nvidia.com/gpu=0 IMAGE /bin/true` (podman 4.3.1 with
runc, its own store, overlay, cgroupfs; the debian test image) alternated round by round with:

- no device          the same command without --device: the baseline;
- default spec       `gpuctk cdi generate` with no mode flag (auto: the folder spec of every
                     capability: 3 mounts, its one hook entry the compiled
                     gpuctk-cdi-hook, which links the firmware and the config files the
                     container's NVIDIA_DRIVER_CAPABILITIES asks for from the stage and leaves
                     the debian test image's loader alone);
- default, all caps  the default spec, the container run with
                     NVIDIA_DRIVER_CAPABILITIES=all: the hook links all 13 files (a compute
                     container, the other cases, gets the firmware and the OpenCL file);
- default, CUDA image  the default spec, the container run with a CUDA image's
                     NVIDIA_REQUIRE_CUDA=cuda>=12.2, which podman writes (Go's JSON) as
                     `cuda\\u003e=12.2`; with --against REV also the same spec naming REV's
                     gpuctk-cdi-hook;
- default, mounted   the same spec with `--disable-hook create-symlinks`: those 13 files
                     mounted one by one (16 mounts) for every container;
- hook spec          `gpuctk cdi generate --library-mode hook`: the driver
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
- nvidia             with --nvidia-ctk-bin DIR: the NVIDIA Container Toolkit's own spec,
                     written by DIR's `nvidia-ctk cdi generate` over the same simulated node
                     (bench/nvidiaspec.py), its hooks running DIR's nvidia-cdi-hook;
- nvidia, no hooks   that spec with its hooks removed (its mounts and device nodes alone).

podman reads specs only from /etc/cdi and /var/run/cdi: each run is wrapped in a private mount
namespace with the case's spec folder on /run/cdi (the no-device case too, so all pay the
wrapper). Prints medians and, per round, each spec's paired difference from no device (the
median of the differences: what the spec adds). One simulated L4 over the Debian 535 driver
root. With the nvidia cases it also prints, per gpuctk spec, its add over NVIDIA's (the ratio of
the two medians, and the median of the per-round ratios) and the paired difference of the two
starts. Needs root and podman.

Speed only beside compatibility: before the timed rounds each case runs the applications'
checks of the native CDI matrix once (fixtures.appimages: Triton's `ldconfig -p` lookup,
`nvidia-smi` by name, dlopen of libcuda.so.1 and libnvidia-ml.so.1, the firmware and OpenCL
files) in the debian image, through the same podman and spec, and the table says which pass.
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

from common import CACHE, installed_bin, installed_bin_at, paired
from fixtures import appimages
from fixtures.devroot import make_node_roots
from fixtures.driver_root import build_driver_root
from fixtures.podman import private_podman
from nvidiaspec import add_by_path_links, check_bin, nvidia_spec

from gpuctk.cdi.node.profile import load_profile

IMAGE = "localhost/gpuctk-bench-debian:latest"
PRIVATE = (
    'mount --bind "$1" /run/cdi || exit 97; '
    'if [ -d /etc/cdi ]; then mount -t tmpfs tmpfs /etc/cdi; fi; shift; exec "$@"'
)


NVIDIA = "nvidia"  # the case of NVIDIA's spec
BASE = "default spec"  # gpuctk's default spec (--library-mode auto: folder)
ALL_CAPS = "default, all caps"  # the same spec, a container that asks for every capability
CUDA = "default, CUDA image"
CASE_ENV = {ALL_CAPS: ("-e", "NVIDIA_DRIVER_CAPABILITIES=all"),
            CUDA: ("-e", "NVIDIA_REQUIRE_CUDA=cuda>=12.2")}  # fmt: skip


def case_env(case: str) -> tuple[str, ...]:
    """The podman arguments a case adds (its variable; REV's twin of a case takes its own)."""
    return CASE_ENV.get(case.partition(" @")[0], ())


def make_specs(
    work: Path, bindir: Path, against: tuple[str, Path] | None = None,
    nvidia: Path | None = None,
) -> dict[str, Path]:  # fmt: skip
    driver_root = build_driver_root(CACHE).resolve()
    roots = make_node_roots(work / "node", load_profile("l4"))
    specs: dict[str, Path] = {"no device": work / "empty"}
    specs["no device"].mkdir()
    for case, mode, caps, folders, *more in (
        ("default spec", "", "all", ""),
        ("default, mounted", "", "all", "", "--disable-hook", "create-symlinks"),
        ("hook spec", "hook", "all", "triplet,lib64"),
        ("mounts spec", "mounts", "all", "triplet,lib64"),
        ("mounts, compute", "mounts", "utility,compute", "triplet,lib64"),
        ("compute, triplet", "mounts", "utility,compute", "triplet"),
        ("compute, folder", "folder", "utility,compute", ""),
    ):
        folder = work / case.replace(" ", "-").replace(",", "")
        folder.mkdir()
        where = ["--staging-dir", str(work / "staging")] if mode in ("folder", "") else []
        subprocess.run(
            [str(bindir / "gpuctk"), "cdi", "generate", "--simulate", "l4",
             "--driver-root", str(driver_root), "--dev-root", str(roots.dev_root),
             "--proc-root", str(roots.proc_root), "--sys-root", str(roots.sys_root),
             "--hook-path", str(bindir / "gpuctk-hook"),
             *(["--library-mode", mode] if mode else []), "--driver-capabilities", caps, *where,
             *(["--loader-folders", folders] if folders else []), *more,
             "--output", str(folder / "nvidia.json")],
            check=True, capture_output=True,
        )  # fmt: skip
        specs[case] = folder
    specs[ALL_CAPS] = specs[CUDA] = specs["default spec"]  # run with CASE_ENV's variables
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
        doc = json.loads((specs["default spec"] / "nvidia.json").read_text())
        for hook in doc["containerEdits"]["hooks"]:  # REV's compiled hook, where it has one
            name = Path(hook["path"]).name
            hook["path"] = str(other / name) if (other / name).is_file() else hook["path"]
        (work / "default-rev").mkdir()
        (work / "default-rev" / "nvidia.json").write_text(json.dumps(doc))
        specs[f"{CUDA} @{rev}"] = work / "default-rev"
    if nvidia is not None:  # nvidia-ctk's spec of the same node (its own node roots: by-path links)
        nv_roots = make_node_roots(work / "nvidia-node", load_profile("l4"))
        add_by_path_links(nv_roots.dev_root, nv_roots.sys_root)
        (work / "nvidia-ctk").mkdir()
        spec = nvidia_spec(nvidia, driver_root, nv_roots.dev_root, nv_roots.sys_root, "l4",
                           work / "nvidia-ctk" / "nvidia.json")  # fmt: skip
        specs[NVIDIA] = spec.parent
        doc = json.loads(spec.read_text())
        doc["containerEdits"].pop("hooks", None)
        for device in doc["devices"]:
            device["containerEdits"].pop("hooks", None)
        (work / "nvidia-bare").mkdir()
        (work / "nvidia-bare" / "nvidia.json").write_text(json.dumps(doc))
        specs[f"{NVIDIA}, no hooks"] = work / "nvidia-bare"
    return specs


def measure(
    work: Path, bindir: Path, runs: int, against: tuple[str, Path] | None = None,
    nvidia: Path | None = None,
) -> dict[str, list[float]]:  # fmt: skip
    """Seconds of each `podman run --rm` per case (make_specs' cases, over a private podman):
    a warm-up run of each, then `runs` rounds, the order reversed every other round.
    `against` (REV, its launchers' folder) adds the hook spec with REV's gpuctk-hook;
    `nvidia` (the folder of nvidia-ctk and nvidia-cdi-hook) adds NVIDIA's spec."""
    specs = make_specs(work, bindir, against, nvidia)
    Path("/run/cdi").mkdir(parents=True, exist_ok=True)  # the private namespace's mount point
    with private_podman(work, IMAGE, "overlay") as base:

        def run(case: str) -> float:
            device = [] if case == "no device" else ["--device", "nvidia.com/gpu=0"]
            argv = [
                "unshare", "-m", "--propagation", "private", "sh", "-c", PRIVATE, "sh",
                str(specs[case]), *base, "run", "--rm", "--network", "none",
                "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",  # root's
                *device, *case_env(case),
                IMAGE, "/bin/true",  # hard limits here are below podman's asks
            ]  # fmt: skip
            start = time.perf_counter()
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            elapsed = time.perf_counter() - start
            if done.returncode != 0:
                raise SystemExit(f"{case}: podman failed: {done.stderr}")
            return elapsed

        cases = list(specs)
        compat_check(work, base, specs)
        for case in cases:  # warm-up
            run(case)
        times: dict[str, list[float]] = {case: [] for case in cases}
        for i in range(runs):
            for case in cases if i % 2 == 0 else cases[::-1]:
                times[case].append(run(case))
    return times


APP_IMAGE = "localhost/gpuctk-bench-apps:latest"


def compat_check(work: Path, base: list[str], specs: dict[str, Path]) -> dict[str, str]:
    """Run fixtures.appimages' checks once per case (the debian class, as root) and print
    which pass: "ok", or the first check that does not hold."""
    import tarfile

    root = appimages.make_root(work / "apps", "debian")
    tarball = work / "apps.tar"
    with tarfile.open(tarball, "w") as tar:
        tar.add(root, arcname=".")
    subprocess.run([*base, "import", "-q", str(tarball), APP_IMAGE], check=True,
                   capture_output=True)  # fmt: skip
    found: dict[str, str] = {}
    print("compatibility (the applications' checks, debian image, once per case):")
    for case, folder in specs.items():
        if case == "no device":
            continue
        argv = [
            "unshare", "-m", "--propagation", "private", "sh", "-c", PRIVATE, "sh", str(folder),
            *base, "run", "--rm", "--network", "none", "--ulimit", "nofile=1024:1024",
            "--ulimit", "nproc=1024:1024", "--device", "nvidia.com/gpu=0",
            *case_env(case), APP_IMAGE, "/bin/gpu-apps",
        ]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        found[case] = appimages.summary(done.stdout + done.stderr)
        print(f"  {case:17s} {found[case]}")
    return found


def summarize(times: dict[str, list[float]]) -> dict[str, float]:
    """Print each case's median and each spec's paired difference from no device; returns
    those differences (ms)."""
    added: dict[str, float] = {}
    for case, samples in times.items():
        ms = [t * 1e3 for t in samples]
        line = f"  {case:17s} median {statistics.median(ms):6.1f} ms  min {min(ms):6.1f} ms"
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
        if case.startswith(f"{CUDA} @"):
            diffs = [1e3 * (a - b) for a, b in zip(times[CUDA], times[case], strict=True)]
            print(f"  this checkout's CUDA image start against {case[len(CUDA) + 2 :]}:"
                  f" {statistics.median(diffs):+.1f} ms (paired median)")  # fmt: skip
    if NVIDIA in times:
        against_nvidia(times)
    return added


def against_nvidia(times: dict[str, list[float]], show: bool = True) -> dict[str, dict[str, float]]:
    """Print and return, per gpuctk spec, its add as a fraction of NVIDIA's spec's add (the
    ratio of the paired medians, and the median of the per-round ratios, over the rounds where
    NVIDIA's adds anything) and the paired difference of the two starts (ms)."""
    nv_add = paired(times, NVIDIA, "no device")
    nv_median = statistics.median(nv_add)
    if show:
        print(f"  against NVIDIA's spec (adds {nv_median:+.1f} ms):")
    found: dict[str, dict[str, float]] = {}
    for case in times:
        if case == "no device" or case.startswith(NVIDIA):
            continue
        add = paired(times, case, "no device")
        ratios = [a / n for a, n in zip(add, nv_add, strict=True) if n > 0]
        nan = float("nan")
        found[case] = f = {
            "ratio_of_medians": statistics.median(add) / nv_median if nv_median > 0 else nan,
            "median_ratio": statistics.median(ratios) if ratios else nan,
            "minus_nvidia_ms": statistics.median(paired(times, case, NVIDIA)),
        }
        if show:
            print(
                f"    {case:17s} adds {f['ratio_of_medians']:5.2f}x NVIDIA's (per-round median"
                f" {f['median_ratio']:5.2f}x); start {f['minus_nvidia_ms']:+6.1f} ms against"
                " NVIDIA's (paired median)"
            )
    if show and BASE in found:
        f = found[BASE]
        verdict = "within" if f["median_ratio"] <= 0.5 else "over"
        print(f"  gpuctk's default spec adds {f['median_ratio']:.2f} of what NVIDIA's adds"
              f" (per-round median): {verdict} half")  # fmt: skip
    return found


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
    parser.add_argument(
        "--nvidia-ctk-bin",
        metavar="DIR",
        type=Path,
        help="also time the NVIDIA Container Toolkit's spec, written by DIR's nvidia-ctk (DIR "
        "holds nvidia-ctk and nvidia-cdi-hook: an install's /usr/bin, or a build of your own)",
    )
    args = parser.parse_args()
    if shutil.which("podman") is None:
        raise SystemExit("podman not installed")
    nvidia = check_bin(args.nvidia_ctk_bin) if args.nvidia_ctk_bin else None
    bindir = installed_bin()
    against = (args.against, installed_bin_at(args.against)) if args.against else None
    work = Path(tempfile.mkdtemp(prefix="gpuctk-bench-podman-"))
    try:
        times = measure(work, bindir, args.runs, against, nvidia)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"podman run --rm /bin/true, {args.runs} alternating rounds (1 simulated L4)")
    added = summarize(times)
    if args.json:
        doc = {"runs": args.runs, "median_ms": {c: statistics.median(t) * 1e3 for c, t in
               times.items()}, "added_ms": added}  # fmt: skip
        if NVIDIA in times:
            doc["against_nvidia"] = against_nvidia(times, show=False)
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
