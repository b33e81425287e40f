"""A GPU node's check in one run: the proof first, then the speed, side by side.

    python3 bench/node.py [--lower /] [--runs 15] [--rounds 3] [--checks smi,cache,probe]
        [--probe FILE] [--nvidia-ctk-bin DIR] [--json PATH] [--simulate PROFILE]

For a node with a real NVIDIA GPU (the tests need none), as root, with runc on PATH and gpuctk
importable by this Python (installed, or this checkout's). Everything happens in a tmpfs work
folder (an overlay of / is then legal), removed at the end:

1. The spec: `gpuctk cdi generate` of this node as the deb and the DaemonSet write it (the
   folder spec of every capability, staged in the work folder), checked by `gpuctk cdi
   validate`; gpuctk-runtime, gpuctk-hook and gpuctk-cdi-hook as the deb's launchers
   (gpuctk.install.launchers, for this Python). With --nvidia-ctk-bin DIR, DIR's nvidia-ctk
   writes NVIDIA's spec of the node and its nvidia-container-runtime serves it (CDI mode).
2. The proof, before any timing: a container on an overlay of --lower (default /: the host's
   own userland) scrubbed of the driver (ld.so.conf.d entries, libraries and nvidia-smi that
   name it, the ld cache rebuilt), asking for GPU 0 by NVIDIA_VISIBLE_DEVICES as a CUDA image
   does (NVIDIA_REQUIRE_CUDA=cuda>=12.2; config.json written as engines write it, Go's JSON:
   `>` as `\\u003e`), runs what users run, through each runtime: `nvidia-smi -L` by name
   (smi), `ldconfig -p` listing libcuda.so.1 as Triton reads it and libcuda.so as numba
   opens it (cache), and the CUDA probe (probe: --probe names its C source, built here with
   gcc -ldl, or a binary; it must print PROBE OK). A failed check stops the run: speed is
   reported only beside a path shown to serve the image.
3. The speed: --runs rounds of one container each (create --pid-file, start, wait for /bin/true,
   delete, as containerd's shim drives a runtime: bench/lifecycle.py; the proof's request and
   config.json's writing, bare runc's asking for nothing), alternating bare runc,
   gpuctk-runtime and NVIDIA's runtime; then --rounds bursts of 32 containers at once
   (bench/burst.py), container i asking for GPU i modulo the node's count. Medians, and each
   over bare runc and over NVIDIA's runtime.

--simulate PROFILE tries the script where there is no GPU: the spec of a simulated node over
the tests' Debian driver root and mknod'ed nodes (the smi and probe checks then cannot pass).
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

from burst import BURST, Bundles, burst
from common import CACHE
from fixtures.images import as_go_writes, make_bundle, overlay, unmount
from lifecycle import CUDA_REQUIRE, PATH_ENV, lifecycle
from nvidiaspec import check_bin, nvidia_runtime

CHECKS = ("smi", "cache", "probe")
SCRUB_NAMES = ("libcuda", "libnvidia", "libnvcuvid", "libnvoptix")
WAIT = 120  # seconds a proof container may take


def gpuctk(*args: str, env: dict[str, str] | None = None) -> str:
    """`gpuctk ARGS` through this Python; its stdout, SystemExit with its stderr on failure."""
    done = subprocess.run([sys.executable, "-m", "gpuctk", *args], capture_output=True,
                          text=True, env=env, check=False)  # fmt: skip
    if done.returncode:
        raise SystemExit(f"gpuctk {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def simulated(work: Path, profile: str) -> list[str]:
    """`cdi generate` arguments for a simulated `profile` (tests/fixtures)."""
    from fixtures.devroot import make_node_roots
    from fixtures.driver_root import build_driver_root

    from gpuctk.cdi.node.profile import load_profile

    roots = make_node_roots(work / "sim-node", load_profile(profile))
    return ["--simulate", profile, "--driver-root", str(build_driver_root(CACHE)),
            "--dev-root", str(roots.dev_root), "--proc-root", str(roots.proc_root),
            "--sys-root", str(roots.sys_root)]  # fmt: skip


def scrub(rootfs: Path) -> None:
    """The host's userland as an image without a driver: ld.so.conf.d files naming nvidia or
    cuda, the driver's libraries and nvidia-smi removed (whiteouts in the overlay), the image's
    ld cache rebuilt by the host's ldconfig over the root."""
    conf = rootfs / "etc" / "ld.so.conf.d"
    for entry in conf.glob("*") if conf.is_dir() else ():
        if entry.is_file() and any(w in entry.read_text(errors="replace").lower()
                                   for w in ("nvidia", "cuda")):  # fmt: skip
            entry.unlink()
    for folder in ("lib", "lib64", "usr/lib", "usr/lib64", "lib/x86_64-linux-gnu",
                   "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu"):  # fmt: skip
        where = rootfs / folder
        if where.is_dir() and not where.is_symlink():
            for lib in where.iterdir():
                if lib.name.startswith(SCRUB_NAMES) and (lib.is_file() or lib.is_symlink()):
                    lib.unlink()
    for folder in ("usr/bin", "usr/local/bin", "bin"):
        smi = rootfs / folder / "nvidia-smi"
        if smi.is_file() or smi.is_symlink():
            smi.unlink()
    subprocess.run(["ldconfig", "-r", str(rootfs)], capture_output=True, check=False)


def probe_binary(given: str | None, work: Path) -> Path | None:
    """The CUDA probe to run: --probe's binary, or its C source built with gcc."""
    if not given:
        return None
    path = Path(given).resolve()
    if path.suffix != ".c":
        return path
    out = work / "cudaprobe"
    done = subprocess.run(["gcc", "-O2", "-o", str(out), str(path), "-ldl"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode:
        raise SystemExit(f"--probe {given}: gcc failed:\n{done.stderr}")
    return out


def proof_script(checks: list[str]) -> str:
    lines = ["set -e"]
    if "smi" in checks:
        lines += ['echo "smi: $(command -v nvidia-smi)"', "nvidia-smi -L"]
    if "cache" in checks:
        lines += ["ldconfig -p | grep -q 'libcuda.so.1 ' && ldconfig -p | grep -q 'libcuda.so ' "
                  "&& echo 'cache: libcuda.so.1 libcuda.so'"]  # fmt: skip
    if "probe" in checks:
        lines += ["/usr/local/bin/cudaprobe"]
    return "; ".join([*lines, "echo CHECKS-DONE"])


def prove(
    label: str, argv: list[str], env: dict[str, str], lower: Path, work: Path,
    checks: list[str], probe: Path | None,
) -> str:  # fmt: skip
    """Run the proof container through `argv`; its output, SystemExit where a check fails."""
    folder = work / f"proof-{label}"
    rootfs = overlay(lower, folder / "ov")
    try:
        scrub(rootfs)
        if probe is not None:
            (rootfs / "usr/local/bin").mkdir(parents=True, exist_ok=True)
            shutil.copy2(probe, rootfs / "usr/local/bin/cudaprobe")
        request = ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
                   CUDA_REQUIRE]  # fmt: skip
        bundle = make_bundle(folder / "bundle", rootfs, ["/bin/sh", "-c", proof_script(checks)],
                             env=[PATH_ENV, *request])  # fmt: skip
        as_go_writes(bundle)
        out, name = folder / "out", f"gpuctk-node-proof-{label}-{os.getpid()}"
        with open(out, "w") as sink:
            steps = [[*argv, "create", "--bundle", str(bundle), "--pid-file",
                      str(folder / "pid"), name], [*argv, "start", name]]  # fmt: skip
            for step in steps:
                done = subprocess.run(step, stdin=subprocess.DEVNULL, stdout=sink,
                                      stderr=subprocess.STDOUT, env=env, check=False,
                                      timeout=WAIT)  # fmt: skip
                if done.returncode:
                    break
            deadline = time.monotonic() + WAIT
            while done.returncode == 0 and time.monotonic() < deadline:
                state = subprocess.run([*argv, "state", name], capture_output=True, text=True,
                                       env=env, check=False)  # fmt: skip
                if '"stopped"' in state.stdout or state.returncode:
                    break
                time.sleep(0.05)
        subprocess.run([*argv, "delete", "--force", name], capture_output=True, env=env,
                       check=False)  # fmt: skip
    finally:
        unmount(rootfs)
    text = out.read_text(errors="replace")
    wanted = {"smi": "GPU 0:", "cache": "cache: libcuda.so.1 libcuda.so", "probe": "PROBE OK"}
    missing = [c for c in checks if wanted[c] not in text]
    if missing or "CHECKS-DONE" not in text:
        raise SystemExit(f"{label}: the proof failed ({', '.join(missing) or 'exit'}):\n{text}")
    return text


def nvidia_setup(bindir: Path, runc: str, work: Path) -> tuple[list[str], dict[str, str]]:
    """NVIDIA's spec of this node by its nvidia-ctk, and its runtime over it."""
    spec_dir = work / "nvidia-cdi"
    spec_dir.mkdir()
    subprocess.run([str(bindir / "nvidia-ctk"), "--quiet", "cdi", "generate",
                    "--nvidia-cdi-hook-path", str(bindir / "nvidia-cdi-hook"),
                    "--format", "json", "--output", str(spec_dir / "nvidia.json")],
                   check=True)  # fmt: skip
    made = nvidia_runtime(bindir, spec_dir, runc, work)
    if made is None:
        raise SystemExit(f"--nvidia-ctk-bin {bindir}: no runnable nvidia-container-runtime")
    return made


def gpu_count(spec: dict[str, Any]) -> int:
    return max(1, sum(1 for d in spec.get("devices", []) if str(d.get("name", "")).isdigit()))


def time_runs(
    cases: dict[str, tuple[list[str], dict[str, str]]], lower: Path, work: Path, runs: int,
    rounds: int, count: int,
) -> dict[str, dict[str, list[float]]]:  # fmt: skip
    """{"single" | "burst": {case: seconds per round}}, after one warm-up of each case."""
    times: dict[str, dict[str, list[float]]] = {
        kind: {c: [] for c in cases} for kind in ("single", "burst", "burst_cpu")
    }
    gpu = ["NVIDIA_VISIBLE_DEVICES=0", CUDA_REQUIRE]
    for n in range(runs + 1):
        for name, (argv, env) in cases.items():
            ask = name != "runc"
            took = lifecycle(argv, lower, work, gpu if ask else [], as_go_writes, env)
            if n:
                times["single"][name].append(took)
    for n in range(rounds):
        for name, (argv, env) in cases.items():
            bundles = Bundles(lower, work, name != "runc", count)
            try:
                took, cpu = burst(argv, bundles, env)
            finally:
                bundles.close()
            times["burst"][name].append(took)
            times["burst_cpu"][name].append(cpu)
        print(f"  burst round {n + 1} of {rounds}: " + ", ".join(
            f"{c} {times['burst'][c][-1]:.2f} s" for c in cases))  # fmt: skip
    return times


def report(times: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, cases in times.items():
        if not all(cases.values()):
            continue
        med = {c: statistics.median(s) for c, s in cases.items()}
        unit, scale = ("ms", 1e3) if kind == "single" else ("s", 1.0)
        what = {"single": "one container", "burst": f"{BURST} containers at once"}.get(
            kind, f"CPU seconds of the runtime's processes, {BURST} containers at once"
        )
        print(f"{what}, create+start+delete of /bin/true (medians)")
        for case, m in med.items():
            extra = f", {m / med[NVIDIA]:.2f}x NVIDIA's" if NVIDIA in med else ""
            print(f"  {case:26s} {m * scale:8.2f} {unit}  {m / med['runc']:5.2f}x runc{extra}")
        out[kind] = {c: {"median_s": m, "x_runc": m / med["runc"]} for c, m in med.items()}
    return out


NVIDIA = "nvidia-container-runtime"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lower", default="/", help="the image's root (default: /)")
    parser.add_argument("--runs", type=int, default=15, help="single-container rounds")
    parser.add_argument("--rounds", type=int, default=3, help=f"bursts of {BURST} (0: none)")
    parser.add_argument("--checks", default=",".join(CHECKS), help="of smi, cache, probe")
    parser.add_argument("--probe", metavar="FILE", help="cudaprobe.c (built here) or a binary")
    parser.add_argument(
        "--nvidia-ctk-bin",
        type=Path,
        metavar="DIR",
        help="NVIDIA's nvidia-ctk, nvidia-cdi-hook, nvidia-container-runtime",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    parser.add_argument("--simulate", metavar="PROFILE", help="a simulated node (no GPU)")
    args = parser.parse_args()
    checks = [c for c in args.checks.split(",") if c]
    if any(c not in CHECKS for c in checks):
        parser.error(f"--checks: each of {', '.join(CHECKS)}")
    if "probe" in checks and not args.probe:
        parser.error("--checks probe needs --probe FILE (shared/gpu/cudaprobe.c, or a binary)")
    if os.geteuid() != 0:
        raise SystemExit("needs root (tmpfs and overlay mounts, runc)")
    runc = shutil.which("runc")
    if runc is None:
        raise SystemExit("runc not found on PATH")
    nvidia = check_bin(args.nvidia_ctk_bin) if args.nvidia_ctk_bin else None
    if nvidia is not None and args.simulate:
        raise SystemExit("--nvidia-ctk-bin is for a real node (simulated: bench/burst.py)")
    work = Path(tempfile.mkdtemp(prefix="gpuctk-node-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(work)], check=True)
    try:
        results = run(args, checks, runc, nvidia, work)
    finally:
        subprocess.run(["umount", "-l", str(work)], check=False)
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


def run(
    args: argparse.Namespace, checks: list[str], runc: str, nvidia: Path | None, work: Path
) -> dict[str, Any]:
    """main()'s three steps in `work`."""
    bindir = work / "bin"
    bindir.mkdir()
    subprocess.run([sys.executable, "-m", "gpuctk.install.launchers", str(bindir),
                    "--python", sys.executable], check=True)  # fmt: skip
    extra = simulated(work, args.simulate) if args.simulate else []
    spec_path = work / "cdi" / "nvidia.json"
    spec_path.parent.mkdir()
    gpuctk("cdi", "generate", "--output", str(spec_path), "--staging-dir",
           str(work / "staging"), "--hook-path", str(bindir / "gpuctk-hook"), *extra)  # fmt: skip
    gpuctk("cdi", "validate", str(spec_path))
    spec = json.loads(spec_path.read_text())
    toml = work / "gpuctk.toml"
    toml.write_text(f'runtimes = ["{runc}"]\nspec-dirs = ["{spec_path.parent}"]\n')
    env = {**os.environ, "GPUCTK_CONFIG": str(toml), "GPUCTK_STATE_DIR": str(work / "state")}
    cases = {"runc": ([runc], dict(os.environ)),
             "gpuctk-runtime": ([str(bindir / "gpuctk-runtime")], env)}  # fmt: skip
    if nvidia is not None:
        argv, extra_env = nvidia_setup(nvidia, runc, work)
        cases[NVIDIA] = (argv, {**os.environ, **extra_env})
    lower = Path(args.lower).resolve()
    probe = probe_binary(args.probe, work)
    sockets = [m["hostPath"] for m in spec.get("containerEdits", {}).get("mounts", [])
               if "persistenced" in m["hostPath"]]  # fmt: skip
    print(
        f"spec: {len(spec.get('devices', []))} devices, {gpu_count(spec)} GPUs, "
        f"persistenced's socket {'mounted' if sockets else 'not mounted'}"
    )
    for name, (argv, case_env) in cases.items():
        if name != "runc":
            text = prove(name, argv, case_env, lower, work, checks, probe)
            print(f"proof through {name}: " + " | ".join(text.strip().splitlines()))
    times = time_runs(cases, lower, work, args.runs, args.rounds, gpu_count(spec))
    return {"checks": checks, "results": report(times), "seconds": times}


if __name__ == "__main__":
    main()
