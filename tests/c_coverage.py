"""Line coverage of the C that runs as root (hook/cdihook.c, ldcache.c, shimfront.c), by gcov.

    .venv/bin/python tests/c_coverage.py [PYTEST ARGS...]

Builds gpuctk-cdi-hook with the product's flags and --coverage (gpuctk.hook.cbuild.COVERAGE, a
dynamic PIE) into a temp folder, runs the C tests against it (CDIHOOK_BIN: tests/unit/
test_cdihook.py, test_cdihook_ldcache.py, test_shimfront.py, as root for the whole set), and
prints gcov's figure for each file and for all three. No threshold: the figure is recorded in
docs/testing.md. The process's exit status is pytest's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = ["tests/unit/test_cdihook.py", "tests/unit/test_cdihook_ldcache.py",
         "tests/unit/test_shimfront.py"]  # fmt: skip
FIGURE = re.compile(r"File '([^']*)'\nLines executed:([\d.]+)% of (\d+)")


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    from gpuctk.hook import cbuild

    with tempfile.TemporaryDirectory(prefix="gpuctk-ccov-") as tmp:
        os.chmod(tmp, 0o755)  # the tests' hooks run as other users too
        exe = cbuild.build(Path(tmp) / cbuild.NAME, cbuild.COVERAGE, static=False)
        env = {**os.environ, "CDIHOOK_BIN": str(exe)}
        # the sanitized cases run another binary: leave them out
        pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        done = subprocess.run([*pytest, "-k", "not sanitized", *TESTS, *argv], cwd=REPO, env=env)
        notes = sorted(Path(tmp).glob("*.gcda"))
        if not notes:
            print("c_coverage: no coverage data written", file=sys.stderr)
            return 1
        report = subprocess.run(
            ["gcov", "-n", "-o", tmp, *map(str, notes)],
            cwd=REPO, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    lines = covered = 0
    for name, percent, total in FIGURE.findall(report):
        if not name.endswith(".c"):
            continue
        n = int(total)
        hit = round(float(percent) * n / 100)
        lines, covered = lines + n, covered + hit
        print(f"{os.path.relpath(name, REPO):20} {float(percent):6.2f}% of {n} lines")
    if lines:
        print(f"{'all':20} {100 * covered / lines:6.2f}% of {lines} lines")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
