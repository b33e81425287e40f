"""docs/features.md: every test it names as `path::function` exists, so the table cannot point
at a test that is gone or renamed."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FEATURES = ROOT / "docs" / "features.md"
NAMED = re.compile(r"`(tests/[\w/.-]+\.py)::(\w+)`")


def test_every_named_test_exists() -> None:
    named = NAMED.findall(FEATURES.read_text())
    assert len(named) >= 20, named
    missing = []
    for path, name in named:
        source = ROOT / path
        text = source.read_text() if source.is_file() else ""
        if not re.search(rf"^def {name}\(", text, re.MULTILINE):
            missing.append(f"{path}::{name}")
    assert not missing, missing


def test_every_row_names_a_test_or_says_not_built() -> None:
    rows = [ln for ln in FEATURES.read_text().splitlines() if ln.startswith("| ")][2:]
    assert len(rows) >= 15
    for row in rows:
        shown_by = row.rstrip(" |").rsplit(" | ", 1)[1]
        assert shown_by == "not built" or shown_by.startswith("`tests/"), row
