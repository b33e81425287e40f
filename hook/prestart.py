"""`gpuctk-hook prestart` (also `createRuntime`): GPUs for engines that run the hook without the
shim (runc with the hook in config.json, podman / CRI-O hooks.d). `precreate` is dispatched here
too (gpuctk.hook.precreate).

The runtime runs these hooks in its own namespaces, with the OCI state on stdin, after it has
prepared the container's root and cgroup and while the init process waits before pivot_root.
In one process:

1. read the state (bundle, init pid) and the bundle's config.json;
2. work out the request and the CDI edits exactly as the shim does (gpuctk.hook.cdiedits) and
   apply them to the config in memory (gpuctk.cdi.specs.apply): the entries it adds (device nodes,
   device cgroup rules, mounts, createContainer hooks) are what the runtime would have done had
   the shim written them; nothing asked: exit 0 at once, nothing touched;
3. pin the init process and open its mount namespace (gpuctk.hook.nsmount.Container);
4. allow the devices in its device cgroup (gpuctk.hook.cgroupdev: v1 devices.allow, v2 eBPF);
5. open every mount source on the host side (detached mounts, options already set);
6. enter the container's mount namespace and, with every path resolved inside the root: create
   the device nodes, attach the mounts, then do the createContainer work of each gpuctk-hook
   entry the edits carry (symlinks, modes, ld cache: gpuctk.hook.actions).

What cannot be done after the runtime has read config.json is reported, not silently dropped:
env edits (the process is configured), additionalGids, netDevices, intelRdt, and hooks that are
not gpuctk-hook createContainer entries. The spec's env edit NVIDIA_VISIBLE_DEVICES=void exists
for the shim path and is not needed here.
"""

from __future__ import annotations

import os
import posixpath
import time

from gpuctk.errors import InputError
from gpuctk.hook import oci_state
from gpuctk.log import hook as hooklog

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, BinaryIO

    from gpuctk.cdi.specs.shape import EditsDoc

HOOK_VERBS = ("createContainer", "create-symlinks", "update-ldcache", "chmod")
UNSUPPORTED = ("env", "additionalGids", "netDevices", "intelRdt")


class Plan:
    """What the runtime would have done with the edited config: the entries apply() added."""

    __slots__ = ("devices", "hooks", "mounts", "notes", "rules")

    def __init__(self) -> None:
        self.devices: list[dict[str, Any]] = []
        self.rules: list[tuple[str, int, int, str]] = []
        self.mounts: list[dict[str, Any]] = []
        self.hooks: list[list[str]] = []  # argv of gpuctk-hook createContainer entries
        self.notes: list[str] = []


def _list(parent: Any, *keys: str) -> list[Any]:
    for key in keys:
        parent = parent.get(key) if isinstance(parent, dict) else None
    return parent if isinstance(parent, list) else []


def plan(doc: dict[str, Any], edits: EditsDoc) -> Plan:
    """Apply `edits` to `doc` (in place) and collect what was added, in the runtime's order."""
    from gpuctk.cdi.specs import apply
    from gpuctk.hook import cgroupdev

    had = {id(x) for x in (*_list(doc, "linux", "devices"), *_list(doc, "mounts"))}
    rules_before = len(_list(doc, "linux", "resources", "devices"))
    hooks_before = {s: len(_list(doc, "hooks", s)) for s in apply.HOOK_STAGES}
    apply.apply(doc, edits)
    out = Plan()
    out.devices = [d for d in _list(doc, "linux", "devices") if id(d) not in had]
    out.rules = cgroupdev.rules_of(_list(doc, "linux", "resources", "devices")[rules_before:])
    for mount in _list(doc, "mounts"):
        if id(mount) in had:
            continue
        options = mount.get("options") or []
        if mount.get("type", "bind") != "bind" and not {"bind", "rbind"} & set(options):
            raise InputError(f"mount at {mount['destination']}: only bind mounts can be added")
        out.mounts.append(mount)
    for stage in sorted(apply.HOOK_STAGES):
        for entry in _list(doc, "hooks", stage)[hooks_before[stage] :]:
            args = entry.get("args") or [entry["path"]]
            ours = posixpath.basename(args[0]) == "gpuctk-hook" or posixpath.basename(
                entry["path"]
            ).startswith("gpuctk-hook")
            if stage == "createContainer" and ours and len(args) > 1 and args[1] in HOOK_VERBS:
                out.hooks.append(list(args[1:]))
            else:
                out.notes.append(f"{stage} hook {' '.join(args)[:120]} not run (prestart mode)")
    raw: Mapping[str, Any] = edits  # the keys no prestart hook can apply, by name
    for key in UNSUPPORTED:
        items = raw.get(key)
        if key == "env":
            items = [e for e in items or () if not e.startswith("NVIDIA_VISIBLE_DEVICES=")]
        if items:
            out.notes.append(f"{key} edits cannot be applied by a prestart hook: ignored")
    return out


def _hook_request(args: list[str], config_path: str) -> Any:
    from gpuctk.hook import hook_main
    from gpuctk.hook.actions import Request

    verb = args[0]
    values, ignored = hook_main.parse(verb, args[1:])
    for arg in ignored:
        hooklog.warning(f"{verb}: unknown argument {arg!r} ignored")
    mode = values.get("mode") or []
    ldconfig = values.get("ldconfig-path") or []
    return Request(
        verb,
        links=values.get("link"),
        folders=values.get("folder"),
        mode=mode[-1] if mode else None,
        paths=values.get("path"),
        ldconfig=(ldconfig[-1] if ldconfig else None) or os.environ.get("GPUCTK_LDCONFIG"),
        container_spec=config_path,
        run_ldconfig=verb == "update-ldcache" or bool(values.get("folder")),
    )


def inject(state: oci_state.State, doc: dict[str, Any], todo: Plan, config_path: str) -> str:
    """Steps 3-6 for an applied plan; returns a summary."""
    from gpuctk.hook import actions, cgroupdev, mknod, mounts, nsmount

    requests = [_hook_request(args, config_path) for args in todo.hooks]
    root_path = oci_state.rootfs_path(doc, state.bundle)
    container = nsmount.Container(state.pid)
    sources: list[tuple[Any, str]] = []
    try:
        proc_cgroup = container.open(read_cgroup=bool(todo.rules))
        cgroup = "no device rules"
        if todo.rules:
            version, directory = cgroupdev.locate(state.pid, proc_cgroup=proc_cgroup)
            cgroup = cgroupdev.allow(version, directory, todo.rules)
        for mount in todo.mounts:
            source = nsmount.Source(mount["source"], list(mount.get("options") or []))
            sources.append((source, mount["destination"]))
        root_fd = container.enter(root_path)
        try:
            with mounts.writable_root(root_fd, root_path):
                made = sum(mknod.mknod(root_fd, dev) for dev in todo.devices)
                for source, destination in sources:
                    nsmount.bind(root_fd, source, destination)
        finally:
            os.close(root_fd)
        for request in requests:
            actions.run_request(request)
    finally:
        for source, _ in sources:
            source.close()
        container.close()
    return f"{made} device nodes, {len(sources)} mounts, {cgroup}"


def main(verb: str, argv: list[str], stdin: BinaryIO | None = None) -> int:
    """Run `verb` (prestart, createRuntime or precreate); returns the exit status."""
    if verb == "precreate":
        from gpuctk.hook import precreate

        return precreate.main(argv, stdin)
    started = time.monotonic()
    for arg in argv:
        hooklog.warning(f"{verb}: unknown argument {arg!r} ignored")
    state = oci_state.read_state(stdin)
    config_path = posixpath.join(state.bundle, "config.json")
    doc = oci_state.read_config(config_path)
    from gpuctk.hook import cdiedits, config

    got = cdiedits.resolve(doc, config.load(), hooklog.warning)
    if got is None:
        hooklog.log("debug", f"{verb} {state.id}: no GPU requested", to_stderr=False)
        return 0
    req, edits = got
    todo = plan(doc, edits)
    for note in todo.notes:
        hooklog.log("info", note, to_stderr=False)
    done = inject(state, doc, todo, config_path)
    ms = (time.monotonic() - started) * 1000
    hooklog.info(f"{verb} {state.id}: injected {cdiedits.describe(req)}: {done} ({ms:.0f} ms)")
    return 0
