"""`gpuctk doctor` layer 4: gpuctk's own runtime pieces.

- gpuctk-runtime and gpuctk-hook are on PATH and run (`--version`: the shim passes it through to
  the low-level runtime, so its answer also proves that runtime runs), and gpuctk-hook has
  gpuctk-cdi-hook beside it, of the same build (the default spec's entry names it there, and
  it does the device node guard and the ld cache merge: an older one serves containers by
  older rules);
- the runtime config file (`--runtime-config`, $GPUCTK_CONFIG, <host>/etc/gpuctk/config.toml)
  is valid, read by the same code as the shim (gpuctk.hook.config);
- the low-level runtime the shim will exec is found, by the shim's own search
  (gpuctk.hook.shim.runtime_main.find_runtime) over the configured `runtimes`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from gpuctk.cdi.node.facts import HOOK_NAME, compiled_beside
from gpuctk.doctor.context import Context, Findings
from gpuctk.doctor.report import Result, failed, ok, skipped
from gpuctk.errors import GpuctkError

TIMEOUT_S = 20
INSTALL_FIX = (
    "apt install ./gpuctk_*.deb   # or: kubectl apply -k packaging/kubernetes, or gpuctk install; "
    "or put the directory holding {name} on PATH"
)


def config_path(ctx: Context) -> tuple[str, bool]:
    """(path, explicit) of the runtime config doctor reads."""
    if ctx.runtime_config:
        return ctx.runtime_config, True
    named = os.environ.get("GPUCTK_CONFIG", "")
    if named:
        return named, True
    from gpuctk.hook.config import DEFAULT_PATH

    return ctx.host(DEFAULT_PATH), False


def _run(argv: list[str]) -> tuple[int, str]:
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except OSError as exc:
        return 127, exc.strerror or str(exc)
    except subprocess.TimeoutExpired:
        return 124, f"no answer in {TIMEOUT_S}s"
    text = (done.stdout.strip() or done.stderr.strip()).splitlines()
    return done.returncode, text[0] if text else ""


def install_fix(name: str) -> str:
    """How to get `name` on PATH: the folder of the running gpuctk where it holds `name` (a
    venv's bin/), else the ways gpuctk is installed."""
    folder = os.path.dirname(os.path.abspath(sys.argv[0]))
    if os.path.basename(sys.argv[0]) == "gpuctk" and os.access(os.path.join(folder, name), os.X_OK):
        return f"export PATH={folder}:$PATH   # the {name} installed beside this gpuctk"
    return INSTALL_FIX.format(name=name)


def check_binary(ctx: Context, name: str, what: str) -> Result:
    id_ = "runtime.shim" if name == "gpuctk-runtime" else "runtime.hook"
    title = f"{name} on PATH and runnable"
    path = shutil.which(name, path=ctx.path)
    if path is None:
        return failed(id_, title, [f"{name} not found in PATH={ctx.path}"], install_fix(name))
    code, line = _run([path, "--version"])
    if code != 0:
        return failed(
            id_,
            title,
            [f"{path} --version: exit {code}: {line or '(no output)'}"],
            f"{path} --version   # read the error; reinstall gpuctk if it is an import error",
        )
    if name == HOOK_NAME:
        problem = _front_problem(path)
        if problem:
            fix = "reinstall gpuctk (apt install ./gpuctk_*.deb, gpuctk install, or pip install .)"
            return failed(id_, f"{title}, gpuctk-cdi-hook beside it", [problem], fix)
        what = f"gpuctk-cdi-hook beside it; {what}"
    return ok(id_, title, f"{path}: {what}{line}")


def _front_problem(hook: str) -> str:
    """What is wrong with the gpuctk-cdi-hook beside `hook` (gpuctk-hook, as named or as its
    real file), which the default spec's entry names; "" when there is one that knows this
    build's forms (asked for the guard with a descriptor that is none: it says so, exit 2)."""
    from gpuctk.hook import compiled
    from gpuctk.hook.verbs import nodeprotect

    front = compiled_beside(hook)
    if not front:
        return f"no {compiled.PROGRAM} beside {hook}, where the default spec's entry names it"
    code, line = _run([front, nodeprotect.NAME, compiled.ROOT_FD_OPT, "-1"])
    if code != 2 or "not an open folder" not in line:
        return (
            f"{front} does not know `{nodeprotect.NAME} {compiled.ROOT_FD_OPT}` (exit {code}: "
            f"{line or 'no output'}): an older build than {hook}"
        )
    return ""


def check_config(ctx: Context, found: Findings) -> Result:
    title = "runtime config valid"
    from gpuctk.hook import config

    path, explicit = config_path(ctx)
    if not explicit and not os.path.exists(path):
        found.settings = config.Settings()
        found.settings_source = "defaults"
        return ok("runtime.config", title, f"{path}: absent: the defaults apply")
    try:
        found.settings = config.load({config.ENV_VAR: path})
    except GpuctkError as exc:
        found.settings = config.Settings()
        found.settings_source = "defaults (config invalid)"
        problems = getattr(exc, "problems", None) or [exc.message]
        evidence = [p if p.startswith(path) else f"{path}: {p}" for p in problems]
        return failed(
            "runtime.config",
            title,
            evidence,
            f"edit {path} (keys: {', '.join(config.DEFAULTS)}); until then containers that "
            "ask for a GPU fail (the others start without it being read)",
        )
    found.settings_source = path
    s = found.settings
    return ok(
        "runtime.config",
        title,
        f"{path}: runtimes {list(s.runtimes)}, spec-dirs {list(s.spec_dirs)}",
    )


def check_low_level(ctx: Context, found: Findings) -> Result:
    title = "low-level runtime found"
    if found.settings is None:
        return skipped("runtime.low-level", title, "no runtime settings")
    from gpuctk.hook.shim.runtime_main import find_runtime

    names = list(found.settings.runtimes)
    try:
        path = find_runtime(names)  # the shim's own search: system folders, not PATH
    except GpuctkError as exc:
        where = found.settings_source if found.settings_source != "defaults" else None
        fix = "apt-get install runc   # or name the runtime's absolute path in `runtimes`"
        if where:
            fix += f" in {where}"
        return failed("runtime.low-level", title, [exc.message], fix)
    return ok("runtime.low-level", title, f"{path} (first usable of {', '.join(names)})")


def runtime_checks(ctx: Context, found: Findings) -> list[Result]:
    config = check_config(ctx, found)
    return [
        check_binary(ctx, "gpuctk-runtime", "passes --version to "),
        check_binary(ctx, HOOK_NAME, ""),
        config,
        check_low_level(ctx, found),
    ]
