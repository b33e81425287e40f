"""packaging/deb/prerm on `dpkg -r`: gpuctk leaves the engines it was configured for before its
binaries go, run against a fake root through DPKG_ROOT.

A containerd drop-in (with --set-as-default) and a Docker daemon.json edit are undone exactly;
an upgrade touches nothing; an unconfigure that fails refuses the removal (exit 1) with the
command to run, and changes nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.containerd import SYSTEMD_SANDBOX, gpuctk, snapshot

PRERM = Path(__file__).resolve().parents[2] / "packaging" / "deb" / "prerm"
GPUCTK = Path(sys.executable).with_name("gpuctk")


def fake_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    launcher = root / "usr/bin/gpuctk"
    launcher.write_text(f'#!/bin/sh\nexec {GPUCTK} "$@"\n')
    launcher.chmod(0o755)
    (root / "etc/containerd/conf.d").mkdir(parents=True)
    (root / "etc/containerd/config.toml").write_text(SYSTEMD_SANDBOX)
    (root / "etc/docker").mkdir(parents=True)
    (root / "etc/docker/daemon.json").write_text('{"default-runtime": "runc"}\n')
    return root


def configure(capsys: pytest.CaptureFixture[str], root: Path) -> None:
    ctd = root / "etc/containerd"
    argv = ["runtime", "configure", "--config-source", "file", "--set-as-default"]
    argv += ["--config", str(ctd / "config.toml"), "--drop-in", str(ctd / "conf.d/99-gpuctk.toml")]
    assert gpuctk(capsys, *argv)[0] == 0
    docker = ["runtime", "configure", "--runtime", "docker", "--set-as-default"]
    assert gpuctk(capsys, *docker, "--config", str(root / "etc/docker/daemon.json"))[0] == 0


def prerm(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DPKG_ROOT": str(root)}
    return subprocess.run(
        ["sh", str(PRERM), *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_remove_unconfigures_every_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = fake_root(tmp_path)
    before = snapshot(root)
    configure(capsys, root)
    assert snapshot(root) != before
    done = prerm(root, "remove")
    assert done.returncode == 0, done.stderr
    assert snapshot(root) == before  # drop-in, imports line, daemon.json and backup
    assert "systemctl restart containerd" in done.stdout
    assert "systemctl restart docker" in done.stdout


def test_upgrade_touches_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = fake_root(tmp_path)
    configure(capsys, root)
    configured = snapshot(root)
    done = prerm(root, "upgrade", "1.0")
    assert done.returncode == 0, done.stderr
    assert snapshot(root) == configured


def test_a_failed_unconfigure_refuses_removal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = fake_root(tmp_path)
    configure(capsys, root)
    main = root / "etc/containerd/config.toml"
    main.write_text(main.read_text() + "[broken\n")
    configured = snapshot(root)
    done = prerm(root, "remove")
    assert done.returncode == 1
    assert "removal refused" in done.stderr
    assert "gpuctk runtime unconfigure --runtime containerd" in done.stderr
    assert snapshot(root) == configured
