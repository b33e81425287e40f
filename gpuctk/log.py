"""Every log line gpuctk writes: the `gpuctk` command's, the shim's and the hook's.

- The command (`say`, `warning`, `debug`): status lines and `gpuctk: LEVEL: message` on stderr;
  the root command's `--debug`/`-d` (set_debug) turns debug lines on, its `--quiet` (set_quiet)
  leaves only errors.
- The shim (RuncLog): runc's format, to the engine's `--log` file in its `--log-format`. runc
  (logrus) writes, per line:

      text: time="2024-05-01T10:00:00Z" level=error msg="the message"
      json: {"level":"error","msg":"the message","time":"2024-05-01T10:00:00Z"}

  The engine reads that file back when a runtime call fails (containerd takes the last error
  line as the reason), so an error the shim reports there reads like runc's own. Without
  `--log`, runc logs to stderr, and so does the shim (warnings and errors; info lines only
  with --debug); like runc's `fatal`, an error is also printed as a plain line on stderr when
  the log goes to a file. The configured extra log file (config `log-file`) gets text lines,
  each starting `gpuctk-runtime: ` once; there, where every container's lines meet, a create's
  warning and error lines name the container (`gpuctk-runtime: ID: ...`), as its info lines
  do. The engine's log (one per container) and stderr carry the same line, unnamed.
- The hook (`hook`, one HookLog): warnings and errors on stderr (runc and crun show a hook's
  stderr when it fails); with GPUCTK_HOOK_LOG, every line at or above GPUCTK_HOOK_LOG_LEVEL
  (debug, info, warning or error; default info) is also appended in runc's text format.

A bug (an internal error) in the shim or the hook writes its traceback, as one escaped line
before the one-line reason, to every log file there is (the engine's `--log` file, `log-file`,
GPUCTK_HOOK_LOG whatever its level); stderr gets the traceback only with `--debug`.

Nothing is ever written to stdout (engines parse runc's stdout for some verbs). Each file line
is one O_APPEND write on a freshly opened descriptor; the `log-file` and GPUCTK_HOOK_LOG files
are opened by gpuctk.fs.append_trusted (an absolute path, no link followed, never blocking, a
regular file in a folder root alone can write) and, refused, are dropped after one warning.
Deliberately not the logging module: its import would cost every start more than the lines
(docs/benchmarks.md, import costs).
"""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, TextIO

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
STDERR_PATHS = ("/dev/stderr", "/proc/self/fd/2")  # an engine --log that is stderr, as none
_TO_STDERR = ("", *STDERR_PATHS)
SHIM_PREFIX = "gpuctk-runtime: "
ENGINE_FORMATS = ("text", "json")  # runc's --log-format; the first for any other
# where gpuctk-runtime's compiled create puts the time and the container id in a line the shim
# wrote for it (shim_lines; hook/shimfront.c)
STAMP_MARK, ID_MARK = "@time@", "@id@"

# --- the command ---------------------------------------------------------------------------

_debug = False
_quiet = False


def set_debug(enabled: bool) -> None:
    """Show debug lines (the root command's `--debug`)."""
    global _debug
    _debug = enabled


def set_quiet(enabled: bool) -> None:
    """Show errors only: no warning or debug lines (the root command's `--quiet`, which wins
    over `--debug` as in nvidia-ctk)."""
    global _quiet
    _quiet = enabled


def say(line: str) -> None:
    """A status line on stderr (what was written, a note): errors only under `--quiet`."""
    if not _quiet:
        print(line, file=sys.stderr, flush=True)


def warning(message: str) -> None:
    if not _quiet:
        print(f"gpuctk: warning: {message}", file=sys.stderr)


def debugging() -> bool:
    """Whether debug lines are shown (to skip work that only feeds them)."""
    return _debug and not _quiet


def debug(message: str) -> None:
    if _debug and not _quiet:
        print(f"gpuctk: debug: {message}", file=sys.stderr)


# --- runc's line format --------------------------------------------------------------------


STAMP_FORMAT = "%Y-%m-%dT%H:%M:%S"  # Go's time.RFC3339 up to the zone, for strftime


def zone(offset: int) -> str:
    """Go's time.RFC3339 zone for `offset` seconds east of UTC: "Z", else "+HH:MM"."""
    if offset == 0:
        return "Z"
    hours, minutes = divmod(abs(offset) // 60, 60)
    return f"{'+' if offset > 0 else '-'}{hours:02d}:{minutes:02d}"


def rfc3339(now: float | None = None) -> str:
    """Local time as Go's time.RFC3339 ("2006-01-02T15:04:05Z07:00")."""
    t = time.localtime(now)
    return time.strftime(STAMP_FORMAT, t) + zone(t.tm_gmtoff or 0)


def stamp_zone() -> list[Any]:
    """[offset, zone] of the local time now: what gpuctk-runtime's compiled create stamps the
    plan's lines with (STAMP_FORMAT, then this zone) while the local offset is still this one
    (hook/shimfront.c); the zone's rule stays here."""
    offset = time.localtime().tm_gmtoff or 0
    return [offset, zone(offset)]


def _quote(text: str) -> str:
    """A Go %q-like double-quoted string (what logrus uses for values that need quoting)."""
    out = text.replace("\\", "\\\\").replace('"', '\\"')
    out = out.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    if any(c < " " or c == "\x7f" for c in out):
        out = "".join(f"\\x{ord(c):02x}" if c < " " or c == "\x7f" else c for c in out)
    return f'"{out}"'


def _json_string(text: str) -> str:
    out = text.replace("\\", "\\\\").replace('"', '\\"')
    out = out.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    if any(c < " " or c == "\x7f" for c in out):
        out = "".join(f"\\u{ord(c):04x}" if c < " " or c == "\x7f" else c for c in out)
    return f'"{out}"'


def format_line(
    level: str, msg: str, fmt: str = "text", now: float | None = None, stamp: str = ""
) -> str:
    """One log line (with its newline) in runc's `fmt` ("text" or "json"), at `now` (or with
    the time `stamp`)."""
    stamp = stamp or rfc3339(now)
    if fmt == "json":
        # keys in logrus's (sorted) order; _json_string escapes what JSON needs here
        return f'{{"level":"{level}","msg":{_json_string(msg)},"time":"{stamp}"}}\n'
    return f'time="{stamp}" level={level} msg={_quote(msg)}\n'


def _append(path: str, line: str) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        return False
    try:
        os.write(fd, line.encode("utf-8", "backslashreplace"))
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _append_trusted(path: str, line: str, mode: int) -> str | None:
    from gpuctk.fs import append_trusted

    return append_trusted(path, line.encode("utf-8", "backslashreplace"), mode)


def traceback_text(exc: BaseException) -> str:
    """`exc`'s traceback as one message (the log files keep it on one line, escaped)."""
    import traceback  # only here: its import (linecache, tokenize) costs every start

    return "traceback: " + "".join(traceback.format_exception(exc)).rstrip()


# --- the shim ------------------------------------------------------------------------------


class RuncLog:
    """Where the shim's messages go: the engine's log (or stderr) and an optional extra file."""

    __slots__ = ("container", "engine_format", "engine_path", "extra_path", "stderr", "threshold")

    def __init__(
        self,
        engine_path: str | None = None,
        engine_format: str = "text",
        *,
        level: str = "info",
        stderr: TextIO | None = None,
    ) -> None:
        self.engine_path = engine_path or ""
        self.engine_format = engine_format if engine_format in ENGINE_FORMATS else "text"
        self.extra_path = ""
        self.threshold = LEVELS.get(level, 20)
        self.stderr = stderr
        self.container = ""  # set for a create: its warning and error lines name the container

    def configure(self, extra_path: str = "", level: str | None = None) -> None:
        """Add the configured log file and level once the config has been read (the engine's
        --debug still wins: debug lines then flow whatever the configured level)."""
        self.extra_path = extra_path
        if level is not None and self.threshold > LEVELS["debug"]:
            self.threshold = LEVELS.get(level, LEVELS["info"])

    def _tagged(self, rank: int, msg: str) -> str:
        """`msg` naming the container (after the shim's prefix) for a warning or an error."""
        body = msg.removeprefix(SHIM_PREFIX)
        if not self.container or rank < LEVELS["warning"] or body.startswith(self.container + ":"):
            return msg
        return f"{msg[: len(msg) - len(body)]}{self.container}: {body}"

    def log(self, level: str, msg: str) -> None:
        rank = LEVELS[level]
        if rank < self.threshold:
            return
        if self.engine_path not in _TO_STDERR:
            _append(self.engine_path, format_line(level, msg, self.engine_format))
        elif rank >= LEVELS["warning"] or self.threshold <= LEVELS["debug"]:
            # no --log: the engine's stderr; routine info lines only with --debug
            self._write_stderr(format_line(level, msg, self.engine_format))
        if self.extra_path:
            line = file_line(level, self._tagged(rank, msg))
            why = _append_trusted(self.extra_path, line, 0o644)
            if why is not None:  # say so once, then log without it
                path, self.extra_path = self.extra_path, ""
                self.log("warning", f"gpuctk-runtime: log-file {path}: {why}")

    def _write_stderr(self, text: str) -> None:
        try:
            stream = self.stderr or sys.stderr
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):
            pass

    def debug(self, msg: str) -> None:
        self.log("debug", msg)

    def info(self, msg: str) -> None:
        self.log("info", msg)

    def warning(self, msg: str) -> None:
        self.log("warning", msg)

    def error(self, msg: str) -> None:
        """An error, as runc's `fatal` reports one: in the log, and plainly on stderr when the
        log is a file (it is already on stderr otherwise). Never filtered by the level."""
        saved, self.threshold = self.threshold, 0
        try:
            self.log("error", msg)
        finally:
            self.threshold = saved
        if self.engine_path not in _TO_STDERR:
            self._write_stderr(msg + "\n")

    def internal_error(self, msg: str, exc: BaseException, debug: bool) -> None:
        """A bug: its traceback goes to the log files always (before the error line, so that
        the engine still reads the one-line reason last), to stderr only with `debug`."""
        text = traceback_text(exc)
        if self.engine_path not in _TO_STDERR:
            _append(self.engine_path, format_line("error", text, self.engine_format))
        if self.extra_path:
            _append_trusted(
                self.extra_path, format_line("error", SHIM_PREFIX + text, "text"), 0o644
            )
        if debug:
            self._write_stderr(text + "\n")
        self.error(msg)


def file_line(level: str, msg: str, stamp: str = "") -> str:
    """The line of the configured log file: text, the shim's prefix once."""
    named = msg if msg.startswith(SHIM_PREFIX) else SHIM_PREFIX + msg
    return format_line(level, named, "text", stamp=stamp)


def shim_lines(level: str, log_file: str, msg: str) -> dict[str, Any] | None:
    """The lines RuncLog writes for the info `msg` under the config's log `level` (a RuncLog
    without --debug), the time as STAMP_MARK: {"engine": {--log-format or "": line}, "file":
    line, "zone": stamp_zone()}, none where `level` leaves info out; None at the debug level
    (more lines then)."""
    rank = LEVELS.get(level, LEVELS["info"])
    if rank <= LEVELS["debug"]:
        return None
    if rank > LEVELS["info"]:
        return {}
    engine = {"" if f == ENGINE_FORMATS[0] else f: format_line("info", msg, f, stamp=STAMP_MARK)
              for f in ENGINE_FORMATS}  # fmt: skip
    file = {"file": file_line("info", msg, STAMP_MARK)} if log_file else {}
    return {"engine": engine, **file, "zone": stamp_zone()}


# --- the hook ------------------------------------------------------------------------------


class HookLog:
    """gpuctk-hook's log, configured only by its entry point (configure)."""

    __slots__ = ("level", "path")

    def __init__(self) -> None:
        self.path: str | None = None
        self.level = LEVELS["info"]

    def configure(self, env: Mapping[str, str] | None = None) -> None:
        """Read GPUCTK_HOOK_LOG and GPUCTK_HOOK_LOG_LEVEL from `env` (default: os.environ)."""
        env = os.environ if env is None else env
        self.path = env.get("GPUCTK_HOOK_LOG") or None
        self.level = LEVELS.get(env.get("GPUCTK_HOOK_LOG_LEVEL", "info").lower(), LEVELS["info"])

    def log(self, level: str, message: str, *, to_stderr: bool = True) -> None:
        """Log `message` at `level` (a key of LEVELS); warnings and errors also go to stderr."""
        value = LEVELS[level]
        if to_stderr and value >= LEVELS["warning"]:
            sys.stderr.write(f"gpuctk-hook: {level}: {message}\n")
        path = self.path
        if path is None or value < self.level:
            return
        why = _append_trusted(path, format_line(level, f"gpuctk-hook: {message}"), 0o640)
        if why is not None:  # say so once, then log without it
            sys.stderr.write(f"gpuctk-hook: warning: log file {path}: {why}\n")
            self.path = None

    def debug(self, message: str) -> None:
        self.log("debug", message)

    def info(self, message: str) -> None:
        self.log("info", message)

    def warning(self, message: str) -> None:
        self.log("warning", message)

    def internal_error(self, message: str, exc: BaseException, debug: bool) -> None:
        """A bug: the traceback and the line to the log file always (whatever its level),
        `message` on stderr, the traceback there too only with `debug`."""
        text = traceback_text(exc)
        if debug:
            sys.stderr.write(text + "\n")
        sys.stderr.write(f"gpuctk-hook: {message}\n")
        level, self.level = self.level, LEVELS["debug"]
        try:
            self.log("error", text, to_stderr=False)
            self.log("error", message, to_stderr=False)
        finally:
            self.level = level


hook = HookLog()
