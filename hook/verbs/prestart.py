"""`gpuctk-hook prestart` (also `createRuntime`): GPUs for engines that run the hook without the
shim (runc with the hook in config.json, podman / CRI-O hooks.d). `precreate` is dispatched here
too (gpuctk.hook.verbs.precreate).

The runtime runs these hooks in its own namespaces, with the OCI state on stdin, after it has
prepared the container's root and cgroup and while the init process waits before pivot_root.
In one process:

1. read the state (bundle, init pid) and the bundle's config.json;
2. work out the request and the CDI edits exactly as the shim does (gpuctk.hook.requests.cdiedits)
   and apply them to the config in memory (gpuctk.cdi.specs.apply): the entries it adds (device
   nodes, device cgroup rules, mounts, createContainer hooks) are what the runtime would have done
   had the shim written them; nothing asked: exit 0 at once, nothing touched;
3. pin the init process and open its mount namespace (gpuctk.hook.verbs.nsmount.Container);
4. allow the devices in its device cgroup (gpuctk.hook.verbs.cgroupdev: v1 devices.allow, v2 eBPF);
5. open every mount source on the host side (detached mounts, options already set);
6. enter the container's mount namespace and, with every path resolved inside the root: create
   the device nodes, attach the mounts, then do the createContainer work of each of gpuctk's
   own entries the edits carry (symlinks, `--link-for` links for the capabilities the
   container's NVIDIA_DRIVER_CAPABILITIES asks for, modes, ld cache, and the device node guard:
   gpuctk.hook.verbs.actions, as `gpuctk-hook VERB ARGS` would, the entry's GPUCTK_DRIVER_VERSION
   and other machine facts from its env).

gpuctk's own entries are those whose `path` is named `gpuctk-hook` or `gpuctk-cdi-hook` (the
compiled front of the default folder spec, hook/cdihook.c, which does a subset of
gpuctk-hook's work and hands it everything else with the same arguments), with a verb
gpuctk-hook knows; the shim's in-root work (gpuctk.hook.shim.shimroot) reads them by the same
name. No binary a spec names is run here: their arguments are read as gpuctk-hook's and the
work is done in this process, confined to the container's root as gpuctk-hook confines it.
A spec author who could name a hook can already have a runtime that applies the spec run any
binary as root; this mode runs none.

What cannot be done after the runtime has read config.json is reported, not silently dropped:
env edits (the process is configured), additionalGids, netDevices, intelRdt (in the log), and
hooks that are not gpuctk's (a warning: the work they stand for is not done). The spec's env
edit NVIDIA_VISIBLE_DEVICES=void exists for the shim path and is not needed here.
"""

from __future__ import annotations

import os
import posixpath
import time

from gpuctk.cdi.node import facts
from gpuctk.errors import InputError
from gpuctk.hook import oci_state
from gpuctk.log import hook as hooklog

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, BinaryIO

    from gpuctk.cdi.specs.shape import EditsDoc
    from gpuctk.hook.verbs.actions import Request

FACT_KEYS = (facts.DRIVER_KEY, facts.CUDA_KEY, facts.GPUS_KEY)  # an entry's env: the hook's
UNSUPPORTED = ("env", "additionalGids", "netDevices", "intelRdt")


class Plan:
    """What the runtime would have done with the edited config: the entries apply() added."""

    __slots__ = ("devices", "hook_env", "hooks", "mounts", "notes", "rules", "skipped")

    def __init__(self) -> None:
        self.devices: list[dict[str, Any]] = []
        self.rules: list[tuple[str, int, int, str]] = []
        self.mounts: list[dict[str, Any]] = []
        self.hooks: list[list[str]] = []  # VERB ARGS... of gpuctk's own entries (ours())
        self.hook_env: list[dict[str, str | None]] = []  # the machine facts in each one's env
        self.notes: list[str] = []  # edits a prestart hook cannot apply
        self.skipped: list[str] = []  # hook entries not run: not gpuctk's, or an unknown verb


def ours(entry: Mapping[str, Any]) -> bool:
    """Whether a hook entry is gpuctk's: its path names gpuctk-hook or its compiled front,
    gpuctk-cdi-hook (as gpuctk.hook.shim.shimroot reads a spec's entries). Its work is then done
    in this process; the binary is never run."""
    path = entry.get("path")
    return isinstance(path, str) and posixpath.basename(path) in facts.HOOK_PROGRAMS


def _list(parent: Any, *keys: str) -> list[Any]:
    for key in keys:
        parent = parent.get(key) if isinstance(parent, dict) else None
    return parent if isinstance(parent, list) else []


def plan(doc: dict[str, Any], edits: EditsDoc) -> Plan:
    """Apply `edits` to `doc` (in place) and collect what was added, in the runtime's order."""
    from gpuctk.cdi.specs import apply
    from gpuctk.hook.verbs import cgroupdev, hook_main

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
            verb = args[1] if len(args) > 1 else ""
            if stage == facts.HOOK_VERB and ours(entry) and verb in hook_main.VERBS:
                out.hooks.append(list(args[1:]))
                env = (e.partition("=") for e in entry.get("env") or ())
                out.hook_env.append({k: v for k, _, v in env if k in FACT_KEYS})
            else:
                out.skipped.append(f"{stage} hook {' '.join(args)[:120]} not run (prestart mode)")
    raw: Mapping[str, Any] = edits  # the keys no prestart hook can apply, by name
    for key in UNSUPPORTED:
        items = raw.get(key)
        if key == "env":
            informative = ("NVIDIA_VISIBLE_DEVICES=", f"{facts.LIBCUDA_DIR_ENV}=")
            items = [e for e in items or () if not e.startswith(informative)]
        if items:
            out.notes.append(f"{key} edits cannot be applied by a prestart hook: ignored")
    return out


def _hook_request(args: list[str], config_path: str) -> Request:
    """The Request `gpuctk-hook VERB ARGS` (args: VERB ARGS...) would make, for `config_path`."""
    from gpuctk.hook.verbs import hook_main

    verb = args[0]
    values, parts, ignored = hook_main.parse(verb, args[1:])
    for arg in ignored:
        hooklog.warning(f"{verb}: unknown argument {arg!r} ignored")
    values["container-spec"] = [config_path]
    return hook_main._request(verb, values, parts)


def _set_env(env: Mapping[str, str | None]) -> dict[str, str | None]:
    """Set (None: unset) these os.environ entries; returns what they were. For an entry's
    machine facts (GPUCTK_DRIVER_VERSION, ...), which gpuctk-hook would have in its env."""
    saved = {key: os.environ.get(key) for key in env}
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    return saved


def inject(state: oci_state.State, doc: dict[str, Any], todo: Plan, config_path: str) -> str:
    """Steps 3-6 for an applied plan; returns a summary."""
    from gpuctk.hook.verbs import actions, cgroupdev, mknod, mounts, nsmount

    requests = [_hook_request(args, config_path) for args in todo.hooks]  # bad args fail here
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
        for request, env in zip(requests, todo.hook_env, strict=True):
            saved = _set_env(env)
            try:
                actions.run_request(request)
            finally:
                _set_env(saved)
    finally:
        for source, _ in sources:
            source.close()
        container.close()
    return f"{made} device nodes, {len(sources)} mounts, {cgroup}"


def main(verb: str, argv: list[str], stdin: BinaryIO | None = None) -> int:
    """Run `verb` (prestart, createRuntime or precreate); returns the exit status."""
    if verb == "precreate":
        from gpuctk.hook.verbs import precreate

        return precreate.main(argv, stdin)
    started = time.monotonic()
    for arg in argv:
        hooklog.warning(f"{verb}: unknown argument {arg!r} ignored")
    state = oci_state.read_state(stdin)
    config_path = posixpath.join(state.bundle, "config.json")
    doc = oci_state.read_config(config_path)
    from gpuctk.hook.requests import cdiedits, failsafe

    settings, broken = failsafe.load()
    if broken is not None:  # a no-GPU container goes on as it is (gpuctk.hook.requests.failsafe)
        failsafe.gate(doc, settings, broken, hooklog.warning, f"{verb} {state.id}")
        return 0
    got = cdiedits.resolve(doc, settings, hooklog.warning)
    if got is None:
        hooklog.log("debug", f"{verb} {state.id}: no GPU requested", to_stderr=False)
        return 0
    req, edits = got
    todo = plan(doc, edits)
    for note in todo.notes:
        hooklog.log("info", note, to_stderr=False)
    for skipped in todo.skipped:  # the work such an entry stands for is not done
        hooklog.warning(skipped)
    done = inject(state, doc, todo, config_path)
    ms = (time.monotonic() - started) * 1000
    hooklog.info(f"{verb} {state.id}: injected {cdiedits.describe(req)}: {done} ({ms:.0f} ms)")
    return 0
