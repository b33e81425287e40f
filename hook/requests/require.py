"""NVIDIA_REQUIRE_* constraints, checked at container create against the spec's facts.

Every env var named NVIDIA_REQUIRE_<X> (but NVIDIA_REQUIRE_JETPACK, as the reference) holds one
expression; all of them must hold. In an expression, space-separated terms are alternatives
(OR) and comma-separated constraints inside a term must all hold (AND), as libnvidia-container's
DSL reads them:

    NVIDIA_REQUIRE_CUDA="cuda>=12.0 brand=tesla,driver>=470,driver<471"

Keys: `cuda` (the CUDA version the driver supports), `driver` (the driver version), `arch`
(a selected GPU's compute capability: `arch=sm_90`, `arch>=8.0`), `brand` (not known to the spec
yet: reported as unverifiable, never failing). Operators: = != < <= > >=. Versions compare
numerically, component by component (missing components are 0). Device constraints (arch,
brand) must hold for every selected GPU; with no GPU selected they hold.

A legacy image (CUDA_VERSION set, NVIDIA_REQUIRE_CUDA not) requires cuda>=<its major.minor>.
NVIDIA_DISABLE_REQUIRE set to a true value (1, t, true, ...) turns every check off.

Facts come from the env of the spec's gpuctk hook entry (gpuctk.cdi.node.facts). An unmet
constraint raises RequestError naming the variable, the constraint and the value found.
"""

from __future__ import annotations

from gpuctk.errors import RequestError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any

    from gpuctk.cdi.node.facts import Facts, GpuFacts

    Term = tuple[str, str, str]  # key, operator, value

PREFIX = "NVIDIA_REQUIRE_"
DISABLE = "NVIDIA_DISABLE_REQUIRE"
_TRUE = frozenset(("1", "t", "T", "TRUE", "true", "True"))
_OPS = (">=", "<=", "!=", "=", ">", "<")  # longest first
KEYS = ("cuda", "driver", "arch", "brand")
MAX_TERMS = 256
MAX_DIGITS = 9  # per version component: int() of a longer one costs, then fails past 4300
MAX_SHOWN = 64  # characters of a value quoted in a message


def _shown(text: str) -> str:
    """`text` quoted for a message, cut to MAX_SHOWN characters."""
    return repr(text) if len(text) <= MAX_SHOWN else f"{text[:MAX_SHOWN]!r}..."


def _number(text: str) -> bool:
    """Whether `text` is a version component: ASCII digits, at most MAX_DIGITS of them."""
    return text.isascii() and text.isdigit() and len(text) <= MAX_DIGITS


def requirements(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """(variable, expression) pairs to check, sorted by variable; [] when disabled."""
    if env.get(DISABLE, "") in _TRUE:
        return []
    found = [
        (key, value)
        for key, value in env.items()
        if key.startswith(PREFIX) and not key.startswith(PREFIX + "JETPACK") and value.strip()
    ]
    legacy = env.get("CUDA_VERSION", "")
    if legacy and not env.get(PREFIX + "CUDA"):
        parts = legacy.lstrip("v").split(".")
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            if not (_number(parts[0]) and _number(parts[1])):
                raise RequestError(
                    f"invalid CUDA_VERSION {_shown(legacy)}: not a version "
                    f"(at most {MAX_DIGITS} ASCII digits a component)"
                )
            found.append(("CUDA_VERSION", f"cuda>={int(parts[0])}.{int(parts[1])}"))
    return sorted(found)


def parse_term(text: str) -> Term:
    """("cuda", ">=", "12.0") from "cuda>=12.0"; RequestError when malformed."""
    for i, c in enumerate(text):
        if c in "<>=!":
            key = text[:i].strip().lower()
            rest = text[i:]
            for op in _OPS:
                if rest.startswith(op):
                    value = rest[len(op) :].strip()
                    break
            else:
                raise RequestError(f"invalid constraint {_shown(text)}: unknown operator")
            if key not in KEYS:
                raise RequestError(
                    f"invalid constraint {_shown(text)}: unknown key {_shown(key)} "
                    f"(known: {', '.join(KEYS)})"
                )
            if not value:
                raise RequestError(f"invalid constraint {_shown(text)}: no value")
            if key != "brand":
                _version(key, value, text)
            elif op not in ("=", "!="):
                raise RequestError(f"invalid constraint {_shown(text)}: brand takes = or !=")
            return key, op, value
    raise RequestError(f"invalid constraint {_shown(text)}: expected <key><operator><value>")


def parse_expression(text: str) -> list[list[Term]]:
    """OR-list of AND-lists of terms."""
    alternatives = [[parse_term(t) for t in alt.split(",") if t.strip()] for alt in text.split()]
    alternatives = [a for a in alternatives if a]
    if sum(len(a) for a in alternatives) > MAX_TERMS:
        raise RequestError(f"requirement {text[:40]!r}...: more than {MAX_TERMS} constraints")
    return alternatives


def _version(key: str, value: str, where: str) -> tuple[int, ...]:
    text = value.strip()
    if key == "arch":
        low = text.lower()
        if low.startswith(("sm_", "sm", "compute_")):
            digits = low.removeprefix("compute_").removeprefix("sm").removeprefix("_")
            digits = digits.rstrip("abcdefghijklmnopqrstuvwxyz")
            if len(digits) < 2 or not digits.isdigit():
                raise RequestError(
                    f"invalid constraint {_shown(where)}: bad architecture {_shown(value)}"
                )
            text = f"{digits[:-1]}.{digits[-1]}"
    parts = text.split(".")
    if not all(_number(p) for p in parts):
        raise RequestError(
            f"invalid constraint {_shown(where)}: {_shown(value)} is not a version "
            f"(at most {MAX_DIGITS} ASCII digits a component)"
        )
    return tuple(int(p) for p in parts)


def _compare(found: tuple[int, ...], op: str, wanted: tuple[int, ...]) -> bool:
    width = max(len(found), len(wanted))
    a = found + (0,) * (width - len(found))
    b = wanted + (0,) * (width - len(wanted))
    return {
        "=": a == b,
        "!=": a != b,
        "<": a < b,
        "<=": a <= b,
        ">": a > b,
        ">=": a >= b,
    }[op]


def _holds(term: Term, facts: Facts, gpu: GpuFacts | None, notes: list[str]) -> tuple[bool, str]:
    """(holds, what was found) for one constraint; unverifiable ones hold, with a note."""
    key, op, value = term
    shown = f"{key}{op}{value}"
    if key == "brand":
        notes.append(f"cannot verify {shown}: the GPU brand is not in the CDI spec; assumed met")
        return True, "unknown"
    if key == "arch":
        if gpu is None:
            return True, "no GPU selected"
        found_text = gpu.compute_capability
        where = f"GPU {gpu.index} has compute capability {found_text}"
    elif key == "cuda":
        found_text = facts.cuda_version
        where = f"the driver supports CUDA {found_text}"
    else:
        found_text = facts.driver_version
        where = f"the driver is {found_text}"
    if not found_text:
        notes.append(f"cannot verify {shown}: the CDI spec does not record {key}; assumed met")
        return True, "unknown"
    try:
        found = _version(key, found_text, shown)
    except RequestError:
        notes.append(f"cannot verify {shown}: the spec's {key} {found_text!r} is not a version")
        return True, "unknown"
    return _compare(found, op, _version(key, value, shown)), where


def check(env: Mapping[str, str], facts: Facts | None, gpus: Sequence[GpuFacts]) -> list[str]:
    """Check every requirement in the container env; notes (unverifiable constraints) returned,
    RequestError for the first requirement not met."""
    notes: list[str] = []
    reqs = requirements(env)
    if not reqs:
        return notes
    if facts is None:
        names = ", ".join(name for name, _ in reqs)
        return [f"cannot check {names}: the CDI spec carries no gpuctk facts; assumed met"]
    for name, expression in reqs:
        alternatives = parse_expression(expression)
        targets: Sequence[GpuFacts | None] = gpus or [None]
        for gpu in targets:
            failures = []
            for terms in alternatives:
                for term in terms:
                    ok, found = _holds(term, facts, gpu, notes)
                    if not ok:
                        failures.append(f"{term[0]}{term[1]}{term[2]} ({found})")
                        break
                else:
                    break  # this alternative holds
            else:
                if alternatives:
                    raise RequestError(
                        f"unsatisfied requirement {name}={expression!r}: "
                        + "; ".join(failures)
                        + (" (set NVIDIA_DISABLE_REQUIRE=true to skip the check)")
                    )
    return list(dict.fromkeys(notes))


def facts_of(edits: Mapping[str, Any]) -> Facts | None:
    """The facts in the env of a spec's gpuctk hook entry, None when there are none."""
    hooks = edits.get("hooks")
    for hook in hooks if isinstance(hooks, list) else ():
        env = hook.get("env") if isinstance(hook, dict) else None
        if isinstance(env, list) and any(
            isinstance(e, str) and e.startswith("GPUCTK_DRIVER_VERSION=") for e in env
        ):
            from gpuctk.cdi.node.facts import decode

            try:
                return decode([e for e in env if isinstance(e, str)])
            except ValueError:
                return None
    return None


def gpus_for(names: Iterable[str], facts: Facts) -> list[GpuFacts]:
    """The GPUs behind CDI device names (the part after '='): index, UUID, MIG index or UUID,
    gpu<N>/mig<N:M>, all. Names that match nothing are skipped."""
    chosen: dict[int, GpuFacts] = {}
    for raw in names:
        name = raw.rpartition("=")[2]
        if name == "all":
            chosen.update((g.index, g) for g in facts.gpus)
            continue
        name = name.removeprefix("gpu") if name[3:4].isdigit() else name
        name = name.removeprefix("mig") if name[3:4].isdigit() else name
        head = name.partition(":")[0]
        for g in facts.gpus:
            if head == str(g.index) or name == g.uuid or name in g.mig_uuids:
                chosen[g.index] = g
    return [chosen[i] for i in sorted(chosen)]
