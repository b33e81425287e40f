"""`gpuctk create-server`: the command line of gpuctk.hook.serve (click stays off the create
path: gpuctk-runtime never imports this module)."""

from __future__ import annotations

import click


@click.command("create-server", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--state-dir",
    envvar="GPUCTK_STATE_DIR",
    default="/run/gpuctk",
    show_default=True,
    help="gpuctk-runtime's state folder (GPUCTK_STATE_DIR): the FIFO and pid file go here. "
    "It must be the folder gpuctk-runtime uses.",
)
@click.option(
    "--max-workers",
    type=click.IntRange(1, 1024),
    default=16,
    show_default=True,
    help="Creates served at once (each worker ~5 MiB of its own); a create beyond them runs "
    "the Python shim, as without the server.",
)
def create_server(state_dir: str, max_workers: int) -> None:
    """Serve gpuctk-runtime's container creates from one resident process.

    A create that asks for a GPU otherwise starts Python (~13 ms) and imports the create path
    (~4 ms) every time. With this server running, gpuctk-runtime's sh front hands each such
    create to it through a FIFO in the state folder; a worker forked from the warm server
    (kept warm for the next) edits the bundle in the front's environment, folder and stderr,
    and answers; the front
    then execs runc itself. Without the server, or when anything about it cannot be checked,
    the front starts Python as before: stopping the server is always safe.

    Runs in the foreground until SIGTERM or Ctrl-C, as root; one server per state folder.

    \b
      systemctl enable --now gpuctk-create-server     # the unit the deb ships
      gpuctk create-server --state-dir /run/gpuctk     # the same, by hand
      GPUCTK_SERVE_TIMEOUT=60                          # the front's wait for an answer (s)
    """
    import os
    import sys

    # a fresh interpreter without click and the CLI: the server, and each worker forked from
    # it, carry only the create path (smaller to fork, fewer pages to copy on write)
    os.execv(
        sys.executable,
        [sys.executable, "-I", "-m", "gpuctk.hook.serve", state_dir, str(max_workers)],
    )
