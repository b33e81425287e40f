"""A time-bounded atheris run over the ld.so.cache and ELF SONAME readers (fuzz_readers.py).

About 20 s in all: the harness runs in a subprocess with libFuzzer's -max_total_time and
-atheris_runs bounds, from a seed corpus of the host's ld.so.cache and small ELF files. The
run must end without a crash (an exception other than the documented ValueError, or an
assertion in the harness): libFuzzer exits non-zero and writes a crash-* file on one.
GPUCTK_FUZZ_SECONDS changes the time bound (a longer run by hand: see the harness docstring).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).with_name("fuzz_readers.py")
SECONDS = int(os.environ.get("GPUCTK_FUZZ_SECONDS", "18"))


def test_fuzz_ld_cache_and_elf_readers(tmp_path: Path) -> None:
    pytest.importorskip("atheris")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    seed = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(HARNESS.parent)!r});"
            f"import fuzz_readers; print(fuzz_readers.seeds({str(corpus)!r}))"]  # fmt: skip
    made = subprocess.run(seed, capture_output=True, text=True, check=True, timeout=60)
    assert int(made.stdout) > 0
    done = subprocess.run(
        [
            sys.executable,
            str(HARNESS),
            f"-max_total_time={SECONDS}",
            "-atheris_runs=2000000",
            "-max_len=65536",
            "-rss_limit_mb=1024",
            "-timeout=10",
            str(corpus),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=SECONDS + 120,
        check=False,
    )
    crashes = sorted(p.name for p in tmp_path.glob("crash-*")) + sorted(
        p.name for p in tmp_path.glob("timeout-*")
    )
    assert done.returncode == 0 and not crashes, done.stderr[-4000:]
    assert "Done" in done.stderr or "INFO:" in done.stderr
