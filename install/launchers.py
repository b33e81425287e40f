"""Isolated-mode launchers for the container-create path.

pip's console scripts start Python with the caller's environment: `PYTHONPATH`, `PYTHONHOME`,
`PYTHONSTARTUP` and the user site-packages all apply, and a development (editable) install
adds an import hook to every start. `gpuctk-runtime` and `gpuctk-hook` run as root on every
container start, so the launchers written here start the interpreter with `-IS`:

- `-I` (isolated): no PYTHON* variables, no user site, no script folder on sys.path;
- `-S` (no `site`): no .pth files run, and a quarter of CPython's start saved
  (docs/benchmarks.md). The launcher puts its venv's site-packages on sys.path itself, found
  from the interpreter's own path (`<venv>/bin/python` -> `<venv>/lib/pythonX.Y/
  site-packages`), so a venv can be moved (the deb and `gpuctk install` copy one). Where
  gpuctk is not there (a system-wide or editable install), the launcher runs `site` after all
  and imports again.

    python -m gpuctk.install.launchers /usr/local/bin          # writes the three launchers
    python -m gpuctk.install.launchers --python /opt/gpuctk/bin/python3 DIR

The deb package and `gpuctk install` use this; so does `bench/lifecycle.py`.

`gpuctk-runtime` is different: containerd runs it for every verb of every container (create,
start, state, kill, delete, ...), and most calls need no Python. Its launcher is a POSIX sh
front (dash starts in a fraction of CPython's time) that execs the compiled gpuctk-cdi-hook
beside it, `runtime-front PYTHON PYCODE "$0" ARGS...`, which reads runc's arguments (the one
reading, hook/shimfront.c's read_runc) and the runtime memo that gpuctk-runtime's Python
writes after each start (gpuctk.hook.shim.memo), and then:

- any verb but create/run goes to the low-level runtime in the memo, while the memo holds:
  the state folder one only this uid can write, the memo a regular file of its naming the
  same config file (present or absent alike), which has not changed since (its ctime: a
  config copied in with its old mtime is a change too), its runtime an absolute path to an
  executable regular file of this uid's, not a link, in a folder of its that nobody else
  may write (or sticky), and not changed since either. Python checked that file and every
  folder above it by gpuctk's trusted-path rules when it wrote the memo, and removes the
  memo when it refuses the runtime; a config change takes effect at once (the memo no longer
  holds: Python runs and writes it again), and the verbs that follow a create go to the
  runtime that create used;
- a create or run whose config.json cannot be asking for a GPU goes there too: the memo also
  holds the request markers of the config in force (gpuctk.hook.shim.memo.request_markers:
  `NVIDIA_VISIBLE_DEVICES`, each annotation prefix, and with accept-volume-mounts the
  device-list folder name), and config.json (the bundle as runc reads `--bundle`/`-b`) holds
  none of them, no `\\/` escape and no `\\u` escape but Go's of <, > and & (JSON may spell
  any character so; encoding/json, every engine's, writes a shell command's && and a CUDA
  image's NVIDIA_REQUIRE_CUDA with them). A GPU node whose runtime handler is also the default
  one (every pod through gpuctk-runtime) pays for Python only on containers that ask for a GPU;
- any other create goes to the compiled create (hook/shimfront.c), which does it itself for a
  request Python wrote a front plan for (gpuctk.hook.shim.frontplan), and starts Python
  otherwise;
- anything else (no verb, no memo that holds, crun's `--config`, an attached `-bDIR`) starts
  Python, which decides as always. Where the memo holds, the front hands its runtime to Python
  (`GPUCTK_FRONT_RUNTIME`, removed from the environment before the runtime runs), which then
  neither searches for the runtime nor rewrites the memo; the front removes that variable
  first, so only the front can set it.

Without gpuctk-cdi-hook (removed after the install), the sh front starts Python for every call.
"""

from __future__ import annotations

import os
import sys

from gpuctk.hook import compiled
from gpuctk.hook.shim.runtime_main import FRONT_RUNTIME_ENV

LAUNCHER_MARK = "# gpuctk launcher"  # every launcher's second line starts so

FRONT = compiled.PROGRAM  # hook/cdihook.c, built by setup.py into gpuctk.hook's folder
RUNTIME_FRONT = "runtime-front"  # its verb for gpuctk-runtime's every call (hook/shimfront.c)

# launcher name -> (module, function)
ENTRY_POINTS: dict[str, tuple[str, str]] = {
    "gpuctk": ("gpuctk.cli", "main"),
    "gpuctk-runtime": ("gpuctk.hook.shim.runtime_main", "main"),
    "gpuctk-hook": ("gpuctk.hook.verbs.hook_main", "main"),
}


def _check_interpreter(python: str) -> None:
    if not os.path.isabs(python) or any(c.isspace() or c in "'\"$`\\" for c in python):
        raise ValueError(
            f"the interpreter path must be absolute, without spaces or quotes: {python!r}"
        )


def launcher_text(python: str, module: str, function: str) -> str:
    """The text of one launcher script for `python`."""
    _check_interpreter(python)
    return (
        f"#!{python} -IS\n"
        f"{LAUNCHER_MARK} (gpuctk.install.launchers): isolated mode, no site; see that module.\n"
        "import sys\n"
        "sys.path.append(\n"
        "    f\"{sys.executable.rpartition('/')[0].rpartition('/')[0]}/lib/\"\n"
        '    f"python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"\n'
        ")\n"
        "try:\n"
        f"    from {module} import {function}\n"
        "except ImportError:  # not a venv install: let site find the packages\n"
        "    import site\n"
        "\n"
        "    site.main()\n"
        f"    from {module} import {function}\n"
        f"raise SystemExit({function}())\n"
    )


# The Python half of the runtime front: run with `-IS -c CODE "$0" "$@"` (no single quotes);
# @COMPILED@: the compiled create it writes front plans for ("" where none runs:
# gpuctk.hook.shim.frontplan).
_RUNTIME_PYTHON = """import sys
del sys.argv[0]
sys.path.append(
    sys.executable.rpartition("/")[0].rpartition("/")[0]
    + "/lib/python%d.%d/site-packages" % sys.version_info[:2]
)
try:
    from gpuctk.hook.shim.runtime_main import main
except ImportError:
    import site

    site.main()
    from gpuctk.hook.shim.runtime_main import main
raise SystemExit(main(compiled="@COMPILED@"))
"""


def runtime_front_text(python: str, front: str = "") -> str:
    """The text of the gpuctk-runtime launcher: a POSIX sh front (see the module docstring)
    that execs `front`, the compiled gpuctk-cdi-hook beside it, for every call, and `python`
    where that is missing ("": always)."""
    _check_interpreter(python)
    compiled_front = ""
    if front:
        _check_interpreter(front)
        compiled_front = (
            f"if [ -x {front} ]; then\n"
            f'\texec {front} {RUNTIME_FRONT} {python} "$pycode" "$0" "$@"\n'
            "fi\n"
        )
    return f"""#!/bin/sh
{LAUNCHER_MARK} (gpuctk.install.launchers): gpuctk-runtime's POSIX sh front; see that module.
# gpuctk-cdi-hook reads runc's arguments and runs the low-level runtime, the compiled create or
# this Python; without it, Python serves every call.
unset {FRONT_RUNTIME_ENV}
pycode='{_RUNTIME_PYTHON.replace("@COMPILED@", front)}'
{compiled_front}exec {python} -IS -c "$pycode" "$0" "$@"
"""


def write_launchers(bindir: str, python: str | None = None, installed: str = "") -> list[str]:
    """Write every launcher into `bindir` (mode 0755, atomically), and the package's
    gpuctk-cdi-hook where it was built; returns their paths. `installed`: the folder they will
    run from, where that is not `bindir` (a package's staging root)."""
    from gpuctk.writes import atomic_write

    interpreter = python or sys.executable
    _check_interpreter(interpreter)  # before anything is written
    paths = []
    front = compiled.installed()
    beside = os.path.join(os.path.abspath(bindir), FRONT) if front else ""
    if beside:  # the compiled front goes beside gpuctk-hook (the spec hook, the shim's create)
        with open(front, "rb") as f:
            atomic_write(beside, f.read(), mode=0o755)
    named = os.path.join(installed, FRONT) if beside and installed else beside
    for name, (module, function) in ENTRY_POINTS.items():
        path = os.path.join(bindir, name)
        if name == "gpuctk-runtime":
            text = runtime_front_text(interpreter, named)
        else:
            text = launcher_text(interpreter, module, function)
        atomic_write(path, text.encode(), mode=0o755)
        paths.append(path)
    if beside:
        paths.append(beside)
    return paths


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m gpuctk.install.launchers",
        description="Write isolated-mode launchers for gpuctk, gpuctk-runtime and gpuctk-hook.",
    )
    parser.add_argument("bindir", help="folder to write them into, e.g. /usr/local/bin")
    parser.add_argument(
        "--python", help="interpreter to name in the #! line (default: this one)", default=None
    )
    parser.add_argument(
        "--installed-in",
        metavar="DIR",
        default="",
        help="the folder the launchers will run from, where it is not BINDIR (a package's "
        "staging root): the runtime's front names the compiled create there",
    )
    args = parser.parse_args(argv)
    from gpuctk.errors import GpuctkError

    try:
        for path in write_launchers(args.bindir, args.python, args.installed_in):
            print(path)
    except (GpuctkError, OSError, ValueError) as exc:
        print(f"gpuctk.install.launchers: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
