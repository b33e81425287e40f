"""`gpuctk doctor` results: one record per check, the table, the JSON, the exit code.

Each check gives a status, the evidence it saw and, when something is wrong, the fix: a concrete
command (or the one line to change). Statuses:

    ok       the layer does what the next layer needs
    warning  works now, or works for some requests, but will bite (stale, ambiguous, missing
             optional piece)
    failed   GPU containers fail, or get the wrong devices, because of this
    skipped  not applicable here (engine not installed, no input given, a layer below failed)

Exit code: 0 when nothing is a warning or failure, 1 when the worst is a warning, 2 when any
check failed. Skipped checks never change it. The JSON form (`--format json`) is a stable
interface: keys are only ever added.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

OK = "ok"
WARNING = "warning"
FAILED = "failed"
SKIPPED = "skipped"
STATUSES = (OK, WARNING, FAILED, SKIPPED)

EXIT_ALL_OK = 0
EXIT_WARNINGS = 1
EXIT_FAILURES = 2

JSON_VERSION = 1
LAYERS = ("driver", "nvml", "cdi", "runtime", "engine", "kubernetes", "probe")

_COLOURS = {OK: "green", WARNING: "yellow", FAILED: "red", SKIPPED: "bright_black"}
_MARKS = {OK: "ok", WARNING: "WARN", FAILED: "FAIL", SKIPPED: "skip"}


@dataclass(frozen=True)
class Result:
    """The outcome of one check."""

    id: str  # "cdi.layout": stable, dotted, the layer first
    title: str  # "CDI spec matches the GPU/MIG layout"
    status: str
    evidence: tuple[str, ...] = field(default=())
    fix: str | None = None

    @property
    def layer(self) -> str:
        return self.id.split(".", 1)[0]


def ok(id_: str, title: str, *evidence: str) -> Result:
    return Result(id_, title, OK, tuple(evidence))


def warning(id_: str, title: str, evidence: Iterable[str], fix: str | None) -> Result:
    return Result(id_, title, WARNING, tuple(evidence), fix)


def failed(id_: str, title: str, evidence: Iterable[str], fix: str | None) -> Result:
    return Result(id_, title, FAILED, tuple(evidence), fix)


def skipped(id_: str, title: str, *evidence: str) -> Result:
    return Result(id_, title, SKIPPED, tuple(evidence))


def exit_code(results: Sequence[Result]) -> int:
    statuses = {r.status for r in results}
    if FAILED in statuses:
        return EXIT_FAILURES
    if WARNING in statuses:
        return EXIT_WARNINGS
    return EXIT_ALL_OK


def counts(results: Sequence[Result]) -> dict[str, int]:
    return {s: sum(1 for r in results if r.status == s) for s in STATUSES}


def to_json(results: Sequence[Result]) -> str:
    body = {
        "version": JSON_VERSION,
        "exitCode": exit_code(results),
        "summary": counts(results),
        "checks": [
            {
                "id": r.id,
                "layer": r.layer,
                "title": r.title,
                "status": r.status,
                "evidence": list(r.evidence),
                "fix": r.fix,
            }
            for r in results
        ],
    }
    return json.dumps(body, indent=2) + "\n"


def _style(text: str, status: str, colour: bool) -> str:
    if not colour:
        return text
    import click

    return click.style(
        text, fg=_COLOURS[status], bold=True if status in (WARNING, FAILED) else None
    )


def to_table(results: Sequence[Result], *, colour: bool = False, verbose: bool = False) -> str:
    """A readable table: one row per check, evidence and fix indented under it.

    Evidence is shown for every check that is not ok (and for all with `verbose`)."""
    width = max((len(r.id) for r in results), default=0)
    lines: list[str] = []
    layer = ""
    for r in results:
        if r.layer != layer:
            layer = r.layer
            lines.append(_style(f"{layer.upper()}", OK, False))
        mark = _style(f"{_MARKS[r.status]:<4}", r.status, colour)
        lines.append(f"  {mark}  {r.id:<{width}}  {r.title}")
        if verbose or r.status != OK:
            lines += [f"{'':8}{e}" for e in r.evidence]
        if r.fix and r.status in (WARNING, FAILED):
            lines.append(f"{'':8}fix: {_style(r.fix, r.status, colour)}")
    c = counts(results)
    summary = (
        f"{c[OK]} ok, {c[WARNING]} warning(s), {c[FAILED]} failed, {c[SKIPPED]} skipped "
        f"(exit {exit_code(results)})"
    )
    lines += ["", _style(summary, _worst(results), colour)]
    return "\n".join(lines) + "\n"


def _worst(results: Sequence[Result]) -> str:
    return {EXIT_ALL_OK: OK, EXIT_WARNINGS: WARNING, EXIT_FAILURES: FAILED}[exit_code(results)]
