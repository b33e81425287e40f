"""The `Details:` line that ends every command's `--help`: where that command is documented.

One home for it: the root group (gpuctk.cli) attaches it to each subcommand it loads, and to
their subcommands (attach); `gpuctk cdi`'s lazily loaded ones get it the same way; the shim's
and the hook's help texts end with details_line() too. The target is a section of
commands.md: the copy the Debian package installs in /usr/share/doc/gpuctk when it is there,
else the checkout's docs/commands.md. The anchor is the command's own heading there
(`gpuctk cdi generate` -> #gpuctk-cdi-generate), or the section ANCHORS names for a command
documented under another's heading; a test checks every anchor against docs/commands.md.
Imports nothing heavy: gpuctk-runtime and gpuctk-hook use it for their --help.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    import click

INSTALLED_DOCS = "/usr/share/doc/gpuctk"
CHECKOUT_DOCS = "docs"
DOC = "commands.md"

# command path -> its section in commands.md, where that is not the command's own heading
ANCHORS = {
    "gpuctk": "commands",
    "gpuctk cdi": "commands",
    "gpuctk cdi transform": "gpuctk-cdi-transform-root",
    "gpuctk runtime": "gpuctk-runtime-configure",
    "gpuctk runtime unconfigure": "gpuctk-runtime-configure",
    "gpuctk runtime runtimeclass": "gpuctk-runtime-configure",
    "gpuctk system": "gpuctk-system-create-dev-char-symlinks",
    "gpuctk install": "gpuctk-install-and-gpuctk-uninstall",
    "gpuctk uninstall": "gpuctk-install-and-gpuctk-uninstall",
    "gpuctk config default": "gpuctk-config",
    "gpuctk config show": "gpuctk-config",
    "gpuctk hook": "nvidia-ctks-spellings",
    "gpuctk-runtime": "gpuctk-runtime-the-shim",
}


def anchor(path: str) -> str:
    """The commands.md section of the command `path` ("gpuctk cdi generate")."""
    return ANCHORS.get(path) or "-".join(path.split())


def details_line(path: str, installed: bool | None = None) -> str:
    """`Details: <docs>/commands.md#<anchor>`; `installed`: name the packaged copy (None: when
    it exists on this machine)."""
    if installed is None:
        installed = os.path.isfile(os.path.join(INSTALLED_DOCS, DOC))
    folder = INSTALLED_DOCS if installed else CHECKOUT_DOCS
    return f"Details: {folder}/{DOC}#{anchor(path)}"


def command_path(ctx: click.Context, name: str) -> str:
    """The path of the subcommand `name` of the group whose context is `ctx`, from `gpuctk`
    (whatever name the root was invoked by)."""
    return " ".join(["gpuctk", *ctx.command_path.split()[1:], name])


_MARK = "\b\n"


def attach(command: click.Command, path: str, installed: bool | None = None) -> click.Command:
    """Give `command` and the subcommands it holds (not those a group loads lazily: its own
    get_command attaches those) the Details line as their help's last line."""
    if installed is None:
        installed = os.path.isfile(os.path.join(INSTALLED_DOCS, DOC))
    own = (command.epilog or "").split(_MARK)[0].rstrip()  # a command's own epilog stays
    # "\b": click prints the paragraph as it is, never re-wrapping the path
    command.epilog = (own + "\n\n" if own else "") + _MARK + details_line(path, installed)
    for name, sub in getattr(command, "commands", {}).items():
        attach(sub, f"{path} {name}", installed)
    return command
