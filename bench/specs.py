"""Same specs, byte for byte: `gpuctk cdi generate` of this checkout against another revision.

    .venv/bin/python bench/specs.py --against REV

For each embedded profile and each of a set of generate flag sets (library modes, driver
capabilities, JSON, device names), both installs write the spec of the same simulated node
(the Debian driver root, mknod'ed device nodes, proc and sys roots) to standard output; the
outputs, exit statuses and messages are compared (each install stages into a temporary
folder of its own, named alike first). Prints one line per difference and the count; exit status 1
when any differ. For a change meant to keep behaviour (a refactor): run it before landing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from common import CACHE, installed_bin, installed_bin_at
from fixtures.devroot import make_node_roots
from fixtures.driver_root import build_driver_root

from gpuctk.cdi.node.profile import load_profile

PROFILES = ("h100-8", "h100-8-mig7", "a100-mig", "l4")
FLAG_SETS = (
    (),
    ("--format", "json"),
    ("--library-mode", "mounts"),
    ("--library-mode", "folder", "--staging-dir", "{stage}"),
    ("--driver-capabilities", "utility,compute"),
    ("--library-mode", "mounts", "--driver-capabilities", "compute,utility,video"),
    ("--device-name-strategy", "uuid"),
    ("--no-all-device",),
)


def generate(gpuctk: Path, argv: list[str], stage: Path) -> tuple[int, str, str]:
    """(status, stdout, stderr) of one generate, the staging folder's name made neutral. Every
    generate stages into `stage` (the default and auto modes stage too): never into the
    host's /var/lib/gpuctk, where one install's stage would be the other's to find."""
    args = [a.format(stage=stage) for a in argv]
    if "--staging-dir" not in args:
        args += ["--staging-dir", str(stage)]
    done = subprocess.run([str(gpuctk), "cdi", "generate", *args], capture_output=True, text=True)
    return done.returncode, *(t.replace(str(stage), "STAGE") for t in (done.stdout, done.stderr))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, metavar="REV", help="the other revision")
    args = parser.parse_args()
    ours, theirs = installed_bin() / "gpuctk", installed_bin_at(args.against) / "gpuctk"
    driver = build_driver_root(CACHE)
    cases = differing = 0
    for profile in PROFILES:
        with tempfile.TemporaryDirectory() as tmp:
            roots = make_node_roots(Path(tmp) / "node", load_profile(profile))
            node = [
                "--simulate", profile, "--driver-root", str(driver),
                "--dev-root", str(roots.dev_root), "--proc-root", str(roots.proc_root),
                "--sys-root", str(roots.sys_root), "--hook-path", "/usr/bin/gpuctk-hook",
            ]  # fmt: skip
            for flags in FLAG_SETS:
                cases += 1
                a = generate(ours, [*node, *flags], Path(tmp) / "stage-a")
                b = generate(theirs, [*node, *flags], Path(tmp) / "stage-b")
                if a != b:
                    differing += 1
                    print(f"differ: {profile} {' '.join(flags) or '(defaults)'}: status "
                          f"{a[0]} vs {b[0]}, {len(a[1])} vs {len(b[1])} bytes")  # fmt: skip
    print(f"{cases} specs compared against {args.against}: {differing} differ")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
