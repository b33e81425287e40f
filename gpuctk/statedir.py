"""The state folder: where gpuctk-runtime keeps its memo and caches (`$GPUCTK_STATE_DIR`,
default /run/gpuctk, a tmpfs). Read by the shim, its sh front and the spec cache alike."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

STATE_DIR_ENV = "GPUCTK_STATE_DIR"
DEFAULT_STATE_DIR = "/run/gpuctk"


def state_dir(environ: Mapping[str, str] | None = None) -> str:
    """The state folder `environ` (default: this process's) names."""
    env = os.environ if environ is None else environ
    return env.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR
