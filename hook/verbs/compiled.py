"""gpuctk-cdi-hook (hook/cdihook.c) as gpuctk-hook and gpuctk-runtime run it for the rules
written in C alone: the device node guard (gpuctk.hook.verbs.nodeprotect) and the merge of an
image's ld cache (gpuctk.hook.verbs.ldmerge). Each such form takes what Python resolved inside
the root as inherited descriptors, does its one job and never hands anything back.

The C is a required part of every install (setup.py builds it; no compiler, no install).
"""

from __future__ import annotations

import os
import sys

from gpuctk.errors import GpuctkError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess

PROGRAM = "gpuctk-cdi-hook"
ERROR_PREFIX = f"{PROGRAM}: error: "
ROOT_FD_OPT = "--root-fd"  # the guard's form: the container root as an inherited descriptor
MERGE_VERB = "merge-ld-cache"  # the ld cache merge's form (gpuctk.hook.verbs.ldmerge.merged)
SERVED_VERBS = (MERGE_VERB,)  # the verbs of its own forms


def installed() -> str:
    """The compiled gpuctk-cdi-hook this install has: gpuctk.hook's copy (setup.py's build),
    else the one beside the interpreter (a venv's bin/, where tests/run.sh builds it for an
    editable install); "" where there is none."""
    from gpuctk import hook

    package = os.path.dirname(os.path.abspath(hook.__file__))
    for folder in (package, os.path.dirname(sys.executable)):
        path = os.path.join(folder, PROGRAM)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return ""


def program() -> str:
    """gpuctk-cdi-hook beside this launcher (as named, then its real file: the one that handed
    the container to gpuctk-hook, or the deb's), else installed(); "" where there is none."""
    me = sys.argv[0] if sys.argv else ""
    for mine in [me, os.path.realpath(me)] if me[:1] == "/" else []:
        path = os.path.join(os.path.dirname(mine), PROGRAM)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return installed()


def run(args: list[str], fds: tuple[int, ...], what: str) -> subprocess.CompletedProcess[bytes]:
    """gpuctk-cdi-hook `args` with `fds` inherited, an empty environment and no stdin; its
    output captured. GpuctkError (`what`: the job, for the message) when it is not installed
    or cannot run; the caller reads the exit status."""
    import subprocess

    exe = program()
    if not exe:
        raise GpuctkError(
            f"{what}: no {PROGRAM} beside gpuctk-hook or in the gpuctk package: reinstall "
            "gpuctk (pip install ., the deb or the node image), which builds it"
        )
    try:
        return subprocess.run(
            [exe, *args], pass_fds=fds, env={}, stdin=subprocess.DEVNULL, capture_output=True,
            timeout=60, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GpuctkError(f"{what}: {exe}: {exc}") from None


def why(done: subprocess.CompletedProcess[bytes]) -> str:
    """The C's error line, without its program's prefix."""
    lines = done.stderr.decode(errors="replace").strip().splitlines() or ["no message"]
    return f"{lines[-1].removeprefix(ERROR_PREFIX)} (exit {done.returncode})"
