"""Fixtures of the adversarial suite (defined in secworld.py, which the tests import by name:
a module called `conftest` would be ambiguous beside tests/conftest.py)."""

from secworld import bindir, libmarker, world

__all__ = ["bindir", "libmarker", "world"]
