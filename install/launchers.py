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
start, state, kill, delete, ...), and only `create`/`run` need Python. Its launcher is a POSIX sh
front (dash starts in a fraction of CPython's time) that finds the verb as runc reads its
global flags and, for any verb but create/run, execs the low-level runtime that gpuctk-runtime
itself last resolved, read from its memo (`$GPUCTK_STATE_DIR/runtime`, default
/run/gpuctk/runtime; see gpuctk.hook.shim.memo.remember_runtime). The memo is used only when
the state folder and the memo are owned by the caller's uid and are not symlinks, the memo
is a regular file that names the same config file (present or absent alike) and is not older
than that config file, and its runtime is an absolute path to an executable regular file, not
a symlink, owned by the caller's uid, in a folder owned by it, and not modified after the memo
(`-nt`: anyone who may write the file but does not own it can set its mtime to now only, so
a write after the memo leaves it newer). Python checked that file and every folder above it,
modes included, when it wrote the memo; sh's `test` cannot see modes, so a runtime made
writable by others but not yet written, or a folder above it, is caught only by Python (which
removes the memo when it refuses the front's runtime). PATH plays no part in which runtime
Python resolves, so the memo does not hold it. Anything else (no memo yet, a changed config,
an argument list it cannot read) starts Python, which resolves the runtime as always and
writes the memo again. So a config change takes effect at once, and the verbs that follow a
create go to the runtime that create used.

A `create`/`run` skips Python too when its config.json cannot be asking for a GPU: the memo
also holds the request markers of the config in force (gpuctk.hook.shim.memo
request_markers: `NVIDIA_VISIBLE_DEVICES`, each annotation prefix, and with
accept-volume-mounts the device-list folder name), and the front finds the bundle as runc
reads `--bundle`/`-b` (the current folder without one) and runs the host's grep (/usr/bin or
/bin, fixed paths; `grep -E` in the C locale, without GREP_OPTIONS, the memo holding each
marker as a pattern that matches its bytes as they are) over config.json for them and for
the escapes `\\/` and `\\u` (JSON may spell `/` as `\\/`, and any character as `\\u`), but
Go's `\\u` of <, > and & (OTHER_ESCAPE: encoding/json, every engine's, writes a shell
command's && and a CUDA image's NVIDIA_REQUIRE_CUDA so; no marker holds a character JSON or
Go's JSON writes as an escape). No match: the low-level runtime, at once. A match, crun's
`--config`/`-f` or attached `-bDIR`, no markers in the memo, no grep, or anything else:
Python, which decides as always. A GPU node whose runtime handler is also the default one
(every pod through gpuctk-runtime) pays for Python only on the containers that ask for a
GPU. When the memo holds on such a create, the front hands its runtime to Python
(`GPUCTK_FRONT_RUNTIME`, removed from the environment before the runtime runs), which then
neither searches for the runtime nor rewrites the memo; the front unsets that variable first,
so only the front can set it.

Once Python has written a front plan (the state folder has `front/`, gpuctk.hook.shim.frontplan),
such a create goes to the compiled `gpuctk-cdi-hook shim-create` beside the launchers instead
(hook/shimfront.c), with the interpreter and the Python half as arguments: it does the create
itself for a request with a plan, and execs exactly that Python start otherwise.
"""

from __future__ import annotations

import os
import sys

from gpuctk.hook import compiled
from gpuctk.hook.config import DEFAULT_PATH as DEFAULT_CONFIG
from gpuctk.hook.shim.memo import MEMO_TAG
from gpuctk.hook.shim.runcargs import (
    BUNDLE,
    BUNDLE_SHORT,
    CONFIG_FLAGS,
    GLOBAL_VALUE_FLAGS,
    VERB_VALUE_FLAGS,
)
from gpuctk.hook.shim.runtime_main import FRONT_RUNTIME_ENV
from gpuctk.statedir import DEFAULT_STATE_DIR, STATE_DIR_ENV

LAUNCHER_MARK = "# gpuctk launcher"  # every launcher's second line starts so

FRONT = compiled.PROGRAM  # hook/cdihook.c, built by setup.py into gpuctk.hook's folder
SHIM_CREATE = "shim-create"  # its verb for gpuctk-runtime's create (hook/shimfront.c)

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


GREPS = ("/usr/bin/grep", "/bin/grep")
# a \u escape other than Go's \u003c, \u003e and \u0026 (encoding/json writes <, > and & so:
# every engine's config.json has them where a CUDA image's NVIDIA_REQUIRE_CUDA or a shell
# command's && is), as grep -E reads it
OTHER_ESCAPE = r"\\u([^0]|0[^0]|00[^23]|002[^6]|003[^ce])"

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
    """The text of the gpuctk-runtime launcher: a POSIX sh front (see the module docstring);
    `front`: the compiled gpuctk-cdi-hook beside it, which a create whose memo holds goes to
    once a front plan was ever written (hook/shimfront.c; it starts the same Python where it
    cannot do the create itself)."""
    _check_interpreter(python)
    create_front = ""
    if front:
        _check_interpreter(front)
        create_front = (
            f'\t\tif [ "$verb" = create ] && [ -d "$sdir/front" ] && ! [ -h "$sdir/front" ] &&\n'
            f"\t\t\t[ -x {front} ]; then\n"
            f'\t\t\texec {front} {SHIM_CREATE} {python} "$pycode" "$0" "$@"\n'
            "\t\tfi\n"
        )
    global_flags = "|".join(sorted(GLOBAL_VALUE_FLAGS))
    # bundle/b and config/f have their own patterns before this one in the front
    verb_flags = "|".join(sorted(VERB_VALUE_FLAGS - {BUNDLE, BUNDLE_SHORT, *CONFIG_FLAGS}))
    return f"""#!/bin/sh
{LAUNCHER_MARK} (gpuctk.install.launchers): gpuctk-runtime's POSIX sh front; see that module.
# Verbs other than create/run go to the low-level runtime in the memo; so does a create whose
# config.json holds none of the memo's request markers; anything else starts Python.
unset {FRONT_RUNTIME_ENV}
sdir=${{{STATE_DIR_ENV}:-{DEFAULT_STATE_DIR}}}
memo=$sdir/runtime
pycode='{_RUNTIME_PYTHON.replace("@COMPILED@", front)}'
# shellcheck disable=SC3013 # -nt: not POSIX, but in the test of dash, bash and busybox sh
memo_holds() {{ # the memo is ours, current, and its runtime ours and unchanged since
	! [ -h "$sdir" ] && [ -O "$sdir" ] && ! [ -h "$memo" ] && [ -f "$memo" ] && [ -O "$memo" ] ||
		return 1
	{{ IFS= read -r tag; IFS= read -r m_conf; IFS= read -r m_state
		IFS= read -r m_runtime; IFS= read -r m_create; }} <"$memo"
	conf=${{GPUCTK_CONFIG:-{DEFAULT_CONFIG}}}
	if [ -e "$conf" ]; then state=present; else state=absent; fi
	[ "$tag" = "{MEMO_TAG}" ] && [ "$m_conf" = "$conf" ] && [ "$m_state" = "$state" ] &&
		! [ "$conf" -nt "$memo" ] &&
		case $m_runtime in /*) true ;; *) false ;; esac &&
		! [ -h "$m_runtime" ] && [ -f "$m_runtime" ] && [ -x "$m_runtime" ] &&
		[ -O "$m_runtime" ] && ! [ "$m_runtime" -nt "$memo" ] && [ -O "${{m_runtime%/*}}/." ]
}}
no_request() {{ # CONFIG PATTERN...: true when CONFIG holds no marker (each a grep -E PATTERN),
	# no \\/ escape and no \\u escape but Go's of <, > and & (no marker holds one)
	cfg=$1
	shift
	n=$#
	while [ "$n" -gt 0 ]; do set -- "$@" -e "$1"; shift; n=$((n - 1)); done
	[ -f "$cfg" ] && [ -r "$cfg" ] || return 1
	unset GREP_OPTIONS # grep 3.5 and older read options from it
	for g in {" ".join(GREPS)}; do
		if [ -x "$g" ]; then
			LC_ALL=C "$g" -q -E "$@" -e '\\\\/' -e '{OTHER_ESCAPE}' -- "$cfg"
			[ $? -eq 1 ]
			return
		fi
	done
	return 1
}}
want=verb
verb=
bundle=
fast=yes
for arg do
	case $want in
	value) want=verb; continue ;;
	next) verb=$arg; want=args; continue ;;
	bundle) bundle=$arg; want=args; continue ;;
	skip) want=args; continue ;;
	esac
	case $arg in
	-?*)
		name=${{arg%%=*}}
		while case $name in -*) true ;; *) false ;; esac; do name=${{name#-}}; done ;;
	esac
	if [ "$want" = args ]; then
		case $verb in create|run) ;; *) break ;; esac
		case $arg in
		--) break ;;
		-?*=*)
			case $name in
			bundle|b) bundle=${{arg#*=}} ;;
			config|f) fast=no; break ;;
			esac ;;
		-?*)
			case $name in
			bundle|b) want=bundle ;;
			config|f) fast=no; break ;;
			{verb_flags}) want=skip ;;
			*) case $arg in -[bf]?*) fast=no; break ;; esac ;;
			esac ;;
		esac
		continue
	fi
	case $arg in
	--) want=next ;;
	-?*=*) ;;
	-?*) case $name in {global_flags}) want=value ;; esac ;;
	*) verb=$arg; want=args ;;
	esac
done
case $verb in
'') ;;
create|run)
	if [ "$fast" = yes ] && memo_holds; then
		case $m_create in
		create-grep"	"?*)
			set -f
			IFS="	"
			# shellcheck disable=SC2086 # split on the tabs between markers (IFS, set -f)
			if no_request "${{bundle:-.}}/config.json" ${{m_create#create-grep"	"}}; then
				unset IFS
				set +f
				exec "$m_runtime" "$@"
			fi
			unset IFS
			set +f ;;
		esac
		{FRONT_RUNTIME_ENV}=$m_runtime # the memo holds: Python need not resolve it again
		export {FRONT_RUNTIME_ENV}
{create_front}	fi ;;
*)
	if memo_holds; then
		exec "$m_runtime" "$@"
	fi ;;
esac
exec {python} -IS -c "$pycode" "$0" "$@"
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
