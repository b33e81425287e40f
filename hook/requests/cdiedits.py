"""What a container's OCI config asks for, as merged CDI container edits.

The shim's steps 2-3 (gpuctk.hook.shim.runtime_main.inject) without the file handling, for the hook
modes that serve engines without the shim (precreate, prestart): the request from annotations,
device mounts or NVIDIA_VISIBLE_DEVICES (gpuctk.hook.requests.devices), resolved in the CDI spec
dirs (gpuctk.cdi.specs.registry), the spec-level driver files filtered by NVIDIA_DRIVER_CAPABILITIES
(gpuctk.hook.requests.drivercaps), NVIDIA_REQUIRE_* checked (gpuctk.hook.requests.require), the
blocks merged in the reference order (gpuctk.cdi.specs.apply.merge). One model of "what to inject":
the CDI edits.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from gpuctk.cdi.specs.shape import EditsDoc
    from gpuctk.hook.config import Settings
    from gpuctk.hook.requests.devices import Request


def resolve(
    doc: Mapping[str, Any], settings: Settings, warn: Callable[[str], object]
) -> tuple[Request, EditsDoc] | None:
    """(request, merged edits) for the OCI config `doc`; None when it asks for nothing.
    RequestError for an unknown device or an unmet requirement."""
    req = request(doc, settings, warn)
    if req is None:
        return None
    return req, edits_for(req, doc, settings, warn)[0]


def request(
    doc: Mapping[str, Any], settings: Settings, warn: Callable[[str], object]
) -> Request | None:
    """What the OCI config `doc` asks for under `settings`, its notes warned; None for
    nothing. RequestError for a malformed request."""
    from gpuctk.hook.requests import devices

    req = devices.requested(
        doc,
        kind=settings.default_kind,
        annotation_prefixes=settings.annotation_prefixes,
        accept_volume_mounts=settings.accept_volume_mounts,
        accept_envvar_unprivileged=settings.accept_envvar_unprivileged,
        device_list_kinds=settings.device_list_kinds,
    )
    for note in req.notes:
        warn(note)
    return req if req else None


def edits_for(
    req: Request, doc: Mapping[str, Any], settings: Settings, warn: Callable[[str], object]
) -> tuple[EditsDoc, list[str]]:
    """The merged edits for `req` (from `doc`), resolved in the spec dirs (capability filter,
    NVIDIA_REQUIRE_* checked, hooks given an explicit env), and the registry's errors (spec
    files or dirs it could not use). RequestError for an unknown device or an unmet
    requirement."""
    from gpuctk.cdi.specs import apply, registry
    from gpuctk.cdi.specs.speccache import SpecCache
    from gpuctk.hook.requests import devices, drivercaps, require

    reg = registry.load(settings.spec_dirs, cache=SpecCache.for_this_process())
    for refused in reg.refused:
        warn(f"CDI spec {refused}")
    blocks = reg.common(req.kind) if req.driver_only else []
    if req.devices:  # with driver_only: IMEX channels (gpuctk.hook.requests.imex)
        blocks += reg.resolve(req.devices)
    process = doc.get("process")
    env = devices.env_map(process.get("env") if isinstance(process, dict) else None)
    caps, notes = drivercaps.parse(doc, env.get(drivercaps.ENV))
    parts = [
        drivercaps.filter_device_edits(b.edits, caps)
        if b.device
        else drivercaps.filter_edits(b.edits, caps)
        for b in blocks
    ]
    if require.requirements(env):
        facts = None
        gpus = []
        for block in blocks:
            if block.device is None and facts is None:
                facts = require.facts_of(block.edits)
                if facts is not None:
                    names = [b.device for b in blocks if b.device and b.spec is block.spec]
                    gpus = require.gpus_for(names, facts)
        notes += require.check(env, facts, gpus)
    for note in notes:
        warn(note)
    return explicit_hook_env(apply.merge(parts)), list(reg.errors)


HOOK_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)


def explicit_hook_env(edits: EditsDoc) -> EditsDoc:
    """`edits` with every hook given a non-empty env (HOOK_ENV when a spec's hook has none).
    runc 1.2 and older run a hook whose env is empty with the CONTAINER's environment
    (LD_PRELOAD and all: the NVIDIAScape escape), so no hook entry gpuctk writes lacks one."""
    hooks = edits.get("hooks")
    if hooks:
        edits["hooks"] = [
            h if not isinstance(h, dict) or h.get("env") else {**h, "env": list(HOOK_ENV)}
            for h in hooks
        ]
    return edits


def describe(req: Request) -> str:
    """The request in words, for the log."""
    what = ", ".join(req.devices)
    if req.driver_only:
        what = ", ".join((f"{req.kind} driver files (no GPU)", *req.devices))
    return f"{what} (from {req.source})"


def injected(container: str, req: Request) -> str:
    """The shim's info line once `container` got what it asked for."""
    return f"{container}: injected {describe(req)}"
