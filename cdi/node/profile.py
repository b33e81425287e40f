"""Embedded machine profiles: YAML descriptions of whole GPU nodes.

`gpuctk cdi generate --simulate NAME` builds a Machine from one of these instead of asking NVML,
and the tests' fake libnvidia-ml.so.1 serves the same profiles through the real pynvml, so the
two paths are checked against each other.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from gpuctk.cdi.node.machine import Gpu, Machine, MigDevice
from gpuctk.errors import InputError, UsageError

# Shipped as package data beside this module (an installed package is plain files, never a zip:
# importlib.resources would cost every `cdi generate` its imports for nothing).
_PROFILES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "profiles")

_PROFILE_RE = re.compile(r"^(?:(\d+)c\.)?(\d+)g\.(\d+)gb$")


def available_profiles() -> list[str]:
    """Names of the profiles shipped in the package."""
    return sorted(name[:-5] for name in os.listdir(_PROFILES) if name.endswith(".yaml"))


def mig_profile_name(gi_slices: int, ci_slices: int, memory_mib: int) -> str:
    """NVIDIA's MIG profile name: `1g.10gb`, or `1c.3g.20gb` for a smaller compute instance."""
    gb = math.ceil(memory_mib / 1024)
    if ci_slices == gi_slices:
        return f"{gi_slices}g.{gb}gb"
    return f"{ci_slices}c.{gi_slices}g.{gb}gb"


def parse_mig_profile(profile: str) -> tuple[int, int, int]:
    """`1c.3g.20gb` -> (gi_slices=3, ci_slices=1, gb=20); `2g.10gb` -> (2, 2, 10)."""
    m = _PROFILE_RE.match(profile)
    if not m:
        raise ValueError(f"not a MIG profile name: {profile!r} (expected e.g. 1g.10gb)")
    gi = int(m.group(2))
    ci = int(m.group(1)) if m.group(1) else gi
    return gi, ci, int(m.group(3))


def load_profile_document(name_or_path: str) -> dict[str, Any]:
    """The raw YAML document of a shipped profile name or a profile file path."""
    import yaml

    if os.sep in name_or_path or name_or_path.endswith((".yaml", ".yml")):
        try:
            with open(name_or_path, "rb") as f:
                text = f.read()
        except OSError as exc:
            raise InputError(f"cannot read machine profile {name_or_path}: {exc.strerror}") from exc
    else:
        if name_or_path not in available_profiles():
            raise UsageError(
                f"unknown machine profile {name_or_path!r}; "
                f"choose one of: {', '.join(available_profiles())} (or give a .yaml path)"
            )
        with open(os.path.join(_PROFILES, f"{name_or_path}.yaml"), "rb") as f:
            text = f.read()
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        doc = yaml.load(text, Loader=loader)
    except yaml.YAMLError as exc:
        raise InputError(f"machine profile {name_or_path} is not valid YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise InputError(f"machine profile {name_or_path} must be a mapping")
    return doc


def load_profile(name_or_path: str) -> Machine:
    """Build a Machine from a shipped profile name or a profile file path."""
    doc = load_profile_document(name_or_path)
    try:
        return machine_from_document(doc)
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"machine profile {name_or_path} is malformed: {exc!r}") from exc


def machine_from_document(doc: dict[str, Any]) -> Machine:
    gpus = []
    for g in doc["gpus"]:
        index = int(g["index"])
        major, minor = (int(x) for x in str(g["compute_capability"]).split("."))
        migs = []
        for m in g.get("mig_devices") or []:
            gi_slices, ci_slices, _ = parse_mig_profile(str(m["profile"]))
            expected = mig_profile_name(gi_slices, ci_slices, int(m["memory_mib"]))
            if expected != m["profile"]:
                raise ValueError(
                    f"MIG profile {m['profile']} does not match its memory ({expected})"
                )
            migs.append(
                MigDevice(
                    parent_index=index,
                    index=int(m["index"]),
                    gi=int(m["gi"]),
                    ci=int(m["ci"]),
                    uuid=str(m["uuid"]),
                    profile=str(m["profile"]),
                    memory_mib=int(m["memory_mib"]),
                )
            )
        numa = g.get("numa_node")
        gpus.append(
            Gpu(
                index=index,
                minor=int(g["minor"]),
                uuid=str(g["uuid"]),
                pci_bus_id=str(g["pci_bus_id"]).lower(),
                name=str(g["name"]),
                architecture=str(g["architecture"]),
                compute_capability=(major, minor),
                memory_mib=int(g["memory_mib"]),
                numa_node=None if numa is None else int(numa),
                mig_enabled=bool(g.get("mig_enabled", False)),
                mig_devices=tuple(migs),
            )
        )
    return Machine(
        driver_version=str(doc["driver_version"]),
        cuda_driver_version=str(doc["cuda_driver_version"]),
        gpus=tuple(gpus),
    )
