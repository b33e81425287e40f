"""gpuctk.install.launchers: what the deb, `gpuctk install` and the benches put on PATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuctk.hook import compiled
from gpuctk.install.launchers import ENTRY_POINTS, FRONT, launcher_text, main, write_launchers

PYVER = f"python{sys.version_info[0]}.{sys.version_info[1]}"
PROBE = """
import sys
def main():
    print(sys.flags.isolated, sys.flags.no_site, "site" in sys.modules)
    return 0
"""


def fake_venv(tmp_path: Path) -> Path:
    """<venv>/bin/python (the real interpreter by a link) and a probe module in its
    <venv>/lib/pythonX.Y/site-packages: enough to see where the launcher looks."""
    venv = tmp_path / "moved venv".replace(" ", "-")
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    site_packages = venv / "lib" / PYVER / "site-packages"
    site_packages.mkdir(parents=True)
    (site_packages / "gpuctk_probe.py").write_text(PROBE)
    return venv


def hostile_env(tmp_path: Path) -> dict[str, str]:
    """PYTHONPATH with a gpuctk_probe and a sitecustomize that leave a marker, PYTHONSTARTUP."""
    evil = tmp_path / "evil"
    evil.mkdir()
    marker = tmp_path / "marker"
    plant = f"open({str(marker)!r}, 'w').close()\n"
    (evil / "gpuctk_probe.py").write_text(plant + PROBE)
    (evil / "sitecustomize.py").write_text(plant)
    (evil / "startup.py").write_text(plant)
    return {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONPATH": str(evil),
        "PYTHONSTARTUP": str(evil / "startup.py"),
        "PYTHONINSPECT": "1",
    }


def test_venv_launcher_runs_isolated_without_site_from_the_venv_it_sits_in(
    tmp_path: Path,
) -> None:
    venv = fake_venv(tmp_path)
    launcher = venv / "bin" / "probe"
    launcher.write_text(launcher_text(str(venv / "bin" / "python"), "gpuctk_probe", "main"))
    launcher.chmod(0o755)
    env = hostile_env(tmp_path)
    out = subprocess.run([str(launcher)], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "1", "False"]  # -I, -S, and site never imported
    assert not (tmp_path / "marker").exists()


def test_outside_a_venv_the_launcher_falls_back_to_site(tmp_path: Path) -> None:
    # the development venv is an editable install: gpuctk is found only through site's .pth
    write_launchers(str(tmp_path))
    env = hostile_env(tmp_path)
    for name in ENTRY_POINTS:
        out = subprocess.run(
            [str(tmp_path / name), "--help"], env=env, capture_output=True, text=True, check=False
        )
        assert out.returncode == 0, out.stderr
        # gpuctk-runtime's own help names the runtime it passes everything else to
        assert ("runc" if name == "gpuctk-runtime" else name) in out.stdout + out.stderr
    assert not (tmp_path / "marker").exists()


def test_launchers_are_executable_and_name_the_interpreter(tmp_path: Path) -> None:
    paths = write_launchers(str(tmp_path), "/opt/gpuctk/bin/python3")
    built = bool(compiled.installed())  # setup.py's gpuctk-cdi-hook, or cbuild's in the venv
    assert sorted(Path(p).name for p in paths) == sorted([*ENTRY_POINTS, *[FRONT] * built])
    for path in paths:
        assert os.stat(path).st_mode & 0o777 == 0o755
        if path.endswith(FRONT):  # the compiled front, copied as built, with the mark
            front = Path(path).read_bytes()
            assert front.startswith(b"\x7fELF") and b"# gpuctk launcher" in front
            continue
        text = Path(path).read_text()
        if path.endswith("gpuctk-runtime"):  # the sh front (tests/unit/test_runtime_front.py)
            assert text.startswith("#!/bin/sh\n")
            assert '\nexec /opt/gpuctk/bin/python3 -IS -c "$pycode"' in text
        else:
            assert text.startswith("#!/opt/gpuctk/bin/python3 -IS\n")
        assert (
            "\n# gpuctk launcher (gpuctk.install.launchers)" in text
        )  # what gpuctk.install.host looks for


@pytest.mark.parametrize("python", ["python3", "/opt/my python/bin/python", "/opt/x'y/python"])
def test_bad_interpreter_paths_are_refused(python: str, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main([str(tmp_path), "--python", python]) == 1
    assert "must be absolute, without spaces or quotes" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("installed", ["", "/usr/bin"])
def test_the_runtime_front_names_the_compiled_create_where_it_will_run(
    tmp_path: Path, installed: str
) -> None:
    if not compiled.installed():
        pytest.skip("gpuctk-cdi-hook not built")
    assert main([str(tmp_path), "--python", "/opt/gpuctk/bin/python3",
                 *(["--installed-in", installed] if installed else [])]) == 0  # fmt: skip
    at = f"{installed or tmp_path}/{FRONT}"
    text = (tmp_path / "gpuctk-runtime").read_text()
    assert f'\texec {at} runtime-front /opt/gpuctk/bin/python3 "$pycode" "$0" "$@"\n' in text
    assert (tmp_path / FRONT).is_file()  # written where the launchers are written
