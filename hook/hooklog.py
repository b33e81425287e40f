"""Logging for gpuctk-hook, configured only by its entry point. Never writes to stdout.

Warnings go to stderr (runc and crun show a hook's stderr when it fails, and drop it when it
succeeds). Every message at or above the configured level is also appended, in runc's text log
format, to the file named by GPUCTK_HOOK_LOG (GPUCTK_HOOK_LOG_LEVEL: debug, info, warning or error;
default info). With no file configured nothing is written anywhere but stderr. The file is
opened as the shim opens its `log-file` (gpuctk.fs.append_trusted: an absolute path, no link
followed, never blocking, a regular file in a folder root alone can write); refused, one warning
on stderr and no log file for the rest of the run.
"""

from __future__ import annotations

import os
import sys
import time

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
STDERR_LEVEL = LEVELS["warning"]


class _Config:
    path: str | None = None
    level: int = LEVELS["info"]


def configure(env: dict[str, str] | os._Environ[str] | None = None) -> None:
    """Read GPUCTK_HOOK_LOG and GPUCTK_HOOK_LOG_LEVEL from `env` (default: os.environ)."""
    env = os.environ if env is None else env
    _Config.path = env.get("GPUCTK_HOOK_LOG") or None
    _Config.level = LEVELS.get(env.get("GPUCTK_HOOK_LOG_LEVEL", "info").lower(), LEVELS["info"])


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def log(level: str, message: str, *, to_stderr: bool = True) -> None:
    """Log `message` at `level` (a key of LEVELS); warnings and errors also go to stderr."""
    value = LEVELS[level]
    if to_stderr and value >= STDERR_LEVEL:
        sys.stderr.write(f"gpuctk-hook: {level}: {message}\n")
    path = _Config.path
    if path is None or value < _Config.level:
        return
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"
    line = f"time={_quote(stamp)} level={level} msg={_quote('gpuctk-hook: ' + message)}\n"
    from gpuctk.fs import append_trusted

    why = append_trusted(path, line.encode("utf-8", "backslashreplace"), 0o640)
    if why is not None:  # say so once, then log without it
        sys.stderr.write(f"gpuctk-hook: warning: log file {path}: {why}\n")
        _Config.path = None


def debug(message: str) -> None:
    log("debug", message)


def info(message: str) -> None:
    log("info", message)


def warning(message: str) -> None:
    log("warning", message)
