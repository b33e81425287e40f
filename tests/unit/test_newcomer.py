"""A newcomer's first messages, through the INSTALLED launchers (fixtures.appvenv): each test is
one message that used to mislead (a typo'd config path accepted, a missing driver root shown
as an NVML failure, a simulated spec's fix naming the engines' live folder, an unknown profile
shown as NVML's, a fix saying `pip install`, an empty `cdi list` with no next step, the shim's
log naming itself twice and no container). The other first-hour messages have their own
files: usage errors and helps (test_cli_errors.py), the simulated spec (test_simulate_manifest.py),
`cdi validate` (test_cdi_schema.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fixtures.appvenv import run_installed


def doctor(installed_bin: Path, *args: str) -> tuple[int, dict[str, dict[str, str]]]:
    done = run_installed(installed_bin, "gpuctk", "doctor", *args, "--format", "json")
    assert done.stdout, done.stderr
    checks = {c["id"]: c for c in json.loads(done.stdout)["checks"]}
    return done.returncode, checks


def test_configure_refuses_a_typo_folder(installed_bin: Path, tmp_path: Path) -> None:
    config = tmp_path / "typo" / "dir" / "config.toml"
    done = run_installed(installed_bin, "gpuctk", "runtime", "configure", "--config", str(config))
    assert done.returncode == 2, done.stderr
    first, hint = done.stderr.splitlines()
    assert first.startswith(f"gpuctk: error: --config {config}: folder ") and "--create" in first
    assert hint == "Try 'gpuctk runtime configure --help'."
    assert not (tmp_path / "typo").exists()


def test_doctor_says_the_driver_root_is_missing(installed_bin: Path) -> None:
    _, checks = doctor(installed_bin, "--driver-root", "/nonexistent")
    root = checks["driver.root"]
    assert root["status"] == "failed"
    assert "/nonexistent is not a directory" in json.dumps(root)


def test_doctor_simulate_never_names_a_live_spec_folder(installed_bin: Path) -> None:
    _, checks = doctor(installed_bin, "--simulate", "h100-8")
    fixes = [c.get("fix") or "" for c in checks.values()]
    assert any("--simulate h100-8" in f for f in fixes), fixes
    assert not [f for f in fixes if "/var/run/cdi" in f or "/etc/cdi" in f], fixes


def test_doctor_unknown_profile_is_a_usage_error(installed_bin: Path) -> None:
    done = run_installed(installed_bin, "gpuctk", "doctor", "--simulate", "nope")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("gpuctk: error: unknown machine profile 'nope'")


def test_missing_shim_fix_is_not_pip(installed_bin: Path) -> None:
    _, checks = doctor(installed_bin, "--simulate", "h100-8")
    fix = checks["runtime.shim"].get("fix") or ""
    if checks["runtime.shim"]["status"] == "ok":  # this machine has an installed shim on PATH
        pytest.skip("gpuctk-runtime is on this machine's PATH")
    assert "pip install" not in fix and ("apt install" in fix or "export PATH=" in fix), fix


def test_empty_cdi_list_says_what_to_run(installed_bin: Path, tmp_path: Path) -> None:
    done = run_installed(installed_bin, "gpuctk", "cdi", "list", "--spec-dir", str(tmp_path))
    assert done.returncode == 0 and done.stdout == ""
    assert f"no CDI spec files in {tmp_path}: run gpuctk cdi generate" in done.stderr


def test_shim_log_names_itself_once_and_the_container(installed_bin: Path, tmp_path: Path) -> None:
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    done = run_installed(
        installed_bin,
        "gpuctk",
        "cdi",
        "generate",
        "--simulate",
        "l4",
        "-o",
        str(spec_dir / "n.yaml"),
    )
    assert done.returncode == 0, done.stderr
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    config = {
        "ociVersion": "1.0.2",
        "process": {"args": ["/bin/true"], "cwd": "/", "env": ["NVIDIA_VISIBLE_DEVICES=9"]},
        "root": {"path": "rootfs"},
    }
    (bundle / "config.json").write_text(json.dumps(config))
    log = tmp_path / "gpuctk.log"
    toml = tmp_path / "gpuctk.toml"
    toml.write_text(f'runtimes = ["/bin/true"]\nspec-dirs = ["{spec_dir}"]\nlog-file = "{log}"\n')
    done = run_installed(
        installed_bin, "gpuctk-runtime", "create", "--bundle", str(bundle), "ctr9",
        GPUCTK_CONFIG=str(toml), GPUCTK_STATE_DIR=str(tmp_path / "state"),
    )  # fmt: skip
    assert done.returncode == 1
    assert "gpuctk-runtime: unknown CDI device nvidia.com/gpu=9" in done.stderr
    assert done.stderr.count("gpuctk-runtime: ") == 1, done.stderr
    line = log.read_text().splitlines()[-1]
    assert "gpuctk-runtime: ctr9: unknown CDI device nvidia.com/gpu=9" in line, line
    assert line.count("gpuctk-runtime: ") == 1, line
    assert json.loads((bundle / "config.json").read_text()) == config  # changed nothing
    assert os.listdir(bundle / "rootfs") == []
