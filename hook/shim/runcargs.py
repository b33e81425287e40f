"""runc's arguments as gpuctk-runtime reads them: `parse_argv`, which asks gpuctk-cdi-hook's
`read_runc` (hook/shimfront.c, the one reading: its compiled create serves the usual create
from it; gpuctk-runtime's front acts on it), and the tables it takes its flags from (through
gpuctk_vocab.h).

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
CONFIG_NAME = "config.json"  # the bundle's config without --config
TEXT = "text"  # the log format without --log-format
DEBUG = "debug"  # a global flag: true without a value, or with 1, t or true in any case
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
        self.log_format = TEXT
        self.debug = False
        self.bundle = ""
        self.config_name = CONFIG_NAME
        self.container = ""
        self.globals: list[str] = []  # the flag names before the verb
        self.global_args: list[str] = []  # the arguments before the verb, as given
        self.no_value = ""  # the verb's --bundle/--config flag given without a value


def parse_argv(args: Sequence[str]) -> Invocation:
    """The invocation in runc's arguments (argv without argv[0]), as gpuctk-cdi-hook reads them
    (`read_runc` in hook/shimfront.c, the one reading; its compiled create serves the usual
    create from the same reading). GpuctkError where the C does not run."""
    from gpuctk.errors import GpuctkError
    from gpuctk.hook import compiled

    done, fields = compiled.asked([compiled.RUNC_ARGS_VERB, *args], "runc's arguments")
    if done.returncode != 0 or len(fields) < 11 or fields[-1] or not fields[8].isdigit():
        raise GpuctkError(f"runc's arguments: {compiled.why(done)}")
    inv = Invocation()
    inv.verb, inv.container, inv.bundle, inv.config_name, inv.log, inv.log_format = fields[:6]
    inv.debug, inv.no_value = fields[6] == "1", fields[7]
    inv.global_args = list(args[: int(fields[8])])
    inv.globals = fields[10:-1]
    return inv


def usage_problem(inv: Invocation) -> str:
    """What makes the arguments unreadable to the shim ("" when nothing does)."""
    if not inv.verb:
        return "no verb given (create, start, state, delete, ...)"
    if inv.no_value and inv.verb in INJECT_VERBS:
        return f"{inv.verb}: {inv.no_value} needs a value"
    return ""
