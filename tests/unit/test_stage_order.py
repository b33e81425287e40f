"""`cdi generate --library-mode folder` builds the spec before it stages the driver: a spec
that fails (a missing device node, an unknown --device-id) leaves no stage behind, on a node
where a stage is a copy of hundreds of MiB."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

GPUCTK = str(Path(sys.executable).with_name("gpuctk"))


def generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GPUCTK, "cdi", "generate", "--simulate", "l4", *args],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (("--dev-root", "EMPTY"), "device node"),
        (("--device-id", "7"), "7"),
    ],
)
def test_a_failing_spec_stages_nothing(
    tmp_path: Path, driver_root: Path, extra: tuple[str, ...], words: str
) -> None:
    (tmp_path / "empty").mkdir()
    staging, out = tmp_path / "staging", tmp_path / "nvidia.json"
    extra = tuple(str(tmp_path / "empty") if e == "EMPTY" else e for e in extra)
    p = generate("--driver-root", str(driver_root), "--library-mode", "folder",
                 "--staging-dir", str(staging), "-o", str(out), *extra)  # fmt: skip
    assert p.returncode != 0 and words in p.stderr, p.stderr
    assert "staged" not in p.stderr
    assert not out.exists()
    assert not staging.exists() or list(staging.iterdir()) == []
    # the same flags without the fault stage the driver and name that stage in the spec
    good = generate("--driver-root", str(driver_root), "--library-mode", "folder",
                    "--staging-dir", str(staging), "-o", str(out))  # fmt: skip
    assert good.returncode == 0, good.stderr
    (stage,) = [p for p in staging.iterdir() if not p.name.startswith(".")]
    assert str(stage) in out.read_text()


def test_auto_falls_back_to_hook_mode_when_no_stage_can_be_made(
    tmp_path: Path, driver_root: Path
) -> None:
    """--library-mode auto (the default) over real driver files stages them; where the staging
    dir cannot be used, a note and the hook-mode spec, built again without the stage."""
    bad = tmp_path / "staging"
    bad.mkdir(mode=0o777)
    bad.chmod(0o777)  # others may write it: refused for a stage every container mounts
    out = tmp_path / "nvidia.json"
    p = generate("--driver-root", str(driver_root), "--staging-dir", str(bad), "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert "writing a hook-mode spec (--library-mode hook)" in p.stderr
    text = out.read_text()
    assert str(bad) not in text and "/usr/local/nvidia" not in text
    assert "libcuda.so" in text  # the libraries as mounts of their own
    assert list(bad.iterdir()) == []
