"""Every command's --help ends with ONE `Details:` line naming its section of commands.md.

The walk covers every click command gpuctk has (whatever has been added: it walks the tree,
lazy groups included), then gpuctk-runtime's and gpuctk-hook's own help: each last line is
`Details: <docs>/commands.md#<anchor>`, the docs are the Debian package's installed copy
where it exists (else the checkout's docs/), and the anchor is a heading of docs/commands.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from fixtures.layout import REPO
from test_docs import github_anchors

from gpuctk import helpdoc
from gpuctk.cli import cli

ANCHORS = github_anchors(REPO / "docs" / "commands.md")
INSTALLED = os.path.isfile(f"{helpdoc.INSTALLED_DOCS}/{helpdoc.DOC}")
DOCS = f"{helpdoc.INSTALLED_DOCS if INSTALLED else 'docs'}/commands.md"
BIN = Path(sys.executable).parent


def commands() -> list[list[str]]:
    """The argv words of every visible command, the root ([]) included."""
    found: list[list[str]] = []

    def walk(command: click.Command, words: list[str], ctx: click.Context) -> None:
        found.append(words)
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    walk(sub, [*words, name], click.Context(sub, info_name=name, parent=ctx))

    walk(cli, [], click.Context(cli, info_name="gpuctk"))
    return found


def details(text: str) -> str:
    """The help's Details line, checked to be its one and last line of that kind."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    assert [line for line in lines if line.startswith("Details:")] == lines[-1:], text
    return lines[-1]


def check(line: str, path: str) -> None:
    assert line.startswith(f"Details: {DOCS}#"), (path, line)
    anchor = line.split("#", 1)[1]
    assert anchor in ANCHORS, f"{path}: #{anchor} is no heading of docs/commands.md"


ALL = commands()


def test_the_walk_sees_every_command() -> None:
    paths = {" ".join(words) for words in ALL}
    for known in ("", "cdi generate", "cdi transform root", "runtime configure", "doctor",
                  "system create-device-nodes", "uninstall"):  # fmt: skip
        assert known in paths
    assert len(ALL) >= 18


@pytest.mark.parametrize("words", ALL, ids=[" ".join(["gpuctk", *w]) for w in ALL])
def test_every_command_help_ends_with_its_details_line(words: list[str]) -> None:
    path = " ".join(["gpuctk", *words])
    result = CliRunner().invoke(cli, [*words, "--help"], prog_name="gpuctk")
    assert result.exit_code == 0, result.output
    line = details(result.output)
    check(line, path)
    assert line == helpdoc.details_line(path)


@pytest.mark.parametrize("program", ["gpuctk-runtime", "gpuctk-hook"])
def test_the_shim_and_the_hook_end_with_theirs(program: str) -> None:
    out = subprocess.run(
        [str(BIN / program), "--help"], capture_output=True, text=True, check=True
    ).stdout
    check(details(out), program)


def test_the_installed_docs_are_named_where_the_package_put_them() -> None:
    line = helpdoc.details_line("gpuctk cdi generate", installed=True)
    assert line == "Details: /usr/share/doc/gpuctk/commands.md#gpuctk-cdi-generate"
    assert helpdoc.details_line("gpuctk cdi generate", installed=False) == (
        "Details: docs/commands.md#gpuctk-cdi-generate"
    )
