"""`gpuctk install` / `uninstall`: host-root path resolution and the refusals that change nothing.

The full install (copy, chrooted generation and containerd configuration) is proved in
tests/integration/test_install_host.py; these are the checks made before anything is written.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fixtures.containerd import gpuctk, snapshot

from gpuctk.install import host as install_host
from gpuctk.install.host import resolve


def test_resolve_keeps_absolute_links_inside_the_host(tmp_path: Path) -> None:
    host = tmp_path / "host"
    (host / "run").mkdir(parents=True)
    (host / "var").mkdir()
    (host / "var" / "run").symlink_to("/run")  # Debian's /var/run
    (host / "etc").mkdir()
    (host / "etc" / "up").symlink_to("../../../..")  # cannot climb out of the root
    assert resolve(str(host), "/var/run/cdi/nvidia.yaml") == str(host / "run/cdi/nvidia.yaml")
    assert resolve(str(host), "/etc/up/x") == str(host / "x")
    assert resolve(str(host), "/a/../../b") == str(host / "b")
    (host / "loop").symlink_to("/loop")
    with pytest.raises(install_host.InputError, match="too many levels"):
        resolve(str(host), "/loop/x")


def test_makedirs_records_only_what_it_created(tmp_path: Path) -> None:
    host = tmp_path / "host"
    (host / "run").mkdir(parents=True)
    (host / "var").mkdir()
    (host / "var" / "run").symlink_to("/run")
    assert install_host.makedirs(str(host), "/var/run/cdi") == ["/var/run/cdi"]
    assert (host / "run" / "cdi").is_dir()
    assert install_host.makedirs(str(host), "/var/run/cdi") == []


def _venv_like(tmp_path: Path, python: str) -> Path:
    source = tmp_path / "app"
    (source / "bin").mkdir(parents=True)
    (source / "bin" / "python3").symlink_to(python)
    return source


def test_venv_interpreter_missing_on_the_host_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = tmp_path / "host"
    host.mkdir()
    source = _venv_like(tmp_path, "/opt/python-only-in-the-image/bin/python3")
    code, _, err = gpuctk(capsys, "install", "--host-root", str(host), "--source", str(source))
    assert code == 4
    assert "the host does not have" in err and "self-contained Python" in err
    assert snapshot(host) == {}


def test_interpreter_found_on_the_host(tmp_path: Path) -> None:
    host = tmp_path / "host"
    (host / "usr" / "bin").mkdir(parents=True)
    (host / "usr" / "bin" / "python3.11").write_text("")
    source = _venv_like(tmp_path, "/usr/bin/python3.11")
    assert install_host.interpreter_problem(str(source), str(host)) is None
    (tmp_path / "empty").mkdir()
    assert "has no bin/python3" in str(
        install_host.interpreter_problem(str(tmp_path / "empty"), str(host))
    )


def test_foreign_launcher_is_not_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = tmp_path / "host"
    (host / "usr" / "bin").mkdir(parents=True)
    (host / "usr" / "bin" / "python3").write_text("")
    (host / "usr" / "local" / "bin").mkdir(parents=True)
    (host / "usr" / "local" / "bin" / "gpuctk-runtime").write_text("#!/bin/sh\nexec runc\n")
    source = _venv_like(tmp_path, "/usr/bin/python3")
    before = snapshot(host)
    code, _, err = gpuctk(capsys, "install", "--host-root", str(host), "--source", str(source))
    assert code == 5 and "were not written by gpuctk" in err
    assert snapshot(host) == before
    # a gpuctk launcher at that path is ours to replace
    (host / "usr/local/bin/gpuctk-runtime").write_text("#!/x -I\n# gpuctk launcher: ...\n")
    assert install_host.foreign_launchers(str(host), "/usr/local/bin") == []


def test_foreign_prefix_is_not_replaced(tmp_path: Path) -> None:
    host = tmp_path / "host"
    (host / "usr" / "local" / "gpuctk").mkdir(parents=True)
    (host / "usr" / "local" / "gpuctk" / "admin-file").write_text("keep")
    source = _venv_like(tmp_path, "/usr/bin/python3")
    with pytest.raises(install_host.OutputError, match="not installed by gpuctk"):
        install_host.copy_prefix(str(source), str(host), "/usr/local/gpuctk")
    assert (host / "usr/local/gpuctk/admin-file").read_text() == "keep"


def test_copy_is_skipped_when_identical_and_replaced_when_not(tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    source = _venv_like(tmp_path, "/usr/bin/python3")
    (source / "lib.py").write_text("one")
    assert install_host.copy_prefix(str(source), str(host), "/usr/local/gpuctk") == (
        True,
        ["/usr", "/usr/local"],
    )
    assert install_host.copy_prefix(str(source), str(host), "/usr/local/gpuctk") == (False, [])
    (source / "lib.py").write_text("two")
    assert install_host.copy_prefix(str(source), str(host), "/usr/local/gpuctk")[0] is True
    assert (host / "usr/local/gpuctk/lib.py").read_text() == "two"
    assert os.readlink(host / "usr/local/gpuctk/bin/python3") == "/usr/bin/python3"
    assert sorted(os.listdir(host / "usr/local")) == ["gpuctk"]  # no staging or old copies left


def test_uninstall_without_record_does_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = gpuctk(capsys, "uninstall", "--host-root", str(tmp_path))
    assert code == 0 and "nothing to uninstall" in out
    assert snapshot(tmp_path) == {}


def test_relative_paths_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = gpuctk(capsys, "install", "--host-root", str(tmp_path), "--prefix", "opt/x")
    assert code == 2 and "must be an absolute path" in err
    code, _, err = gpuctk(capsys, "install", "--host-root", str(tmp_path / "missing"))
    assert code == 4 and "not a folder" in err
