"""The containerd runtime handler table that points CRI at gpuctk (shim or hook mode).

The handler starts as a copy of the runc-type handler containerd already uses (the default
runtime when it is runc-based, else `runc`, else `crun`), so SystemdCgroup and every other
option carry over; then runtime_type, the CDI annotation pass-through and either the shim
(`options.BinaryName`) or the hook's base spec (`base_runtime_spec`) are set.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuctk.containerd.options import Options
from gpuctk.containerd.tomlfiles import Table

RUNC_V2 = "io.containerd.runc.v2"
RUNC_TYPES = ("", RUNC_V2, "io.containerd.runc.v1")
CDI_ANNOTATION = "cdi.k8s.io/*"


@dataclass(frozen=True)
class Handler:
    table: Table
    base_name: str | None
    notes: tuple[str, ...]


def pick_base(
    runtimes: Mapping[str, Any], default_name: object, ours: str
) -> tuple[str | None, Table]:
    """The runc-type handler to copy, and a copy of its table."""
    names = [default_name] if isinstance(default_name, str) else []
    for name in [*names, "runc", "crun"]:
        table = runtimes.get(name)
        if name == ours or not isinstance(table, dict):
            continue
        if table.get("runtime_type", "") in RUNC_TYPES:
            return name, copy.deepcopy(table)
    return None, {}


def build(
    runtimes: Mapping[str, Any], default_name: object, opts: Options, base_spec: str | None
) -> Handler:
    """The handler table for `opts.runtime_name`."""
    base_name, table = pick_base(runtimes, default_name, opts.runtime_name)
    notes: list[str] = []
    if base_name is None:
        notes.append("no runc handler found to copy options from; the handler uses defaults")
    table["runtime_type"] = RUNC_V2
    current = table.get("container_annotations")
    annotations = [a for a in current if isinstance(a, str)] if isinstance(current, list) else []
    if CDI_ANNOTATION not in annotations:
        annotations.append(CDI_ANNOTATION)
    table["container_annotations"] = annotations
    raw = table.pop("options", None)
    options: Table = dict(raw) if isinstance(raw, dict) else {}
    if opts.mode == "shim":
        real = options.get("BinaryName")
        if isinstance(real, str) and real not in ("", "runc", "/usr/bin/runc", "/usr/sbin/runc"):
            notes.append(
                f"handler {base_name!r} runs {real}: list it in `runtimes` in "
                "/etc/gpuctk/config.toml so that gpuctk-runtime executes it"
            )
        options["BinaryName"] = opts.runtime_path
    else:
        assert base_spec is not None
        table["base_runtime_spec"] = base_spec
    table["options"] = options
    return Handler(table, base_name, tuple(notes))
