"""What every benchmark here shares: the test fixtures on sys.path, the cache, and timing
Python the way an installed package runs (with its .pyc files)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("GPUCTK_TEST_CACHE", REPO / "tests" / ".cache"))
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))


def installed_like_python() -> None:
    """Installed packages carry .pyc files; this environment may forbid writing them
    (PYTHONDONTWRITEBYTECODE), which would time the compiler instead of gpuctk."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "gpuctk", "cdi", "hook", "containerd-config"],
        cwd=REPO,
        check=True,
    )
