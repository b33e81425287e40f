"""No module of the product over MAX_LINES lines: a module that grows past it holds more than
one concern and is split (the folders are pyproject.toml's package-dir, tests/fixtures/layout)."""

from __future__ import annotations

from fixtures.layout import REPO, package_dirs

MAX_LINES = 400


def test_no_module_is_over_the_limit() -> None:
    sizes = {
        path: len(path.read_text().splitlines())
        for folder in set(package_dirs().values())
        for path in folder.glob("*.py")
    }
    assert len(sizes) > 50  # the walk found the modules
    over = {str(p.relative_to(REPO)): n for p, n in sizes.items() if n > MAX_LINES}
    assert not over, f"split these modules (at most {MAX_LINES} lines): {over}"
