"""Isolated-mode launchers for the container-create path.

pip's console scripts start Python with the caller's environment: `PYTHONPATH`, `PYTHONHOME`,
`PYTHONSTARTUP` and the user site-packages all apply, and a development (editable) install
adds an import hook to every start. `gpuctk-runtime` and `gpuctk-hook` run as root on every
container start, so the launchers written here start the interpreter with `-IS`:

- `-I` (isolated): no PYTHON* variables, no user site, no script folder on sys.path;
- `-S` (no `site`): no .pth files run, and ~2.5 ms less per start (a quarter of CPython's
  start here). The launcher puts its venv's site-packages on sys.path itself, found from the
  interpreter's own path (`<venv>/bin/python` -> `<venv>/lib/pythonX.Y/site-packages`), so a
  venv can be moved (the deb and `gpuctk install` copy one). Where gpuctk is not there (a
  system-wide or editable install), the launcher runs `site` after all and imports again.

    python -m gpuctk.launchers /usr/local/bin          # writes the three launchers
    python -m gpuctk.launchers --python /opt/gpuctk/bin/python3 DIR

The deb package and `gpuctk install` use this; so does `bench/lifecycle.py`.
"""

from __future__ import annotations

import os
import sys

# launcher name -> (module, function)
ENTRY_POINTS: dict[str, tuple[str, str]] = {
    "gpuctk": ("gpuctk.cli", "main"),
    "gpuctk-runtime": ("gpuctk.hook.runtime_main", "main"),
    "gpuctk-hook": ("gpuctk.hook.hook_main", "main"),
}


def launcher_text(python: str, module: str, function: str) -> str:
    """The text of one launcher script for `python`."""
    if not os.path.isabs(python) or any(c.isspace() for c in python):
        raise ValueError(f"the interpreter path must be absolute, without spaces: {python!r}")
    return (
        f"#!{python} -IS\n"
        "# gpuctk launcher (gpuctk.launchers): isolated mode, no site; see that module.\n"
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


def write_launchers(bindir: str, python: str | None = None) -> list[str]:
    """Write every launcher into `bindir` (mode 0755, atomically); returns their paths."""
    from gpuctk.fs import atomic_write

    interpreter = python or sys.executable
    paths = []
    for name, (module, function) in ENTRY_POINTS.items():
        path = os.path.join(bindir, name)
        atomic_write(path, launcher_text(interpreter, module, function).encode(), mode=0o755)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m gpuctk.launchers",
        description="Write isolated-mode launchers for gpuctk, gpuctk-runtime and gpuctk-hook.",
    )
    parser.add_argument("bindir", help="folder to write them into, e.g. /usr/local/bin")
    parser.add_argument(
        "--python", help="interpreter to name in the #! line (default: this one)", default=None
    )
    args = parser.parse_args(argv)
    from gpuctk.errors import GpuctkError

    try:
        for path in write_launchers(args.bindir, args.python):
            print(path)
    except (GpuctkError, OSError, ValueError) as exc:
        print(f"gpuctk.launchers: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
