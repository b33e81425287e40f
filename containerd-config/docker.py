"""`--runtime docker`: a `runtimes` entry in daemon.json (JSON edited, other keys kept).

Docker has no drop-in folder, so daemon.json itself is edited. configure keeps a byte copy of
the original next to it (daemon.json.gpuctk-backup); unconfigure removes what configure adds,
puts back the values it replaced (the admin's own `default-runtime` after --set-as-default, a
same-named runtime, `features.cdi`), restores the original bytes (formatting included) when the
result equals that copy, and removes the copy.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

from gpuctk import log
from gpuctk.containerd import plan as planmod
from gpuctk.containerd import tomlfiles
from gpuctk.containerd.options import Options
from gpuctk.containerd.plan import FileChange, Plan
from gpuctk.errors import ValidationError

BACKUP_SUFFIX = ".gpuctk-backup"


def _load(path: str, text: str | None) -> dict[str, Any]:
    if text is None or not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValidationError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValidationError(f"{path}: the top level must be a JSON object")
    return data


def _object(data: dict[str, Any], key: str, path: str) -> dict[str, Any]:
    value = data.setdefault(key, {})
    if not isinstance(value, dict):
        raise ValidationError(f"{path}: `{key}` must be a JSON object")
    return value


def _dumps(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, indent=4) + "\n").encode("utf-8")


def plan_configure(opts: Options) -> Plan:
    text = tomlfiles.read_text(opts.config)
    data = _load(opts.config, text)
    new = copy.deepcopy(data)
    _object(new, "runtimes", opts.config)[opts.runtime_name] = {"path": opts.runtime_path}
    if opts.set_as_default:
        new["default-runtime"] = opts.runtime_name
    if opts.cdi_enabled:
        _object(new, "features", opts.config)["cdi"] = True
    keys = [f"runtimes.{opts.runtime_name}"] + ["default-runtime"] * opts.set_as_default
    log.debug(
        f"daemon.json {opts.config}: {'absent' if text is None else 'read'}; sets "
        f"{', '.join(keys + ['features.cdi'] * opts.cdi_enabled)}"
        + (" (already set)" if new == data else "")
    )
    if new == data:
        return Plan(())
    changes = []
    backup = opts.config + BACKUP_SUFFIX
    if text is not None and not os.path.exists(backup):
        mode = planmod.file_mode(opts.config)
        changes.append(FileChange(backup, text.encode(), "backup of daemon.json", mode))
    target = planmod.write_target(opts.config)
    changes.append(FileChange(target, _dumps(new), "Docker daemon.json"))
    notes = []
    if opts.cdi_spec_dirs != ("/etc/cdi", "/var/run/cdi"):
        notes.append(
            "Docker reads CDI specs from /etc/cdi and /var/run/cdi; --cdi-spec-dir ignored"
        )
    return Plan(tuple(changes), tuple(notes))


def _table(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def _restore(new: dict[str, Any], original: dict[str, Any], name: str) -> None:
    """Take out what configure added to `new`, putting back the values it replaced (as the
    backup has them): the admin's own `default-runtime`, a `runtimes` entry or `features.cdi`
    of the same name."""
    runtimes = new.get("runtimes")
    before: dict[str, Any] = _table(original, "runtimes")
    if isinstance(runtimes, dict):
        if name in before:
            runtimes[name] = copy.deepcopy(before[name])
        else:
            runtimes.pop(name, None)
        if not runtimes and "runtimes" not in original:
            del new["runtimes"]
    if new.get("default-runtime") == name:
        if "default-runtime" in original:
            new["default-runtime"] = original["default-runtime"]
        else:
            del new["default-runtime"]
    features = new.get("features")
    if isinstance(features, dict):
        old = _table(original, "features")
        if "cdi" in old:
            features["cdi"] = old["cdi"]
        else:
            features.pop("cdi", None)
        if not features and "features" not in original:
            del new["features"]


def plan_unconfigure(opts: Options) -> Plan:
    """Take out what configure added, put back what it replaced, and remove the backup: the
    original bytes when nothing else changed since, else the current file without gpuctk's
    keys (the admin's later edits kept)."""
    text = tomlfiles.read_text(opts.config)
    backup = opts.config + BACKUP_SUFFIX
    backup_text = tomlfiles.read_text(backup)
    log.debug(
        f"daemon.json {opts.config}: {'absent' if text is None else 'read'}; backup {backup}: "
        f"{'absent' if backup_text is None else 'read'}"
    )
    if text is None:
        return Plan(() if backup_text is None else (FileChange(backup, None, "backup"),))
    data = _load(opts.config, text)
    original = _load(backup, backup_text) if backup_text is not None else {}
    new = copy.deepcopy(data)
    _restore(new, original, opts.runtime_name)
    changes: list[FileChange] = []
    target = planmod.write_target(opts.config)
    if backup_text is not None and new == original:
        changes.append(FileChange(target, backup_text.encode(), "Docker daemon.json (restored)"))
    elif backup_text is None and not new:
        changes.append(FileChange(opts.config, None, "Docker daemon.json (created by gpuctk)"))
    elif new != data:
        changes.append(FileChange(target, _dumps(new), "Docker daemon.json"))
    if backup_text is not None:
        changes.append(FileChange(backup, None, "backup of daemon.json"))
    return Plan(tuple(changes))
