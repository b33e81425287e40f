"""gpuctk-cdi-hook's one build recipe (gpuctk.hook.cbuild) and setup.py's use of it: the binary
is hardened as the recipe says (a PIE with full RELRO, fortified calls, a stack protector), an
install builds it outside the source tree, and one without a compiler or with a compile error
stops with one line naming what to install."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures import cfront
from fixtures.layout import REPO, package_dirs

from gpuctk.hook import cbuild

LINE = "apt install gcc libc6-dev"


def readelf(exe: Path, flag: str) -> str:
    if not shutil.which("readelf"):
        pytest.skip("needs readelf (binutils)")
    return subprocess.run(["readelf", flag, "-W", str(exe)], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip


def test_the_build_is_a_hardened_static_pie() -> None:
    exe = cfront.binary("plain")
    if exe is None:
        pytest.skip("no C compiler")
    assert "DYN (Position-Independent Executable file)" in readelf(exe, "-h")
    assert "GNU_RELRO" in readelf(exe, "-l")
    dynamic = readelf(exe, "-d")
    assert "BIND_NOW" in dynamic and "NOW PIE" in dynamic, dynamic
    assert "NEEDED" not in dynamic  # static: no library of the node's is loaded
    symbols = readelf(exe, "-s")
    assert "__stack_chk_fail" in symbols  # -fstack-protector-strong
    assert "__snprintf_chk" in symbols  # -D_FORTIFY_SOURCE=2


def test_no_compiler_is_one_line_naming_what_to_install(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}  # no cc, no gcc
    out = tmp_path / "out" / cbuild.NAME
    done = subprocess.run([sys.executable, "-m", "gpuctk.hook.cbuild", str(out)], env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and LINE in done.stderr, done.stderr
    assert not out.exists()


def test_a_failed_compile_leaves_the_old_binary_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / cbuild.NAME
    out.write_bytes(b"old")
    monkeypatch.setenv("CC", shutil.which("false") or "/bin/false")
    with pytest.raises(cbuild.BuildError, match=LINE):
        cbuild.build(out)
    assert out.read_bytes() == b"old" and os.listdir(tmp_path) == [cbuild.NAME]


def setup_py_build(src: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`setup.py build` of a copy of the checkout's sources in `src`."""
    shutil.rmtree(src / "build", ignore_errors=True)  # each build from scratch
    shutil.copy2(REPO / "setup.py", src / "setup.py")
    shutil.copy2(REPO / "pyproject.toml", src / "pyproject.toml")
    shutil.copy2(REPO / "README.md", src / "README.md")
    for folder in dict.fromkeys(package_dirs().values()):
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", cbuild.NAME)
        shutil.copytree(folder, src / folder.name, ignore=ignore, dirs_exist_ok=True)
    return subprocess.run(
        [sys.executable, "setup.py", "-q", "build"],
        cwd=src, env={**os.environ, **env}, capture_output=True, text=True, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not cbuild.compiler():
        pytest.skip("no C compiler")
    pytest.importorskip("setuptools")
    return tmp_path_factory.mktemp("src")


def test_setup_py_builds_it_outside_the_source_tree(src: Path) -> None:
    done = setup_py_build(src)
    assert done.returncode == 0, done.stderr
    built = src / "build" / "lib" / "gpuctk" / "hook" / cbuild.NAME
    assert built.is_file() and built.read_bytes().startswith(b"\x7fELF")
    assert not (src / "hook" / cbuild.NAME).exists()


def test_setup_py_without_a_compiler_fails(src: Path) -> None:
    done = setup_py_build(src, CC="/nonexistent/cc")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("gpuctk: error: ") and LINE in last, done.stderr
    assert not list(src.rglob(cbuild.NAME))


def test_clang_finds_nothing_gcc_does_not(tmp_path: Path) -> None:
    """The build's compiler is gcc; clang's -Wall -Wextra (it sees, for one, a variable used
    where a hand-over did not happen) finds nothing either: the libFuzzer harnesses are built
    with it."""
    clang = shutil.which("clang")
    if clang is None:
        pytest.skip("no clang")
    from gpuctk.hook import cvocab

    cvocab.write(tmp_path)
    argv = [
        clang,
        "-fsyntax-only",
        "-Wall",
        "-Wextra",
        "-Werror",
        f"-I{tmp_path}",
        str(cbuild.SOURCE),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
