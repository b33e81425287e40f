"""`gpuctk-hook`: the OCI hook binary named in gpuctk's CDI specs.

    gpuctk-hook createContainer [--link TARGET::LINK]... [--link-for CAP:TARGET::LINK]...
                    [--folder DIR]... [--mode M --path P]... [--ld-cache FILE]
                    [--disable-hook NAME]...        (an action left out: gpuctk.hook.verbs.actions)
    gpuctk-hook create-symlinks --link TARGET::LINK...        (nvidia-ctk hook verbs, one by one)
    gpuctk-hook update-ldcache --folder DIR...
    gpuctk-hook chmod --mode M --path P...
    gpuctk-hook disable-device-node-modification             (gpuctk.hook.verbs.nodeprotect)
    gpuctk-hook prestart | createRuntime | precreate           (no shim: gpuctk.hook.verbs.prestart)
    gpuctk-hook createRuntime | poststop --netdev IF[::NAME]... (NICs: gpuctk.hook.verbs.netdev)
    gpuctk-hook --version

Every verb reads the OCI state on stdin (or takes --container-spec PATH to a config.json), finds
the container root from the bundle's config.json and does all its work inside that root, in one
process. An unknown verb or option logs a warning and is ignored (exit 0), so that a spec written
by a newer gpuctk never blocks a container. Arguments it cannot read at all (no verb, an option
before the verb, a verb's option without its value) are a usage error: `gpuctk-hook: error: ...`
and `Try 'gpuctk-hook --help'.` on stderr, exit 2. Other errors: one line on stderr, exit 1 (runc's
convention: runc shows it; crun 1.8 shows only the exit code, so a spec's hook env should name
a GPUCTK_HOOK_LOG file). Logs: never stdout; see gpuctk.log (hook).

The modes for engines without the shim: `prestart` / `createRuntime` (run in the runtime's
namespaces: enter /proc/<pid>/ns/mnt after checking the pid, then the same in-root steps) and
`precreate` (config.json in, edited config out) live in gpuctk.hook.verbs.prestart and .precreate,
dispatched in `_run` before the verbs above.

Imports are kept to the standard library, gpuctk.errors, gpuctk.rootfs and this package: the
hook runs at every container start. Packaging should run it as `python3 -I` (isolated: no
PYTHON* variables, no user site): the hook entry in a spec carries an explicit env in any case.
"""

from __future__ import annotations

import os
import sys

from gpuctk import __version__
from gpuctk.cdi.node import facts
from gpuctk.errors import EXIT_FAILURE, GpuctkError, UsageError
from gpuctk.log import hook as hooklog

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: typing's import is costly at every start
if TYPE_CHECKING:
    from collections.abc import Callable

    from gpuctk.hook.verbs.actions import Request

# the spec entry's options, by name (their words are gpuctk.cdi.node.facts', as the C's are)
LINK, LINK_FOR, FOLDER, LD_CACHE, DISABLE = (
    o.removeprefix("--")
    for o in (facts.LINK_OPT, facts.LINK_FOR_OPT, facts.FOLDER_OPT, facts.LD_CACHE_OPT,
              facts.DISABLE_OPT)
)  # fmt: skip
OPTIONS = facts.HOOK_OPTIONS  # verb -> the options it takes
VERBS = tuple(OPTIONS)  # gpuctk-hook's in-root verbs
USAGE = """Usage: gpuctk-hook [OPTIONS] VERB [VERB OPTIONS]

  The OCI hook named in gpuctk's CDI specs: reads the OCI state on stdin (or
  --container-spec PATH to a config.json) and works inside the container's root.

Verbs:
  createContainer [--link T::L]... [--link-for CAP:T::L]... [--folder DIR]...
      [--mode M --path P]... [--ld-cache FILE]
                                 --link-for: when the container asks for CAP
  create-symlinks --link TARGET::LINK...     one step of createContainer
  update-ldcache --folder DIR...             one step of createContainer
  chmod --mode M --path P...                 one step of createContainer
  disable-device-node-modification           one step of createContainer
  prestart | createRuntime | precreate       for engines without gpuctk-runtime
  createRuntime | poststop --netdev IF[::NAME]...    network interfaces (NICs)

Options:
  --debug      a traceback on internal errors
  --help       this help
  --version    the version

An unknown verb or a verb's unknown option is ignored with a warning.
"""  # + details_line


Parts = dict[tuple[str, str], tuple[str, str, str]]  # (NAME, VALUE) -> how a link value splits


def parse(verb: str, argv: list[str]) -> tuple[dict[str, list[str]], Parts, list[str]]:
    """Options of `verb` as name -> values, the split of each --link and --link-for value that
    splits ((NAME, VALUE) -> (CAPABILITY or "", TARGET, LINK)), and the arguments ignored: as
    gpuctk-cdi-hook reads them at every container start (gpuctk.hook.compiled.read_args)."""
    from gpuctk.hook import compiled

    values: dict[str, list[str]] = {name: [] for name in OPTIONS[verb]}
    parts: Parts = {}
    ignored: list[str] = []
    for kind, start, _stop, name, value, cap, target, link in compiled.read_args(verb, argv):
        if kind == "i":
            ignored.append(argv[start])
            continue
        values[name].append(value)
        if kind == "l":
            parts[name, value] = (cap, target, link)
    return values, parts, ignored


def _request(verb: str, values: dict[str, list[str]], parts: Parts) -> Request:
    from gpuctk.hook.verbs.actions import Request

    def one(name: str) -> str | None:
        got = values.get(name) or []
        if len(got) > 1:
            raise GpuctkError(f"{verb}: --{name} given more than once")
        return got[0] if got else None

    return Request(
        verb=verb,
        links=values.get(LINK, []),
        links_for=values.get(LINK_FOR, []),
        folders=values.get(FOLDER, []),
        mode=one("mode"),
        paths=values.get("path", []),
        ldconfig=one("ldconfig-path") or os.environ.get("GPUCTK_LDCONFIG") or None,
        container_spec=one("container-spec"),
        run_ldconfig=verb == facts.LDCACHE_ACTION or bool(values.get(FOLDER)),
        disabled=values.get(DISABLE, []),
        ld_cache=one(LD_CACHE),
        parts=parts,
    )


def _run(argv: list[str]) -> int:
    words = [a for a in argv if a not in ("--debug",)]
    if words and words[0] in ("-h", "--help", "help"):
        from gpuctk.helpdoc import details_line

        sys.stdout.write(f"{USAGE}{details_line('gpuctk-hook')}\n")
        return 0
    if words and words[0] in ("--version", "version"):
        sys.stdout.write(f"gpuctk-hook version {__version__}\n")
        return 0
    if not words:
        raise UsageError("no verb given (createContainer, prestart, precreate, ...)")
    verb = words[0]
    if verb.startswith("-"):
        raise UsageError(f"no such option: {verb} (options of a verb go after it)")
    if verb in ("createRuntime", "poststop") and any(
        w == "--netdev" or w.startswith("--netdev=") for w in words[1:]
    ):  # a NIC spec's entry: move network interfaces (gpuctk.hook.verbs.netdev, pyroute2)
        from gpuctk.hook.verbs import netdev

        return netdev.main(verb, words[1:])
    if verb in ("prestart", "createRuntime", "precreate"):  # engines without the shim
        from gpuctk.hook.verbs import prestart

        return prestart.main(verb, words[1:])
    from gpuctk.hook import compiled

    if verb in compiled.SERVED_VERBS or compiled.ROOT_FD_OPT in words[1:]:
        # gpuctk-cdi-hook's own forms, run by this gpuctk-hook: the one beside it handed them
        # back, so it is one from before them
        raise GpuctkError(
            f"{verb} {' '.join(words[1:3])}...: a form of {compiled.PROGRAM} that the "
            f"{compiled.PROGRAM} beside gpuctk-hook does not know (an older build): reinstall "
            "gpuctk (pip install ., the deb, or gpuctk install) so that both come from one build"
        )
    if verb not in OPTIONS:
        hooklog.warning(f"unknown verb {verb!r} ignored (written by a newer gpuctk?)")
        return 0
    # the verb's arguments as given: a --debug among them is the C's to tell from a value
    values, parts, ignored = parse(verb, argv[argv.index(verb) + 1 :])
    for arg in ignored:
        hooklog.warning(f"{verb}: unknown argument {arg!r} ignored")
    from gpuctk.hook.verbs.actions import run_request  # not for prestart's nothing-requested exit

    run_request(_request(verb, values, parts))
    return 0


def main(argv: list[str] | None = None, *, exit: Callable[[int], object] = sys.exit) -> None:
    """Console-script entry point: run, turn errors into one stderr line and exit 1 (a usage
    error: two lines, exit 2)."""
    args = sys.argv[1:] if argv is None else argv
    hooklog.configure()
    try:
        code = _run(args)
    except UsageError as exc:
        hooklog.log("error", exc.message, to_stderr=False)
        sys.stderr.write(f"gpuctk-hook: error: {exc.message}\nTry 'gpuctk-hook --help'.\n")
        code = exc.exit_code
    except GpuctkError as exc:
        hooklog.log("error", exc.message, to_stderr=False)
        sys.stderr.write(f"gpuctk-hook: error: {exc.message}\n")
        code = EXIT_FAILURE
    except Exception as exc:  # the edge of the program
        message = f"internal error: {exc.__class__.__name__}: {exc}"
        hooklog.internal_error(message, exc, "--debug" in args)
        code = EXIT_FAILURE
    exit(code)
