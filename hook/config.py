"""gpuctk-runtime configuration: /etc/gpuctk/config.toml, or the file named by GPUCTK_CONFIG.

    runtimes = ["runc", "crun"]            # low-level runtimes, first found wins: a name
                                           # (searched in the system folders, not PATH:
                                           # gpuctk.hook.shim.runtime_main.DEFAULT_PATH) or an
                                           # absolute path; root-owned, not g/o-writable
    spec-dirs = ["/etc/cdi", "/var/run/cdi"]
    default-kind = "nvidia.com/gpu"        # kind given to bare NVIDIA_VISIBLE_DEVICES names
    device-list-kinds = []                 # kinds besides default-kind that the device list
                                           # (NVIDIA_VISIBLE_DEVICES, device mounts) may name
    annotation-prefixes = ["cdi.k8s.io/"]
    accept-envvar-unprivileged = "auto"    # honour NVIDIA_VISIBLE_DEVICES/NVIDIA_IMEX_CHANNELS
                                           # without CAP_SYS_ADMIN: true, false, or "auto" =
                                           # false in a Kubernetes container (the CRI
                                           # runtime's annotations: gpuctk.hook.requests.devices
                                           # .is_kubernetes), true elsewhere
    accept-volume-mounts = false           # /var/run/nvidia-container-devices/* mounts
    disable-device-node-modification = true  # GPU containers see ModifyDeviceFiles: 0
                                           # (gpuctk.hook.verbs.nodeguard); false: not guarded
    log-file = ""                          # an extra log file (text format); "" for none
    log-level = "info"                     # debug, info, warning, error

A missing default file means the defaults; a file named by GPUCTK_CONFIG must exist. Unknown
keys, wrong types and bad values are errors (ValidationError, every problem listed; a key in
IGNORED is accepted and read by nothing); what a
create does under such a file: gpuctk.hook.requests.failsafe. The file
names what root runs: it is read only when it and every folder above it can be written by root
(or the user gpuctk runs as) alone (gpuctk.fs.open_trusted_file); anything else is refused
(TrustError, naming the component at fault and the fix).

Reading: the usual file (top-level `key = value` lines: strings, booleans, one-line arrays of
strings, comments) is parsed by a small exact parser, so container start does not pay for
importing tomllib (and the `re` and `datetime` it pulls in); anything beyond that subset is
handed to the stdlib tomllib, which then decides.
"""

from __future__ import annotations

import os

from gpuctk.errors import InputError, TrustError, ValidationError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

DEFAULT_PATH = "/etc/gpuctk/config.toml"
ENV_VAR = "GPUCTK_CONFIG"
MAX_BYTES = 256 * 1024
LOG_LEVELS = ("debug", "info", "warning", "error")
AUTO = "auto"
DEFAULTS: dict[str, Any] = {
    "runtimes": ["runc", "crun"],
    "spec-dirs": ["/etc/cdi", "/var/run/cdi"],
    "default-kind": "nvidia.com/gpu",
    "device-list-kinds": [],
    "annotation-prefixes": ["cdi.k8s.io/"],
    "accept-envvar-unprivileged": "auto",
    "accept-volume-mounts": False,
    "disable-device-node-modification": True,
    "log-file": "",
    "log-level": "info",
}
# keys a file may hold that nothing reads: the device node guard reads each container's
# own params file, never the host's (gpuctk.hook.verbs.nodeguard)
IGNORED = frozenset(("proc-root",))


class Settings:
    """The validated configuration (attribute names are the keys with '_' for '-')."""

    __slots__ = (
        "accept_envvar_unprivileged",
        "accept_volume_mounts",
        "annotation_prefixes",
        "default_kind",
        "device_list_kinds",
        "disable_device_node_modification",
        "log_file",
        "log_level",
        "runtimes",
        "source",
        "source_identity",
        "spec_dirs",
    )

    def __init__(self, values: Mapping[str, Any] | None = None, source: str = "") -> None:
        merged = {**DEFAULTS, **(values or {})}
        self.runtimes: tuple[str, ...] = tuple(merged["runtimes"])
        self.spec_dirs: tuple[str, ...] = tuple(merged["spec-dirs"])
        self.default_kind: str = merged["default-kind"]
        self.device_list_kinds: tuple[str, ...] = tuple(merged["device-list-kinds"])
        self.annotation_prefixes: tuple[str, ...] = tuple(merged["annotation-prefixes"])
        # None: "auto" (gpuctk.hook.requests.devices.env_allowed decides per container)
        envvar = merged["accept-envvar-unprivileged"]
        self.accept_envvar_unprivileged: bool | None = None if envvar == AUTO else envvar
        self.accept_volume_mounts: bool = merged["accept-volume-mounts"]
        self.disable_device_node_modification: bool = merged["disable-device-node-modification"]
        self.log_file: str = merged["log-file"]
        self.log_level: str = merged["log-level"]
        self.source = source  # the file read, "" for the defaults
        # gpuctk.fs.stat_identity of the file as read (None: the defaults); set by load()
        self.source_identity: tuple[int, int, int, int, int] | None = None


def _str_list_problem(key: str, value: Any) -> str | None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return f"{key}: must be a list of strings"
    if any(not v or "\x00" in v for v in value):
        return f"{key}: entries must be non-empty"
    return None


def check(values: Mapping[str, Any]) -> list[str]:
    """Every problem of a parsed config table."""
    out: list[str] = []
    for key in values:
        if key not in DEFAULTS and key not in IGNORED:
            out.append(_unknown_key(key))
    for key in ("runtimes", "spec-dirs", "annotation-prefixes", "device-list-kinds"):
        if key in values:
            problem = _str_list_problem(key, values[key])
            if problem:
                out.append(problem)
            elif key == "runtimes" and not values[key]:
                out.append("runtimes: name at least one runtime")
            elif key == "runtimes":
                for v in values[key]:
                    if "/" in v and not v.startswith("/"):
                        out.append(f"runtimes: {v!r} must be a name or an absolute path")
            elif key == "spec-dirs":
                for v in values[key]:
                    if not v.startswith("/"):
                        out.append(f"spec-dirs: {v!r} must be an absolute path")
            elif key == "device-list-kinds":
                from gpuctk.cdi.specs.names import kind_problem

                out += [f"{key}: {p}" for p in map(kind_problem, values[key]) if p]
    envvar = values.get("accept-envvar-unprivileged", AUTO)
    if not isinstance(envvar, bool) and envvar != AUTO:
        out.append(f'accept-envvar-unprivileged: must be true, false or "{AUTO}"')
    for key in (
        "accept-volume-mounts",
        "disable-device-node-modification",
    ):
        if key in values and not isinstance(values[key], bool):
            out.append(f"{key}: must be true or false")
    for key in ("default-kind", "log-file", "log-level"):
        if key in values and not isinstance(values[key], str):
            out.append(f"{key}: must be a string")
    if isinstance(values.get("default-kind"), str):
        from gpuctk.cdi.specs.names import kind_problem

        problem = kind_problem(values["default-kind"])
        if problem:
            out.append(f"default-kind: {problem}")
    log_file = values.get("log-file")
    if isinstance(log_file, str) and log_file and not log_file.startswith("/"):
        out.append(f"log-file: {log_file!r} must be an absolute path (or empty)")
    level = values.get("log-level")
    if isinstance(level, str) and level not in LOG_LEVELS:
        out.append(f"log-level: {level!r} is not one of {', '.join(LOG_LEVELS)}")
    return out


def _unknown_key(key: str) -> str:
    """The problem line of an unknown key, with the known key it is likely a typo of; one of
    nvidia-ctk's (its tables, its accept-nvidia-* keys) names `gpuctk migrate`."""
    if key.startswith(("nvidia-", "accept-nvidia-")):
        return f"{key}: nvidia-ctk's setting, not gpuctk's (carry its file over: gpuctk migrate)"
    from difflib import get_close_matches  # only for a broken file

    close = get_close_matches(key, list(DEFAULTS), n=1, cutoff=0.75)
    if close:
        return f"{key}: unknown key (did you mean {close[0]}?)"
    return f"{key}: unknown key (known: {', '.join(DEFAULTS)})"


_CONTROL = frozenset(chr(c) for c in (*range(9), *range(10, 32), 127))
_BARE_KEY = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def _simple_string(text: str, i: int) -> tuple[str, int] | None:
    """A basic ("...") or literal ('...') one-line string without escapes at text[i]."""
    quote = text[i]
    if text.startswith(quote * 3, i):
        return None  # a multi-line string: tomllib's call
    end = text.find(quote, i + 1)
    if end < 0:
        return None
    value = text[i + 1 : end]
    if "\\" in value or not _CONTROL.isdisjoint(value):
        return None  # escapes and control characters: tomllib's call
    return value, end + 1


def _simple_value(text: str) -> Any:
    """The value of a one-line `key = value` right-hand side, or None outside the subset."""
    text = text.strip(" \t")
    if text.startswith(("true", "false")):
        value: Any = text.startswith("true")
        rest = text[4 if value else 5 :]
    elif text[:1] in ('"', "'"):
        got = _simple_string(text, 0)
        if got is None:
            return None
        value, end = got
        rest = text[end:]
    elif text.startswith("["):
        items: list[str] = []
        i = 1
        while True:
            while i < len(text) and text[i] in " \t":
                i += 1
            if text[i : i + 1] == "]":
                i += 1
                break
            if text[i : i + 1] not in ('"', "'"):
                return None
            got = _simple_string(text, i)
            if got is None:
                return None
            items.append(got[0])
            i = got[1]
            while i < len(text) and text[i] in " \t":
                i += 1
            if text[i : i + 1] == ",":
                i += 1
            elif text[i : i + 1] != "]":
                return None
        value, rest = items, text[i:]
    else:
        return None
    rest = rest.strip(" \t")
    if rest and not rest.startswith("#"):
        return None
    if not _CONTROL.isdisjoint(rest):
        return None  # control characters in a comment: invalid TOML, tomllib says so
    return value


def parse_simple(text: str) -> dict[str, Any] | None:
    """`text` as a TOML table when it stays within the simple subset, else None."""
    table: dict[str, Any] = {}
    for raw in text.split("\n"):
        line = raw[:-1] if raw.endswith("\r") else raw
        if "\r" in line:
            return None
        stripped = line.strip(" \t")
        if not stripped or stripped.startswith("#"):
            if not _CONTROL.isdisjoint(stripped):
                return None
            continue
        key, sep, rhs = stripped.partition("=")
        key = key.strip(" \t")
        if not sep or not key or not set(key) <= _BARE_KEY or key in table:
            return None
        value = _simple_value(rhs)
        if value is None:
            return None
        table[key] = value
    return table


def parse_table(text: str, source: str) -> dict[str, Any]:
    """The TOML `text` of the file `source` as a table, unchecked; ValidationError when it is
    not TOML."""
    values = parse_simple(text)
    if values is None:
        import tomllib

        try:
            values = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValidationError(f"{source}: invalid TOML: {exc}", [str(exc)]) from None
    return values


def parse(text: str, source: str) -> Settings:
    """Settings from the TOML `text` of the file `source`; ValidationError when invalid."""
    values = parse_table(text, source)
    problems = check(values)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ValidationError(f"{source}: {problems[0]}{more}", problems)
    return Settings(values, source)


def config_path(environ: Mapping[str, str]) -> tuple[str, bool]:
    """(path, explicit): the GPUCTK_CONFIG file when set, else the default path."""
    named = environ.get(ENV_VAR, "")
    return (named, True) if named else (DEFAULT_PATH, False)


def load(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings in force: InputError/ValidationError for an unreadable or bad file,
    TrustError for one that someone other than root (or this euid) could have written."""
    path, text, identity = read(environ)
    if text is None or identity is None:
        return Settings()
    from gpuctk.fs import stat_identity

    settings = parse(text, path)
    settings.source_identity = stat_identity(identity)
    return settings


def read(
    environ: Mapping[str, str] | None = None,
) -> tuple[str, str | None, os.stat_result | None]:
    """(path, text, its stat) of the config file in force; (path, None, None) when the default
    file is absent (the defaults apply). The errors of `load`, but for the file's content."""
    path, explicit = config_path(os.environ if environ is None else environ)
    from gpuctk.fs import open_trusted_file

    try:
        fd, _ = open_trusted_file(path)  # it and every folder above it: root's alone
    except FileNotFoundError:
        if explicit:
            raise InputError(f"{path} (named by {ENV_VAR}): no such file") from None
        return path, None, None
    except TrustError as exc:
        raise TrustError(f"{path}: refused: {exc.message}") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot open: {exc.strerror or exc}") from None
    try:
        data = os.read(fd, MAX_BYTES + 1)
        identity = os.fstat(fd)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise InputError(f"{path}: larger than {MAX_BYTES} bytes")
    try:
        return path, data.decode("utf-8"), identity
    except UnicodeDecodeError as exc:
        raise ValidationError(f"{path}: not UTF-8 (byte {exc.start})") from None
