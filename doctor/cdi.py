"""`gpuctk doctor` layer 3: the CDI spec the engines and the shim will read.

- present: a spec for the kind (nvidia.com/gpu) in the spec dirs (the runtime config's
  `spec-dirs` unless `--spec-dir` is given), read as the shim's registry reads them;
- valid: the strict validator (gpuctk.cdi.specs.validate; the JSON schema layer when it is found);
- driver version: the version the spec was generated for (the facts in its gpuctk-hook entry,
  else the versioned library names it mounts) is the running one, and what it mounts exists;
- layout: its GPU UUIDs and MIG devices are NVML's now (drift after a GPU swap, a MIG
  re-partition or a driver upgrade), and its device nodes exist; a stale spec's fix is the
  package's refresh unit (gpuctk-cdi-refresh.service) where it writes that file;
- conflicts: no other spec file (another tool's, an old copy) defines the same devices;
- stages: every folder-mode spec's driver stage exists (gpuctk.doctor.stages);
- imex: every IMEX channel node a spec names has the major /proc/devices gives the IMEX driver
  now (gpuctk.doctor.imexspec): a stale one grants whatever device holds the old number.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Any

from gpuctk import log
from gpuctk.cdi.stage import STAGE_NAME
from gpuctk.doctor.context import Context, Findings
from gpuctk.doctor.report import Result, failed, ok, skipped, warning

_VERSIONED_LIB = re.compile(r"/lib(?:cuda|nvidia-ml)\.so\.(\d+\.\d+(?:\.\d+)?)$")
FOREIGN_HOOKS = {"nvidia-ctk": "nvidia-ctk", "nvidia-cdi-hook": "nvidia-ctk"}
DEFAULT_OUTPUT = "/var/run/cdi/nvidia.yaml"
MAX_SHOWN = 6


SIMULATED_OUTPUT = "simulated.yaml"  # a simulated spec never goes where engines read specs


def generate_fix(ctx: Context, output: str | None = None, extra: tuple[str, ...] = ()) -> str:
    """The `gpuctk cdi generate` command (with the flags `extra`) that rewrites the spec for
    this node: never with a driver root that is not a folder (driver.root says so), and for a
    simulated node never into the engines' live spec folder."""
    argv = ["gpuctk", "cdi", "generate"]
    if ctx.driver_root != "/":
        root = ctx.driver_root if os.path.isdir(ctx.driver_root) else "<the driver's folder>"
        argv += ["--driver-root", root]
    if ctx.dev_root != "/":
        argv += ["--dev-root", ctx.dev_root]
    if ctx.simulate:
        argv += ["--simulate", ctx.simulate]
    if ctx.kind != "nvidia.com/gpu":
        vendor, _, cls = ctx.kind.partition("/")
        argv += ["--vendor", vendor, "--class", cls]
    argv += [*extra, "--output", output or (SIMULATED_OUTPUT if ctx.simulate else DEFAULT_OUTPUT)]
    return shlex.join(argv)


REFRESH_SERVICE = "gpuctk-cdi-refresh.service"  # the deb's unit: it writes DEFAULT_OUTPUT
REFRESH_UNIT_DIRS = ("/usr/lib/systemd/system", "/lib/systemd/system", "/etc/systemd/system")


def refresh_fix(ctx: Context, output: str, extra: tuple[str, ...] = ()) -> str:
    """How to bring the spec at `output` up to date: the package's refresh unit when it is
    installed and writes that file (what an operator runs after a MIG re-partition too), with
    the generate command (with the flags `extra`) beside it; else the generate command."""
    generate = generate_fix(ctx, output, extra)
    default = ctx.host(DEFAULT_OUTPUT)
    same = output in (default, os.path.normpath(default))
    same = same or os.path.realpath(output) == os.path.realpath(default)
    units = (ctx.host(f"{d}/{REFRESH_SERVICE}") for d in REFRESH_UNIT_DIRS)
    if same and any(os.path.isfile(u) for u in units):
        return f"systemctl start {REFRESH_SERVICE}   # or: {generate}"
    return generate


def _shown(items: list[str]) -> list[str]:
    if len(items) <= MAX_SHOWN:
        return items
    return [*items[:MAX_SHOWN], f"... and {len(items) - MAX_SHOWN} more"]


def _hooks(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for block in _edit_blocks(doc):
        hooks = block.get("hooks")
        out += [h for h in hooks if isinstance(h, dict)] if isinstance(hooks, list) else []
    return out


def writer(doc: dict[str, Any]) -> str:
    """Which tool wrote a spec: "gpuctk", "nvidia-ctk" or "unknown"."""
    for hook in _hooks(doc):
        path = hook.get("path")
        if isinstance(path, str):
            name = os.path.basename(path)
            if name.startswith("gpuctk"):
                return "gpuctk"
            if name in FOREIGN_HOOKS:
                return FOREIGN_HOOKS[name]
    return "unknown"


def spec_facts(doc: dict[str, Any]) -> Any:
    """The gpuctk machine facts in a spec's hook env (gpuctk.cdi.node.facts.Facts), or None."""
    from gpuctk.cdi.node import facts

    for hook in _hooks(doc):
        env = hook.get("env")
        if isinstance(env, list) and all(isinstance(e, str) for e in env):
            try:
                found = facts.decode(env)
            except ValueError:
                continue
            if found is not None:
                return found
    return None


def _edit_blocks(doc: dict[str, Any]) -> list[dict[str, Any]]:
    blocks = [doc.get("containerEdits")]
    devices = doc.get("devices")
    for d in devices if isinstance(devices, list) else []:
        if isinstance(d, dict):
            blocks.append(d.get("containerEdits"))
    return [b for b in blocks if isinstance(b, dict)]


def _host_paths(doc: dict[str, Any], key: str, field: str) -> list[str]:
    out: list[str] = []
    for block in _edit_blocks(doc):
        for item in block.get(key) or []:
            if isinstance(item, dict):
                path = item.get(field) or item.get("path")
                if isinstance(path, str):
                    out.append(path)
    return list(dict.fromkeys(out))


def check_present(ctx: Context, found: Findings, registry: Any) -> tuple[Result, Any]:
    """The spec serving the kind (the one with `<kind>=all`, else the last read), or None."""
    title = f"a CDI spec for {ctx.kind}"
    dirs = ", ".join(found.spec_dirs)
    ours = [s for s in registry.specs if s.kind == ctx.kind]
    if not ours:
        evidence = [f"no spec for {ctx.kind} in {dirs}"]
        evidence += _shown([f"skipped: {e}" for e in registry.errors])
        return failed("cdi.spec", title, evidence, generate_fix(ctx)), None
    held = registry.devices.get(f"{ctx.kind}=all")
    active = held[0] if held is not None else ours[-1]
    count = sum(1 for name in registry.devices if name.startswith(f"{ctx.kind}="))
    by = writer(active.doc)
    if by == "nvidia-ctk" and refresh_fix(ctx, active.path).startswith("systemctl"):
        # gpuctk's refresh unit writes this file and refuses to replace nvidia-ctk's spec
        evidence = [
            f"{active.path} was written by nvidia-ctk (nvidia-container-toolkit-base's "
            f"nvidia-cdi-refresh.service writes it): {REFRESH_SERVICE} refuses to replace it "
            "and fails, so the spec is not gpuctk's",
        ]
        fix = (
            "systemctl disable --now nvidia-cdi-refresh.path nvidia-cdi-refresh.service; "
            + generate_fix(ctx, active.path, ("--force",))
        )
        return warning("cdi.spec", title, evidence, fix), active
    return ok("cdi.spec", title, f"{active.path} ({by}): {count} devices in {dirs}"), active


def check_valid(ctx: Context, registry: Any) -> Result:
    title = "CDI specs valid (strict)"
    from gpuctk.cdi.specs.validate import schema_checker, validate_spec_dict
    from gpuctk.errors import GpuctkError

    try:
        checker = schema_checker()
    except GpuctkError:
        checker = None
    if not registry.specs and not registry.errors:
        return skipped("cdi.valid", title, "no spec files")
    bad: list[str] = []
    paths: list[str] = []
    for spec in registry.specs:
        problems = validate_spec_dict(spec.doc, spec.path, schema=checker)
        if problems:
            paths.append(spec.path)
            bad += [f"{spec.path}: {p}" for p in problems]
    for error in registry.errors:
        bad.append(f"unreadable, skipped by engines: {error}")
        paths.append(error.split(":", 1)[0])
    layers = "strict + CDI schema" if checker is not None else "strict"
    if bad:
        fix = f"gpuctk cdi validate {' '.join(dict.fromkeys(paths))}   # then: {generate_fix(ctx)}"
        return failed("cdi.valid", title, _shown(bad), fix)
    return ok("cdi.valid", title, f"{len(registry.specs)} spec file(s) valid ({layers})")


def _spec_driver_version(doc: dict[str, Any], facts: Any) -> str | None:
    if facts is not None:
        return str(facts.driver_version)
    for path in _host_paths(doc, "mounts", "hostPath"):
        match = _VERSIONED_LIB.search(path) or STAGE_NAME.fullmatch(os.path.basename(path))
        if match:
            return match.group(1)
    return None


def _missing_mounts(missing: list[str]) -> list[str]:
    if not missing:
        return []
    # The two libraries every CUDA container loads first: they say most about what broke.
    first = sorted(missing, key=lambda p: _VERSIONED_LIB.search(p) is None)
    return [f"{len(missing)} file(s) the spec mounts are missing on the host:", *_shown(first)]


def check_driver_version(ctx: Context, found: Findings, spec: Any) -> Result:
    title = "CDI spec generated for the running driver"
    if spec is None:
        return skipped("cdi.driver-version", title, "no spec")
    facts = spec_facts(spec.doc)
    wrote = _spec_driver_version(spec.doc, facts)
    running = found.machine.driver_version if found.machine else found.kernel_version
    missing = [p for p in _host_paths(spec.doc, "mounts", "hostPath") if not os.path.lexists(p)]
    fix = refresh_fix(ctx, spec.path)
    evidence: list[str] = []
    if wrote is None:
        evidence.append(f"{spec.path}: names no driver version")
    elif running is None:
        evidence.append(f"{spec.path}: driver {wrote}; the running driver is unknown")
    elif wrote != running:
        evidence.append(f"{spec.path}: generated for driver {wrote}, the node runs {running}")
        evidence += _missing_mounts(missing)
        return failed("cdi.driver-version", title, evidence, fix)
    else:
        evidence.append(f"{spec.path}: driver {wrote}, the node runs {running}")
    if missing:
        evidence += _missing_mounts(missing)
        return failed("cdi.driver-version", title, evidence, fix)
    if wrote is None or running is None:
        return warning("cdi.driver-version", title, evidence, fix)
    return ok("cdi.driver-version", title, *evidence)


def _layout_drift(machine: Any, facts: Any, doc: dict[str, Any]) -> list[str]:
    """What differs between the machine and the spec's facts (or its UUID device names)."""
    drift: list[str] = []
    node_gpus = {g.uuid: g for g in machine.gpus}
    if facts is not None:
        spec_gpus = {g.uuid: g for g in facts.gpus}
        for uuid in sorted(set(spec_gpus) - set(node_gpus)):
            drift.append(f"GPU {uuid}: in the spec, not on the node (removed or replaced)")
        for uuid in sorted(set(node_gpus) - set(spec_gpus)):
            drift.append(f"GPU {node_gpus[uuid].index} {uuid}: on the node, not in the spec")
        for uuid in sorted(set(spec_gpus) & set(node_gpus)):
            g = node_gpus[uuid]
            had = set(spec_gpus[uuid].mig_uuids)
            now = {d.uuid for d in g.mig_devices}
            if had != now:
                drift.append(
                    f"GPU {g.index}: MIG layout changed: the spec has {len(had)} MIG device(s), "
                    f"the node {len(now)} ({len(had - now)} gone, {len(now - had)} new)"
                )
        return drift
    names = {d.get("name") for d in doc.get("devices") or [] if isinstance(d, dict)}
    spec_uuids = {n for n in names if isinstance(n, str) and n.startswith(("GPU-", "MIG-"))}
    # A MIG-enabled GPU is exposed through its MIG devices only (gpuctk and nvidia-ctk alike).
    node_uuids = {g.uuid for g in machine.gpus if not g.mig_enabled}
    node_uuids |= {d.uuid for d in machine.mig_devices}
    if spec_uuids:
        for uuid in sorted(spec_uuids - node_uuids):
            drift.append(f"{uuid}: in the spec, not on the node")
        for uuid in sorted(node_uuids - spec_uuids):
            drift.append(f"{uuid}: on the node, not in the spec")
    return drift


def check_layout(ctx: Context, found: Findings, spec: Any) -> Result:
    title = "CDI spec matches the GPU/MIG layout"
    if spec is None:
        return skipped("cdi.layout", title, "no spec")
    fix = refresh_fix(ctx, spec.path)
    nodes = _host_paths(spec.doc, "deviceNodes", "hostPath")
    missing = [f"device node {p} (in the spec) is missing" for p in nodes if not os.path.exists(p)]
    if found.machine is None:
        if missing:
            return failed("cdi.layout", title, _shown(missing), fix)
        return skipped("cdi.layout", title, "NVML unavailable: layout not compared")
    facts = spec_facts(spec.doc)
    drift = _layout_drift(found.machine, facts, spec.doc)
    if drift or missing:
        return failed("cdi.layout", title, _shown([*drift, *missing]), fix)
    m = found.machine
    basis = "the spec's gpuctk facts" if facts is not None else "the spec's UUID device names"
    return ok(
        "cdi.layout",
        title,
        f"{len(m.gpus)} GPU(s), {len(m.mig_devices)} MIG device(s) match {basis}; "
        f"{len(nodes)} device nodes exist",
    )


def check_conflicts(ctx: Context, found: Findings, registry: Any, spec: Any) -> Result:
    title = "no conflicting CDI specs"
    ours = [s for s in registry.specs if s.kind == ctx.kind]
    if not ours:
        return skipped("cdi.conflicts", title, "no spec")
    same_dir = {n: p for n, p in registry.conflicts.items() if n.startswith(f"{ctx.kind}=")}
    if same_dir:
        files = sorted({p for paths in same_dir.values() for p in paths})
        evidence = [
            f"{len(same_dir)} device(s) defined by more than one file of one dir: "
            "requests for them fail"
        ]
        evidence += [f"{p} ({writer(_doc(ours, p))})" for p in files]
        keep = spec.path if spec is not None else files[-1]
        drop = [p for p in files if p != keep] or files[:-1]
        return failed("cdi.conflicts", title, evidence, f"rm {' '.join(drop)}   # keep {keep}")
    others = [s for s in ours if spec is None or s.path != spec.path]
    shadowed = []
    for other in others:
        names = {f"{ctx.kind}={d['name']}" for d in other.doc["devices"]}
        hidden = [n for n in names if registry.devices.get(n, (other,))[0] is not other]
        if hidden:
            shadowed.append((other, len(hidden)))
    if shadowed:
        evidence = [
            f"{o.path} ({writer(o.doc)}): {n} device(s) overridden by {spec.path} "
            f"({writer(spec.doc)})"
            for o, n in shadowed
        ]
        evidence.append(
            "two tools maintain specs for one kind: the one you do not update goes "
            "stale and wins again if the other is removed"
        )
        return warning(
            "cdi.conflicts", title, evidence, f"rm {' '.join(o.path for o, _ in shadowed)}"
        )
    extra = f"; {len(others)} other spec file(s) for distinct devices" if others else ""
    return ok("cdi.conflicts", title, f"one spec file serves {ctx.kind}{extra}")


def _doc(specs: list[Any], path: str) -> dict[str, Any]:
    for s in specs:
        if s.path == path:
            return dict(s.doc)
    return {}


def cdi_checks(ctx: Context, found: Findings) -> list[Result]:
    from gpuctk.cdi.specs import registry as registrymod
    from gpuctk.doctor.imexspec import check_imex_majors
    from gpuctk.doctor.stages import check_stages

    registry = registrymod.load(found.spec_dirs)
    paths = ", ".join(s.path for s in registry.specs) or "none"
    log.debug(f"doctor: CDI spec files read: {paths}")
    present, spec = check_present(ctx, found, registry)
    found.active_spec = spec.doc if spec is not None else None
    found.cdi_devices = frozenset(n for n in registry.devices if n not in registry.conflicts)
    return [
        present,
        check_valid(ctx, registry),
        check_driver_version(ctx, found, spec),
        check_layout(ctx, found, spec),
        check_conflicts(ctx, found, registry, spec),
        check_stages(ctx, registry),
        check_imex_majors(ctx, registry),
    ]
