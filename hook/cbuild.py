"""The one build recipe of gpuctk-cdi-hook, the only compiled part (hook/cdihook.c, which
includes hook/ldcache.c and hook/shimfront.c): it runs as root against hostile images, so it is
built with every warning that can catch a conversion or format slip made an error, and with the
hardening a Debian 12 gcc offers (fortified libc calls, stack protector and clash protection,
a position-independent executable, relocations read-only after start).

Everything that builds it uses this module: setup.py (by file path, before the package is
installed), hence a wheel, the deb (packaging/deb/build.py) and the node image
(packaging/kubernetes/Containerfile); tests/run.sh, which builds it into the venv's bin/; and
the tests, which add the sanitizers or coverage to the same flags. Standard library only.

The words the C shares with the Python (capability names, the hook's verbs and options, file
paths, limits, environment variables) come from gpuctk_vocab.h, which hook/cvocab.py writes
from the Python constants into a folder of each build's own, beside `out` and removed after it
(never the source tree); the compiler gets it with -I.

    python -m gpuctk.hook.cbuild OUT            # build to OUT (a temp file, then renamed)
    python -m gpuctk.hook.cbuild OUT -- -g      # the same with extra compiler flags
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _program_name() -> str:
    """gpuctk.cdi.node.facts.COMPILED_HOOK, read from the file beside this one's folder (the
    same in a source tree and an install): setup.py loads this module before the package is
    importable."""
    import importlib.util

    path = HERE.parent / "cdi" / "node" / "facts.py"
    spec = importlib.util.spec_from_file_location("_gpuctk_build_facts", path)
    assert spec and spec.loader, path
    facts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(facts)
    return str(facts.COMPILED_HOOK)


NAME = _program_name()
SOURCE = HERE / "cdihook.c"  # the one translation unit
SOURCES = (SOURCE, HERE / "ldcache.c", HERE / "shimfront.c")  # what the binary is made of
WARNINGS = [
    "-Wall", "-Wextra", "-Wconversion", "-Wsign-conversion", "-Wshadow", "-Wformat=2",
    "-Wformat-security", "-Werror",
]  # fmt: skip
HARDENING = [
    "-D_FORTIFY_SOURCE=2", "-fstack-protector-strong", "-fstack-clash-protection", "-fPIE",
    "-Wl,-z,relro", "-Wl,-z,now",
]  # fmt: skip
FLAGS = ["-O2", *WARNINGS, *HARDENING]
# static: it runs on any node a venv is copied to, whatever its glibc
STATIC = ["-static-pie"]
DYNAMIC = ["-pie"]
# the tests' builds: extra flags after FLAGS (a later -O wins)
SANITIZE = ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
COVERAGE = ["-O0", "-U_FORTIFY_SOURCE", "--coverage"]
INSTALL = "apt install gcc libc6-dev"
HEADER = "gpuctk_vocab.h"  # hook/cvocab.py's


class BuildError(Exception):
    """The hook could not be built: one line, what is missing and what to do."""


def compiler() -> str | None:
    """$CC, else cc or gcc on PATH."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _hint() -> str:
    return f"install a C compiler and libc headers ({INSTALL})"


def _write_vocab(folder: str) -> None:
    """gpuctk_vocab.h into `folder`, from the Python constants of the tree this file lies in:
    hook/cvocab.py run by this interpreter without site-packages (it needs none), from the folder
    that holds the package (a source tree's root, whose gpuctk/__init__.py maps gpuctk.hook to
    this folder; or an install's site-packages), so that no other installed gpuctk answers."""
    top = HERE.parent if (HERE.parent / "pyproject.toml").is_file() else HERE.parent.parent
    argv = [sys.executable, "-S", "-E", "-m", "gpuctk.hook.cvocab", folder]
    done = subprocess.run(argv, cwd=top, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        why = " ".join(done.stderr.strip().splitlines()[-1:]) or f"exit {done.returncode}"
        raise BuildError(f"{NAME}'s {HEADER} could not be written from {top} ({why}): build "
                         "from a whole gpuctk source tree")  # fmt: skip


def _compile(
    cc: str, link: Sequence[str], extra: Sequence[str], out: str, include: str
) -> subprocess.CompletedProcess[str]:
    argv = [cc, *FLAGS, f"-I{include}", *link, *extra, "-o", out, str(SOURCE)]
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def build(out: str | Path, extra_flags: Sequence[str] = (), static: bool = True) -> Path:
    """Compile SOURCE with FLAGS and `extra_flags` into `out` (mode 0755): into a temp file in
    out's folder, renamed over `out`, so that `out` is always a whole binary or the old one.
    `static`: a static PIE (the sanitizers need a dynamic one). BuildError when it fails; the
    compiler's own messages go to stderr first."""
    cc = compiler()
    if not cc:
        raise BuildError(f"no C compiler (cc or gcc) to build {NAME}: {_hint()}")
    out = Path(out).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    os.close(fd)
    include = tempfile.mkdtemp(prefix=f".{out.name}.vocab.", dir=out.parent)
    try:
        _write_vocab(include)
        try:
            done = _compile(cc, STATIC if static else DYNAMIC, extra_flags, tmp, include)
        except OSError as exc:
            raise BuildError(
                f"cannot run the C compiler {cc} ({exc.strerror}): {_hint()}"
            ) from None
        if (
            done.returncode != 0
            and static
            and _compile(cc, DYNAMIC, extra_flags, tmp, include).returncode == 0
        ):
            print(f"gpuctk: note: no static libc here: {NAME} is linked dynamically (it then "
                  "runs only where this glibc or a newer one is)", file=sys.stderr)  # fmt: skip
        elif done.returncode != 0:
            sys.stderr.write(done.stderr)
            why = " ".join(done.stderr.strip().splitlines()[-1:]) or f"exit {done.returncode}"
            raise BuildError(f"{NAME} did not compile with {cc} ({why}): {_hint()}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
        shutil.rmtree(include, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0].startswith("-") or (len(args) > 1 and args[1] != "--"):
        print(f"usage: python -m gpuctk.hook.cbuild OUT [-- CFLAGS...]  (builds {NAME})",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        print(build(args[0], args[2:]))
    except BuildError as exc:
        print(f"gpuctk: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
