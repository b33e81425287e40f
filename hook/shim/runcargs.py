"""runc's arguments as gpuctk-runtime reads them: the one reader in Python (`parse_argv`) and the
tables both the sh front (gpuctk.install.launchers) and the compiled create (hook/shimfront.c,
through gpuctk_vocab.h) take their flags from.

Flags are read as runc (Go flag + urfave/cli) reads them: `--bundle X`, `--bundle=X`, `-b X`,
`-b=X`, `-bundle X`, flags after the container id; crun's `-bX` too. A flag not in a VALUE table
takes no value. The compiled create reads the usual create only: the global flags that take a
value and FRONT_GLOBAL_BOOL_FLAGS, then FRONT_VERB_VALUE_FLAGS (the verb's value flags but
crun's --config), FRONT_VERB_BOOL_FLAGS and one container id, each once; anything else (--debug
among them) is the Python shim's.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

CREATE = "create"
INJECT_VERBS = frozenset((CREATE, "run"))
BUNDLE, BUNDLE_SHORT = "bundle", "b"
CONFIG_FLAGS = frozenset(("config", "f"))  # crun's: a config file of another name
LOG, LOG_FORMAT = "log", "log-format"
PID_FILE = "pid-file"
GLOBAL_VALUE_FLAGS = frozenset(
    (LOG, LOG_FORMAT, "root", "criu", "rootless", "cgroup-manager", "log-level")
)
FRONT_VERB_VALUE_FLAGS = frozenset(
    (BUNDLE, BUNDLE_SHORT, PID_FILE, "console-socket", "preserve-fds", "pidfd-socket")
)
VERB_VALUE_FLAGS = FRONT_VERB_VALUE_FLAGS | CONFIG_FLAGS
FRONT_GLOBAL_BOOL_FLAGS = frozenset(("systemd-cgroup",))
FRONT_VERB_BOOL_FLAGS = frozenset(("no-new-keyring", "no-pivot"))


class Invocation:
    """What the engine asked for, as far as the shim cares."""

    __slots__ = (
        "bundle",
        "config_name",
        "container",
        "debug",
        "global_args",
        "globals",
        "log",
        "log_format",
        "no_value",
        "verb",
    )

    def __init__(self) -> None:
        self.verb = ""
        self.log = ""
        self.log_format = "text"
        self.debug = False
        self.bundle = ""
        self.config_name = "config.json"
        self.container = ""
        self.globals: list[str] = []  # the flag names before the verb
        self.global_args: list[str] = []  # the arguments before the verb, as given
        self.no_value = ""  # the verb's --bundle/--config flag given without a value


def _flag(token: str) -> tuple[str, str | None]:
    """("bundle", "X") from "--bundle=X", ("b", None) from "-b"."""
    name, sep, value = token.lstrip("-").partition("=")
    return name, (value if sep else None)


def parse_argv(args: Sequence[str]) -> Invocation:
    """The invocation in runc's arguments (argv without argv[0])."""
    inv = Invocation()
    i = 0
    while i < len(args):  # global flags, up to the verb
        token = args[i]
        i += 1
        if token == "--":
            break
        if not token.startswith("-") or token == "-":
            inv.verb, inv.global_args = token, list(args[: i - 1])
            break
        name, value = _flag(token)
        inv.globals.append(name)
        if value is None and name in GLOBAL_VALUE_FLAGS and i < len(args):
            value, i = args[i], i + 1
        if name == LOG:
            inv.log = value or ""
        elif name == LOG_FORMAT:
            inv.log_format = value or "text"
        elif name == "debug":
            inv.debug = value is None or value.lower() in ("1", "t", "true")
    if not inv.verb and i < len(args) and args[i - 1] == "--":
        inv.verb, i = args[i], i + 1
    while i < len(args):  # the verb's flags and positionals
        token = args[i]
        i += 1
        if token == "--":
            if not inv.container and i < len(args):
                inv.container = args[i]
            break
        if not token.startswith("-") or token == "-":
            inv.container = inv.container or token
            continue
        name, value = _flag(token)
        crun_attached = token[1:2] in ("b", "f") and len(token) > 2  # crun's -bDIR, -fFILE
        if value is None and name not in VERB_VALUE_FLAGS and crun_attached:
            name, value = token[1], token[2:]
        if value is None and name in VERB_VALUE_FLAGS:
            if i >= len(args):
                inv.no_value = token
                break
            value, i = args[i], i + 1
        if name in (BUNDLE, BUNDLE_SHORT) and value is not None:
            inv.bundle = value
        elif name in CONFIG_FLAGS and value is not None:
            inv.config_name = value
    return inv


def usage_problem(inv: Invocation) -> str:
    """What makes the arguments unreadable to the shim ("" when nothing does)."""
    if not inv.verb:
        return "no verb given (create, start, state, delete, ...)"
    if inv.no_value and inv.verb in INJECT_VERBS:
        return f"{inv.verb}: {inv.no_value} needs a value"
    return ""
