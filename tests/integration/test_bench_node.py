"""bench/node.py, the one script for a node with a real GPU, kept runnable where there is none:
on a simulated node it writes the default install's spec, proves the path serves an image
scrubbed of the driver (what Triton reads in `ldconfig -p`), then times it; and a check that
fails stops it before anything is timed. No timing is asserted."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration
TIMEOUT = 900  # only to catch a hang


def node(*args: str) -> subprocess.CompletedProcess[str]:
    if os.geteuid() != 0 or shutil.which("runc") is None:
        pytest.skip("needs root and runc")
    argv = [sys.executable, "bench/node.py", "--simulate", "h100-8", *args]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT,
                          check=False)  # fmt: skip


def test_the_proof_then_the_times() -> None:
    done = node("--checks", "cache", "--runs", "1", "--rounds", "1")
    assert done.returncode == 0, done.stderr
    assert (
        "proof through gpuctk-runtime: cache: libcuda.so.1 libcuda.so | CHECKS-DONE" in done.stdout
    )
    assert "one container, create+start+delete" in done.stdout
    assert "32 containers at once, create+start+delete" in done.stdout  # bench/burst's burst()
    assert "CPU seconds of the runtime's processes" in done.stdout
    assert not list(Path("/tmp").glob("gpuctk-node-*")), "its work folder is left behind"


def test_a_failed_check_stops_the_run_before_any_timing() -> None:
    done = node("--checks", "smi", "--runs", "1", "--rounds", "0")  # no GPU behind the fake
    assert done.returncode != 0
    assert "gpuctk-runtime: the proof failed (smi)" in done.stderr, done.stderr
    assert "create+start+delete" not in done.stdout
