"""Docker 28's dockerd loads daemon.json after configure --set-as-default and after unconfigure
(`dockerd --validate`), and unconfigure gives the admin's `default-runtime` back."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from fixtures import sidengines
from fixtures.containerd import gpuctk, snapshot

pytestmark = [pytest.mark.integration]


def validate(dockerd: Path, config: Path) -> None:
    argv = [str(dockerd), "--validate", "--userland-proxy=false", "--config-file", str(config)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and "configuration OK" in done.stdout + done.stderr, done.stderr


def test_dockerd_reads_both_and_the_admin_default_comes_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dockerd = sidengines.require("docker") / "usr/sbin/dockerd"
    config = tmp_path / "daemon.json"
    config.write_text('{\n  "default-runtime": "runc",\n  "log-driver": "journald"\n}\n')
    before = snapshot(tmp_path)
    validate(dockerd, config)
    base = ["runtime", "configure", "--runtime", "docker", "--config", str(config)]
    assert gpuctk(capsys, *base, "--set-as-default")[0] == 0
    assert json.loads(config.read_text())["default-runtime"] == "nvidia"
    validate(dockerd, config)
    undo = ["runtime", "unconfigure", "--runtime", "docker", "--config", str(config)]
    assert gpuctk(capsys, *undo)[0] == 0
    assert snapshot(tmp_path) == before
    validate(dockerd, config)
