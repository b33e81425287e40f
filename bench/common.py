"""What every benchmark here shares: the test fixtures on sys.path, the cache, and timing
Python the way an installed package runs (with its .pyc files)."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("GPUCTK_TEST_CACHE", REPO / "tests" / ".cache"))
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))


def installed_like_python() -> None:
    """Installed packages carry .pyc files; this environment may forbid writing them
    (PYTHONDONTWRITEBYTECODE), which would time the compiler instead of gpuctk."""
    from fixtures.layout import package_dirs

    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    folders = dict.fromkeys(str(f.relative_to(REPO)) for f in package_dirs(REPO).values())
    subprocess.run([sys.executable, "-m", "compileall", "-q", *folders], cwd=REPO, check=True)


def installed_bin() -> Path:
    """gpuctk as an operator installs it, with .pyc files and the isolated-mode launchers of
    gpuctk.install.launchers (what the deb and `gpuctk install` ship). Returns the launchers'
    folder.

    Where Debian's /usr/bin/python3 exists: the deb's own venv (packaging/deb/build.py venv,
    through tests/fixtures/appvenv.py), on that interpreter, as a node runs it. Elsewhere: a
    regular install of this checkout in CACHE/bench-venv, on this interpreter.

    The interpreter matters: a pyenv build (libpython as a shared library) starts ~1 ms
    slower than Debian's, and in a container lifecycle ~4 ms slower (measured side by side).
    The development .venv is an editable install, whose import hook costs ~15 ms on every
    Python start: timing it would measure the checkout, not the product."""
    installed_like_python()
    from fixtures.appvenv import app_venv, have_system_python

    if have_system_python():
        venv = app_venv()
        python = venv / "bin" / "python3"
        bindir = CACHE / f"bench-launchers-{venv.name}"
    else:
        venv = CACHE / "bench-venv"
        python = venv / "bin" / "python"
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "-q", str(REPO)], check=True)
        else:  # this checkout's code, the dependencies as they are
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall",
                 str(REPO)],
                check=True,
            )  # fmt: skip
        subprocess.run([str(python), "-m", "compileall", "-q", str(venv / "lib")], check=True)
        bindir = venv / "launchers"
    return _launchers(python, bindir)


PYTHON_NOTE = ".python"  # in the launchers' folder: the venv interpreter they start


# where a revision keeps its launcher writer: this tree's, then older revisions' (--against)
LAUNCHER_MODULES = ("gpuctk.install.launchers", "gpuctk.hook.launchers", "gpuctk.launchers")


def _launchers(python: Path, bindir: Path) -> Path:
    """Write the launchers (gpuctk.install.launchers) for the venv of `python` into `bindir`;
    returns it."""
    bindir.mkdir(exist_ok=True)
    for module in LAUNCHER_MODULES:
        probe = f"import importlib.util as u; print(u.find_spec({module!r}) is not None)"
        found = subprocess.run(
            [str(python), "-I", "-c", probe], capture_output=True, text=True, check=False
        )
        if found.stdout.strip() == "True":
            break
    subprocess.run(
        [str(python), "-I", "-m", module, str(bindir)],
        check=True,
        capture_output=True,
    )
    (bindir / PYTHON_NOTE).write_text(str(python))
    return bindir


def installed_python(bindir: Path) -> Path:
    """The venv interpreter behind the launchers in `bindir` (from installed_bin)."""
    return Path((bindir / PYTHON_NOTE).read_text())


def installed_bin_at(rev: str) -> Path:
    """installed_bin() for another revision of this repository (`git archive REV`, built into
    the deb's venv on /usr/bin/python3 once per commit, under CACHE/bench-rev-<commit>): for
    timing a change side by side with what it changes, in one run. Returns the launchers'
    folder."""
    from fixtures.appvenv import SYSTEM_PYTHON, build_env, have_system_python

    if not have_system_python():
        raise SystemExit(f"--against needs {SYSTEM_PYTHON} (the deb's interpreter)")
    found = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if found.returncode != 0:
        raise SystemExit(f"--against {rev}: not a commit of {REPO}")
    commit = found.stdout.strip()
    base = CACHE / f"bench-rev-{commit[:12]}"
    python = base / "venv" / "bin" / "python3"
    if not python.exists():
        shutil.rmtree(base, ignore_errors=True)
        (base / "src").mkdir(parents=True)
        archive = subprocess.run(
            ["git", "archive", commit], cwd=REPO, capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(base / "src")], input=archive, check=True)
        subprocess.run(
            [sys.executable, str(base / "src" / "packaging" / "deb" / "build.py"), "venv",
             str(base / "venv"), "--python", SYSTEM_PYTHON],
            env=build_env(), check=True, capture_output=True,
        )  # fmt: skip
    bindir = _launchers(python, base / "launchers")
    _rev_front(base / "src", bindir)
    return bindir


def _rev_front(src: Path, bindir: Path) -> None:
    """The compiled spec-hook front of a revision whose deb venv lacks it (its build.py left
    setup.py out of the wheel's sources): built by that revision's own setup.py, put beside
    its launchers, so that its specs name it as an install's would."""
    front = bindir / "gpuctk-cdi-hook"
    if front.exists() or not (src / "setup.py").is_file() or not (src / "hook/cdihook.c").is_file():
        return
    subprocess.run(  # setup.py compiles at import; `--version` only prints the version
        [sys.executable, "setup.py", "--version"], cwd=src, capture_output=True, check=False
    )
    built = src / "hook" / "gpuctk-cdi-hook"
    if built.is_file():
        shutil.copy2(built, front)


def paired(times: dict[str, list[float]], case: str, base: str) -> list[float]:
    """Per round, case's time less base's (ms): the rounds alternate the cases, so each
    difference is of two starts made side by side."""
    return [1e3 * (a - b) for a, b in zip(times[case], times[base], strict=True)]


PERSISTENCED = "run/nvidia-persistenced/socket"  # under the driver root, as on a node


def node_options(parser: argparse.ArgumentParser, cases: str = "") -> None:
    """The container benches' --nvidia-ctk-bin DIR (NVIDIA's runtime beside, `cases` saying
    which) and --no-persistenced (persistenced() off)."""
    parser.add_argument(
        "--nvidia-ctk-bin", type=Path, metavar="DIR",
        help="also time NVIDIA's nvidia-container-runtime from DIR (with nvidia-ctk and "
        f"nvidia-cdi-hook: its CDI mode, on nvidia-ctk's spec of the same node){cases}",
    )  # fmt: skip
    parser.add_argument(
        "--no-persistenced", action="store_true",
        help="no nvidia-persistenced socket on the node (by default one listens, as on most "
        "nodes, and every spec mounts it)",
    )  # fmt: skip


@contextlib.contextmanager
def persistenced(driver_root: Path, on: bool = True) -> Iterator[Path | None]:
    """A listening nvidia-persistenced socket in `driver_root` while the bench runs (what most
    real nodes have, and so what the specs of both toolkits mount), removed after; `on` False:
    none (yields None)."""
    if not on:
        yield None
        return
    # a SIGTERM (`timeout`, `kill`) ends the bench through the cleanups, this one's too: the
    # socket left in the cached driver root would be mounted by every test's spec
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    path = driver_root / PERSISTENCED
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    listening = socket.socket(socket.AF_UNIX)
    try:
        listening.bind(str(path))
        listening.listen()
        yield path
    finally:
        listening.close()
        path.unlink(missing_ok=True)
        for folder in (path.parent, path.parent.parent):
            with contextlib.suppress(OSError):
                folder.rmdir()
