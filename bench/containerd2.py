"""Benchmark: what a CDI spec adds to a container start in containerd 2.1 through its CRI, the
way the kubelet asks for a device plugin's or DRA driver's GPU (the container config's CDI
devices field), gpuctk's default spec beside NVIDIA's.

    .venv/bin/python bench/containerd2.py [--runs 30] [--json out.json] [--nvidia-ctk-bin DIR]

Debian sid's containerd 2.1 (tests/fixtures/sidengines.py: fetched once with a private apt
configuration, its own root, state and socket, runc from Debian 12, cgroupfs). One daemon per
spec folder (CDI cannot hold two `nvidia.com/gpu` specs in one folder), each with one pod in the
node's namespaces made before the rounds. A round runs, in each daemon, one container of the
debian test image running /bin/true: CreateContainer (with `nvidia.com/gpu=0` in the CDI
devices field, or nothing for the "no device" case), StartContainer, ContainerStatus until it
has exited, RemoveContainer, timed end to end as the kubelet's calls are; the order of the cases
reversed every other round. Cases:

- no device       the gpuctk daemon, no CDI device: the baseline;
- default spec    `gpuctk cdi generate` with no mode flag over a simulated L4 (the folder spec:
                  3 mounts, one gpuctk-cdi-hook entry);
- nvidia          with --nvidia-ctk-bin DIR: the NVIDIA Container Toolkit's spec of the same
                  node written by DIR's nvidia-ctk (bench/nvidiaspec.py), its hooks DIR's
                  nvidia-cdi-hook.

Speed only beside compatibility: each case first runs the applications' checks
(fixtures.appimages: Triton's `ldconfig -p` lookup, `nvidia-smi` by name, dlopen of libcuda.so.1
and libnvidia-ml.so.1, the firmware and OpenCL files) in the same daemon, and the table says
which pass. Prints each case's median, each spec's paired add over no device, and the default
spec's add as a fraction of NVIDIA's. Needs root.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from common import CACHE, installed_bin, paired
from fixtures import appimages, sidengines
from fixtures.cri import EXITED, Cri
from fixtures.devroot import make_node_roots
from fixtures.driver_root import build_driver_root
from nvidiaspec import add_by_path_links, check_bin, nvidia_spec

from gpuctk.cdi.node.profile import load_profile

NONE, BASE, NVIDIA = "no device", "default spec", "nvidia"
DEVICE = "nvidia.com/gpu=0"


def make_specs(work: Path, bindir: Path, nvidia: Path | None) -> dict[str, Path]:
    """{case: its spec folder} (the no-device case shares the default spec's daemon)."""
    driver_root = build_driver_root(CACHE).resolve()
    roots = make_node_roots(work / "node", load_profile("l4"))
    folder = work / "gpuctk"
    folder.mkdir()
    subprocess.run(
        [str(bindir / "gpuctk"), "cdi", "generate", "--simulate", "l4",
         "--driver-root", str(driver_root), "--dev-root", str(roots.dev_root),
         "--proc-root", str(roots.proc_root), "--sys-root", str(roots.sys_root),
         "--hook-path", str(bindir / "gpuctk-hook"), "--staging-dir", str(work / "staging"),
         "--output", str(folder / "nvidia.json")],
        check=True, capture_output=True,
    )  # fmt: skip
    specs = {NONE: folder, BASE: folder}
    if nvidia is not None:
        nv_roots = make_node_roots(work / "nvidia-node", load_profile("l4"))
        add_by_path_links(nv_roots.dev_root, nv_roots.sys_root)
        (work / "nvidia").mkdir()
        spec = nvidia_spec(nvidia, driver_root, nv_roots.dev_root, nv_roots.sys_root, "l4",
                           work / "nvidia" / "nvidia.json")  # fmt: skip
        specs[NVIDIA] = spec.parent
    return specs


class Daemon:
    """One containerd 2.1 over one spec folder, its pod, the image imported."""

    def __init__(self, stack: contextlib.ExitStack, work: Path, folder: Path, root: Path) -> None:
        self.engine = stack.enter_context(sidengines.Containerd2(work, folder))
        self.image = self.engine.import_image(root, "gpuctk.bench/apps:1")
        cri: Cri = self.engine.cri
        self.cri = cri
        logs = work / "logs"
        logs.mkdir(parents=True)
        self.pod_config = Cri.sandbox_config(f"bench-{work.name}", self.engine.cgroup_parent,
                                             str(logs))  # fmt: skip
        self.pod = cri.run_pod(self.pod_config, "")
        stack.callback(self.close)
        self.count = 0

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.cri.stop_pod(self.pod)
            self.cri.remove_pod(self.pod)

    def start(self, devices: list[str], command: list[str]) -> float:
        """Seconds from CreateContainer to the container removed after its exit."""
        self.count += 1
        began = time.perf_counter()
        container = self.cri.create(self.pod, self.pod_config, f"c{self.count}", self.image,
                                    command, {}, {}, cdi_devices=devices)  # fmt: skip
        self.cri.start(container)
        while self.cri.status(container)[0] != EXITED:
            time.sleep(0.002)
        code = self.cri.status(container)[1]
        self.cri.remove(container)
        took = time.perf_counter() - began
        if code != 0:
            raise SystemExit(f"a container exited {code}")
        return took


def compat_check(daemons: dict[str, Daemon]) -> dict[str, str]:
    found: dict[str, str] = {}
    print("compatibility (the applications' checks, debian image, CRI CDI devices field):")
    for case, daemon in daemons.items():
        if case == NONE:
            continue
        env = dict(e.split("=", 1) for e in appimages.CLASSES["debian"].env)
        code, out = daemon.engine.run(daemon.image, ["/bin/gpu-apps"], env=env,
                                      cdi_devices=[DEVICE])  # fmt: skip
        found[case] = appimages.summary(out) if code == 0 else f"exit {code}: {out[-200:]}"
        print(f"  {case:13s} {found[case]}")
    return found


def measure(work: Path, bindir: Path, runs: int, nvidia: Path | None) -> tuple[dict, dict]:
    specs = make_specs(work, bindir, nvidia)
    root = appimages.make_root(work / "apps", "debian")
    with contextlib.ExitStack() as stack:
        daemons: dict[str, Daemon] = {}
        for case, folder in specs.items():
            if case == NONE:
                continue
            daemons[case] = Daemon(stack, work / case.replace(" ", "-"), folder, root)
        daemons = {NONE: daemons[BASE], **daemons}
        compat = compat_check(daemons)
        cases = list(daemons)

        def run(case: str) -> float:
            return daemons[case].start([] if case == NONE else [DEVICE], ["/bin/true"])

        for case in cases:  # warm-up
            run(case)
        times: dict[str, list[float]] = {case: [] for case in cases}
        for i in range(runs):
            for case in cases if i % 2 == 0 else cases[::-1]:
                times[case].append(run(case))
    return times, compat


def summarize(times: dict[str, list[float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for case, samples in times.items():
        ms = [t * 1e3 for t in samples]
        line = f"  {case:13s} median {statistics.median(ms):6.1f} ms  min {min(ms):6.1f} ms"
        if case != NONE:
            out[f"{case} adds ms"] = statistics.median(paired(times, case, NONE))
            line += f"  adds {out[f'{case} adds ms']:+6.1f} ms (paired median)"
        print(line)
    if NVIDIA in times:
        nv, ours = paired(times, NVIDIA, NONE), paired(times, BASE, NONE)
        ratios = [o / n for o, n in zip(ours, nv, strict=True) if n > 0]
        out["ratio_of_medians"] = statistics.median(ours) / statistics.median(nv)
        out["median_ratio"] = statistics.median(ratios) if ratios else float("nan")
        verdict = "within" if out["median_ratio"] <= 0.5 else "over"
        print(f"  gpuctk's default spec adds {out['median_ratio']:.2f} of what NVIDIA's adds "
              f"(per-round median; ratio of medians {out['ratio_of_medians']:.2f}): "
              f"{verdict} half")  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--json", metavar="PATH", help="also write the results here")
    parser.add_argument(
        "--nvidia-ctk-bin",
        metavar="DIR",
        type=Path,
        help="also time the NVIDIA Container Toolkit's spec, written by DIR's nvidia-ctk (DIR "
        "holds nvidia-ctk and nvidia-cdi-hook: an install's /usr/bin, or a build of your own)",
    )
    args = parser.parse_args()
    reason = sidengines.available("containerd2")
    if reason:
        raise SystemExit(f"containerd 2.1 cannot run here: {reason}")
    nvidia = check_bin(args.nvidia_ctk_bin) if args.nvidia_ctk_bin else None
    bindir = installed_bin()
    work = Path(tempfile.mkdtemp(prefix="gpuctk-bench-ctrd2-"))
    try:
        times, compat = measure(work, bindir, args.runs, nvidia)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"containerd 2.1 CRI create+start+exit+remove of /bin/true, {args.runs} alternating "
          "rounds (1 simulated L4)")  # fmt: skip
    found = summarize(times)
    if args.json:
        doc = {"runs": args.runs, "compat": compat, **found,
               "median_ms": {c: statistics.median(t) * 1e3 for c, t in times.items()}}  # fmt: skip
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
