"""NVIDIA_DRIVER_CAPABILITIES: which driver files a container gets.

The reference toolkit ignores the variable in CDI mode and mounts every driver file; gpuctk
honours it, as libnvidia-container does in legacy mode (and a folder spec's hook entry honours
it for the config files it links, in engines that apply the spec themselves too). Default
(unset or empty): `utility,compute`; `all`: everything; unknown words are ignored (reported
as notes).

Only the spec-level edits are filtered, and within them only the mounts of driver libraries and
binaries (and the graphics/display config files); device nodes, IPC sockets (mounted noexec),
firmware and anything not recognised stay. A device's own edits lose their /dev/dri nodes unless
graphics or display is asked for (filter_device_edits). A library's capability comes from its
file name (gpuctk.cdi.node.capabilities.capability_of); a 32-bit library (in an i386/lib32 folder,
or
in /usr/lib or /lib when the spec also mounts libraries from /usr/lib64 or /lib64) needs
`compat32` as well as its own capability. The hook's `--link TARGET::LINK` arguments whose
target is a dropped file (or a dropped link) are dropped too, and its `--link-for
CAPABILITY:TARGET::LINK` arguments (a folder spec's links to its staged config files:
gpuctk.cdi.stage) whose capability is not selected.
"""

from __future__ import annotations

import posixpath

from gpuctk.cdi.node import capabilities as caps
from gpuctk.cdi.node.facts import LIBCUDA_DIR_ENV
from gpuctk.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

ENV = "NVIDIA_DRIVER_CAPABILITIES"
_BIN_DIRS = frozenset(
    ("/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin")
)
_CONFIG_CAPS = (  # container path prefix -> capability, for non-library files
    ("/usr/share/vulkan/", caps.GRAPHICS),
    ("/etc/vulkan/", caps.GRAPHICS),
    ("/usr/share/glvnd/", caps.GRAPHICS),
    ("/usr/share/egl/", caps.GRAPHICS),
    ("/etc/egl/", caps.GRAPHICS),
    ("/usr/share/nvidia/nvoptix", caps.GRAPHICS),
    ("/usr/share/nvidia/nvidia-application-profiles", caps.GRAPHICS),
    ("/etc/OpenCL/", caps.COMPUTE),
    ("/usr/share/X11/", caps.DISPLAY),
    ("/etc/X11/", caps.DISPLAY),
    ("/usr/lib/xorg/", caps.DISPLAY),
)
_32BIT_PARTS = ("/i386-linux-gnu", "/lib32", "/i686-linux-gnu", "/arm-linux-gnueabihf")


def parse(config: Mapping[str, Any], value: str | None) -> tuple[frozenset[str], list[str]]:
    """(capabilities, notes) the OCI config `config` asks for by NVIDIA_DRIVER_CAPABILITIES, as
    gpuctk-cdi-hook reads it (gpuctk.hook.compiled.capabilities: the rule's one home);
    `value`, the variable as set, only names it in a note."""
    from gpuctk.hook import compiled

    selected, unknown = compiled.capabilities(config)
    notes: list[str] = []
    if unknown:
        words = "a word that names" if unknown == 1 else f"{unknown} words that name"
        notes.append(
            f"{ENV}={value!r}: ignoring {words} no capability (known: {', '.join(caps.ALL)}, all)"
        )
    return selected, notes


def _is_32bit(folder: str, lib64: bool) -> bool:
    if any(part in folder for part in _32BIT_PARTS):
        return True
    return lib64 and folder in ("/usr/lib", "/lib")


def file_capabilities(mount: Mapping[str, Any], lib64: bool) -> tuple[str, ...]:
    """The capabilities a mounted file needs (all of them); () when it is always kept."""
    path = mount.get("containerPath")
    if not isinstance(path, str):
        return ()
    options = mount.get("options") or ()
    if "noexec" in options or "/firmware/" in path:
        return ()  # IPC sockets and GSP firmware
    folder, name = posixpath.split(path)
    if ".so" in name:
        own = caps.capability_of(name)
        return (own, caps.COMPAT32) if _is_32bit(folder, lib64) else (own,)
    if folder in _BIN_DIRS:
        return (caps.capability_of(name),)
    for prefix, capability in _CONFIG_CAPS:
        if path.startswith(prefix):
            return (capability,)
    return ()


def _filter_links(args: list[str], dropped: set[str], selected: frozenset[str]) -> list[str]:
    """`args` without the --link-for arguments whose capability `selected` lacks (a folder
    spec's links to its staged config files) and the --link and --link-for arguments whose
    target resolves into `dropped` (which grows with every dropped link, so chains libcuda.so
    -> libcuda.so.1 -> file all go). The links are gpuctk-cdi-hook's reading of them
    (gpuctk.hook.compiled.entry_links; a --link's CAPABILITY is ""); none where it refuses
    them, as the hook would."""
    from gpuctk.hook import compiled

    try:
        pairs = compiled.entry_links(args)
    except UsageError:
        return args
    drop_spans: set[int] = set()
    for start, _stop, _name, cap, _target, link in pairs:
        if cap and cap not in selected:
            drop_spans.add(start)
            dropped.add(posixpath.normpath(link))
    changed = True
    while changed:
        changed = False
        for start, _stop, _name, _cap, target, link in pairs:
            if start in drop_spans:
                continue
            full = target if target.startswith("/") else posixpath.dirname(link) + "/" + target
            if posixpath.normpath(full) in dropped:
                drop_spans.add(start)
                dropped.add(posixpath.normpath(link))
                changed = True
    if not drop_spans:
        return args
    out: list[str] = []
    spans = {start: stop for start, stop, *_ in pairs if start in drop_spans}
    i = 0
    while i < len(args):
        if i in spans:
            i = spans[i]
            continue
        out.append(args[i])
        i += 1
    return out


def filter_device_edits(edits: Mapping[str, Any], selected: frozenset[str]) -> Mapping[str, Any]:
    """A device's `edits` less its /dev/dri card and render nodes unless `selected` has
    graphics or display: only those open them, and libnvidia-container's legacy mode adds them
    for those two only (each node is one more mknod and device rule at every start). The
    input is returned as it is when nothing goes."""
    nodes = edits.get("deviceNodes")
    if not isinstance(nodes, list) or selected & caps.DRM_USERS:
        return edits
    kept = [
        n
        for n in nodes
        if not (isinstance(n, dict) and str(n.get("path", "")).startswith(caps.DRM_NODES))
    ]
    return edits if len(kept) == len(nodes) else {**edits, "deviceNodes": kept}


def filter_edits(edits: Mapping[str, Any], selected: frozenset[str]) -> dict[str, Any]:
    """A copy of spec-level `edits` with the files `selected` does not cover left out (and
    NVIDIA_CTK_LIBCUDA_DIR with libcuda's).

    The input is not modified; unchanged parts are shared with it."""
    out = dict(edits)
    mounts = edits.get("mounts")
    if selected >= frozenset(caps.ALL):
        return out
    if not isinstance(mounts, list):
        mounts = []
    lib64 = any(
        isinstance(m, dict)
        and isinstance(m.get("containerPath"), str)
        and m["containerPath"].startswith(("/usr/lib64/", "/lib64/"))
        and ".so" in m["containerPath"]
        for m in mounts
    )
    kept: list[Any] = []
    dropped: set[str] = set()
    for mount in mounts:
        needed = file_capabilities(mount, lib64) if isinstance(mount, dict) else ()
        if all(c in selected for c in needed):
            kept.append(mount)
        else:
            dropped.add(posixpath.normpath(mount["containerPath"]))
    if dropped:
        out["mounts"] = kept
    env = edits.get("env")
    no_cuda = any(p.rpartition("/")[2].startswith("libcuda.so") for p in dropped)
    if isinstance(env, list) and no_cuda:  # no folder named as holding a libcuda it lacks
        out["env"] = [e for e in env if not str(e).startswith(f"{LIBCUDA_DIR_ENV}=")]
    hooks = edits.get("hooks")
    if isinstance(hooks, list):
        new_hooks = []
        for hook in hooks:
            args = hook.get("args") if isinstance(hook, dict) else None
            if isinstance(args, list) and all(isinstance(a, str) for a in args):
                filtered = _filter_links(args, dropped, selected)
                if filtered is not args:
                    hook = {**hook, "args": filtered}
            new_hooks.append(hook)
        if any(a is not b for a, b in zip(new_hooks, hooks, strict=True)):
            out["hooks"] = new_hooks
    return out
