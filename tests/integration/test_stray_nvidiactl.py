"""README's first command, and a sample of the suite, where /dev holds only a stray nvidiactl.

A GPU workstation, or a node with the driver and fewer GPUs than a profile describes, has
/dev/nvidiactl and not the nodes of an embedded machine. `--simulate` must describe the
profile's machine whatever this host's /dev holds. Each command here runs through
`tests/fixtures/stray_nvidiactl.sh`: a private mount namespace whose /dev is a fresh tmpfs
holding null, zero, full, random, urandom, tty, fd, std*, shm and nvidiactl (195:255), no
nvidia<N>. The host's /dev is never touched.

The sample is the unit test files that run `gpuctk cdi generate --simulate` and check the
spec it writes; each fails there when the simulated path reads the host's /dev. The inner
pytest run sets GPUCTK_STRAY_NVIDIACTL_INNER, and this file skips under it.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
STRAY = REPO / "tests" / "fixtures" / "stray_nvidiactl.sh"
VENV_BIN = Path(sys.executable).parent
GPUCTK = str(VENV_BIN / "gpuctk")
INNER = "GPUCTK_STRAY_NVIDIACTL_INNER"
SAMPLE = [
    "tests/unit/test_simulate_manifest.py",
    "tests/unit/test_cdi_schema.py",
    "tests/unit/test_newcomer.py",
    "tests/unit/test_yamlout.py",
    "tests/unit/test_library_mode.py",
    "tests/unit/test_cdi_validate.py",
    "tests/unit/test_generate_foreign_spec.py",
]


def _unshare_problem() -> str | None:
    if os.environ.get(INNER):
        return f"runs the suite itself: skipped inside that run ({INNER} is set)"
    if os.geteuid() != 0:
        return "needs root (a private mount namespace with a tmpfs on /dev)"
    if shutil.which("unshare") is None:
        return "needs unshare (util-linux)"
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "true"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if probe.returncode != 0:
        return f"unshare --mount cannot run here: {probe.stderr.strip()}"
    return None


pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif((why := _unshare_problem()) is not None, reason=why or ""),
]


def stray(argv: list[str], cwd: Path, env: dict[str, str] | None = None,
          timeout: int = 120) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run(
        ["sh", str(STRAY), *argv],
        capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout, check=False,
    )  # fmt: skip


def readme_first_command() -> list[str]:
    """README's first set-up command, split at `&&`: the first line of its first sh block."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"^```sh\n(.*?)^```", text, re.M | re.S)
    assert block, "README.md has no sh block"
    line = block.group(1).splitlines()[0].split("#", 1)[0]
    return [part.strip() for part in line.split("&&")]


def test_readme_first_command_sees_the_profile_not_the_hosts_dev(tmp_path: Path) -> None:
    steps = readme_first_command()
    # The set-up steps are the checkout's own .venv, already built (the suite runs in it);
    # the rest runs as README states it, with .venv/ the venv running this test.
    setup = ["python3 -m venv .venv", ".venv/bin/pip install -q ."]
    assert steps[: len(setup)] == setup, steps
    rest = [re.sub(r"^\.venv/bin/", f"{VENV_BIN}/", step) for step in steps[len(setup) :]]
    assert rest and all(shlex.split(step)[0] == GPUCTK for step in rest), steps
    done = stray(["sh", "-c", " && ".join(rest)], cwd=REPO)
    assert done.returncode == 0, done.stderr
    spec = yaml.safe_load(done.stdout)
    gpus = sorted(d["name"] for d in spec["devices"] if d["name"].isdigit())
    assert gpus == [str(i) for i in range(8)], spec["devices"]
    nodes = {n["path"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]}
    assert nodes >= {f"/dev/nvidia{i}" for i in range(8)}, nodes
    out = tmp_path / "nvidia.yaml"
    out.write_text(done.stdout)
    check = stray([GPUCTK, "cdi", "validate", str(out)], cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_sample_of_the_suite_passes() -> None:
    env = {**os.environ, INNER: "1"}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SAMPLE]
    done = stray(argv, cwd=REPO, env=env, timeout=900)
    summary = done.stdout.strip().splitlines()[-1:] or [done.stderr]
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert re.search(r"\b\d+ passed\b", summary[0]) and "failed" not in summary[0], summary
