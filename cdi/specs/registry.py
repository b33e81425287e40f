"""The CDI registry the shim resolves device requests against: spec dirs -> qualified devices.

Like the reference cache (pkg/cdi/cache.go): each spec dir is read in order (default /etc/cdi,
then /var/run/cdi), files ending in `.json` or `.yaml` directly inside it (no subdirectories),
in name order. A device defined in a later dir wins over the same qualified name in an earlier
one; two files of the SAME dir defining one name are a conflict, and requesting that name fails.
A file that cannot be read or is malformed is skipped and remembered: the rest still serve, and
a request that cannot be resolved names those files in its message.

Trust (gpuctk.cdi.specs.spectrust): a spec dir or file that someone other than root (or the user
gpuctk runs as) owns or can write, or that sits below a folder they can write, is refused
before it is read: listed in `Registry.refused` (the shim and the hook log each as a warning)
and in `Registry.errors`. Each dir is listed, and its files opened, through the descriptor the
trust walk (gpuctk.fs.open_trusted_dir) returned.

`resolve` returns the edit blocks to apply, in the reference's order: the spec-level edits of a
spec once, just before the first device requested from it, then each device's own edits.

Import cost: stdlib `os` only at import; the spec loader (gpuctk.cdi.specs.specfile) is imported
when
the first spec file is read, and gpuctk.cdi.specs.names for kind checks.
"""

from __future__ import annotations

import os

from gpuctk.errors import GpuctkError, RequestError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from typing import Any

    from gpuctk.cdi.specs.speccache import SpecCache

    Loader = Callable[[str], dict[str, Any]]

DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
SPEC_SUFFIXES = (".json", ".yaml")
MAX_SPEC_FILES = 1024  # per dir: a dir flooded with files must not stall container start
MAX_LISTED = 12  # known devices shown in an "unknown device" message


class SpecFile:
    """One loaded spec: its path, dir priority (index of its dir) and document."""

    __slots__ = ("doc", "kind", "path", "priority")

    def __init__(self, path: str, priority: int, kind: str, doc: dict[str, Any]) -> None:
        self.path = path
        self.priority = priority
        self.kind = kind
        self.doc = doc

    def edits(self) -> dict[str, Any]:
        edits = self.doc.get("containerEdits")
        return edits if isinstance(edits, dict) else {}


class Block:
    """Edits to apply: a spec's own (`device` is None) or one device's."""

    __slots__ = ("device", "edits", "spec")

    def __init__(self, spec: SpecFile, device: str | None, edits: dict[str, Any]) -> None:
        self.spec = spec
        self.device = device
        self.edits = edits

    def __repr__(self) -> str:
        return f"Block({self.spec.path!r}, {self.device!r})"


def _load_spec_file(
    path: str, cache: SpecCache | None = None, dir_fd: int | None = None
) -> dict[str, Any]:
    from gpuctk.cdi.specs.specfile import load_spec_file

    return load_spec_file(path, cache=cache, dir_fd=dir_fd)


def _spec_problem(doc: dict[str, Any]) -> str | None:
    """The first structural problem the registry cannot index around (full checks: cdi.validate)."""
    from gpuctk.cdi.specs.names import device_name_problem, kind_problem

    kind = doc.get("kind")
    if not isinstance(kind, str):
        return "kind: missing or not a string"
    problem = kind_problem(kind)
    if problem:
        return f"kind: {problem}"
    if not isinstance(doc.get("cdiVersion"), str):
        return "cdiVersion: missing or not a string"
    if doc.get("containerEdits") is not None and not isinstance(doc["containerEdits"], dict):
        return "containerEdits: must be a mapping"
    devices = doc.get("devices")
    if not isinstance(devices, list) or not devices:
        return "devices: a spec needs a list of at least one device"
    seen = set()
    for i, dev in enumerate(devices):
        if not isinstance(dev, dict) or not isinstance(dev.get("name"), str):
            return f"devices[{i}]: needs a name"
        problem = device_name_problem(dev["name"])
        if problem:
            return f"devices[{i}].name: {problem}"
        if dev["name"] in seen:
            return f"devices[{i}].name: {dev['name']!r} is defined twice"
        seen.add(dev["name"])
        if not isinstance(dev.get("containerEdits"), dict):
            return f"devices[{i}].containerEdits: missing or not a mapping"
    return None


class Registry:
    """Qualified device name -> (spec, device), built by `load`."""

    def __init__(self, dirs: Sequence[str]) -> None:
        self.dirs = tuple(dirs)
        self.specs: list[SpecFile] = []
        self.devices: dict[str, tuple[SpecFile, dict[str, Any]]] = {}
        self.conflicts: dict[str, list[str]] = {}  # name -> paths, same dir
        self.errors: list[str] = []  # "<path>: <problem>" of files skipped
        self.refused: list[str] = []  # "<path>: refused: <why>" (trust policy), also in errors
        self.found_dirs: list[str] = []

    def add(self, spec: SpecFile) -> None:
        self.specs.append(spec)
        for dev in spec.doc["devices"]:
            name = f"{spec.kind}={dev['name']}"
            held = self.devices.get(name)
            if held is not None and held[0].priority == spec.priority:
                self.conflicts.setdefault(name, [held[0].path]).append(spec.path)
                continue
            self.conflicts.pop(name, None)  # a later dir overrides a conflict in an earlier one
            self.devices[name] = (spec, dev)

    def known(self) -> list[str]:
        return sorted(self.devices, key=_natural_key)

    def describe_dirs(self) -> str:
        return ", ".join(self.dirs) or "(no spec dirs configured)"

    def _unresolved_message(self, unresolved: list[str]) -> str:
        if not self.specs:
            text = f"no CDI spec found in {self.describe_dirs()}: run gpuctk cdi generate"
            if self.errors:
                text = f"no usable CDI spec in {self.describe_dirs()} ({self._errors_text()})"
                text += ": fix it or run gpuctk cdi generate"
            return f"cannot inject {', '.join(unresolved)}: {text}"
        lines = []
        for name in unresolved:
            paths = self.conflicts.get(name)
            if paths:
                lines.append(f"{name} is defined by more than one spec: {', '.join(paths)}")
        plain = [n for n in unresolved if n not in self.conflicts]
        if plain:
            known = self.known()
            kinds = {n.partition("=")[0] for n in plain}
            known.sort(key=lambda n: n.partition("=")[0] not in kinds)  # stable: same kind first
            shown = ", ".join(known[:MAX_LISTED])
            if len(known) > MAX_LISTED:
                shown += f", ... ({len(known) - MAX_LISTED} more)"
            what = "unknown CDI device" + ("s" if len(plain) > 1 else "")
            lines.append(f"{what} {', '.join(plain)} (known: {shown or 'none'})")
        if self.errors:
            lines.append(f"specs skipped: {self._errors_text()}")
        return "; ".join(lines)

    def _errors_text(self) -> str:
        shown = "; ".join(self.errors[:3])
        if len(self.errors) > 3:
            shown += f"; ... ({len(self.errors) - 3} more)"
        return shown

    def resolve(self, names: Iterable[str]) -> list[Block]:
        """The edit blocks for `names` (qualified, duplicates ignored); RequestError listing
        every name that cannot be resolved."""
        wanted = list(dict.fromkeys(names))
        unresolved = [n for n in wanted if n not in self.devices or n in self.conflicts]
        if unresolved:
            raise RequestError(self._unresolved_message(unresolved))
        blocks: list[Block] = []
        seen: set[int] = set()
        for name in wanted:
            spec, dev = self.devices[name]
            if id(spec) not in seen:
                seen.add(id(spec))
                blocks.append(Block(spec, None, spec.edits()))
            blocks.append(Block(spec, name, dev["containerEdits"]))
        return blocks

    def common(self, kind: str) -> list[Block]:
        """The spec-level edits alone (driver files, no GPU) of the spec serving `kind`: the one
        that defines `<kind>=all`, else the last one read for that kind."""
        held = self.devices.get(f"{kind}=all")
        spec = held[0] if held is not None else None
        if spec is None:
            for candidate in reversed(self.specs):
                if candidate.kind == kind:
                    spec = candidate
                    break
        if spec is None:
            if not self.specs:
                raise RequestError(self._unresolved_message([f"{kind} driver files"]))
            kinds = sorted({s.kind for s in self.specs})
            raise RequestError(
                f"no CDI spec for kind {kind} in {self.describe_dirs()} "
                f"(specs found for: {', '.join(kinds)})"
            )
        return [Block(spec, None, spec.edits())]


def _natural_key(name: str) -> tuple[str, int, str]:
    head = name.rstrip("0123456789")
    tail = name[len(head) :]
    return (head, int(tail) if tail and len(tail) < 10 else -1, name)


def spec_paths(directory: str) -> list[str]:
    """The spec files directly in `directory`, in name order; [] when it does not exist.

    OSError for a directory that exists but cannot be listed."""
    try:
        with os.scandir(directory) as it:
            names = sorted(
                e.name for e in it if e.name.endswith(SPEC_SUFFIXES) and not e.name.startswith(".")
            )
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [os.path.join(directory, n) for n in names]


def _load_dir(
    registry: Registry,
    directory: str,
    dir_fd: int,
    priority: int,
    loader: Loader | None,
    cache: SpecCache | None,
) -> None:
    """Every spec file of the trusted spec dir `directory` (open as `dir_fd`) into `registry`."""
    try:
        with os.scandir(dir_fd) as it:
            names = sorted(
                e.name
                for e in it
                if e.name.endswith(SPEC_SUFFIXES) and not e.name.startswith(".") and not e.is_dir()
            )
    except OSError as exc:
        registry.errors.append(f"{directory}: cannot list: {exc.strerror or exc}")
        return
    registry.found_dirs.append(directory)
    if len(names) > MAX_SPEC_FILES:
        registry.errors.append(
            f"{directory}: {len(names)} spec files, only the first {MAX_SPEC_FILES} read"
        )
        names = names[:MAX_SPEC_FILES]
    for name in names:
        path = os.path.join(directory, name)
        try:
            doc = loader(path) if loader is not None else _load_spec_file(path, cache, dir_fd)
        except (GpuctkError, OSError, ValueError) as exc:
            text = str(exc)
            text = text if text.startswith(path) else f"{path}: {text}"
            registry.errors.append(text)
            if text.startswith(f"{path}: refused: "):
                registry.refused.append(text)
            continue
        problem = _spec_problem(doc)
        if problem:
            registry.errors.append(f"{path}: {problem}")
            continue
        registry.add(SpecFile(path, priority, doc["kind"], doc))


def load(
    dirs: Sequence[str] = DEFAULT_SPEC_DIRS,
    *,
    loader: Loader | None = None,
    cache: SpecCache | None = None,
) -> Registry:
    """Read every spec in `dirs` (later dirs win). Never raises for a bad file or dir: those
    land in `Registry.errors`. With a `cache` (gpuctk.cdi.specs.speccache, the shim's), unchanged
    spec files are not decoded again, and the cache is saved before returning."""
    registry = Registry(dirs)
    from gpuctk.cdi.specs.spectrust import open_spec_dir
    from gpuctk.errors import TrustError

    for priority, directory in enumerate(dirs):
        try:
            dir_fd = open_spec_dir(directory)
        except (FileNotFoundError, NotADirectoryError):
            continue  # no such dir: nothing to read
        except TrustError as exc:
            text = f"{directory}: refused: {exc.message}"
            registry.errors.append(text)
            registry.refused.append(text)
            continue
        except OSError as exc:
            registry.errors.append(f"{directory}: cannot list: {exc.strerror or exc}")
            continue
        try:
            _load_dir(registry, directory, dir_fd, priority, loader, cache)
        finally:
            os.close(dir_fd)
    if cache is not None:
        cache.save()
    return registry
