"""The OCI hooks.d file (hooks 1.0.0) that podman and CRI-O read: `gpuctk-hook prestart` for
the containers that ask for a GPU by CDI annotation, written only by `gpuctk runtime configure
--runtime podman|crio --mode hook` (the deb installs none).

podman reads /usr/share/containers/oci/hooks.d, then /etc/containers/oci/hooks.d (a same-named
file in the second overrides the first); CRI-O reads its `hooks_dir` (by default the first
only). Either adds the hook to a container only when its `when` matches. `when` can match
annotations (regular expressions on keys and values), process.args[0] and bind mounts, never the
environment: so the file matches the CDI annotations (`cdi.k8s.io/...`, the prefix of the
device plugin's `cdi-annotations` strategy and of `--annotation cdi.k8s.io/x=nvidia.com/gpu=0`)
and nothing else. An image's NVIDIA_VISIBLE_DEVICES alone never runs the hook: env requests,
and the device plugin's envvar and volume-mounts strategies, need the shim (a runtime handler).
podman's own `--device nvidia.com/gpu=0` (and CRI-O's CDI field) need no hook at all.
"""

from __future__ import annotations

import json
import os
from typing import Any

from gpuctk import log
from gpuctk.containerd import ocispec, state, tomlfiles
from gpuctk.containerd import plan as planmod
from gpuctk.containerd.options import Options
from gpuctk.containerd.plan import FileChange, Plan
from gpuctk.errors import OutputError

# An annotation key with the default CDI prefix (gpuctk.hook.config annotation-prefixes), any
# value: Go's regexp, unanchored unless anchored here.
WHEN: dict[str, Any] = {"annotations": {r"^cdi\.k8s\.io/": ".*"}}


def hooks_json(hook_path: str, config: str | None = None) -> dict[str, Any]:
    return {
        "version": "1.0.0",
        "hook": ocispec.hook_entry(hook_path, config),
        "when": json.loads(json.dumps(WHEN)),
        "stages": [ocispec.HOOK_VERB],
    }


def owned(path: str) -> bool:
    """Whether the hooks file at `path` is gpuctk's (False: none); OutputError for another one,
    which is never overwritten or removed."""
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


def state_path(drop_in: str) -> str:
    """The record of the folders configure made for the hooks file: beside it, not `.json`,
    so podman and CRI-O (which read only `*.json` there) never read it."""
    return os.path.splitext(drop_in)[0] + ".gpuctk-state"


def plan_configure(opts: Options, what: str, notes: tuple[str, ...] = ()) -> Plan:
    log.debug(
        f"{what} {opts.drop_in}: {'exists' if owned(opts.drop_in) else 'absent'}; runs "
        f"{opts.hook_path} {ocispec.HOOK_VERB} when {json.dumps(WHEN)}"
    )
    data = ocispec.dumps(hooks_json(opts.hook_path, opts.hook_config))
    changes = [FileChange(opts.drop_in, data, what)]
    record = state_path(opts.drop_in)
    made = planmod.missing_dirs(opts.drop_in)
    if made or os.path.exists(record):  # a re-run keeps what the first run made
        previous = _recorded(record)
        dirs = tuple(dict.fromkeys((*previous.dirs, *made)))
        text = state.State(dirs=dirs).line() + "\n"
        changes.append(FileChange(record, ("# " + text).encode(), "folders gpuctk made"))
    return Plan(tuple(changes), notes)


def _recorded(path: str) -> state.State:
    text = tomlfiles.read_text(path)
    return (state.parse(text) if text is not None else None) or state.State()


def plan_unconfigure(opts: Options, what: str) -> Plan:
    """Remove the hooks file, its record and the folders configure made (when empty)."""
    record = state_path(opts.drop_in)
    changes: list[FileChange] = []
    if os.path.lexists(opts.drop_in) and owned(opts.drop_in):
        changes.append(FileChange(opts.drop_in, None, what))
    if os.path.lexists(record):
        changes.append(FileChange(record, None, "record of the folders gpuctk made"))
    removed = [c.path for c in changes]
    changes += planmod.removable_dirs(_recorded(record).dirs, removed)
    return Plan(tuple(changes))
