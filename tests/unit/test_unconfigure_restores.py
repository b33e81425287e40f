"""`gpuctk runtime unconfigure` puts back exactly what was there.

Docker: the values configure replaced (the admin's own `"default-runtime": "runc"` after
--set-as-default, a same-named runtime, `features.cdi`) come back, and the backup goes, also
when the admin changed daemon.json meanwhile. podman: the folders configure --create made go
with the hooks file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.containerd import gpuctk, snapshot

ADMIN = """{
  "default-runtime": "runc",
  "runtimes": {"nvidia": {"path": "/usr/bin/nvidia-container-runtime"}},
  "features": {"cdi": false},
  "log-driver": "journald"
}
"""


def docker(root: Path, verb: str, *extra: str) -> list[str]:
    return ["runtime", verb, "--runtime", "docker", "--config", str(root / "daemon.json"), *extra]


def test_docker_set_as_default_then_unconfigure_gives_the_file_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "daemon.json").write_text(ADMIN)
    before = snapshot(tmp_path)
    argv = docker(tmp_path, "configure", "--set-as-default", "--cdi-enabled")
    assert gpuctk(capsys, *argv)[0] == 0
    data = json.loads((tmp_path / "daemon.json").read_text())
    assert data["default-runtime"] == "nvidia" and data["features"]["cdi"] is True
    assert gpuctk(capsys, *docker(tmp_path, "unconfigure"))[0] == 0
    assert snapshot(tmp_path) == before  # the bytes, and no backup left


def test_docker_unconfigure_after_the_admin_edited_keeps_the_edit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "daemon.json"
    path.write_text(ADMIN)
    assert gpuctk(capsys, *docker(tmp_path, "configure", "--set-as-default"))[0] == 0
    data = json.loads(path.read_text())
    data["debug"] = True  # the admin's change after configure
    path.write_text(json.dumps(data))
    assert gpuctk(capsys, *docker(tmp_path, "unconfigure"))[0] == 0
    assert json.loads(path.read_text()) == {**json.loads(ADMIN), "debug": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["daemon.json"]  # backup gone


def test_podman_unconfigure_removes_the_folders_configure_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hooks = tmp_path / "etc/containers/oci/hooks.d/oci-gpuctk-hook.json"
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/keep").write_text("admin's\n")
    before = snapshot(tmp_path)
    argv = ["runtime", "configure", "--runtime", "podman", "--drop-in", str(hooks), "--create"]
    assert gpuctk(capsys, *argv)[0] == 0
    assert json.loads(hooks.read_text())["stages"]
    assert gpuctk(capsys, *argv)[0] == 0  # a re-run keeps the record of what the first made
    assert [p.name for p in hooks.parent.iterdir() if p.suffix == ".json"] == [hooks.name]
    unconfigure = ["runtime", "unconfigure", "--runtime", "podman", "--drop-in", str(hooks)]
    assert gpuctk(capsys, *unconfigure)[0] == 0
    assert snapshot(tmp_path) == before  # containers/, oci/, hooks.d/ gone; etc/ stays


def test_podman_unconfigure_keeps_a_made_folder_someone_else_uses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hooks = tmp_path / "hooks.d/oci-gpuctk-hook.json"
    argv = ["runtime", "configure", "--runtime", "podman", "--drop-in", str(hooks), "--create"]
    assert gpuctk(capsys, *argv)[0] == 0
    (tmp_path / "hooks.d/other.json").write_text("{}\n")
    unconfigure = ["runtime", "unconfigure", "--runtime", "podman", "--drop-in", str(hooks)]
    assert gpuctk(capsys, *unconfigure)[0] == 0
    assert sorted(p.name for p in (tmp_path / "hooks.d").iterdir()) == ["other.json"]
