"""Driver file manifests: the driver files of a real install, shipped as package data.

`gpuctk cdi generate --simulate PROFILE` describes a machine that is not this one. Its device
list comes from the profile (gpuctk.cdi.node.profile); its driver files come from the node when
the driver root holds the profile's driver version, and otherwise from the manifest of that
version, `profiles/drivers/<version>.json`, so that the simulated spec mounts what a real node
with that driver would get.

A manifest is one JSON object: what gpuctk.cdi.node.driverfiles discovers in a real install,
with every path in container terms (the driver root at /). Keys:

- `about`: what the file is and the command that makes it; `install`: the install it records,
  in words ("a Debian 12 install of driver 535.309.01"); `driver_version`.
- `libraries`, `binaries`, `firmware`, `configs`, `sockets`: lists of files in discovery's order,
  each `{"path", "capability"}` plus `"host"` where the real file is elsewhere than the mount
  target (nvidia-smi mounted at /usr/bin/nvidia-smi is /usr/lib/nvidia/current/nvidia-smi),
  and `"soname"`, `"arch"`, `"links"` (the development links beside it, by name) for
  libraries that have them.
- `symlinks`: `[target, link]` pairs; `ld_folders`: the folders holding libraries.

`document()` makes one from a discovery run (tests/fixtures/driver_manifest.py writes the
shipped file with it); `load()` turns one back into DriverFiles whose host paths carry the
driver root in front, container paths unchanged.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from typing import Any

from gpuctk.cdi.node.driverfiles import DriverFile, DriverFiles, dev_link_name
from gpuctk.errors import InputError
from gpuctk.records import record

# Shipped as package data: gpuctk.cdi's profiles/drivers/ (see gpuctk.cdi.node.profile).
MANIFESTS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "profiles", "drivers"
)

FILE_SECTIONS = (
    ("libraries", "library"),
    ("binaries", "binary"),
    ("firmware", "firmware"),
    ("configs", "config"),
    ("sockets", "socket"),
)

_VERSION_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._-]{0,63}$")


@record
class Manifest:
    """A loaded manifest: the files, host paths under the driver root, and what they are."""

    files: DriverFiles
    install: str  # "a Debian 12 install of driver 535.309.01"
    driver_version: str


def manifest_path(version: str) -> str | None:
    """The shipped manifest of driver `version`, or None when the package has none."""
    if not _VERSION_RE.match(version):
        return None
    path = os.path.join(MANIFESTS, f"{version}.json")
    return path if os.path.isfile(path) else None


def _strip(root: str, host: str) -> str:
    prefix = "" if root == "/" else root.rstrip("/")
    if prefix and not host.startswith(prefix + "/"):
        raise ValueError(f"{host} is not under the driver root {root}")
    return host[len(prefix) :]


def _entry(f: DriverFile, root: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"path": f.container_path, "capability": f.capability}
    host = _strip(root, f.host_path)
    if host != f.container_path:
        entry["host"] = host
    if f.soname is not None:
        entry["soname"] = f.soname
    if f.arch is not None:
        entry["arch"] = f.arch
    if f.links:
        entry["links"] = list(f.links)
    return entry


def document(files: DriverFiles, driver_root: str, version: str, install: str,
             about: str) -> dict[str, Any]:  # fmt: skip
    """The manifest of `files`, discovered under `driver_root`: every host path with the root
    stripped. ValueError if a host path is outside the root."""
    doc: dict[str, Any] = {"about": about, "install": install, "driver_version": version}
    for section, _ in FILE_SECTIONS:
        doc[section] = [_entry(f, driver_root) for f in getattr(files, section)]
    doc["symlinks"] = [[target, link] for target, link in files.symlinks]
    doc["ld_folders"] = list(files.ld_folders)
    return doc


def dumps(doc: dict[str, Any]) -> str:
    """`doc` as the shipped text: keys sorted, one line per file, link and folder."""
    lines = ["{"]
    keys = sorted(doc)
    for n, key in enumerate(keys):
        value = doc[key]
        comma = "," if n < len(keys) - 1 else ""
        if isinstance(value, list) and value:
            items = [json.dumps(v, sort_keys=True, ensure_ascii=True) for v in value]
            body = ",\n".join(f"  {item}" for item in items)
            lines.append(f" {json.dumps(key)}: [\n{body}\n ]{comma}")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=True)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or "\0" in value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    return value


def _path(value: Any, what: str) -> str:
    path = _text(value, what)
    if not path.startswith("/") or "/../" in path + "/" or "\n" in path:
        raise ValueError(f"{what} must be an absolute path without '..', got {value!r}")
    return path


def _file(entry: Any, kind: str, prefix: str) -> DriverFile:
    if not isinstance(entry, dict):
        raise ValueError(f"a {kind} entry must be an object, got {entry!r}")
    unknown = set(entry) - {"path", "host", "capability", "soname", "arch", "links"}
    if unknown:
        raise ValueError(f"a {kind} entry has unknown keys {sorted(unknown)}")
    container = _path(entry.get("path"), f"{kind} path")
    host = _path(entry.get("host", container), f"{kind} host")
    soname = entry.get("soname")
    soname = None if soname is None else _text(soname, f"{kind} soname")
    arch = entry.get("arch")
    links = entry.get("links", [])
    if links:  # only what discovery records: the library's own development link
        link = dev_link_name(posixpath.basename(container), soname)
        if kind != "library" or link is None or links != [link]:
            want = f"[] or [{link!r}]" if kind == "library" and link else "[]"
            raise ValueError(f"{kind} {container}: links must be {want}, got {links!r}")
    return DriverFile(
        host_path=prefix + host,
        container_path=container,
        kind=kind,
        capability=_text(entry.get("capability"), f"{kind} capability"),
        soname=soname,
        arch=None if arch is None else _text(arch, f"{kind} arch"),
        links=tuple(links),
    )


def _list(doc: dict[str, Any], key: str) -> list[Any]:
    value = doc.get(key, [])
    if not isinstance(value, list):
        raise ValueError(f"{key} must be a list")
    return value


def from_document(doc: Any, driver_root: str = "/") -> Manifest:
    """The Manifest of `doc`, host paths under `driver_root`. ValueError if it is malformed."""
    if not isinstance(doc, dict):
        raise ValueError("a manifest must be a JSON object")
    prefix = "" if driver_root == "/" else driver_root.rstrip("/")
    sections = {
        section: tuple(_file(e, kind, prefix) for e in _list(doc, section))
        for section, kind in FILE_SECTIONS
    }
    links = []
    for pair in _list(doc, "symlinks"):
        if not isinstance(pair, list) or len(pair) != 2:
            raise ValueError(f"a symlink must be a [target, link] pair, got {pair!r}")
        links.append((_text(pair[0], "symlink target"), _path(pair[1], "symlink")))
    folders = tuple(_path(f, "ld folder") for f in _list(doc, "ld_folders"))
    files = DriverFiles(**sections, symlinks=tuple(links), ld_folders=folders)
    version = _text(doc.get("driver_version"), "driver_version")
    return Manifest(files, _text(doc.get("install"), "install"), version)


def load(version: str, driver_root: str = "/") -> Manifest | None:
    """The shipped manifest of driver `version` with host paths under `driver_root`, or None
    when the package has none. InputError if the shipped file is unreadable or malformed."""
    path = manifest_path(version)
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
        found = from_document(doc, driver_root)
    except (OSError, ValueError) as exc:
        raise InputError(f"driver manifest {path}: {exc}") from exc
    if found.driver_version != version:
        raise InputError(f"driver manifest {path} is of driver {found.driver_version}")
    return found
