"""bench/generate.py --node: runs with nothing but the product (no test fixture, no pytest),
and leaves no trace: its specs and folder-mode stages go into a temporary folder it removes,
never into /var/lib/gpuctk. No timing is asserted: only that it runs and cleans up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.devroot import make_node_roots
from fixtures.fake_nvml import write_fake_profile
from fixtures.layout import REPO

from gpuctk.cdi.node.profile import load_profile

STATE = Path("/var/lib/gpuctk")
GPUCTK = Path(sys.executable).parent / "gpuctk"
# the bench as an operator's node runs it: any `import pytest` fails
NO_PYTEST = (
    "import runpy, sys; sys.modules['pytest'] = None; sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def tree(top: Path) -> dict[str, tuple[int, int]]:
    found = {}
    for folder, dirs, files in os.walk(top):
        for name in dirs + files:
            st = os.lstat(os.path.join(folder, name))
            found[os.path.join(folder, name)] = (st.st_ino, st.st_mtime_ns)
    return found


def test_node_mode_needs_no_pytest_and_leaves_no_stage(
    tmp_path: Path, driver_root: Path, fake_nvml_lib: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the device nodes of the node roots need mknod (root)")
    roots = make_node_roots(tmp_path / "node", load_profile("h100-8"))
    profile = write_fake_profile("h100-8", tmp_path / "h100-8.txt")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    before = tree(STATE)
    flags = [
        "--nvml-library", str(fake_nvml_lib), "--driver-root", str(driver_root),
        "--dev-root", str(roots.dev_root), "--proc-root", str(roots.proc_root),
        "--sys-root", str(roots.sys_root), "--library-mode", "folder",
    ]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", NO_PYTEST, str(REPO / "bench" / "generate.py"), "--node",
         "--gpuctk", str(GPUCTK), "--runs", "1", "--", *flags],
        env=dict(os.environ, FAKE_NVML_PROFILE=str(profile), TMPDIR=str(scratch)),
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 alternating runs each (this node, its NVML)" in proc.stdout
    assert "this node" in proc.stdout.splitlines()[1], proc.stdout
    assert tree(STATE) == before  # no stage, no spec of the node's touched
    assert list(scratch.iterdir()) == []  # its own folder, stage included, removed
