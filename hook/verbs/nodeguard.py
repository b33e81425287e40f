"""gpuctk-runtime's part in keeping containers from making device nodes
(gpuctk.hook.verbs.nodeprotect).

The mount over the container's /proc/driver/nvidia/params can only be made in the container's
mount namespace once the runtime has mounted its /proc (runc refuses config.json mounts inside
/proc), so the shim cannot make it before it execs runc. It leaves it to one hook entry, the
same on the Python create and in the compiled create's plans (gpuctk.hook.shim.frontplan):

- the spec's gpuctk hook entry runs (a folder spec's entry, or a gpuctk-hook entry the shim
  could not serve): that process protects the nodes as part of createContainer; nothing is
  added;
- the shim did the hook's in-root work, or the spec has no gpuctk hook (`--library-mode
  mounts`, `--disable-hook all`):
  a createContainer entry `gpuctk-cdi-hook disable-device-node-modification` is added, unless
  the spec's hook carries `--disable-hook disable-device-node-modification`. The entry reads
  the container's params file at each start and does nothing where it says
  `ModifyDeviceFiles: 0` or is missing, so the entry never depends on the host's file at
  create, and a plan made once holds on every host;
- the shim's config says `disable-device-node-modification = false`: nothing is added, and a
  spec hook that runs gets `--disable-hook disable-device-node-modification`.

The added entry names the spec's gpuctk-hook (its path and env); for a spec without one, the
gpuctk-hook installed beside this gpuctk-runtime (the launcher's folder), else
/usr/bin/gpuctk-hook. Where gpuctk-cdi-hook (hook/cdihook.c) is installed beside that
gpuctk-hook, the entry names it instead: it guards in C, with no Python start.
"""

from __future__ import annotations

import os
import posixpath
import sys

from gpuctk.cdi.node import facts

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpuctk.cdi.specs.shape import EditsDoc, HookDoc
    from gpuctk.hook.config import Settings

NAME = facts.GUARD_ACTION
ACTIONS = facts.HOOK_ACTIONS  # the --disable-hook names of a spec's hook args
PACKAGED_HOOK = facts.PACKAGED_HOOK
HOOK_ENV = (facts.HOOK_ENV_PATH,)


def disabled(hook: Any) -> list[str]:
    """The `--disable-hook` names in a gpuctk hook entry's args."""
    args = hook.get("args") or [] if isinstance(hook, dict) else []
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--disable-hook" and i + 1 < len(args):
            out.append(args[i + 1])
        elif isinstance(arg, str) and arg.startswith("--disable-hook="):
            out.append(arg.partition("=")[2])
    return out


def mode(settings: Settings) -> str:
    """The guard's mode for guard()'s `protect`: "hook", or "off" where the shim's config says
    `disable-device-node-modification = false`."""
    return "hook" if settings.disable_device_node_modification else "off"


def guard(
    edits: EditsDoc,
    ours: list[Any],
    protect: str,
    debug: Callable[[str], None],
    *,
    taken: bool = False,
    path: str = "",
    warn: Callable[[str], None] | None = None,
) -> EditsDoc:
    """`edits` as the container gets them, protection included (the module docstring).
    `ours`: the spec's gpuctk hook entries; `taken`: the shim did their work (and dropped
    them from `edits`). `protect`: "hook" (an entry where needed) or "off"; `path`: the
    program the entry runs for a spec with no gpuctk hook (default hook_path()); `warn` (else
    `debug`): where no such program is found."""
    if protect == "off":
        if taken or not ours:
            return edits
        done = edits.copy()
        done["hooks"] = [
            {**h, "args": [*h["args"], "--disable-hook", NAME]} if h in ours else h
            for h in edits.get("hooks") or []
        ]
        return done
    if ours and not taken:
        return edits  # the spec's hook runs and protects
    if ours and NAME in disabled(ours[0]):
        return edits
    if ours:
        path, env = front(ours[0]["path"]), list(ours[0].get("env") or HOOK_ENV)
    else:
        path, env = path or hook_path(), list(HOOK_ENV)
        if not path:
            (warn or debug)(
                f"no gpuctk-hook beside gpuctk-runtime or at {PACKAGED_HOOK}: this GPU "
                "container's device nodes are not guarded; fix: install gpuctk-hook and "
                "gpuctk-cdi-hook beside gpuctk-runtime (gpuctk install, or the deb)"
            )
            return edits
    done = edits.copy()
    done["hooks"] = [*(edits.get("hooks") or []), entry(path, env)]
    return done


def entry(path: str, env: list[str]) -> HookDoc:
    """The guard's createContainer entry: `path` (gpuctk-hook or gpuctk-cdi-hook) run with the
    action's name alone."""
    return {"hookName": "createContainer", "path": path,
            "args": [posixpath.basename(path), NAME], "env": env}  # fmt: skip


def hook_path() -> str:
    """gpuctk-hook beside this gpuctk-runtime's launcher (as named, then with its links
    resolved: a `runc` that is a link to it), else PACKAGED_HOOK (each through front()); ""
    when none is an executable file."""
    me = sys.argv[0] if sys.argv else ""
    mine = [me, os.path.realpath(me)] if me[:1] == "/" else []
    candidates = [posixpath.join(posixpath.dirname(m), facts.HOOK_NAME) for m in mine]
    for path in [*candidates, PACKAGED_HOOK]:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return front(path)
    return ""


def front(path: str) -> str:
    """gpuctk-cdi-hook beside the gpuctk-hook at `path` where it is installed (the guard then
    runs in C, and hands over to gpuctk-hook only where it cannot), else `path`."""
    return facts.compiled_beside(path) or path
