"""gpuctk-runtime: the runc shim. `create`/`run` get the CDI edits; every other verb passes through.

    gpuctk-runtime [global flags] create --bundle B [flags] ID
      1. read B/config.json (or crun's --config name) through the bundle's fd (gpuctk.hook.bundle)
      2. work out the requested devices (gpuctk.hook.requests.devices); none: go to 5, file
         untouched
      3. resolve them in the CDI spec dirs, filter the driver files by NVIDIA_DRIVER_CAPABILITIES,
         check NVIDIA_REQUIRE_*, apply the edits (gpuctk.cdi.specs.apply)
      4. write config.json back atomically, same mode and owner, every other field kept
      5. execv the low-level runtime (config `runtimes`) with the original arguments

Any error: message in the engine's log (runc's format) and on stderr, exit 1, config.json as it
was. Flags are read as runc reads them (gpuctk.hook.shim.runcargs).

Arguments the shim itself cannot read are a usage error (two lines on stderr, exit 2): no verb, or
a create/run whose --bundle/--config has no value. Every other argument, unknown flags included,
goes to the runtime untouched, under runc's conventions. `--help` (no verb) prints HELP and a
Details line; `--version` (no verb), `gpuctk-runtime version X`, then the runtime's own.

Imports at start: os, sys, time, gpuctk.errors and gpuctk.hook.shim.runcargs (runc's arguments);
the rest only on `create`/`run`. config.json is read and written with the C scanner and encoder
of the stdlib `_json` module directly (gpuctk.jsonfast): the `json` package would import `re`
(and `enum`) for nothing.
"""

from __future__ import annotations

import os
import sys

from gpuctk import __version__
from gpuctk.errors import EXIT_USAGE, GpuctkError, InputError
from gpuctk.hook.shim.runcargs import INJECT_VERBS, Invocation, parse_argv, usage_problem
from gpuctk.log import RuncLog

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import NoReturn

    from gpuctk.cdi.specs.shape import EditsDoc
    from gpuctk.hook.config import Settings

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# set by the front (gpuctk-cdi-hook runtime-front) for the Python it starts when its memo holds
FRONT_RUNTIME_ENV = "GPUCTK_FRONT_RUNTIME"
HELP = """Usage: gpuctk-runtime [GLOBAL OPTIONS] VERB [OPTIONS] CONTAINER-ID

  The runc shim: `create` and `run` get the CDI edits for the GPUs the
  container asks for (CDI annotations, NVIDIA_VISIBLE_DEVICES, device-list
  mounts); then the low-level runtime (runc or crun: the config's `runtimes`)
  runs with the same arguments. Every other verb goes to it untouched.

Options (before the verb; every other flag is the runtime's own):
  --log FILE          the engine's log (runc's format); errors go there
  --log-format FMT    text or json
  --debug             debug lines in the log
  --help              this help; `RUNTIME --help` lists the runtime's own
  --version           gpuctk-runtime's version, then the runtime's

Configuration: /etc/gpuctk/config.toml (GPUCTK_CONFIG names another).
"""  # + details_line


def find_runtime(names: Sequence[str], search: str = DEFAULT_PATH) -> str:
    """The first of `names` that is a trusted executable file: an absolute path as given, a
    bare name in the folders of `search` (DEFAULT_PATH, never the PATH the engine passes:
    containerd puts its own plugin folder first), never this shim itself (a `runc` may be a
    link to it). Trusted: the file and every folder above it writable by root (or this euid)
    alone (gpuctk.fs.open_trusted_file). The path is returned as checked and exec'd by name:
    nobody but root can swap what it names in between, since every folder on it is root's.
    InputError naming each candidate refused and why."""
    from gpuctk.errors import TrustError
    from gpuctk.fs import open_trusted_dir, open_trusted_file, trusted_file

    try:
        me = os.stat(sys.argv[0]) if sys.argv and sys.argv[0] else None
    except OSError:
        me = None
    refused: list[str] = []
    folders: dict[str, int | None] = {}  # search folder -> descriptor, for this call only
    try:
        for name in names:
            if name.startswith("/"):
                candidates = [("", name)]
            else:
                candidates = [(d, name) for d in search.split(":") if d.startswith("/")]
            for folder, leaf in candidates:
                path = f"{folder}/{leaf}" if folder else leaf
                try:
                    if not folder:
                        fd, st = open_trusted_file(path, flags=os.O_PATH)
                    else:
                        if folder not in folders:
                            folders[folder] = None  # kept when missing or refused: skipped
                            folders[folder] = open_trusted_dir(folder)
                        dir_fd = folders[folder]
                        if dir_fd is None:
                            continue
                        fd, st = trusted_file(dir_fd, leaf, folder=folder, flags=os.O_PATH)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                except TrustError as exc:
                    refused.append(f"{path} ({exc.message})")
                    continue
                except OSError as exc:
                    refused.append(f"{path} ({exc.strerror or exc})")
                    continue
                os.close(fd)
                if not st.st_mode & 0o111:
                    refused.append(f"{path} (not executable; fix: chmod +x {path})")
                elif me is None or (st.st_dev, st.st_ino) != (me.st_dev, me.st_ino):
                    return path
    finally:
        for held in folders.values():
            if held is not None:
                os.close(held)
    more = f"; refused: {'; '.join(refused)}" if refused else ""
    raise InputError(
        f"no low-level runtime found: tried {', '.join(names)} (names in {search}){more}; "
        "set `runtimes` in the gpuctk config"
    )


def inject(
    inv: Invocation, settings: Settings, log: RuncLog, runtime: str = "", compiled: str = ""
) -> None:
    """Steps 1-4 for a `create`/`run` (no-op when the container asks for nothing). A request
    resolved before in the same specs takes its remembered plan (gpuctk.hook.shim.plans).
    `compiled`: as main's."""
    from gpuctk.hook.bundle import open_bundle

    bundle = inv.bundle or os.getcwd()
    bundle_fd, dir_fd, name = open_bundle(bundle, inv.config_name)
    try:
        _inject(inv, settings, log, bundle, bundle_fd, dir_fd, name, (runtime, compiled))
    finally:
        if dir_fd != bundle_fd:
            os.close(dir_fd)
        os.close(bundle_fd)


def _inject(
    inv: Invocation,
    settings: Settings,
    log: RuncLog,
    bundle: str,
    bundle_fd: int,
    dir_fd: int,
    name: str,
    runtimes: tuple[str, str],
) -> None:
    from gpuctk.cdi.specs import apply
    from gpuctk.hook.bundle import read_config, write_config
    from gpuctk.hook.requests import cdiedits
    from gpuctk.hook.requests.devices import env_map
    from gpuctk.hook.shim import frontplan, shimroot
    from gpuctk.hook.shim.plans import Plans, key_of

    path = os.path.join(bundle, inv.config_name)
    doc, st, write_name, text = read_config(dir_fd, name, path)
    req = cdiedits.request(doc, settings, log.warning)
    if req is None:
        log.debug(f"{inv.container}: no GPU requested; {path} left as it is")
        return
    if write_name is None:
        raise InputError(
            f"{path} is a symlink out of its folder: not edited for a GPU request; "
            "fix: make it a regular file in the bundle"
        )
    process = doc.get("process")
    key = key_of(req, env_map(process.get("env") if isinstance(process, dict) else None))
    plans = Plans.for_this_process(settings.spec_dirs)
    plan = plans.get(key) if plans is not None else None
    runtime, compiled = runtimes
    if plan is not None and plans is not None:
        log.debug(f"{inv.container}: the request's plan remembered in {plans.path}")
        for note in plan["notes"]:
            log.warning(note)
        edits: EditsDoc = plan["edits"]
        prep = plan["prep"]
        if not plan["notes"]:  # the world now: a plan found holds for the specs as they are
            frontplan.keep(
                compiled, text, plans.state, req, edits, settings, plans.snapshot, runtime,
                log.warning,
            )  # fmt: skip
    else:
        before = plans.snapshot() if plans is not None else None
        notes: list[str] = []

        def warn(note: str) -> None:
            notes.append(note)
            log.warning(note)

        edits, errors = cdiedits.edits_for(req, doc, settings, warn)
        prep = shimroot.prepare(edits)
        if (
            plans is not None
            and not errors
            and plans.offer(key, before, {"edits": edits, "notes": notes, "prep": prep})
            and not notes
        ):
            frontplan.keep(
                compiled, text, plans.state, req, edits, settings, lambda: before, runtime,
                log.warning,
            )  # fmt: skip
    from gpuctk.hook.verbs.nodeguard import mode

    edits = shimroot.take_over(
        doc, bundle, edits, log.debug, prep, bundle_fd=bundle_fd, protect=mode(settings),
        warn=log.warning,
    )  # fmt: skip
    apply.apply(doc, edits)
    write_config(dir_fd, write_name, path, doc, st)
    log.info(cdiedits.injected(inv.container, req))


def prepare(args: list[str], front: str = "", compiled: str = "") -> tuple[int, str, RuncLog]:
    """Everything `main` does before it execs the low-level runtime: (exit status, runtime,
    log). Status 0: exec the runtime with `args`; anything else: the error is already logged.
    `front`: the runtime the front's memo names (then neither searched for nor
    remembered, once find_runtime finds the file trusted; ignored unless an absolute
    path); `compiled`: as main's."""
    front = front if front.startswith("/") else ""
    inv = parse_argv(args)
    log = RuncLog(inv.log, inv.log_format, level="debug" if inv.debug else "info")
    if inv.verb in INJECT_VERBS:
        log.container = inv.container
    runtime = ""
    try:
        from gpuctk.hook.requests import failsafe
        from gpuctk.hook.shim.memo import forget_runtime, remember_runtime, request_markers

        # a broken config file stops GPU creates only (gpuctk.hook.requests.failsafe); every verb
        # runs the runtime the file names validly, else the defaults
        settings, broken = failsafe.load()
        settings_ok = broken is None
        if broken is not None and inv.verb not in INJECT_VERBS:
            which = failsafe.runtimes_said(settings)
            log.warning(f"gpuctk-runtime: {broken.message}; using {which}")
        log.configure(settings.log_file, settings.log_level)
        if front and settings_ok and inv.verb in INJECT_VERBS:
            try:  # the front checked its memo against this config; the file is checked here
                runtime = find_runtime([front])
            except InputError as exc:
                log.debug(f"gpuctk-runtime: the front's runtime: {exc.message}")
                forget_runtime()  # the front must not exec it for the verbs that follow
        if not runtime:
            try:
                runtime = find_runtime(settings.runtimes)
            except InputError:
                forget_runtime()  # whatever runtime it names is no longer found
                raise
            if settings_ok:
                remember_runtime(runtime, markers=request_markers(settings), settings=settings)
        if inv.verb in INJECT_VERBS and broken is not None:  # no GPU: left as it is
            failsafe.gate_create(inv.bundle or os.getcwd(), inv.config_name, settings, broken, log)
        elif inv.verb in INJECT_VERBS:
            inject(inv, settings, log, runtime, compiled)
    except GpuctkError as exc:
        log.error(f"gpuctk-runtime: {exc.message}")
        return 1, runtime, log
    except Exception as exc:  # a bug: say so, keep the engine's error path working
        message = f"gpuctk-runtime: internal error: {type(exc).__name__}: {exc}"
        log.internal_error(message, exc, inv.debug)
        return 1, runtime, log
    return 0, runtime, log


def _unread(args: list[str], exc: GpuctkError) -> NoReturn:
    """Where runc's arguments cannot be read (gpuctk-cdi-hook missing or failing): the runtime
    the config names runs them as given, so that no state, kill or delete is stopped; any
    argument that may be a create or run fails, as that container's GPUs cannot be given."""
    message = f"gpuctk-runtime: error: {exc.message}"
    if not any(arg in INJECT_VERBS for arg in args):
        from gpuctk.hook.requests import failsafe

        try:
            runtime = find_runtime(failsafe.load()[0].runtimes)
            sys.stderr.write(f"{message}; {runtime} runs the arguments as given\n")
            os.execv(runtime, [runtime, *args])
        except (GpuctkError, OSError, ValueError) as why:
            message += f"; no runtime to run them: {why}"
    sys.stderr.write(f"{message}\n")
    sys.exit(1)


def main(argv: Sequence[str] | None = None, compiled: str = "") -> NoReturn:
    """`compiled`: the launchers' compiled create, which front plans are written for."""
    args = list(sys.argv[1:] if argv is None else argv)
    front = os.environ.pop(FRONT_RUNTIME_ENV, "")
    try:
        inv = parse_argv(args)
    except GpuctkError as exc:  # no gpuctk-cdi-hook to read them: a broken install
        _unread(args, exc)
    if not inv.verb and ("help" in inv.globals or "h" in inv.globals):
        from gpuctk.helpdoc import details_line

        sys.stdout.write(f"{HELP}{details_line('gpuctk-runtime')}\n")
        sys.exit(0)
    if not inv.verb and "version" in inv.globals:
        sys.stdout.write(f"gpuctk-runtime version {__version__}\n")
        sys.stdout.flush()  # before the runtime's own lines
    elif usage_problem(inv):
        message = f"gpuctk-runtime: error: {usage_problem(inv)}"
        if inv.log:
            RuncLog(inv.log, inv.log_format).error(message)
        sys.stderr.write(f"{message}\nTry 'gpuctk-runtime --help'.\n")
        sys.exit(EXIT_USAGE)
    status, runtime, log = prepare(args, front, compiled)
    if status:
        sys.exit(status)
    try:
        os.execv(runtime, [runtime, *args])
    except OSError as exc:
        log.error(f"gpuctk-runtime: cannot run {runtime}: {exc.strerror or exc}")
        sys.exit(1)
