"""`--runtime docker`: a `runtimes` entry in daemon.json (JSON edited, other keys kept).

Docker has no drop-in folder, so daemon.json itself is edited. configure keeps a byte copy of
the original next to it (daemon.json.gpuctk-backup); unconfigure removes what configure adds and,
when the result equals that copy, puts the original bytes back (formatting included).
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

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


def plan_unconfigure(opts: Options) -> Plan:
    text = tomlfiles.read_text(opts.config)
    if text is None:
        return Plan(())
    data = _load(opts.config, text)
    backup = opts.config + BACKUP_SUFFIX
    backup_text = tomlfiles.read_text(backup)
    original = _load(backup, backup_text) if backup_text is not None else {}
    new = copy.deepcopy(data)
    runtimes = new.get("runtimes")
    if isinstance(runtimes, dict):
        runtimes.pop(opts.runtime_name, None)
        if not runtimes and "runtimes" not in original:
            del new["runtimes"]
    if new.get("default-runtime") == opts.runtime_name:
        del new["default-runtime"]
    features = new.get("features")
    if isinstance(features, dict) and "cdi" not in (original.get("features") or {}):
        features.pop("cdi", None)
        if not features and "features" not in original:
            del new["features"]
    changes: list[FileChange] = []
    if backup_text is not None and new == original:
        changes.append(
            FileChange(
                planmod.write_target(opts.config),
                backup_text.encode(),
                "Docker daemon.json (restored)",
            )
        )
        changes.append(FileChange(backup, None, "backup of daemon.json"))
    elif backup_text is None and not new:
        changes.append(FileChange(opts.config, None, "Docker daemon.json (created by gpuctk)"))
    elif new != data:
        target = planmod.write_target(opts.config)
        changes.append(FileChange(target, _dumps(new), "Docker daemon.json"))
    return Plan(tuple(changes))
