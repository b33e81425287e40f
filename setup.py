"""Builds the one compiled part, `gpuctk-cdi-hook` (hook/cdihook.c, the spec hook's front; it
includes hook/shimfront.c, the shim's compiled create), with the host's C compiler through the
one recipe, hook/cbuild.py; everything else is in pyproject.toml.

`build_front`, a step of `build`, compiles it into setuptools' build folder (never the source
tree) and puts it in the package (gpuctk/hook/gpuctk-cdi-hook, from where
gpuctk.install.launchers copies it beside the launchers it writes) and in the data files: the
venv's bin/, beside gpuctk-hook (as data: build_scripts would read it as text). An editable
install has neither (setuptools installs no data for it): tests/run.sh builds it into the venv's
bin/ with the same recipe, where gpuctk.install.launchers also looks. With no compiler,
or a source that does not compile, the build fails with one line saying what to install
(`apt install gcc libc6-dev`): gpuctk does not work without it (the device node guard, for one,
is done by it alone).
"""

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from setuptools import Command, setup
from setuptools.command.build import build

HERE = Path(__file__).resolve().parent


def _cbuild() -> Any:
    """hook/cbuild.py, loaded by path: the package is not importable while it is being built."""
    spec = importlib.util.spec_from_file_location("_gpuctk_cbuild", HERE / "hook" / "cbuild.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildFront(Command):
    description = "compile gpuctk-cdi-hook (hook/cdihook.c) into the build folder"
    user_options: list[tuple[str, str | None, str]] = []

    def initialize_options(self) -> None:
        self.build_lib = None
        self.build_temp = None
        self.editable_mode = False

    def finalize_options(self) -> None:
        self.set_undefined_options(
            "build", ("build_lib", "build_lib"), ("build_temp", "build_temp")
        )

    def run(self) -> None:
        cbuild = _cbuild()
        if self.editable_mode:  # its package is the source folder, and it installs no data
            print(
                f"gpuctk: an editable install leaves {cbuild.NAME} out: build it into the "
                f"venv with `python -m gpuctk.hook.cbuild VENV/bin/{cbuild.NAME}`",
                file=sys.stderr,
            )
            return
        out = Path(self.build_temp, "front", cbuild.NAME)
        try:
            cbuild.build(out)
        except cbuild.BuildError as exc:
            raise SystemExit(f"gpuctk: error: {exc}") from None
        package = Path(self.build_lib, "gpuctk", "hook")
        package.mkdir(parents=True, exist_ok=True)
        shutil.copy2(out, package / cbuild.NAME)
        # install_data reads the list when it runs, after the build
        self.distribution.data_files.append(("bin", [os.path.relpath(out)]))


class Build(build):
    sub_commands = [*build.sub_commands, ("build_front", None)]


setup(cmdclass={"build": Build, "build_front": BuildFront}, data_files=[])
