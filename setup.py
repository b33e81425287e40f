"""Builds the one compiled part, hook/cdihook.c (`gpuctk-cdi-hook`, the spec hook's front; it
includes hook/shimfront.c, the shim's compiled create), with the host's C compiler; everything
else is in pyproject.toml.

The binary goes into the venv's bin/ beside gpuctk-hook (as data: setuptools' build_scripts
would read it as text; an editable install skips data, so tests/run.sh copies it there) and into
the package (gpuctk/hook/gpuctk-cdi-hook), from where gpuctk.hook.launchers copies it beside the
launchers it writes. Without a compiler (or with GPUCTK_NO_FRONT=1) nothing is built and specs name
gpuctk-hook itself: slower container starts, the same result.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "hook" / "cdihook.c"
BINARY = HERE / "hook" / "gpuctk-cdi-hook"
FLAGS = ["-O2", "-Wall", "-Wextra", "-Werror", "-D_FORTIFY_SOURCE=2", "-fstack-protector-strong"]


def build_front() -> list[str]:
    if os.environ.get("GPUCTK_NO_FRONT") == "1" or not SOURCE.is_file():
        return []
    newest = max(p.stat().st_mtime for p in SOURCE.parent.glob("*.c"))  # shimfront.c too
    if BINARY.is_file() and BINARY.stat().st_mtime >= newest:
        return [str(BINARY.relative_to(HERE))]
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        print("gpuctk: no C compiler: gpuctk-cdi-hook not built", file=sys.stderr)
        return []
    tmp = BINARY.with_name(f".{BINARY.name}.{os.getpid()}")
    for link in (["-static"], []):  # static: it runs on any node a venv is copied to
        argv = [cc, *FLAGS, *link, "-o", str(tmp), str(SOURCE)]
        done = subprocess.run(argv, check=False, capture_output=bool(link))
        if done.returncode == 0:
            break
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        print("gpuctk: gpuctk-cdi-hook did not compile: not built", file=sys.stderr)
        return []
    tmp.chmod(0o755)
    tmp.replace(BINARY)
    return [str(BINARY.relative_to(HERE))]


setup(data_files=[("bin", build_front())])  # bin/: the venv's, beside gpuctk-hook
