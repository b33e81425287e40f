"""`--runtime podman`: an OCI hooks.d file (hooks 1.0.0) that runs `gpuctk-hook prestart`.

podman (and CRI-O) read hooks.d folders (/usr/share/containers/oci/hooks.d, then
/etc/containers/oci/hooks.d, where a same-named file overrides the first) and add the hook to
every container whose `when` matches. The hook itself does nothing for a container that asks for
no GPU, so it matches always.
"""

from __future__ import annotations

import json
import os
from typing import Any

from gpuctk.containerd import ocispec, tomlfiles
from gpuctk.containerd.options import Options
from gpuctk.containerd.plan import FileChange, Plan
from gpuctk.errors import OutputError


def hooks_json(hook_path: str, config: str | None = None) -> dict[str, Any]:
    return {
        "version": "1.0.0",
        "hook": ocispec.hook_entry(hook_path, config),
        "when": {"always": True},
        "stages": [ocispec.HOOK_VERB],
    }


def _owned(path: str) -> bool:
    """Whether the hooks file at `path` is gpuctk's (refuse to touch another one)."""
    text = tomlfiles.read_text(path)
    if text is None:
        return False
    try:
        data = json.loads(text)
        args = data["hook"]["args"]
        ours = isinstance(args, list) and bool(args) and args[0] == "gpuctk-hook"
    except (ValueError, KeyError, TypeError):
        ours = False
    if not ours:
        raise OutputError(
            f"{path} exists and is not a gpuctk hooks file: refusing to overwrite or remove it; "
            "choose another --drop-in"
        )
    return True


def plan_configure(opts: Options) -> Plan:
    _owned(opts.drop_in)
    data = ocispec.dumps(hooks_json(opts.hook_path, opts.hook_config))
    notes = []
    if opts.set_as_default or opts.cdi_enabled:
        notes.append("podman has no runtime handler: --set-as-default and --cdi-enabled ignored")
    return Plan((FileChange(opts.drop_in, data, "podman hooks.d file"),), tuple(notes))


def plan_unconfigure(opts: Options) -> Plan:
    if not os.path.lexists(opts.drop_in) or not _owned(opts.drop_in):
        return Plan(())
    return Plan((FileChange(opts.drop_in, None, "podman hooks.d file"),))
