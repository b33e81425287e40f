"""`gpuctk doctor`'s `cdi.stages`: the driver stage of every folder-mode spec exists.

A folder-mode spec (`gpuctk cdi generate`'s default where the driver's files are real) mounts
one host folder, `<staging dir>/<driver version>-<digest>` (gpuctk.cdi.stage), and its lib64/.
When that folder is gone (removed by hand or by another tool, a staging dir on a
tmpfs after a reboot) every container given those devices fails at start with the runtime's
bare "no such file or directory", naming no cause. This check reads every spec in the spec
dirs (every kind: a monitoring or IMEX spec can be a folder spec too), finds the mount sources
that lie in a stage (a path component named like one), and fails for each stage, or folder of
one, that is missing, with the command that rebuilds it: the package's refresh unit where it
writes that spec, else `gpuctk cdi generate --output <that spec>` (with `--staging-dir` when
the stage is not in the default staging dir). Mount sources are host paths, read as they are
(as cdi.driver-version reads them), not under --host-root.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from gpuctk.cdi.stage import DEFAULT_STAGING_DIR, STAGE_NAME
from gpuctk.doctor.cdi import _host_paths, _shown, refresh_fix
from gpuctk.doctor.context import Context
from gpuctk.doctor.report import Result, failed, ok, skipped


def stage_of(path: str) -> str | None:
    """The stage folder a mount source lies in (itself or a folder above it named
    `<version>-<digest>`), else None."""
    parts = os.path.normpath(path).split("/")
    for i in range(len(parts) - 1, 0, -1):
        if STAGE_NAME.fullmatch(parts[i]):
            return "/".join(parts[: i + 1])
    return None


def check_stages(ctx: Context, registry: Any) -> Result:
    title = "the driver stage of every folder-mode CDI spec exists"
    missing: list[str] = []
    fixes: list[str] = []
    stages: set[str] = set()
    removals: list[str] = []
    for spec in registry.specs:
        sources = [(p, stage_of(p)) for p in _host_paths(spec.doc, "mounts", "hostPath")]
        named = list(dict.fromkeys(s for _, s in sources if s is not None))
        stages.update(named)
        broken = []
        for folder in named:
            if not os.path.lexists(folder):
                missing.append(f"{spec.path}: its driver stage {folder} is missing")
                broken.append(folder)
                continue
            gone = [p for p, s in sources if s == folder and not os.path.lexists(p)]
            missing += [f"{spec.path}: {p} (in its driver stage) is missing" for p in gone]
            if gone:  # generate reuses a stage folder that exists: it must go first
                broken.append(folder)
                removals.append(folder)
        if broken:
            staging_dir = os.path.dirname(broken[0])
            extra = () if staging_dir == DEFAULT_STAGING_DIR else ("--staging-dir", staging_dir)
            fixes.append(refresh_fix(ctx, spec.path, extra))
    if missing:
        evidence = [
            *_shown(missing),
            "every container given these devices fails to start (runc, crun: no such file or "
            "directory)",
        ]
        first, *others = dict.fromkeys(fixes)
        evidence += [f"and: {f}" for f in others]
        if removals:
            first = f"rm -r {shlex.join(dict.fromkeys(removals))} && {first}"
        return failed("cdi.stages", title, evidence, first)
    if not stages:
        return skipped("cdi.stages", title, "no folder-mode spec")
    return ok("cdi.stages", title, *(f"{s} exists" for s in sorted(stages)))
