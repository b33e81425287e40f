"""`gpuctk cdi list` and `gpuctk cdi validate`: look at the CDI specs on a node.

Both commands are plain click commands (`list_cmd`, `validate_cmd`) that the `gpuctk cdi` group
registers. The work is imported inside the commands, so registering them costs `generate`
nothing. Errors are gpuctk.errors exceptions; gpuctk.cli.main prints them as one line and exits
with their code.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import click

from gpuctk import log
from gpuctk.errors import ValidationError

DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
DIR_EXTENSIONS = (".json", ".yaml")  # what the reference registry reads from the spec dirs

_FORMAT = click.Choice(["text", "json"])


@dataclass(frozen=True)
class ListedDevice:
    name: str  # "nvidia.com/gpu=0"
    spec: str  # the file that defines it
    priority: int  # index of its spec dir: later dirs win


@dataclass(frozen=True)
class Listing:
    devices: tuple[ListedDevice, ...]
    problems: dict[str, list[str]]  # file (or dir) -> why it was skipped, or its conflicts
    files: int  # spec files seen


def _spec_files(directory: str) -> list[str]:
    with os.scandir(directory) as entries:
        return sorted(
            entry.path
            for entry in entries
            if entry.name.endswith(DIR_EXTENSIONS) and not entry.is_dir(follow_symlinks=False)
        )


def scan_spec_dirs(dirs: tuple[str, ...] | list[str]) -> Listing:
    """The devices the spec dirs define, resolved as the reference registry does.

    A later dir has a higher priority: a device defined in two dirs is taken from the later one.
    Defined twice at one priority, it is a conflict: reported for both files, and dropped.
    Invalid spec files are skipped (and reported), as engines skip them.
    """
    from gpuctk.cdi.specs.specfile import load_spec_file
    from gpuctk.cdi.specs.validate import qualified_devices, validate_spec_dict
    from gpuctk.errors import GpuctkError

    chosen: dict[str, ListedDevice] = {}
    conflicts: set[str] = set()
    problems: dict[str, list[str]] = {}
    files = 0
    for priority, directory in enumerate(dirs):
        try:
            paths = _spec_files(directory)
        except FileNotFoundError:
            continue
        except OSError as exc:
            problems.setdefault(directory, []).append(f"cannot read: {exc.strerror or exc}")
            continue
        for path in paths:
            files += 1
            try:
                doc = load_spec_file(path)
            except GpuctkError as exc:
                problems.setdefault(path, []).append(exc.message.removeprefix(f"{path}: "))
                continue
            found = validate_spec_dict(doc, path)
            if found:
                problems.setdefault(path, []).extend(found)
                continue
            for _, qualified in qualified_devices(doc):
                old = chosen.get(qualified)
                if old is None or priority > old.priority:
                    chosen[qualified] = ListedDevice(qualified, path, priority)
                elif priority == old.priority:
                    conflicts.add(qualified)
                    for mine, other in ((path, old.spec), (old.spec, path)):
                        problems.setdefault(mine, []).append(
                            f"conflicting device {qualified} (also in {other}): not listed"
                        )
    listed = tuple(
        sorted((d for n, d in chosen.items() if n not in conflicts), key=lambda d: _natural(d.name))
    )
    return Listing(listed, problems, files)


def _natural(text: str) -> tuple[Any, ...]:
    """Sort key that puts gpu=2 before gpu=10."""
    parts: list[Any] = []
    digits = ""
    word = ""
    for c in text:
        if c.isdigit():
            if word:
                parts.append((1, word))
                word = ""
            digits += c
        else:
            if digits:
                parts.append((0, int(digits)))
                digits = ""
            word += c
    parts.append((0, int(digits)) if digits else (1, word))
    return tuple(parts)


@click.command("list")
@click.option(
    "--spec-dir",
    "spec_dirs",
    multiple=True,
    metavar="DIR",
    help="Spec directory to read (repeatable, in increasing priority). "
    f"Default: {' then '.join(DEFAULT_SPEC_DIRS)}.",
)
@click.option("--format", "fmt", type=_FORMAT, default="text", show_default=True)
@click.option("--strict", is_flag=True, help="Exit 7 when any spec file is invalid or conflicts.")
def list_cmd(spec_dirs: tuple[str, ...], fmt: str, strict: bool) -> None:
    """Print the fully qualified CDI device names found in the spec directories.

    \b
    Reads every *.json and *.yaml file directly in each directory, as
    container engines do. A later directory has priority: a device
    defined in two directories is listed once, from the later one; one
    defined twice in the same directory is a conflict and is left out.
    Invalid files are reported on stderr and skipped, as engines skip them.

    \b
    Exit status: 0 when the directories could be listed (even with some
    invalid files); 7 when spec files exist but none of them is valid,
    or, with --strict, when any file is invalid or conflicts.

    \b
    Examples:
      gpuctk cdi list
      gpuctk cdi list --spec-dir /var/run/cdi --format json
      podman run --device "$(gpuctk cdi list | head -n1)" ...
    """
    env = [d for d in os.environ.get("NVIDIA_CTK_CDI_SPEC_DIRS", "").split(",") if d]
    dirs = list(spec_dirs) or env or list(DEFAULT_SPEC_DIRS)  # nvidia-ctk's variable, too
    listing = scan_spec_dirs(dirs)
    for path, found in listing.problems.items():
        for problem in found:
            log.warning(f"{path}: {problem}")
    if fmt == "json":
        body = {
            "specDirs": dirs,
            "devices": [
                {"name": d.name, "spec": d.spec, "specDir": dirs[d.priority]}
                for d in listing.devices
            ],
            "problems": listing.problems,
        }
        click.echo(json.dumps(body, indent=2))
    else:
        for device in listing.devices:
            click.echo(device.name)
    if not listing.files:
        output = os.path.join(dirs[-1], "nvidia.yaml")
        log.say(
            f"gpuctk: no CDI spec files in {', '.join(dirs)}: "
            f"run gpuctk cdi generate --output {output}"
        )
    bad = sum(1 for path in listing.problems if path not in dirs)
    if listing.problems and (strict or (listing.files and not listing.devices and bad)):
        raise ValidationError(
            f"{len(listing.problems)} spec file(s) or dir(s) with problems (see above)",
            [f"{p}: {m}" for p, found in listing.problems.items() for m in found],
        )


def _expand(paths: tuple[str, ...]) -> list[str]:
    """Files as given; a directory stands for the spec files directly in it."""
    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            try:
                with os.scandir(path) as entries:
                    files += sorted(
                        e.path for e in entries if e.name.endswith((*DIR_EXTENSIONS, ".yml"))
                    )
            except OSError as exc:
                from gpuctk.errors import InputError

                raise InputError(f"{path}: cannot read the directory: {exc.strerror}") from None
        else:
            files.append(path)
    return files


@click.command("validate")
@click.argument("files", nargs=-1, required=True, metavar="FILE|DIR...")
@click.option(
    "--schema-dir",
    type=click.Path(file_okay=False),
    metavar="DIR",
    help="Directory with another schema.json (and its defs.json), such as the CDI project's. "
    "Default: $GPUCTK_CDI_SCHEMA_DIR, else gpuctk's own schema, shipped in the package.",
)
@click.option("--no-schema", is_flag=True, help="Skip the JSON schema layer.")
@click.option("--format", "fmt", type=_FORMAT, default="text", show_default=True)
def validate_cmd(files: tuple[str, ...], schema_dir: str | None, no_schema: bool, fmt: str) -> None:
    """Check CDI spec files strictly and report every problem, grouped by file.

    \b
    Layers: decoding (UTF-8, 4 MiB, no duplicate YAML/JSON keys, no YAML
    aliases), unknown keys and types, the CDI JSON schema, cdiVersion
    (known, and at least what the content needs: 0.5.0 for numeric device
    names or hostPath, 0.6.0 for annotations), names (vendor/class,
    devices, duplicates), edits (KEY=VALUE env, absolute paths, device
    node types and numbers, OCI hook names, conflicting edits), and
    devices defined in two files of one folder. A device in files of two
    folders is CDI's override, not a problem: a note names the file of
    the folder given later, which wins.

    \b
    Output (text): "FILE: valid", or one line per problem:
      spec.yaml: devices[2].containerEdits.deviceNodes[0].path: must be absolute, not 'dev/x'

    \b
    Exit status: 0 when every file is valid, 7 when any problem is found,
    4 when a file cannot be read (missing, not a regular file, no permission)
    or the arguments name no spec file at all.

    \b
    Examples:
      gpuctk cdi validate /var/run/cdi/nvidia.yaml
      gpuctk cdi validate /etc/cdi /var/run/cdi --format json
    """
    from gpuctk.cdi.specs.validate import check_files
    from gpuctk.errors import InputError

    paths = _expand(files)
    if not paths:
        raise InputError(f"no spec files in {', '.join(files)}")
    report = check_files(paths, schema_dir, use_schema=not no_schema)
    for note in report.notes:
        log.say(f"gpuctk: note: {note}")
    if fmt == "json":
        body = {
            "valid": report.ok,
            "schema": str(report.schema) if report.schema else None,
            "files": [
                {"path": path, "valid": not found, "problems": found}
                for path, found in report.problems.items()
            ],
            "notes": list(report.notes),
        }
        click.echo(json.dumps(body, indent=2))
    else:
        for path, found in report.problems.items():
            if path in report.unreadable:
                continue  # said once, on stderr, as the error below
            if not found:
                click.echo(f"{path}: valid")
            for problem in found:
                click.echo(f"{path}: {problem}")
    if report.unreadable:
        raise InputError(
            "; ".join(f"{path}: {report.problems[path][0]}" for path in report.unreadable)
        )
    if not report.ok:
        bad = [path for path, found in report.problems.items() if found]
        count = sum(len(found) for found in report.problems.values())
        raise ValidationError(
            f"{count} problem(s) in {len(bad)} of {len(report.problems)} file(s)", report.lines()
        )
