"""containerd config versions: which CRI plugin table each one uses, which containerd reads it.

containerd merges every imported file into the main one and then checks the result's
`version`: a drop-in newer than what the running containerd reads makes it exit at start
(1.6.32+/1.7.17+: "unsupported config version `3`"; 2.0-2.2: "expected containerd config
version equal to or less than `3`, got `4`"; 1.6 before 1.6.32 reads a version 3 file as
version 2 and ignores its CRI tables). containerd already starts with the main config, so a
drop-in at the main config's own version is always read; `containerd config dump` is no guide, as it
prints every config migrated to the newest version that containerd knows.

Version 4 (containerd 2.3) moves only server settings (grpc, ttrpc, debug, metrics) into
plugins; the CRI runtime table keeps the version 3 place.
"""

from __future__ import annotations

from gpuctk.containerd import engine, imports
from gpuctk.containerd.tomlfiles import Table
from gpuctk.errors import ValidationError

CRI_V2 = "io.containerd.grpc.v1.cri"
CRI_RUNTIME = "io.containerd.cri.v1.runtime"
CRI_PLUGIN = {2: CRI_V2, 3: CRI_RUNTIME, 4: CRI_RUNTIME}
SUPPORTED = tuple(CRI_PLUGIN)
# The first containerd release that reads each config version.
FIRST_READER = {2: (1, 3), 3: (2, 0), 4: (2, 3)}
V3_ONLY_PLUGINS = (CRI_RUNTIME, "io.containerd.cri.v1.images")


def newest_read_by(binary: engine.Binary) -> int:
    """The newest config version this containerd reads."""
    known = (binary.major, binary.minor)
    return max((v for v, first in FIRST_READER.items() if known >= first), default=1)


def deep_merges(version: int, binary: engine.Binary | None) -> bool:
    """Whether imported files are merged key by key (containerd 2.x) or table by table (1.x)."""
    return version >= 3 or (binary is not None and binary.major >= 2)


def main_version(main: str, data: Table | None, binary: engine.Binary | None) -> int:
    """The main config's version (the drop-in's too), after checking containerd reads it."""
    declared = data.get("version") if data is not None else None
    if data is not None and "version" in data and declared not in (1, *SUPPORTED):
        raise ValidationError(f"{main}: unsupported config version {declared!r} (use 2, 3 or 4)")
    if declared == 1:
        raise ValidationError(
            f"{main}: config version 1 is not supported: migrate it to version 2 "
            "(`containerd config migrate` in containerd 1.7+, or by hand)"
        )
    if declared is None:
        if data is not None and "plugins" in data:
            raise ValidationError(
                f"{main}: has plugin tables but no `version`, so containerd reads it as the "
                "unsupported version 1: add `version = 2` (containerd 1.x) or 3 (2.x)"
            )
        version = 3 if binary is not None and binary.major >= 2 else 2
    else:
        assert isinstance(declared, int)
        version = declared
    if binary is not None and version > newest_read_by(binary):
        first = ".".join(map(str, FIRST_READER[version]))
        raise ValidationError(
            f"{main} is config version {version} (containerd {first}+) but {binary.path} is "
            f"{binary.major}.{binary.minor}, which reads version {newest_read_by(binary)}: "
            "conflicting versions"
        )
    plugins = data.get("plugins") if data is not None else None
    if version == 2 and isinstance(plugins, dict):
        clash = [p for p in V3_ONLY_PLUGINS if p in plugins]
        if clash:
            raise ValidationError(
                f"{main}: version 2 config with version 3 plugin tables ({', '.join(clash)}): "
                "conflicting versions"
            )
    return version


def check_imports(main: str, files: tuple[str, ...], version: int, skip: str) -> None:
    """Refuse when a file the main config imports declares a newer version than the main's."""
    for path, found in imports.versions(f for f in files if f != skip).items():
        if found is not None and found > version:
            raise ValidationError(
                f"{path} is config version {found} but the main config {main} is version "
                f"{version}: conflicting versions (a containerd that reads only the main's "
                f"version exits at start): rewrite {path} as version {version}, or raise "
                f"{main} to version {found}"
            )
