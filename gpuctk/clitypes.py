"""What a flag accepts, checked where click reads it: one home and one message per rule.

A value that does not fit stops the command before it does anything, with click's usage
error (exit 2, `Try 'gpuctk COMMAND --help'.`), whether it came from the flag or from the
variable click reads for it (nvidia-ctk's `NVIDIA_CTK_*`, `DEV_ROOT`, ...).

    ABSOLUTE_PATH   a host path from /, given as written
    NORMAL_PATH     the same, normalized (`/a//b/../c` -> `/a/c`)
    Checked(problem, hint)  a value that `problem(value)` finds nothing wrong with (its one
                    line says what is), the rule kept where it lives (a CDI name's in
                    gpuctk.cdi.specs.names, a capability list's in gpuctk.cdi.node.capabilities)
"""

from __future__ import annotations

import posixpath

import click

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    _Base = click.ParamType[str, Any]  # generic in newer click
else:
    _Base = click.ParamType

ABSOLUTE_PROBLEM = "must be an absolute path, got {value!r}"


class AbsolutePath(_Base):
    """A path from /: kept as written, or normalized (`normal`)."""

    name = "path"

    def __init__(self, normal: bool = False) -> None:
        self.normal = normal

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if not text.startswith("/"):
            self.fail(ABSOLUTE_PROBLEM.format(value=text), param, ctx)
        return posixpath.normpath(text) if self.normal else text


ABSOLUTE_PATH = AbsolutePath()
NORMAL_PATH = AbsolutePath(normal=True)


class Checked(_Base):
    """A string that `problem` finds nothing wrong with (it returns None, or says what is
    wrong in a few words), `hint` added to the message (an example of a good value)."""

    name = "text"

    def __init__(self, problem: Callable[[str], str | None], hint: str = "") -> None:
        self.problem = problem
        self.hint = hint

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        problem = self.problem(text)
        if problem:
            self.fail(f"{problem}{f' ({self.hint})' if self.hint else ''}", param, ctx)
        return text
