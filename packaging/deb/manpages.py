#!/usr/bin/env python3
"""A man page for every gpuctk command, made from its click help (no other tool needed).

    /opt/gpuctk/bin/python3 -I packaging/deb/manpages.py OUTDIR VERSION

build.py runs it with the package's own interpreter at build time, so the pages describe
exactly the commands the package holds: one per command of the click tree, groups included
(gpuctk.1, gpuctk-cdi.1, gpuctk-cdi-generate.1, ...), found by walking it as `--help` does
(hidden commands left out), and one each for gpuctk-runtime and gpuctk-hook from their own
help text. Each is gzipped (mtime 0: reproducible) man(7) roff: NAME (the short help),
SYNOPSIS (the usage line), DESCRIPTION (the help text as `--help` prints it), OPTIONS,
COMMANDS (a group's), SEE ALSO (its section of the installed commands.md, and the related
pages).
"""

from __future__ import annotations

import gzip
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from gpuctk import helpdoc
from gpuctk.cli import cli

WIDTH = 80
SHORT = 300  # a short help in full, never cut with "..."
# the programs that are not click commands: (page, their help text's module and attribute)
PLAIN = {
    "gpuctk-runtime": (
        "gpuctk.hook.shim.runtime_main",
        "HELP",
        "the runc shim gpuctk's handlers run",
    ),
    "gpuctk-hook": ("gpuctk.hook.verbs.hook_main", "USAGE", "the OCI hook gpuctk's CDI specs name"),
}


def esc(text: str) -> str:
    """`text` as roff text: backslashes and hyphens escaped, no line read as a request."""
    out = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(
        "\\&" + line if line.startswith((".", "'")) else line for line in out.split("\n")
    )


def walk() -> Iterator[tuple[list[str], click.Command, click.Context]]:
    """(words after `gpuctk`, command, its context) for every visible command, root first."""

    def visit(
        command: click.Command, words: list[str], ctx: click.Context
    ) -> Iterator[tuple[list[str], click.Command, click.Context]]:
        yield words, command, ctx
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    child = click.Context(sub, info_name=name, parent=ctx)
                    yield from visit(sub, [*words, name], child)

    root = click.Context(cli, info_name="gpuctk", terminal_width=WIDTH, max_content_width=WIDTH)
    yield from visit(cli, [], root)


def page_name(words: list[str]) -> str:
    return "-".join(["gpuctk", *words])


def _header(name: str, summary: str, version: str) -> list[str]:
    return [
        f'.TH "{name.upper()}" 1 "" "gpuctk {version}" "gpuctk manual"',
        ".SH NAME",
        f"{esc(name)} \\- {esc(summary)}",
    ]


def _see_also(path: str, related: list[str]) -> list[str]:
    lines = [".SH SEE ALSO", esc(helpdoc.details_line(path, installed=True))]
    if related:
        shown = dict.fromkeys(related)
        lines += [".PP", ", ".join(f"\\fB{esc(p)}\\fR(1)" for p in shown)]
    return lines


def command_page(words: list[str], command: click.Command, ctx: click.Context,
                 version: str) -> str:  # fmt: skip
    """The roff page of one click command."""
    path = " ".join(["gpuctk", *words])
    helpdoc.attach(command, path, installed=True)
    lines = _header(page_name(words), command.get_short_help_str(SHORT), version)
    usage = " ".join(command.collect_usage_pieces(ctx))
    lines += [".SH SYNOPSIS", f"\\fB{esc(path)}\\fR {esc(usage)}".rstrip()]
    formatter = ctx.make_formatter()
    command.format_help_text(ctx, formatter)
    text = "\n".join(line[2:] if line.startswith("  ") else line
                     for line in formatter.getvalue().strip("\n").splitlines())  # fmt: skip
    if text:
        lines += [".SH DESCRIPTION", ".nf", esc(text), ".fi"]
    records = [r for r in (p.get_help_record(ctx) for p in command.get_params(ctx)) if r]
    if records:
        lines.append(".SH OPTIONS")
        for flags, help_ in records:
            lines += [".TP", f"\\fB{esc(flags)}\\fR", esc(help_) or "\\&"]
    related = [page_name(words[:-1])] if words else []
    if isinstance(command, click.Group):
        lines.append(".SH COMMANDS")
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            lines += [".TP", f"\\fB{esc(path)} {esc(name)}\\fR", esc(sub.get_short_help_str(SHORT))]
            related.append(page_name([*words, name]))
    if not words:
        related += list(PLAIN)
    return "\n".join([*lines, *_see_also(path, related)]) + "\n"


def plain_page(name: str, version: str) -> str:
    """The roff page of gpuctk-runtime or gpuctk-hook: their help text, as they print it."""
    import importlib

    module, attr, summary = PLAIN[name]
    text = getattr(importlib.import_module(module), attr).rstrip("\n")
    lines = _header(name, summary, version)
    usage, _, body = text.partition("\n")
    lines += [".SH SYNOPSIS", esc(usage.removeprefix("Usage: "))]
    lines += [".SH DESCRIPTION", ".nf", esc(body.strip("\n")), ".fi"]
    return "\n".join([*lines, *_see_also(name, ["gpuctk"])]) + "\n"


def pages(version: str) -> dict[str, str]:
    """page name -> roff text, for every command. The program gpuctk-runtime and the group
    `gpuctk runtime` would share a page name: the program's page holds the group's too."""
    found = {page_name(w): command_page(w, c, ctx, version) for w, c, ctx in walk()}
    for name in PLAIN:
        plain = plain_page(name, version)
        group = found.get(name)
        if group is not None:  # the group's sections after the program's, under its name
            rest = group.partition(".SH SYNOPSIS\n")[2]
            title = esc(" ".join(["gpuctk", *name.split("-")[1:]]))
            body = rest.replace(".SH ", ".SS ").replace(".SS SEE ALSO", ".SS See also")
            plain = plain.replace(".SH SEE ALSO", f'.SH "THE {title.upper()} COMMAND"\n'
                                  f".SS SYNOPSIS\n{body}.SH SEE ALSO", 1)  # fmt: skip
        found[name] = plain
    return found


def write(out_dir: Path, version: str) -> list[Path]:
    """<out_dir>/<page>.1.gz for every page; the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in pages(version).items():
        target = out_dir / f"{name}.1.gz"
        target.write_bytes(gzip.compress(text.encode(), mtime=0))
        target.chmod(0o644)
        written.append(target)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: manpages.py OUTDIR VERSION")
    for path in write(Path(sys.argv[1]), sys.argv[2]):
        print(path)
