"""`gpuctk doctor`: policy checks between layers: who may pick GPUs, which specs engines read.

runtime.envvar-unprivileged: with `accept-envvar-unprivileged = true`, an unprivileged pod whose
image sets NVIDIA_VISIBLE_DEVICES=all gets every GPU of the node, whatever the device plugin
allocated to it; with `auto` (the default) or `false`, env requests of unprivileged Kubernetes
containers are refused, so the device plugin must grant GPUs in a way gpuctk-runtime reads
(CDI annotations, CDI devices, volume mounts with accept-volume-mounts): a plugin on `envvar`
is a failure. The fix depends on how the NVIDIA device plugin hands GPUs out, its
`DEVICE_LIST_STRATEGY` (`--device-list-strategy`, or `flags.plugin.deviceListStrategy` in its
config file; default `envvar`; also `volume-mounts`, `cdi-annotations`, `cdi-cri`), which the
doctor reads off the running plugin processes under the proc root: only those root runs from a
root-owned executable count, never a local user's (gpuctk.doctor.plugin). The fix never drops
the explicit `true` before the plugin has been switched. Only a Kubernetes node (one with a
kubelet root) has an allocation to bypass; elsewhere the check is skipped.

cdi.version-readers: each spec's cdiVersion is one that every engine on the node reads. The
libraries' readable versions and the engines' vendored library versions are in READERS.
"""

from __future__ import annotations

import os
import re
import shutil
from functools import cmp_to_key
from typing import Any

from gpuctk.doctor.context import Context, Findings
from gpuctk.doctor.plugin import plugin_strategy
from gpuctk.doctor.report import Result, failed, ok, skipped, warning
from gpuctk.errors import GpuctkError

ENVVAR_CHECK = "runtime.envvar-unprivileged"
ENVVAR_TITLE = "unprivileged pods cannot take GPUs by NVIDIA_VISIBLE_DEVICES"
READERS_CHECK = "cdi.version-readers"
READERS_TITLE = "every CDI-reading engine on the node reads the specs' cdiVersion"
STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")

Release = tuple[int, int, int]

# The newest cdiVersion each engine release reads: an entry holds from its release up to the
# next entry, and up to the newest release checked (NEWEST). The versions a CDI library reads
# are its validSpecVersions (tags.cncf.io/container-device-interface: pkg/cdi/spec.go up to
# v0.5.3, pkg/cdi/version.go from v0.5.4, specs-go/version.go from v1.0.0): v0.3.x 0.3.0,
# v0.4.x 0.4.0, v0.5.x 0.5.0, v0.6.x 0.6.0, v0.7.x 0.7.0, v0.8.x 0.8.0, v1.0.x 1.0.0,
# v1.1.0 1.1.0; the 2022-01-11 snapshot podman 4.0 vendors reads 0.1.0 and 0.2.0 only. The
# library each release vendors is the one in its go.mod at the release tag:
#   podman (containers/podman): 4.0 snapshot, 4.1 v0.4.0, 4.3 v0.5.2 (so Debian 12's 4.3.1
#     reads up to 0.5.0), 4.7 v0.6.1, 4.8 v0.6.2, 5.1 v0.7.2, 5.2 v0.8.0, 5.5 to 5.8 v1.0.1;
#     podman 3.x vendors a CDI snapshot that checks no cdiVersion;
#   containerd (containerd/containerd): 1.7.0 v0.5.4, 1.7.12 v0.6.1, 1.7.16 v0.7.2, 1.7.27
#     v0.8.1, 2.0.0 v0.8.0, 2.0.5 v1.0.0, 2.1.0 and 2.2.0 v1.0.1, 2.2.1 to 2.3 v1.1.0;
#     containerd 1.6 has no CDI support at all;
#   CRI-O (cri-o/cri-o): 1.24 v0.3.2, 1.25 v0.5.x, 1.28 v0.6.0, 1.29 v0.6.2, 1.30 v0.7.2,
#     1.31 v0.8.0, 1.33 v1.0.1, 1.35 and 1.36 v1.1.0.
READERS: dict[str, tuple[tuple[Release, str], ...]] = {
    "podman": (
        ((4, 0, 0), "0.2.0"), ((4, 1, 0), "0.4.0"), ((4, 3, 0), "0.5.0"), ((4, 7, 0), "0.6.0"),
        ((5, 1, 0), "0.7.0"), ((5, 2, 0), "0.8.0"), ((5, 5, 0), "1.0.0"),
    ),
    "containerd": (
        ((1, 7, 0), "0.5.0"), ((1, 7, 12), "0.6.0"), ((1, 7, 16), "0.7.0"), ((1, 7, 27), "0.8.0"),
        ((2, 0, 0), "0.8.0"), ((2, 0, 5), "1.0.0"), ((2, 2, 1), "1.1.0"),
    ),
    "crio": (
        ((1, 24, 0), "0.3.0"), ((1, 25, 0), "0.5.0"), ((1, 28, 0), "0.6.0"), ((1, 30, 0), "0.7.0"),
        ((1, 31, 0), "0.8.0"), ((1, 33, 0), "1.0.0"), ((1, 35, 0), "1.1.0"),
    ),
}  # fmt: skip
NEWEST: dict[str, tuple[int, int]] = {"podman": (5, 8), "containerd": (2, 3), "crio": (1, 36)}


# --- runtime.envvar-unprivileged -------------------------------------------------------------


def _grant_fix(ctx: Context, found: Findings, strategies: set[str] | None) -> str | None:
    """How pods get the GPUs the device plugin grants through gpuctk-runtime while env
    requests of unprivileged Kubernetes containers are refused; None when they already do."""
    from gpuctk.doctor.runtime import config_path

    config = config_path(ctx)[0]
    settings = found.settings
    prefixes = settings.annotation_prefixes if settings is not None else ()
    if strategies is None or "envvar" in strategies:
        return (
            "set DEVICE_LIST_STRATEGY=cdi-annotations on the NVIDIA device plugin (helm: --set "
            "deviceListStrategy=cdi-annotations)   # or volume-mounts with accept-volume-mounts "
            f"= true in {config}; or, knowing any pod may then take every GPU, "
            "accept-envvar-unprivileged = true"
        )
    if "cdi-annotations" in strategies and "cdi.k8s.io/" not in prefixes:
        return f'add "cdi.k8s.io/" to annotation-prefixes in {config}'
    if "volume-mounts" in strategies and not (settings and settings.accept_volume_mounts):
        return f"set accept-volume-mounts = true in {config}"
    return None


def check_envvar_unprivileged(ctx: Context, found: Findings) -> Result:
    settings = found.settings
    if settings is None:
        return skipped(ENVVAR_CHECK, ENVVAR_TITLE, "no runtime settings")
    where = found.settings_source or "defaults"
    value = settings.accept_envvar_unprivileged
    said = {None: "auto", False: "false", True: "true"}[value]
    kubelet = ctx.kubelet_root or ctx.host("/var/lib/kubelet")
    if not os.path.isdir(kubelet):
        return skipped(
            ENVVAR_CHECK, ENVVAR_TITLE, f"{kubelet}: absent: no device plugin allocation to bypass"
        )
    strategies, plugin = plugin_strategy(ctx)
    setting = f"{where}: accept-envvar-unprivileged = {said}"
    if value:
        evidence = [
            f"{setting}: an unprivileged pod whose image sets NVIDIA_VISIBLE_DEVICES=all gets "
            "every GPU of the node, not the ones the device plugin allocated to it",
            plugin,
        ]
        fix = _grant_fix(ctx, found, strategies)
        then = "remove the key (auto: env requests of Kubernetes containers are refused)"
        return warning(ENVVAR_CHECK, ENVVAR_TITLE, evidence, f"{fix}, then {then}" if fix else then)
    fix = _grant_fix(ctx, found, strategies)
    if fix is None:
        return ok(ENVVAR_CHECK, ENVVAR_TITLE, setting, plugin)
    evidence = [
        f"{setting}: env requests of unprivileged Kubernetes containers are refused",
        plugin,
    ]
    if strategies is not None and "envvar" in strategies:
        evidence.append("the plugin hands GPUs out by NVIDIA_VISIBLE_DEVICES: its pods get none")
        return failed(ENVVAR_CHECK, ENVVAR_TITLE, evidence, fix)
    if strategies is None:  # no plugin: no grant to miss
        return ok(ENVVAR_CHECK, ENVVAR_TITLE, setting, plugin)
    evidence.append("the plugin's grants are not read by gpuctk-runtime as configured")
    return failed(ENVVAR_CHECK, ENVVAR_TITLE, evidence, fix)


# --- cdi.version-readers ---------------------------------------------------------------------


def _release(binary: str) -> tuple[Release, str]:
    """(major, minor, patch) and the first line of `binary --version`; GpuctkError if none."""
    from gpuctk.containerd import engine

    found = engine.version(binary)
    patch = re.search(rf"(?<![\d.]){found.major}\.{found.minor}\.(\d+)", found.text)
    line = found.text.strip().splitlines()[0] if found.text.strip() else binary
    return (found.major, found.minor, int(patch.group(1)) if patch else 0), line


def _containerd_cdi_on(ctx: Context, binary: str, release: Release) -> bool:
    """containerd's effective enable_cdi (its default: off in 1.7, on from 2.0)."""
    from gpuctk.doctor import engine

    config = ctx.containerd_config or ctx.host("/etc/containerd/config.toml")
    try:
        data, _ = engine.load_containerd(ctx, binary, config)
    except GpuctkError:
        return True  # unknown: count it as a reader
    value = engine._handlers(data)[1].get("enable_cdi")
    return value if isinstance(value, bool) else release >= (2, 0, 0)


def readers(ctx: Context) -> tuple[list[tuple[str, Release, str]], list[str]]:
    """([(engine, release, newest cdiVersion it reads)], evidence of engines that read none)."""
    out: list[tuple[str, Release, str]] = []
    notes: list[str] = []
    for name in READERS:
        binary = ctx.containerd if name == "containerd" and ctx.containerd else None
        binary = binary or shutil.which(name, path=ctx.path)
        if binary is None:
            continue
        try:
            release, line = _release(binary)
        except GpuctkError as exc:
            notes.append(f"{name}: version unknown, not checked: {exc.message}")
            continue
        shown = f"{name} {'.'.join(map(str, release))}"
        table = READERS[name]
        if release < table[0][0]:
            why = "no CDI support: it reads no spec" if name == "containerd" else "not checked"
            notes.append(f"{shown} ({line}): older than the table's first entry: {why}")
        elif release[:2] > NEWEST[name]:
            notes.append(f"{shown}: newer than the releases this check knows: not checked")
        elif name == "containerd" and not _containerd_cdi_on(ctx, binary, release):
            notes.append(f"{shown}: enable_cdi = false: it reads no spec")
        else:
            out.append((name, release, [v for first, v in table if first <= release][-1]))
    return out, notes


def _first_reading(name: str, needed: str) -> str:
    from gpuctk.cdi.specs.version import compare_versions

    for first, newest in READERS[name]:
        if compare_versions(newest, needed) >= 0:
            return f"{name} {'.'.join(map(str, first))}"
    return f"a {name} newer than {'.'.join(map(str, NEWEST[name]))}"


def _spec_problems(
    ctx: Context, path: str, doc: dict[str, Any], engines: list[tuple[str, Release, str]]
) -> tuple[list[str], list[str]]:
    from gpuctk.cdi.specs import version
    from gpuctk.doctor.cdi import refresh_fix

    declared = version.normalize_version(str(doc.get("cdiVersion", "")))
    if not version.is_known_version(declared):
        return [], []  # cdi.valid reports it
    rejecting = [e for e in engines if version.compare_versions(declared, e[2]) > 0]
    problems = [
        f"{path}: cdiVersion {declared}: {name} {'.'.join(map(str, rel))} reads up to {newest} "
        "and rejects this spec, so none of its devices reach that engine's containers"
        for name, rel, newest in rejecting
    ]
    if not rejecting:
        return [], []
    needed = version.minimum_version(doc)
    lowest = min((e[2] for e in rejecting), key=cmp_to_key(version.compare_versions))
    if version.compare_versions(needed, lowest) <= 0:
        return problems, [f"{refresh_fix(ctx, path)}   # it needs only cdiVersion {needed}"]
    reason = version._REASONS.get(needed, "")
    upgrades = ", ".join(_first_reading(name, needed) for name, _, _ in rejecting)
    return problems, [
        f"its content needs cdiVersion {needed}{reason}: regenerate {path} without that, "
        f"or upgrade to {upgrades}"
    ]


def check_version_readers(ctx: Context, found: Findings) -> Result:
    from gpuctk.cdi.specs import registry as registrymod

    specs = registrymod.load(found.spec_dirs).specs
    if not specs:
        return skipped(READERS_CHECK, READERS_TITLE, "no spec files")
    engines, notes = readers(ctx)
    if not engines:
        return skipped(READERS_CHECK, READERS_TITLE, "no engine here reads CDI specs", *notes)
    problems: list[str] = []
    fixes: list[str] = []
    for spec in specs:
        more, fix = _spec_problems(ctx, spec.path, spec.doc, engines)
        problems += more
        fixes += [f for f in fix if f not in fixes]
    shown = [f"{n} {'.'.join(map(str, r))} reads cdiVersion up to {v}" for n, r, v in engines]
    if problems:
        return failed(READERS_CHECK, READERS_TITLE, [*problems, *shown, *notes], "; ".join(fixes))
    versions = sorted({str(s.doc.get("cdiVersion")) for s in specs})
    return ok(
        READERS_CHECK,
        READERS_TITLE,
        f"{len(specs)} spec file(s), cdiVersion {', '.join(versions)}",
        *shown,
        *notes,
    )


def runtime_policy_checks(ctx: Context, found: Findings) -> list[Result]:
    return [check_envvar_unprivileged(ctx, found)]


def cdi_policy_checks(ctx: Context, found: Findings) -> list[Result]:
    return [check_version_readers(ctx, found)]
