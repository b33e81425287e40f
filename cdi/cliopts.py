"""The node options `cdi generate`, `info` and `doctor` share: one definition of each flag, its
default and its environment variable (nvidia-ctk's names), so the three commands cannot drift.
Each command keeps its own help text, which says what the root is used for there."""

from __future__ import annotations

import click

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Decorator = Callable[[Any], Any]

nvml_library: Decorator = click.option(
    "--nvml-library",
    metavar="PATH",
    envvar="GPUCTK_NVML_LIBRARY",
    help="This libnvidia-ml.so.1, not the driver's.",
)


def table_or_json(help_: str) -> Decorator:
    """`--format table|json` (default table), passed as `fmt`."""
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(["table", "json"]),
        default="table",
        show_default=True,
        help=help_,
    )


def driver_root(help_: str) -> Decorator:
    return click.option(
        "--driver-root", default="/", show_default=True, envvar="NVIDIA_DRIVER_ROOT", help=help_
    )


def dev_root(help_: str) -> Decorator:
    return click.option(
        "--dev-root", default="/", show_default=True, envvar="NVIDIA_DEV_ROOT", help=help_
    )


def sys_root(help_: str) -> Decorator:
    return click.option("--sys-root", default="/sys", show_default=True, help=help_)


def simulate(help_: str) -> Decorator:
    return click.option("--simulate", metavar="PROFILE", help=help_)
