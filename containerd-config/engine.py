"""Asking the installed containerd: its version, and `config dump` without gpuctk's drop-in.

`containerd --config X config dump` needs no running daemon: it loads X and its imports, fills
in every default and prints the result. To see the configuration as it is *without* our drop-in
(so that running configure twice gives the same drop-in, and so that a stale drop-in never feeds
itself), the dump runs on a temporary copy of the main config whose imports leave it out.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from gpuctk.containerd import imports, tomlfiles
from gpuctk.containerd.tomlfiles import Table
from gpuctk.errors import InputError, ValidationError

_VERSION = re.compile(r"\s(?:v)?(\d+)\.(\d+)(?:\.(\d+))?")
_TIMEOUT_S = 60


@dataclass(frozen=True)
class Binary:
    """An engine executable and the version it reports."""

    path: str
    major: int
    minor: int
    text: str


def find(executable: str | None, name: str = "containerd") -> str | None:
    """The engine binary: the given path, else `name` on PATH; None when there is none."""
    if executable:
        if not os.access(executable, os.X_OK):
            raise InputError(f"{executable}: not an executable file (--executable-path)")
        return executable
    return shutil.which(name)


def run(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except OSError as exc:
        raise InputError(f"cannot run {argv[0]}: {exc.strerror}") from None
    except subprocess.TimeoutExpired:
        raise InputError(f"{' '.join(argv)}: no answer in {_TIMEOUT_S}s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise InputError(f"{' '.join(argv)} failed (exit {proc.returncode}): {last}")
    return proc.stdout


def version(path: str) -> Binary:
    """Run `<binary> --version` and read its major.minor."""
    text = run([path, "--version"]).strip()
    match = _VERSION.search(" " + text)
    if not match:
        raise InputError(f"{path} --version: cannot read a version from {text!r}")
    return Binary(path, int(match.group(1)), int(match.group(2)), text)


def _dump_main(
    main: str, main_data: Table | None, exclude: str, also_exclude: tuple[str, ...] = ()
) -> Table:
    """The main config rewritten for a copy in another folder, without the drop-in's import
    (nor those of `also_exclude`, the drop-ins configure --take-over disables)."""
    data: Table = dict(main_data or {})
    skips = {tomlfiles.abspath(p) for p in (exclude, *also_exclude)}
    entries = imports.string_list(data.get("imports"), main, "imports")
    kept: list[str] = []
    for entry in entries:
        resolved = imports.resolve(main, [entry])
        if imports.is_glob(entry):
            kept.extend(p for p in resolved if tomlfiles.abspath(p) not in skips)
        elif resolved and tomlfiles.abspath(resolved[0]) not in skips:
            kept.append(resolved[0])
    data["imports"] = kept
    return data


def dump(
    path: str,
    main: str,
    main_data: Table | None,
    exclude: str,
    version: int,
    also_exclude: tuple[str, ...] = (),
) -> Table:
    """`containerd config dump` of the main config with the drop-in `exclude` (and the files
    `also_exclude`) left out."""
    data = _dump_main(main, main_data, exclude, also_exclude)
    data.setdefault("version", version)
    with tempfile.TemporaryDirectory(prefix="gpuctk-dump-") as tmp:
        copy = os.path.join(tmp, "config.toml")
        with open(copy, "w", encoding="utf-8") as f:
            f.write(tomlfiles.dumps_tables(data))
        text = run([path, "--config", copy, "config", "dump"])
    dumped = tomlfiles.parse(text, f"{path} config dump")
    loaded = [tomlfiles.abspath(p) for p in imports.string_list(dumped.get("imports"), "", "")]
    if tomlfiles.abspath(exclude) in loaded:
        raise ValidationError(
            f"{exclude} is imported by another imported file, so its old content cannot be left "
            "out of `containerd config dump`: remove that import, or use --config-source file"
        )
    return dumped
