"""Shared test set-up. Each fixture module under tests/fixtures/ is a pytest plugin.

Fixture modules (one owner each):
    fixtures.fake_nvml   -- fake libnvidia-ml.so.1 built with gcc, profile files for it
    fixtures.driver_root -- driver root from Debian's NVIDIA 535 packages
    fixtures.devroot     -- dev/proc/sys roots with mknod'ed device nodes and mig-minors
    fixtures.images      -- small container images (glibc, musl, ...) and fresh overlays

Here: `installed_bin` (session): a folder any user may enter holding gpuctk, gpuctk-runtime and
gpuctk-hook launchers of the packaged, non-editable venv (fixtures.appvenv), for the tests
that must run what an operator runs, not the editable tree.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SHARED = REPO.parent / "shared"
CACHE = Path(os.environ.get("GPUCTK_TEST_CACHE", TESTS / ".cache"))

if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

# gpuctk-runtime keeps its runtime memo and spec cache in $GPUCTK_STATE_DIR (default
# /run/gpuctk): the tests' shims keep theirs in a private folder, never the host's.
if "GPUCTK_STATE_DIR" not in os.environ:
    _STATE_BASE = tempfile.mkdtemp(prefix="gpuctk-test-state-")
    os.environ["GPUCTK_STATE_DIR"] = os.path.join(_STATE_BASE, "state")
    atexit.register(shutil.rmtree, _STATE_BASE, True)  # one per pytest process: never kept

# The device-plugin tests run gRPC servers in this process, and the hook's tests fork it
# afterwards (hook/verbs/namespaces.py): gRPC's fork handlers can then leave os.fork() waiting
# on a lock for ever. Every fork here is followed by an exec or an exit, the case gRPC's
# GRPC_ENABLE_FORK_SUPPORT=0 is for (read when grpc is first imported).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

pytest_plugins = [
    "fixtures.fake_nvml",
    "fixtures.driver_root",
    "fixtures.devroot",
    "fixtures.images",
]


@pytest.fixture(scope="session")
def installed_bin() -> Iterator[Path]:
    from fixtures.appvenv import have_system_python, installed_launchers

    if not have_system_python():
        pytest.skip("/usr/bin/python3 is needed for the packaged venv")
    bindir = Path(tempfile.mkdtemp(prefix="gpuctk-bin-"))
    bindir.chmod(0o755)  # the tests that run a launcher as another user
    try:
        yield installed_launchers(bindir)
    finally:
        shutil.rmtree(bindir)
