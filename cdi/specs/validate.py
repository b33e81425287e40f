"""Validation of CDI spec files in layers, every problem reported at once, grouped by file.

Layers, in order (each reports everything it finds; later layers skip values of the wrong type):

1. decode   -- gpuctk.cdi.specs.specfile: UTF-8, size and nesting caps, no duplicate keys/aliases
2. strict   -- gpuctk.cdi.specs.strict: unknown keys anywhere, wrong types, missing required keys
3. schema   -- gpuctk.cdi.specs.schema: gpuctk's own JSON schema, shipped in the package, or
               another one chosen by directory (jsonschema is imported only then); findings at
               a location another layer already reported are dropped as duplicates
4. version  -- gpuctk.cdi.specs.version: cdiVersion known and >= the minimum the content needs
5. names    -- kind (vendor/class), device names, duplicate device names, at least one device,
               annotation keys (Kubernetes qualified names, 256 KiB in all)
6. edits    -- gpuctk.cdi.specs.validate_edits: env, paths, device nodes, hooks, mounts, conflicts
7. cross-spec (validate_files) -- one fully qualified device name defined in two files of one
               folder; across folders the later one overrides (a note, not a problem)

Problems are strings "<location>: <message>", e.g.
`devices[2].containerEdits.deviceNodes[0].path: must be absolute, not 'dev/nvidia0'`.
This module imports neither click nor jsonschema: the shim may use validate_spec_dict.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuctk.cdi.specs import names, version
from gpuctk.cdi.specs.schema import SHIPPED_SCHEMA, SchemaChecker, find_schema_dir, load_checker
from gpuctk.cdi.specs.specfile import load_spec_file
from gpuctk.cdi.specs.strict import strict_problems
from gpuctk.cdi.specs.validate_edits import conflict_problems, edits_problems
from gpuctk.errors import InputError, ValidationError

ANNOTATIONS_LIMIT = 256 * 1024
_DNS_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")
_KEY_INNER = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.")


@dataclass(frozen=True)
class ValidationReport:
    """Problems per file (every file given, in order; [] when valid) and notes for the user.

    `unreadable`: the files that could not be read at all (missing, not a regular file, no
    permission), each with one problem; `schema`: the schema file used, None when skipped."""

    problems: dict[str, list[str]]
    notes: tuple[str, ...] = ()
    schema: Path | None = None
    unreadable: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not any(self.problems.values())

    def lines(self) -> list[str]:
        """ "<file>: <problem>" for every problem, grouped by file."""
        return [f"{path}: {p}" for path, found in self.problems.items() for p in found]


def schema_checker(schema_dir: str | os.PathLike[str] | None = None) -> SchemaChecker | None:
    """A checker for the schema in `schema_dir` (or $GPUCTK_CDI_SCHEMA_DIR), else for the shipped
    one; None only when an install lacks the shipped file (see gpuctk.cdi.specs.schema)."""
    directory = find_schema_dir(schema_dir)
    if directory is None and not SHIPPED_SCHEMA.is_file():
        return None
    return load_checker(directory)


def _annotation_key_problem(key: str) -> str | None:
    prefix, sep, name = key.rpartition("/")
    if sep:
        if not prefix or len(prefix) > 253 or "/" in prefix:
            return "prefix must be a DNS subdomain of at most 253 characters"
        for label in prefix.split("."):
            if not label or not set(label) <= _DNS_CHARS or "-" in (label[0], label[-1]):
                return "prefix must be a lowercase DNS subdomain"
    if not name or len(name) > 63:
        return "name must be 1..63 characters"
    if not (names.is_alnum(name[0]) and names.is_alnum(name[-1])):
        return "name must start and end with a letter or digit"
    if not set(name) <= _KEY_INNER:
        return "name may only carry letters, digits, '-', '_' and '.'"
    return None


def _annotation_problems(value: Any, where: str, out: list[str]) -> None:
    if not isinstance(value, dict):
        return
    size = 0
    for key, text in value.items():
        if not isinstance(key, str) or not isinstance(text, str):
            continue
        size += len(key.encode()) + len(text.encode())
        problem = _annotation_key_problem(key)
        if problem:
            out.append(f"{where}[{key!r}]: invalid annotation key: {problem}")
    if size > ANNOTATIONS_LIMIT:
        out.append(f"{where}: {size} bytes in all, more than {ANNOTATIONS_LIMIT}")


def _name_problems(doc: dict[str, Any], out: list[str]) -> None:
    kind = doc.get("kind")
    if isinstance(kind, str):
        problem = names.kind_problem(kind)
        if problem:
            out.append(f"kind: {problem}")
    _annotation_problems(doc.get("annotations"), "annotations", out)
    devices = doc.get("devices")
    if not isinstance(devices, list):
        return
    if not devices:
        out.append("devices: a spec needs at least one device")
    first: dict[str, int] = {}
    for i, device in enumerate(devices):
        if not isinstance(device, dict):
            continue
        _annotation_problems(device.get("annotations"), f"devices[{i}].annotations", out)
        name = device.get("name")
        if not isinstance(name, str):
            continue
        problem = names.device_name_problem(name)
        if problem:
            out.append(f"devices[{i}].name: {problem}")
        elif name in first:
            out.append(f"devices[{i}].name: {name!r} is already defined by devices[{first[name]}]")
        else:
            first[name] = i


def _edit_problems(doc: dict[str, Any], out: list[str]) -> None:
    common = doc.get("containerEdits")
    out += edits_problems(common, "containerEdits", device=False)
    out += conflict_problems(common, None, "")
    devices = doc.get("devices")
    for i, device in enumerate(devices if isinstance(devices, list) else []):
        if isinstance(device, dict):
            where = f"devices[{i}].containerEdits"
            out += edits_problems(device.get("containerEdits"), where, device=True)
            out += conflict_problems(common, device.get("containerEdits"), where)


def _norm(location: str) -> str:
    """ "annotations['a.b']" -> "annotations.a.b", the schema layer's spelling."""
    return location.replace("['", ".").replace("']", "")


def _is_within(location: str, reported: Iterable[str]) -> bool:
    location = _norm(location)
    for done in map(_norm, reported):
        if location == done or location.startswith((done + ".", done + "[")):
            return True
    return False


def validate_spec_dict(
    doc: Any, source: str = "<spec>", *, schema: SchemaChecker | None = None
) -> list[str]:
    """Every problem of the spec document `doc` (named `source`), schema layer if `schema`."""
    if not isinstance(doc, dict):
        return [f"{source}: a CDI spec must be a mapping, not {type(doc).__name__}"]
    out = strict_problems(doc)
    rest = version.version_problems(doc)
    _name_problems(doc, rest)
    _edit_problems(doc, rest)
    if schema is not None:
        reported = [p.split(": ", 1)[0] for p in out + rest]
        for where, message in schema.problems(doc):
            if not _is_within(where, reported):
                out.append(f"{where or 'spec'}: {message} (CDI schema)")
    return out + rest


def check_spec_dict(
    doc: Any, source: str = "<spec>", *, schema: SchemaChecker | None = None
) -> None:
    """Raise ValidationError (with every problem) unless `doc` is a valid spec."""
    problems = validate_spec_dict(doc, source, schema=schema)
    if problems:
        raise ValidationError(f"{source}: invalid CDI spec: {problems[0]}", problems)


def qualified_devices(doc: Any) -> list[tuple[int, str]]:
    """(index, "vendor/class=name") of each well-named device of a spec document."""
    if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str):
        return []
    kind = doc["kind"]
    if names.kind_problem(kind):
        return []
    devices = doc.get("devices")
    found = []
    for i, device in enumerate(devices if isinstance(devices, list) else []):
        name = device.get("name") if isinstance(device, dict) else None
        if isinstance(name, str) and not names.device_name_problem(name):
            found.append((i, f"{kind}={name}"))
    return found


def _cross_spec(docs: dict[str, Any], problems: dict[str, list[str]]) -> list[str]:
    """Devices defined in more than one file. Two files of one folder: a problem in each
    (requests for the name fail, as in gpuctk.cdi.specs.registry). Files of different
    folders: CDI's override, the later folder's file wins (folders ordered as first given),
    returned as one note per overridden file."""
    folders: dict[str, int] = {}
    for path in docs:
        folders.setdefault(os.path.dirname(os.path.abspath(path)), len(folders))
    owners: dict[str, list[tuple[str, int]]] = {}
    for path, doc in docs.items():
        for index, qualified in qualified_devices(doc):
            owners.setdefault(qualified, []).append((path, index))
    overridden: dict[tuple[str, str], list[str]] = {}  # (loser, winner) -> names
    for qualified, places in owners.items():
        by_folder: dict[int, list[tuple[str, int]]] = {}
        for path, index in places:
            by_folder.setdefault(folders[os.path.dirname(os.path.abspath(path))], []).append(
                (path, index)
            )
        for group in by_folder.values():
            files = {path for path, _ in group}
            if len(files) < 2:
                continue  # duplicates inside one file are reported by the names layer
            for path, index in group:
                others = ", ".join(sorted(files - {path}))
                problems[path].append(
                    f"devices[{index}].name: {qualified} is also defined in {others}"
                )
        last = max(by_folder)
        winner = ", ".join(dict.fromkeys(path for path, _ in by_folder[last]))
        for folder, group in by_folder.items():
            if folder != last:
                for loser in dict.fromkeys(path for path, _ in group):
                    overridden.setdefault((loser, winner), []).append(qualified)
    notes = []
    for (loser, winner), names_ in overridden.items():
        shown = ", ".join(names_[:3]) + (", ..." if len(names_) > 3 else "")
        notes.append(
            f"{winner} overrides {loser} for {len(names_)} device(s) ({shown}): "
            "a later spec folder wins over an earlier one"
        )
    return notes


def check_files(
    paths: Sequence[str | os.PathLike[str]],
    schema_dir: str | os.PathLike[str] | None = None,
    *,
    use_schema: bool = True,
) -> ValidationReport:
    """Validate spec files together: each on its own, then across them (a device defined
    twice in one folder; a later folder overriding an earlier one is a note)."""
    notes: list[str] = []
    checker = schema_checker(schema_dir) if use_schema else None
    if use_schema and checker is None:
        notes.append(
            f"CDI JSON schema not found ({SHIPPED_SCHEMA} is missing from this install; set "
            "--schema-dir or GPUCTK_CDI_SCHEMA_DIR): schema layer skipped"
        )
    problems: dict[str, list[str]] = {}
    docs: dict[str, Any] = {}
    unreadable: list[str] = []
    for raw in paths:
        path = os.fspath(raw)
        if path in problems:
            continue  # the same file given twice is not a conflict with itself
        problems[path] = []
        try:
            os.lstat(path)
            doc = load_spec_file(path)
        except FileNotFoundError:
            problems[path].append("does not exist")
            unreadable.append(path)
            continue
        except ValidationError as exc:
            problems[path] += exc.problems or [exc.message]
            continue
        except InputError as exc:
            problems[path].append(exc.message.removeprefix(f"{path}: "))
            unreadable.append(path)
            continue
        docs[path] = doc
        problems[path] += validate_spec_dict(doc, path, schema=checker)
    notes += _cross_spec(docs, problems)
    schema = checker.path if checker else None
    return ValidationReport(problems, tuple(notes), schema, tuple(unreadable))


def validate_files(
    paths: Sequence[str | os.PathLike[str]], schema_dir: str | os.PathLike[str] | None = None
) -> dict[str, list[str]]:
    """{path: [problem, ...]} for each file given ([] when valid); see check_files."""
    return check_files(paths, schema_dir).problems
