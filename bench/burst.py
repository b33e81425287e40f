"""Benchmark: 32 containers at once through gpuctk-runtime against 32 through bare runc.

    .venv/bin/python bench/burst.py [--rounds 5] [--json out.json] [--against REV]
        [--library-mode auto|hook|...] [--nvidia-ctk-bin DIR] [--no-persistenced]

A burst is 32 containers started together, each going through bench/lifecycle.py's round
(`<runtime> create --bundle B --pid-file P NAME`, `start NAME`, a wait for /bin/true to exit,
`delete NAME`) in its own thread; it is timed from the moment they are let go to the end of
the last delete. Container i asks for GPU i of a simulated 32-GPU node (tests/fixtures/burst.py;
`NVIDIA_VISIBLE_DEVICES=i`; the spec `gpuctk cdi generate` writes with `--library-mode`,
default auto: the default install's) and runs on its own fresh overlay of the debian test image;
overlays, bundles and edits made ahead are all made off the clock. A waiter needs no CPU (a
pidfd: bench/lifecycle.py polls /proc, which 32 threads at once would pay for on the CPUs the
burst needs).

Burst cases, alternating round by round (their order rotated each round, so that machine noise
and a case's effect on the next hit them alike):

- runc                bare runc, no GPU request;
- runc + GPU edits    bare runc on config.json files that gpuctk-runtime edited ahead, off the
                      clock: the same requests satisfied by the same spec (mounts, device nodes,
                      the container's ld cache), what runc itself pays for them;
- gpuctk              gpuctk-runtime as installed (gpuctk.install.launchers' front on every
                      verb; a create of a request resolved before goes to the compiled
                      create, of the default install's spec, else one Python start), its
                      state folder warm as on a node (a plan per request, kept by every
                      create of a burst);
- gpuctk @REV         the same for git revision REV (--against; its own venv, built once, and
                      its own state folder);
- nvidia-container-runtime  with --nvidia-ctk-bin DIR: NVIDIA's runtime from DIR in its CDI
                      mode (NVIDIA_VISIBLE_DEVICES=i becomes nvidia.com/gpu=i) on the spec
                      DIR's nvidia-ctk writes for the same node, its hooks DIR's
                      nvidia-cdi-hook: this repository neither carries nor builds them.

Unless --no-persistenced, an nvidia-persistenced socket listens in the driver root for the
whole run, as on most real nodes, so that every spec mounts it.

In the same rounds, one container at a time (bench/lifecycle.py's lifecycle(), the round its
ratios come from), SINGLES of each case, interleaved: runc, runc + GPU edits, gpuctk 1 GPU and
gpuctk 1 GPU @REV.

Prints the medians, the CPU seconds a burst's runtime processes spent (user and system: what
the wall time hides when the machine is shared), the burst's ratio over bare runc with the
same edits (the target: at most 1.5x) and over runc without a GPU, the single-create ratios
beside REV's, and this checkout over REV (median ratio and paired difference, within this
run). Builds the fixtures (driver
root, device nodes, image) if needed; needs root and runc.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import CACHE, installed_bin, installed_bin_at, node_options, persistenced
from fixtures.burst import many_gpu_node, wait_exit
from fixtures.driver_root import build_driver_root
from fixtures.images import build_image, make_bundle, overlay, unmount
from lifecycle import PATH_ENV, lifecycle
from nvidiaspec import check_bin, nvidia_node_runtime

BURST = 32
TARGET = 1.5
WAIT = 300  # seconds any one step may take before the benchmark gives up
ONE_GPU = ["NVIDIA_VISIBLE_DEVICES=0"]  # the single container's request
SINGLES = 5  # single containers per case in each round (they are short: more samples)
NVIDIA = "nvidia-container-runtime"  # NVIDIA's runtime's case (--nvidia-ctk-bin)

Edit = Callable[[list[Path]], None]  # edits bundles ahead, off the clock
Case = tuple[list[str], dict[str, str], bool, Edit | None]  # argv, env, asks for a GPU, edit


class Bundles:
    """BURST bundles on fresh overlays of `image` in a new folder under `work`, bundle i asking
    for GPU i modulo `count` (`gpus`) or for nothing; close() unmounts and removes them."""

    def __init__(self, image: Path, work: Path, gpus: bool, count: int = BURST) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="burst-", dir=work))
        self.rootfs: list[Path] = []
        self.paths: list[Path] = []
        try:
            for i in range(BURST):
                place = self.work / f"ov-{i}"
                self.rootfs.append(place / "merged")  # unmounted by close() if the mount ran
                overlay(image, place)
                env = [PATH_ENV, f"NVIDIA_VISIBLE_DEVICES={i % count}"] if gpus else [PATH_ENV]
                bundle = self.work / f"bundle-{i}"
                self.paths.append(make_bundle(bundle, self.rootfs[-1], ["/bin/true"], env=env))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for rootfs in self.rootfs:
            unmount(rootfs)
        shutil.rmtree(self.work, ignore_errors=True)


def editor(shim: str, dry: Path, state: Path) -> Edit:
    """gpuctk-runtime's edits to bundles, all at once, with `dry` (its runtime /bin/true:
    nothing is created) and its state in `state`."""

    def edit(paths: list[Path]) -> None:
        env = {**os.environ, "GPUCTK_CONFIG": str(dry), "GPUCTK_STATE_DIR": str(state)}
        procs = [
            subprocess.Popen([shim, "create", "--bundle", str(b), f"gpuctk-burst-dry-{i}"], env=env)
            for i, b in enumerate(paths)
        ]
        if any(p.wait(timeout=WAIT) for p in procs):
            raise SystemExit(f"{shim} could not edit the bundles ahead")

    return edit


def children_cpu() -> float:
    """CPU seconds (user and system) of every child this process has waited for so far."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def burst(argv: list[str], bundles: Bundles, proc_env: dict[str, str]) -> tuple[float, float]:
    """Seconds for every bundle's create, start, wait, delete through `argv`, all at once, and
    the CPU seconds the runtime's processes spent on them (each waited for by then, the
    cleanup's `delete --force` too, a no-op after a delete; the containers' own processes,
    reparented, are not counted)."""
    cpu = children_cpu()
    tag = f"gpuctk-burst-{os.getpid()}-{time.monotonic_ns()}"
    gate = threading.Barrier(BURST + 1, timeout=WAIT)
    ends = [0.0] * BURST
    failures: list[str] = []

    def one(i: int) -> None:
        name, pid_file = f"{tag}-{i}", bundles.work / f"pid-{i}"
        log = bundles.work / f"err-{i}"
        try:
            # stderr to a file, not a pipe: the container inherits runc's stdio, so a pipe
            # would stay open after `create` until the container exits
            with open(log, "w") as err:
                quiet: dict[str, Any] = {
                    "stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": err,
                    "env": proc_env, "timeout": WAIT,
                }  # fmt: skip
                gate.wait()
                for step in ("create", "start", "delete"):
                    if step == "create":
                        cmd = [*argv, "create", "--bundle", str(bundles.paths[i]),
                               "--pid-file", str(pid_file), name]  # fmt: skip
                    else:
                        cmd = [*argv, step, name]
                    if subprocess.run(cmd, **quiet, check=False).returncode:
                        failures.append(f"{name} {step}: {log.read_text()}")
                        return
                    if step == "start" and not wait_exit(int(pid_file.read_text()), WAIT):
                        failures.append(f"{name}: /bin/true still running after {WAIT} s")
                        return
            ends[i] = time.perf_counter()
        except Exception as exc:  # reported below, with the others
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
        finally:
            subprocess.run(
                [*argv, "delete", "--force", name], capture_output=True, env=proc_env, check=False
            )

    threads = [threading.Thread(target=one, args=(i,)) for i in range(BURST)]
    for thread in threads:
        thread.start()
    gate.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    if failures:
        raise SystemExit(f"{argv[0]}: {len(failures)} of {BURST} failed:\n" + "\n".join(failures))
    return max(ends) - start, children_cpu() - cpu


def measure(
    cases: dict[str, Case], image: Path, work: Path, rounds: int
) -> dict[str, dict[str, list[float]]]:
    """{"burst" | "burst_cpu" | "single": {case: seconds in each measured round}}, after a
    warm-up round ("burst_cpu": the CPU seconds of each burst)."""
    names = list(cases)
    out: dict[str, dict[str, list[float]]] = {
        k: {c: [] for c in names} for k in ("burst", "burst_cpu", "single")
    }
    time.sleep(1.1)  # the spec settles (gpuctk.cdi.specs.speccache.SETTLE_NS), as on a node
    for n in range(rounds + 1):  # round 0 warms the page cache, the .pyc files, the caches
        order = names[n % len(names) :] + names[: n % len(names)]
        for name in order:
            argv, env, gpus, edit = cases[name]
            bundles = Bundles(image, work, gpus)
            try:
                if edit is not None:
                    edit(bundles.paths)
                took, cpu = burst(argv, bundles, env)
            finally:
                bundles.close()
            if n:
                out["burst"][name].append(took)
                out["burst_cpu"][name].append(cpu)
        for _ in range(SINGLES):
            for name in order:
                argv, env, gpus, edit = cases[name]
                prepare = (lambda b, edit=edit: edit([b])) if edit is not None else None
                took = lifecycle(argv, image, work, ONE_GPU if gpus else [], prepare, env)
                if n:
                    out["single"][name].append(took)
        if n:
            print(f"  round {n} of {rounds}: " + ", ".join(
                f"{name} {out['burst'][name][-1]:.2f} s" for name in names
            ))  # fmt: skip
    return out


def report(
    times: dict[str, dict[str, list[float]]], rounds: int, against: str | None, out: str | None,
    mode: str = "auto",
) -> None:  # fmt: skip
    med = {
        kind: {c: statistics.median(s) for c, s in cases.items()} for kind, cases in times.items()
    }
    low = {kind: {c: min(s) for c, s in cases.items()} for kind, cases in times.items()}
    titles = {
        "burst": f"{BURST} containers at once, each create+start+delete of /bin/true asking for "
        f"its own GPU (h100-{BURST} spec, {mode} mode), wall time of the burst",
        "single": "one container at a time, create+start+delete (bench/lifecycle.py's round), "
        "1 GPU",
    }
    ratios: dict[str, dict[str, dict[str, float]]] = {}
    print(f"{rounds} alternating rounds")
    for kind in ("burst", "single"):
        bare, edited = med[kind]["runc"], med[kind]["runc + GPU edits"]
        unit, scale = ("s", 1.0) if kind == "burst" else ("ms", 1e3)
        print(titles[kind])
        ratios[kind] = {}
        for case, m in med[kind].items():
            ratios[kind][case] = {"x_runc": m / bare, "x_runc_edits": m / edited}
            print(
                f"  {case:24s} median {m * scale:7.2f} {unit}  min {low[kind][case] * scale:7.2f}"
                f" {unit}  ({m / bare:4.2f}x runc, {m / edited:4.2f}x runc + GPU edits)"
            )
    gpuctk = [c for c in med["burst"] if c.startswith("gpuctk") or c == NVIDIA]
    print(f"  {'side by side':24s} {'burst':>22s}    {'single':>22s}")

    def row(case: str, of: dict[str, dict[str, float]]) -> str:
        cols = [
            f"{of[kind][case] / of[kind][base]:5.2f}x {label}"
            for kind in ("burst", "single")
            for base, label in (("runc + GPU edits", "edits"), ("runc", "runc "))
        ]
        return f"  {case:24s} {cols[0]} {cols[1]}    {cols[2]} {cols[3]}".rstrip()

    for case in gpuctk:
        print(row(case, med))
    print("  the same from the minima (the least of the machine's other load)")
    for case in gpuctk:
        print(row(case, low))
    cpu = med["burst_cpu"]
    print("  CPU seconds of a burst's runtime processes (less noisy than the wall on a shared "
          "machine)")  # fmt: skip
    for case, m in cpu.items():
        print(f"  {case:24s} median {m:7.2f} s  ({m / cpu['runc + GPU edits']:4.2f}x runc + "
              "GPU edits)")  # fmt: skip
    x = ratios["burst"]["gpuctk"]["x_runc_edits"]
    print(
        f"  target: a burst at most {TARGET}x bare runc with the same GPU edits -> {x:.2f}x"
        f" {'meets' if x <= TARGET else 'MISSES'}"
    )
    x = ratios["burst"]["gpuctk"]["x_runc"]
    print(
        f"  target: a burst at most {TARGET}x bare runc -> {x:.2f}x"
        f" {'meets' if x <= TARGET else 'MISSES'}"
    )
    if NVIDIA in med["burst"]:
        for kind in ("burst", "single"):
            x = med[kind]["gpuctk"] / med[kind][NVIDIA]
            print(f"  gpuctk over NVIDIA's runtime, {kind}: {x:.2f}x"
                  f" ({'ahead' if x < 1 else 'BEHIND'})")  # fmt: skip
    if against:
        for kind in ("burst", "burst_cpu", "single"):
            here, there = times[kind]["gpuctk"], times[kind][f"gpuctk @{against}"]
            paired = statistics.median(a - b for a, b in zip(here, there, strict=True))
            unit, scale = ("ms", 1e3) if kind == "single" else ("s", 1.0)
            print(
                f"  this checkout against {against}, {kind.replace('_', ' ')}: median"
                f" {statistics.median(here) / statistics.median(there):.3f}x, paired difference"
                f" {paired * scale:+.2f} {unit}"
            )
    if out:
        doc = {"rounds": rounds, "burst": BURST, "seconds": times, "ratios": ratios}
        Path(out).write_text(json.dumps(doc, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (default 5)")
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    parser.add_argument(
        "--against",
        metavar="REV",
        help="also time gpuctk as of git revision REV (built once into its own venv, with its "
        "own state folder), alternating with this checkout's, and print both side by side",
    )
    node_options(parser)
    parser.add_argument(
        "--library-mode", default="auto",
        help="the spec's `gpuctk cdi generate --library-mode` (default auto: the default "
        "install's spec; hook: the hook spec)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if os.geteuid() != 0:
        raise SystemExit("needs root (overlay mounts, mknod, runc)")
    runc = shutil.which("runc")
    if runc is None:
        raise SystemExit("runc not installed")

    bindir = installed_bin()
    other = installed_bin_at(args.against) if args.against else None
    nvidia = check_bin(args.nvidia_ctk_bin) if args.nvidia_ctk_bin else None
    driver_root = build_driver_root(CACHE)
    image = build_image("debian")
    work = Path(tempfile.mkdtemp(prefix="gpuctk-bench-burst-"))
    try:
        with persistenced(driver_root, not args.no_persistenced) as sock:
            times = _run(args, runc, bindir, other, nvidia, driver_root, image, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"nvidia-persistenced's socket mounted by every spec: {'yes' if sock else 'no'}")
    report(times, args.rounds, args.against, args.json, args.library_mode)


def _run(
    args: argparse.Namespace, runc: str, bindir: Path, other: Path | None, nvidia: Path | None,
    driver_root: Path, image: Path, work: Path,
) -> dict[str, dict[str, list[float]]]:  # fmt: skip
    """The cases of main(), measured."""
    mode = ("--library-mode", args.library_mode)
    staged = ("--staging-dir", str(work / "staging")) if args.library_mode != "hook" else ()
    node = many_gpu_node(work / "node", driver_root, BURST, bindir, (*mode, *staged))
    toml, dry = work / "gpuctk.toml", work / "dry.toml"
    toml.write_text(
        f'runtimes = ["{runc}"]\nspec-dirs = ["{node.spec_dir}"]\nlog-file = "{work}/gpuctk.log"\n'
    )
    dry.write_text(f'runtimes = ["/bin/true"]\nspec-dirs = ["{node.spec_dir}"]\n')
    shim = str(bindir / "gpuctk-runtime")
    # the shim's memo and caches as on a node: a state folder of its own for each build
    env = {**os.environ, "GPUCTK_CONFIG": str(toml), "GPUCTK_STATE_DIR": str(work / "state")}
    cases: dict[str, Case] = {
        "runc": ([runc], env, False, None),
        "runc + GPU edits": ([runc], env, True, editor(shim, dry, work / "state-dry")),
        "gpuctk": ([shim], env, True, None),
    }
    if other is not None:
        there = {**env, "GPUCTK_STATE_DIR": str(work / "state-against")}
        cases[f"gpuctk @{args.against}"] = ([str(other / "gpuctk-runtime")], there, True, None)
    if nvidia is not None:
        cases[NVIDIA] = nvidia_case(nvidia, driver_root, runc, work, env)
    return measure(cases, image, work, args.rounds)


def nvidia_case(
    nvidia: Path, driver_root: Path, runc: str, work: Path, env: dict[str, str]
) -> Case:
    """NVIDIA's nvidia-container-runtime (CDI mode) on nvidia-ctk's spec of the node
    many_gpu_node made under work/node (the same profile)."""
    profile = work / "node" / f"h100-{BURST}.yaml"
    argv, extra = nvidia_node_runtime(nvidia, driver_root, str(profile), runc, work)
    return argv, {**env, **extra}, True, None


if __name__ == "__main__":
    main()
