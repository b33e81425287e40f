"""`gpuctk doctor`: every IMEX channel node a CDI spec names still has the IMEX driver's major.

The channels' major is dynamic (/proc/devices, `nvidia-caps-imex-channels`): after a driver
reload it can change, and a spec generated before (`--mode imex`, or `--mode management`, which
takes the channels too) then grants containers whatever device holds the old number. The refresh
unit (gpuctk-cdi-refresh.service) regenerates an existing imex spec at GPUCTK_IMEX_SPEC; any
other stale spec is named here, with the command that rewrites it (or removes it when no
channel is left: `--if-exists`).
"""

from __future__ import annotations

import os
from typing import Any

from gpuctk.doctor.context import Context
from gpuctk.doctor.report import Result, failed, ok, skipped

ID = "cdi.imex"
IMEX_SPEC = "/var/run/cdi/imex.yaml"  # the refresh unit's GPUCTK_IMEX_SPEC default


def _nodes(doc: dict[str, Any]) -> list[dict[str, Any]]:
    blocks = [doc.get("containerEdits")]
    devices = doc.get("devices")
    if isinstance(devices, list):
        blocks += [d.get("containerEdits") for d in devices if isinstance(d, dict)]
    out: list[dict[str, Any]] = []
    for block in blocks:
        nodes = block.get("deviceNodes") if isinstance(block, dict) else None
        if isinstance(nodes, list):
            out += [n for n in nodes if isinstance(n, dict)]
    return out


def _mode(kind: str) -> str:
    if kind.endswith("/imex-channel"):
        return "imex"
    return "management" if kind.startswith("management.") else "nvml"


def _fix(ctx: Context, path: str, kind: str) -> str:
    """The command that rewrites the spec at `path` (the refresh unit where it writes it)."""
    from gpuctk.doctor.cdi import REFRESH_SERVICE, REFRESH_UNIT_DIRS, generate_fix

    mode = _mode(kind)
    extra: tuple[str, ...] = ("--mode", mode) if mode != "nvml" else ()
    if mode == "imex":
        extra += ("--if-exists",)  # no channel left: the spec is removed
    if ctx.proc_root != "/proc":
        extra += ("--proc-root", ctx.proc_root)
    generate = generate_fix(ctx, path, extra)
    units = (ctx.host(f"{d}/{REFRESH_SERVICE}") for d in REFRESH_UNIT_DIRS)
    if mode == "imex" and path == ctx.host(IMEX_SPEC) and any(map(os.path.isfile, units)):
        return f"systemctl start {REFRESH_SERVICE}   # or: {generate}"
    return generate


def check_imex_majors(ctx: Context, registry: Any) -> Result:
    from gpuctk.cdi.imex import DRIVER, FOLDER
    from gpuctk.cdi.node.devchar import read_char_majors

    title = "IMEX channel nodes in the CDI specs have the driver's major"
    major = read_char_majors(ctx.proc_root).get(DRIVER)
    now = f"major {major}" if major is not None else "no major (no IMEX channels now)"
    named, stale, fixes = 0, list[str](), dict[str, str]()
    for spec in registry.specs:
        for node in _nodes(spec.doc):
            path = node.get("path")
            if not isinstance(path, str) or not path.startswith(FOLDER + "/"):
                continue
            named += 1
            have = node.get("major")
            if isinstance(have, int) and have != major:
                stale.append(
                    f"{spec.path}: {path} is {have}:{node.get('minor')}, but /proc/devices gives "
                    f"{DRIVER} {now}: containers given it get whatever device holds {have}"
                )
                fixes.setdefault(spec.path, _fix(ctx, spec.path, str(spec.kind)))
    if not named:
        return skipped(ID, title, "no spec names an IMEX channel")
    if stale:
        return failed(ID, title, stale[:6], "; ".join(fixes.values()))
    return ok(ID, title, f"{named} IMEX channel node(s) with {DRIVER} {now}")
