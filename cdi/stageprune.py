"""`gpuctk cdi generate --prune-stages`: remove the driver stages (gpuctk.cdi.stage) that no CDI
spec names and no running container mounts (gpuctk.cdi.stagemounts finds those), and the
`.tmp-` folders a run that died left behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable

from gpuctk.cdi.stage import STAGE_NAME, STALE_TMP_S, sources_records

KEEP_OTHERS = 2  # older stages a prune keeps without a word; more kept gets a warning line


def _spec_texts(spec_dirs: tuple[str, ...]) -> dict[str, str]:
    """{path: text} of the CDI spec files (*.json, *.yaml, *.yml) directly in `spec_dirs`."""
    texts: dict[str, str] = {}
    for folder in spec_dirs:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.name.endswith((".json", ".yaml", ".yml")) and entry.is_file():
                try:
                    with open(entry.path, "rb") as f:
                        texts[entry.path] = f.read(1 << 24).decode("utf-8", "replace")
                except OSError:
                    continue
    return texts


def prune_stages(
    staging_dir: str,
    keep: str,
    spec_dirs: tuple[str, ...],
    report: Callable[[str], None],
    proc: str = "/proc",
) -> list[str]:
    """Remove the stages in `staging_dir` other than `keep` that no CDI spec file (*.json,
    *.yaml, *.yml) in `spec_dirs` names and no mount namespace mounts (a running container:
    gpuctk.cdi.stagemounts, by filesystem and path inside it), and `.tmp-` folders left by a
    run that died an hour or more ago. A stage a container mounts is never removed: the
    container's bind keeps the folder but not its files. It goes at a later prune, once no
    container mounts it. What stays is the current stage, every stage a spec names and every
    stage a container mounts: no count can be enforced on those without breaking a spec or a
    container, so more than KEEP_OTHERS of them besides the current gets a warning line naming
    each and why it stays. Returns the folders removed."""
    texts = _spec_texts(spec_dirs)
    removed: list[str] = []
    named: dict[str, str] = {}
    candidates: list[str] = []
    now = time.time()
    for entry in sorted(os.scandir(staging_dir), key=lambda e: e.name):
        if entry.path == keep or not entry.is_dir(follow_symlinks=False):
            continue
        if STAGE_NAME.fullmatch(entry.name):
            spec = next((p for p, text in texts.items() if entry.path in text), None)
            if spec is not None:
                named[entry.path] = spec
            else:
                candidates.append(entry.path)
        elif entry.name.startswith(".tmp-") and now - entry.stat().st_mtime > STALE_TMP_S:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
            report(f"removed {entry.path}: a stage a run left unfinished over an hour ago")
    in_use: dict[str, int] = {}
    if candidates:
        from gpuctk.cdi.stagemounts import mounted

        real = {os.path.realpath(c): c for c in candidates}
        found, note = mounted(list(real), proc)
        in_use = {real[r]: n for r, n in found.items()}
        if note:
            report(f"kept every stage no spec names: {note}")
    for path in candidates:
        if path in in_use:
            if in_use[path]:
                report(
                    f"kept {path}: no spec names it, but {in_use[path]} mount namespace(s) "
                    "(running containers) mount it; a later --prune-stages removes it"
                )
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
        report(f"removed {path}: no CDI spec in {', '.join(spec_dirs)} names it")
    for stage, source in sources_records(staging_dir):  # the records of stages gone
        if not os.path.isdir(stage):
            with contextlib.suppress(FileNotFoundError):  # a prune running beside this one
                os.unlink(source)
    kept = [*(f"{p} (named by {s})" for p, s in named.items()),
            *(f"{p} (mounted)" for p in candidates if p in in_use)]  # fmt: skip
    if len(kept) > KEEP_OTHERS:
        report(
            f"warning: {len(kept)} older stages kept in {staging_dir} besides the current one "
            f"(over {KEEP_OTHERS}; each pins a driver's files on disk): {'; '.join(kept)}; "
            "regenerate or remove the specs that name them"
        )
    return removed
