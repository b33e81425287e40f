"""The product's modules, as a newcomer reads them: none over MAX_LINES lines (one that grows past
it holds more than one concern and is split), and no timings in their text (figures measured on
one machine go stale; they live in docs/benchmarks.md beside the command that measures them).
The folders are pyproject.toml's package-dir (tests/fixtures/layout)."""

from __future__ import annotations

import re
from pathlib import Path

from fixtures.layout import REPO, package_dirs

MAX_LINES = 400
TIMING = re.compile(r"~?\b\d+(\.\d+)? ?(ms|µs|us)\b")


def modules() -> list[Path]:
    found = sorted({p for f in package_dirs().values() for p in f.rglob("*.py")})
    assert len(found) > 50  # the walk found the modules
    return found


def test_no_module_is_over_the_limit() -> None:
    sizes = {path: len(path.read_text().splitlines()) for path in modules()}
    over = {str(p.relative_to(REPO)): n for p, n in sizes.items() if n > MAX_LINES}
    assert not over, f"split these modules (at most {MAX_LINES} lines): {over}"


def test_no_timings_in_module_text() -> None:
    found = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()[:80]}"
        for path in modules()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if TIMING.search(line)
    ]
    assert not found, "timings belong in docs/benchmarks.md:\n" + "\n".join(found)
