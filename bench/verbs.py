"""Benchmark: what gpuctk-runtime's front costs on the calls that never reach Python.

    .venv/bin/python bench/verbs.py [--calls 200] [--rounds 5] [--against REV]

containerd runs gpuctk-runtime for every verb of every container (start, state, kill, delete,
...), and most creates on a node whose default runtime it is ask for no GPU. The front sends
those calls straight to the low-level runtime in its memo. Here that runtime is /usr/bin/true,
so what is timed is the front alone, as installed (bench/common.py installed_bin: the deb's
launchers), each case --calls calls in a row, the cases alternating round by round:

- true                     /usr/bin/true itself: the floor (a process start);
- state                    `gpuctk-runtime state c1`;
- create, no GPU asked     `gpuctk-runtime create --bundle B --pid-file P c1` on a config.json
                           as engines write it (Go's JSON) that holds no request marker;

and with --against REV the same two through that revision's launchers. Each front is called
once first (its Python writes the memo). Prints the median per call over the rounds, and each
case against this checkout's, paired round by round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from common import installed_bin, installed_bin_at
from fixtures.images import go_json

RUNTIME = "/usr/bin/true"
NO_GPU = {
    "ociVersion": "1.2.0",
    "process": {
        "args": ["sh", "-c", "make && ./run > out.log"],
        "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/"],
        "cwd": "/",
    },
    "root": {"path": "rootfs"},
    "annotations": {"io.kubernetes.cri.container-type": "container"},
}


def calls(argv: list[str], env: dict[str, str], n: int) -> float:
    """Seconds per call of `argv`, run `n` times in a row (posix_spawn, waited for)."""
    start = time.perf_counter()
    for _ in range(n):
        pid = os.posix_spawn(argv[0], argv, env)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{' '.join(argv)}: exit {os.waitstatus_to_exitcode(status)}")
    return (time.perf_counter() - start) / n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per case and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", metavar="REV", help="also time this revision's front")
    args = parser.parse_args()
    fronts = {"": installed_bin() / "gpuctk-runtime"}
    if args.against:
        fronts[f" @{args.against}"] = installed_bin_at(args.against) / "gpuctk-runtime"
    with tempfile.TemporaryDirectory(prefix="gpuctk-verbs-") as tmp:
        work = Path(tmp)
        work.chmod(0o700)
        config = work / "config.toml"
        config.write_text(f'runtimes = ["{RUNTIME}"]\n')
        bundle = work / "bundle"
        bundle.mkdir()
        (bundle / "config.json").write_bytes(go_json(NO_GPU))
        cases: dict[str, tuple[list[str], dict[str, str]]] = {"true": ([RUNTIME], {})}
        for tag, front in fronts.items():
            state = work / f"state{len(cases)}"
            env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "GPUCTK_CONFIG": str(config),
                   "GPUCTK_STATE_DIR": str(state)}  # fmt: skip
            create = [str(front), "create", "--bundle", str(bundle), "--pid-file",
                      str(work / "pid"), "c1"]  # fmt: skip
            cases[f"state{tag}"] = ([str(front), "state", "c1"], env)
            cases[f"create, no GPU asked{tag}"] = (create, env)
            calls([str(front), "state", "c1"], env, 1)  # Python writes the memo
            if not (state / "runtime").is_file():
                raise SystemExit(f"{front}: no memo written in {state}")
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, (argv, env) in cases.items():
                times[name].append(calls(argv, env, args.calls))
    print(f"one call, {args.calls} in a row, {args.rounds} alternating rounds (ms per call)")
    floor = statistics.median(times["true"])
    for name, got in times.items():
        med = statistics.median(got)
        print(f"  {name:36} median {med * 1e3:6.2f} ms  (+{(med - floor) * 1e3:.2f} over true)")
    for name in (n for n in times if "@" in n):
        mine = name.rsplit(" @", 1)[0]
        diff = statistics.median(a - b for a, b in zip(times[mine], times[name], strict=True))
        print(f"  this checkout against {args.against}, {mine}: paired {diff * 1e3:+.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
