"""Warnings and debug lines of the `gpuctk` command, on stderr, as `gpuctk: LEVEL: message`.

Deliberately not the logging module: importing it costs ~10 ms (traceback, threading, string,
...) on every `gpuctk cdi generate`, for two kinds of line. `--debug` turns debug lines on.
"""

from __future__ import annotations

import sys

_debug = False


def set_debug(enabled: bool) -> None:
    """Show debug lines (the root command's `--debug`)."""
    global _debug
    _debug = enabled


def warning(message: str) -> None:
    print(f"gpuctk: warning: {message}", file=sys.stderr)


def debug(message: str) -> None:
    if _debug:
        print(f"gpuctk: debug: {message}", file=sys.stderr)
