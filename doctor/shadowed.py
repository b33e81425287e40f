"""`gpuctk doctor`: main-config CRI keys that gpuctk's containerd 1.x drop-in shadows.

containerd 1.x replaces a whole plugin table from an imported file, so gpuctk's drop-in carries
a copy of the CRI table the main config (and the imports before it) set, plus the handler. An
edit of such a key in the main config after configure (sandbox_image, a registry setting,
runc's SystemdCgroup) then has no effect: containerd reads the drop-in's copy. This check
compares the two, key by key, and fails naming each key whose value differs (or that the copy
lacks); the fix is configure again, which copies the current values. The handler's own table
and the keys configure sets on purpose (default_runtime_name with --set-as-default, enable_cdi
and cdi_spec_dirs with --cdi-enabled) are left out. containerd 2.x merges key by key: nothing
is shadowed there.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpuctk.doctor.report import Result, failed, ok, skipped
from gpuctk.errors import GpuctkError

SHADOWED = (
    "engine.containerd.shadowed",
    "gpuctk's containerd drop-in shadows no main-config CRI setting",
)
_ABSENT = object()


def _leaves(table: dict[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for key, value in table.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, (*prefix, key))
        else:
            yield (*prefix, key)


def _at(table: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = table
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return _ABSENT
        node = node[key]
    return node


def _ours(path: tuple[str, ...], drop_in: dict[str, Any], name: str) -> bool:
    """Whether configure sets this key on purpose (the handler, --set-as-default, CDI)."""
    if path[:3] == ("containerd", "runtimes", name):
        return True
    if path == ("containerd", "default_runtime_name"):
        return bool(_at(drop_in, path) == name)
    if path in (("enable_cdi",), ("cdi_spec_dirs",)):
        return _at(drop_in, ("enable_cdi",)) is True
    return False


def _merges_deep(version: int, binary: str | None) -> bool:
    from gpuctk.containerd import engine, versions

    found = None
    if binary is not None:
        try:
            found = engine.version(binary)
        except GpuctkError:
            found = None
    return versions.deep_merges(version, found)


def check_shadowed(config: str, binary: str | None, name: str, configure_fix: str) -> Result:
    """engine.containerd.shadowed: each key the main config sets that the 1.x drop-in pins."""
    from gpuctk.containerd import imports, state, tomlfiles, versions

    id_, title = SHADOWED
    try:
        main = tomlfiles.load(config) or {}
        files = imports.load(config, "replace").files
        version = main.get("version") if main.get("version") in versions.CRI_PLUGIN else 2
        assert isinstance(version, int)
        if _merges_deep(version, binary):
            return ok(id_, title, "containerd 2.x merges drop-ins key by key: nothing shadowed")
        plugin = versions.CRI_PLUGIN[version]
        tables = [
            (p, tomlfiles.get_table(tomlfiles.load(p) or {}, "plugins", plugin)) for p in files
        ]
    except GpuctkError as exc:
        return skipped(id_, title, exc.message)
    setters = [(p, t) for p, t in tables if t is not None]
    ours = [i for i, (p, _) in enumerate(setters) if p != files[0] and _owned(p, state)]
    if not ours:
        return ok(id_, title, "no gpuctk drop-in sets the CRI table")
    if ours[-1] != len(setters) - 1:
        return skipped(id_, title, f"{setters[-1][0]} replaces the CRI table after gpuctk's")
    drop_path, drop = setters[ours[-1]]
    assert drop is not None
    if ours[-1] == 0:
        return ok(id_, title, f"{drop_path}: no file before it sets the CRI table")
    base_path, base = setters[ours[-1] - 1]
    assert base is not None
    evidence = []
    for path in _leaves(base):
        if _ours(path, drop, name):
            continue
        want, have = _at(base, path), _at(drop, path)
        if want != have:
            shown = "nothing" if have is _ABSENT else repr(have)
            evidence.append(
                f"{base_path}: {'.'.join(path)} = {want!r} has no effect: containerd 1.x "
                f"reads the whole CRI table from {drop_path}, which has {shown}"
            )
    if evidence:
        return failed(id_, title, evidence, configure_fix)
    return ok(id_, title, f"{drop_path}: every CRI key of {base_path} carried unchanged")


def _owned(path: str, state: Any) -> bool:
    from gpuctk.containerd import tomlfiles

    try:
        text = tomlfiles.read_text(path)
    except GpuctkError:
        return False
    return text is not None and state.parse(text) is not None
