"""Whether a spec file that `gpuctk cdi generate --output` would replace is another tool's.

nvidia-container-toolkit-base's `nvidia-cdi-refresh.service` runs `nvidia-ctk cdi generate`,
which writes /var/run/cdi/nvidia.yaml, the path gpuctk's refresh unit writes too: two tools
overwriting each other's spec every minute is worse than either. nvidia-ctk's spec is told by
its hooks, the one part no other generator copies: every hook entry it writes runs
`nvidia-cdi-hook` (toolkit 1.16+) or `nvidia-ctk hook ...` (1.13-1.15), as the entry's `path`
and its argv[0]. gpuctk's own specs name gpuctk-hook or gpuctk-cdi-hook.

The test is cheap where it matters: a file whose bytes do not mention either program (every
spec gpuctk writes) is not decoded at all, so the refresh each minute imports no YAML reader.

A spec whose writer is gone is not defended: when no program its hooks name exists any more
(the package was removed and left its spec in /var/run/cdi), every container given one of its
devices fails at its hook, and replacing it is the fix. `owner` says which case it is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

# hook program basename -> who writes specs that run it
WRITERS = {
    "nvidia-cdi-hook": "nvidia-ctk (NVIDIA Container Toolkit)",
    "nvidia-ctk": "nvidia-ctk (NVIDIA Container Toolkit)",
}
_MARKERS = tuple(name.encode() for name in WRITERS)
_MAX_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Owner:
    """Another tool's spec at `path`: who wrote it, and the hook programs it runs."""

    path: str
    writer: str
    programs: tuple[str, ...]

    @property
    def installed(self) -> bool:
        """Whether a program its hooks run is still there (the tool is still installed)."""
        return any(os.path.exists(p) for p in self.programs)

    def refusal(self) -> str:
        """The one line `cdi generate` (and the refresh unit's journal) prints."""
        return (
            f"{self.path} was written by {self.writer} (its hooks run "
            f"{', '.join(self.programs)}): refusing to overwrite another tool's spec; "
            "remove nvidia-container-toolkit-base (or `systemctl disable --now "
            "nvidia-cdi-refresh.path nvidia-cdi-refresh.service`), then rerun with --force, "
            "or write elsewhere with --output"
        )


def _hooks(doc: dict[str, Any]) -> list[Any]:
    edits = [doc.get("containerEdits")]
    devices = doc.get("devices")
    if isinstance(devices, list):
        edits += [d.get("containerEdits") for d in devices if isinstance(d, dict)]
    out: list[Any] = []
    for edit in edits:
        hooks = edit.get("hooks") if isinstance(edit, dict) else None
        if isinstance(hooks, list):
            out.extend(hooks)
    return out


def _program(hook: Any) -> tuple[str, str] | None:
    """(writer, program path) when the hook runs another tool's program, by its path or by
    its argv[0]."""
    if not isinstance(hook, dict):
        return None
    path = hook.get("path")
    args = hook.get("args")
    first = args[0] if isinstance(args, list) and args else None
    for value in (path, first):
        if isinstance(value, str) and os.path.basename(value) in WRITERS:
            return WRITERS[os.path.basename(value)], path if isinstance(path, str) else value
    return None


def owner(path: str) -> Owner | None:
    """The other tool that wrote the spec at `path`; None when there is no file, it is
    gpuctk's, or it is not a spec any known tool writes (then it is replaced as before)."""
    from gpuctk.cdi.specs import specfile
    from gpuctk.errors import GpuctkError

    try:
        data = specfile.read_bytes(path, max_bytes=_MAX_BYTES)
    except GpuctkError:
        return None
    if not any(marker in data for marker in _MARKERS):
        return None
    try:
        # YAML reads JSON too: the extension does not matter
        doc = specfile.decode_spec(data, path, is_json=False)
    except GpuctkError:
        return None
    found = [f for f in map(_program, _hooks(doc)) if f is not None]
    if not found:
        return None
    return Owner(path, found[0][0], tuple(dict.fromkeys(p for _, p in found)))
