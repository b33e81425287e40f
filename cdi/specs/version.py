"""CDI spec versions: which cdiVersion a spec's content needs, and which versions are known.

The rules mirror the reference Go library (tags.cncf.io/container-device-interface,
specs-go/version.go at spec 1.1.0). Each version lists the content that first needs it:

    0.3.0  the earliest version a spec may carry (0.1.0 and 0.2.0 are known but too old)
    0.4.0  a mount with a `type`
    0.5.0  a device name that starts with a digit ("0", "0:1"); a device node with `hostPath`
    0.6.0  annotations (spec or device level, non-empty); a dot in the class ("vendor.com/a.b")
    0.7.0  `intelRdt` (present, even empty); non-empty `additionalGids`
    0.8.0  nothing (API-only bump)
    1.0.0  nothing (API-only bump)
    1.1.0  non-empty `netDevices`; `intelRdt.schemata` present or `intelRdt.enableMonitoring` true

Besides the minimum, the reference checks fields whose mere presence depends on the version
(`versioned_field_problems`): the `netDevices` key needs 1.1.0; `intelRdt.schemata` and
`.enableMonitoring` need 1.1.0; `intelRdt.enableCMT` and `.enableMBM` are gone in 1.1.0.

Generators must write the minimum: Debian 12's podman 4.3.1 accepts only up to 0.5.0, so a spec
with numeric device names and hostPaths must say 0.5.0 (not the newest version).

Everything here works on plain dicts in CDI JSON shape and tolerates malformed content (wrong
types are ignored here; the strict layer of gpuctk.cdi.specs.validate reports them).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

KNOWN_VERSIONS: tuple[str, ...] = (
    "0.1.0",
    "0.2.0",
    "0.3.0",
    "0.4.0",
    "0.5.0",
    "0.6.0",
    "0.7.0",
    "0.8.0",
    "1.0.0",
    "1.1.0",
)
EARLIEST_VERSION = "0.3.0"
CURRENT_VERSION = KNOWN_VERSIONS[-1]


def normalize_version(version: str) -> str:
    """ "v0.5.0" -> "0.5.0" (the reference accepts an optional leading 'v')."""
    return version[1:] if version.startswith("v") else version


def is_known_version(version: str) -> bool:
    return normalize_version(version) in KNOWN_VERSIONS


def _key(version: str) -> tuple[int, ...]:
    parts = normalize_version(version).split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a CDI version: {version!r} (expected MAJOR.MINOR.PATCH)")
    return tuple(int(p) for p in parts)


def compare_versions(a: str, b: str) -> int:
    """-1, 0 or 1 as `a` is older than, equal to or newer than `b`; ValueError if malformed."""
    ka, kb = _key(a), _key(b)
    return (ka > kb) - (ka < kb)


def _dicts(value: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(value, list):
        for item in value:
            if isinstance(item, Mapping):
                yield item


def _all_edits(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """The spec-level edits, then each device's edits (only those that are mappings)."""
    edits = spec.get("containerEdits")
    if isinstance(edits, Mapping):
        yield edits
    for device in _dicts(spec.get("devices")):
        edits = device.get("containerEdits")
        if isinstance(edits, Mapping):
            yield edits


def _requires_110(spec: Mapping[str, Any]) -> bool:
    for edits in _all_edits(spec):
        rdt = edits.get("intelRdt")
        if isinstance(rdt, Mapping) and (
            rdt.get("schemata") is not None or rdt.get("enableMonitoring") is True
        ):
            return True
        net = edits.get("netDevices")
        if isinstance(net, list) and net:
            return True
    return False


def _requires_070(spec: Mapping[str, Any]) -> bool:
    for edits in _all_edits(spec):
        if edits.get("intelRdt") is not None:
            return True
        gids = edits.get("additionalGids")
        if isinstance(gids, list) and gids:
            return True
    return False


def _requires_060(spec: Mapping[str, Any]) -> bool:
    annotations = spec.get("annotations")
    if isinstance(annotations, Mapping) and annotations:
        return True
    for device in _dicts(spec.get("devices")):
        annotations = device.get("annotations")
        if isinstance(annotations, Mapping) and annotations:
            return True
    kind = spec.get("kind")
    if isinstance(kind, str):
        _, sep, class_ = kind.partition("/")
        return bool(sep) and "." in class_
    return False


def _requires_050(spec: Mapping[str, Any]) -> bool:
    for device in _dicts(spec.get("devices")):
        name = device.get("name")
        if isinstance(name, str) and name[:1].isdigit() and name[0].isascii():
            return True
    for edits in _all_edits(spec):
        for node in _dicts(edits.get("deviceNodes")):
            host_path = node.get("hostPath")
            if isinstance(host_path, str) and host_path:
                return True
    return False


def _requires_040(spec: Mapping[str, Any]) -> bool:
    for edits in _all_edits(spec):
        for mount in _dicts(edits.get("mounts")):
            type_ = mount.get("type")
            if isinstance(type_, str) and type_:
                return True
    return False


# Newest first: the first rule that matches gives the minimum.
_RULES = (
    ("1.1.0", _requires_110),
    ("0.7.0", _requires_070),
    ("0.6.0", _requires_060),
    ("0.5.0", _requires_050),
    ("0.4.0", _requires_040),
)


def minimum_version(spec: Mapping[str, Any]) -> str:
    """The lowest cdiVersion ("0.3.0" style, no 'v') that can carry the content of `spec`."""
    for version, requires in _RULES:
        if requires(spec):
            return version
    return EARLIEST_VERSION


def versioned_field_problems(spec: Mapping[str, Any]) -> list[str]:
    """Fields present in `spec` that its own (known) cdiVersion does not allow."""
    raw = spec.get("cdiVersion")
    if not isinstance(raw, str) or not is_known_version(raw):
        return []
    before_110 = compare_versions(raw, "1.1.0") < 0
    problems = []
    places: list[tuple[str, Any]] = [("containerEdits", spec.get("containerEdits"))]
    devices = spec.get("devices")
    if isinstance(devices, list):
        places += [
            (f"devices[{i}].containerEdits", d.get("containerEdits"))
            for i, d in enumerate(devices)
            if isinstance(d, Mapping)
        ]
    for where, edits in places:
        if not isinstance(edits, Mapping):
            continue
        if "netDevices" in edits and before_110:
            problems.append(
                f"{where}.netDevices: needs cdiVersion 1.1.0 or later (spec says {raw})"
            )
        rdt = edits.get("intelRdt")
        if not isinstance(rdt, Mapping):
            continue
        for field in ("schemata", "enableMonitoring"):
            if field in rdt and before_110:
                problems.append(
                    f"{where}.intelRdt.{field}: needs cdiVersion 1.1.0 or later (spec says {raw})"
                )
        for field in ("enableCMT", "enableMBM"):
            if field in rdt and not before_110:
                problems.append(
                    f"{where}.intelRdt.{field}: not valid in cdiVersion {raw} "
                    "(removed in 1.1.0; use schemata/enableMonitoring)"
                )
    return problems


_REASONS = {
    "0.4.0": " (a mount has a type)",
    "0.5.0": " (a device name starts with a digit, or a device node has a hostPath)",
    "0.6.0": " (annotations, or a dot in the class name)",
    "0.7.0": " (intelRdt or additionalGids)",
    "1.1.0": " (netDevices, or intelRdt schemata/enableMonitoring)",
}


def version_problems(spec: Mapping[str, Any]) -> list[str]:
    """The reference's ValidateVersion: cdiVersion known, and at least what the content needs."""
    raw = spec.get("cdiVersion")
    if not isinstance(raw, str):
        return []  # missing or wrong type: reported by the strict layer
    if not is_known_version(raw):
        return [f"cdiVersion: unknown version {raw!r} (known: {', '.join(KNOWN_VERSIONS[2:])})"]
    needed = minimum_version(spec)
    if compare_versions(needed, raw) > 0:
        return [
            f"cdiVersion: {raw} is too old for this content, which needs at least {needed}"
            f"{_REASONS.get(needed, '')}"
        ]
    return versioned_field_problems(spec)
