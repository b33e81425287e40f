"""`gpuctk doctor` layer 4: gpuctk's own runtime pieces.

- gpuctk-runtime and gpuctk-hook are on PATH and run (`--version`: the shim passes it through to
  the low-level runtime, so its answer also proves that runtime runs);
- the runtime config file (`--runtime-config`, $GPUCTK_CONFIG, <host>/etc/gpuctk/config.toml)
  is valid, read by the same code as the shim (gpuctk.hook.config);
- the low-level runtime the shim will exec is found, by the shim's own search
  (gpuctk.hook.runtime_main.find_runtime) over the configured `runtimes`;
- whether a create server (gpuctk.hook.serve) serves the shim's state folder, as the sh front
  judges it: `create.fifo` a FIFO, `create.pid` naming a process (under --proc-root) whose
  comm is `gpuctk-serve`, and a bash of 5.1 or later on a host doctor runs on. Not running
  is no fault (creates start Python); a pid file that names no server, or a bash too old for
  the front's client, is a warning.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

from gpuctk.cdi.doctor_context import Context, Findings
from gpuctk.cdi.doctor_report import Result, failed, ok, skipped, warning
from gpuctk.errors import GpuctkError

TIMEOUT_S = 20
INSTALL_FIX = "pip install gpuctk   # or put the directory holding {name} on PATH"


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


def check_binary(ctx: Context, name: str, what: str) -> Result:
    id_ = "runtime.shim" if name == "gpuctk-runtime" else "runtime.hook"
    title = f"{name} on PATH and runnable"
    path = shutil.which(name, path=ctx.path)
    if path is None:
        return failed(
            id_, title, [f"{name} not found in PATH={ctx.path}"], INSTALL_FIX.format(name=name)
        )
    code, line = _run([path, "--version"])
    if code != 0:
        return failed(
            id_,
            title,
            [f"{path} --version: exit {code}: {line or '(no output)'}"],
            f"{path} --version   # read the error; reinstall gpuctk if it is an import error",
        )
    return ok(id_, title, f"{path}: {what}{line}")


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
            f"edit {path} (keys: {', '.join(config.DEFAULTS)}); GPU containers fail until then",
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
    from gpuctk.hook.runtime_main import find_runtime

    names = list(found.settings.runtimes)
    try:
        path = find_runtime(names, {"PATH": ctx.path})
    except GpuctkError as exc:
        where = found.settings_source if found.settings_source != "defaults" else None
        fix = "apt-get install runc   # or name the runtime's absolute path in `runtimes`"
        if where:
            fix += f" in {where}"
        return failed("runtime.low-level", title, [exc.message], fix)
    return ok("runtime.low-level", title, f"{path} (first usable of {', '.join(names)})")


def _bash_version() -> tuple[int, int] | None:
    code, line = _run(["/bin/bash", "-c", 'echo "${BASH_VERSINFO[0]} ${BASH_VERSINFO[1]}"'])
    try:
        major, minor = (int(x) for x in line.split())
    except ValueError:
        return None
    return (major, minor) if code == 0 else None


def check_create_server(ctx: Context) -> Result:
    from gpuctk import launchers
    from gpuctk.hook import serve

    id_, title = "runtime.create-server", "create server"
    state = os.environ.get(launchers.STATE_DIR_ENV) or ctx.host(launchers.DEFAULT_STATE_DIR)
    pidfile, fifo = os.path.join(state, serve.PIDFILE), os.path.join(state, serve.FIFO)
    start = "systemctl restart gpuctk-create-server"
    try:
        with open(pidfile) as f:
            pid = f.read(32).strip()
    except OSError:
        return skipped(
            id_, title, f"not running ({pidfile} absent): each GPU container's create starts "
            "Python (~15 ms more); `systemctl enable --now gpuctk-create-server` serves them",
        )  # fmt: skip
    comm = ""
    try:
        with open(ctx.proc(f"{int(pid)}/comm")) as f:
            comm = f.read().strip()
    except (OSError, ValueError):
        pass
    if comm != launchers.SERVE_COMM:
        seen = f"a process called {comm!r}" if comm else "no live process"
        return warning(
            id_, title, [f"{pidfile} names pid {pid}: {seen} under {ctx.proc_root}, not "
                         f"{launchers.SERVE_COMM}; GPU creates start Python"], start,
        )  # fmt: skip
    try:
        is_fifo = stat.S_ISFIFO(os.lstat(fifo).st_mode)
    except OSError:
        is_fifo = False
    if not is_fifo:
        return warning(id_, title, [f"{fifo} is not a FIFO: GPU creates start Python"], start)
    if ctx.host_root in ("", "/"):
        bash = _bash_version()
        if bash is None or bash < (5, 1):
            have = "no /bin/bash" if bash is None else f"bash {bash[0]}.{bash[1]}"
            return warning(
                id_, title, [f"pid {pid} serves {fifo}, but the runtime's front needs bash 5.1+ "
                             f"to reach it and this host has {have}: GPU creates start Python"],
                "install bash 5.1 or later",
            )  # fmt: skip
    return ok(id_, title, f"pid {pid} serves {fifo}: GPU creates skip the Python start")


def runtime_checks(ctx: Context, found: Findings) -> list[Result]:
    config = check_config(ctx, found)
    return [
        check_binary(ctx, "gpuctk-runtime", "passes --version to "),
        check_binary(ctx, "gpuctk-hook", ""),
        config,
        check_low_level(ctx, found),
        check_create_server(ctx),
    ]
