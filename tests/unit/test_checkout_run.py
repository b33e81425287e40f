"""`python -m gpuctk ...` in the checkout's root, where the source folder gpuctk/ shadows the
installed package: the other packages (gpuctk.hook, gpuctk.containerd, ...) are found in their
own folders as pyproject.toml's package-dir maps them (gpuctk/__init__.py)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# -S: no site, so no editable-install finder; the venv's libraries (click, ...) by hand, and
# the checkout's root first on the path, as `python -m` from the root has it
PROLOGUE = f"""
import sys
sys.path[:0] = ["", {sysconfig.get_paths()["purelib"]!r}]
"""


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-S", "-c", PROLOGUE + code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_every_package_imports_from_the_checkout_root() -> None:
    done = run(
        "import gpuctk.hook.verbs.hook_main, gpuctk.containerd.cli, gpuctk.cdi.node.facts\n"
        "print(gpuctk.__file__, gpuctk.hook.verbs.hook_main.__file__,"
        " gpuctk.containerd.cli.__file__)"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        str(ROOT / "gpuctk/__init__.py"),
        str(ROOT / "hook/verbs/hook_main.py"),
        str(ROOT / "containerd-config/cli.py"),
    ]


def test_python_dash_m_gpuctk_runs_the_command() -> None:
    done = run("import runpy; sys.argv = ['gpuctk', '--version']; runpy.run_module('gpuctk')")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "gpuctk version 0.1.0\n"
    done = run(
        "import runpy; sys.argv = ['gpuctk', 'cdi', 'generate', '--simulate', 'l4'];"
        "runpy.run_module('gpuctk', run_name='__main__')"
    )
    assert done.returncode == 0, done.stderr
    assert "nvidia.com/gpu" in done.stdout


def test_an_unknown_subpackage_is_still_an_import_error() -> None:
    done = run("import gpuctk.nosuchthing")
    assert done.returncode == 1 and "No module named 'gpuctk.nosuchthing'" in done.stderr
