"""`gpuctk doctor`: whether the running containerd has loaded its config.

A handler written into containerd's config reaches pods only after a restart: each containerd
process running with that config (found through /proc: its comm, its --config, its start
time) must have started after the newest of the config files it merges.
"""

from __future__ import annotations

import os

from gpuctk.doctor.context import Context
from gpuctk.doctor.report import Result, ok, skipped, warning
from gpuctk.errors import GpuctkError

LOADED_TITLE = "the running containerd has loaded its config"


def _read_text(path: str, limit: int = 1 << 16) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def _daemon_config(argv: list[str]) -> str:
    """The --config a containerd command line names (containerd's default when none)."""
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return "/etc/containerd/config.toml"


def containerd_daemons(ctx: Context, config: str) -> list[tuple[int, float]]:
    """(pid, start time as epoch seconds) of each containerd running with `config`."""
    stat_text = _read_text(ctx.proc("stat")) or ""
    btime = next(
        (int(ln.split()[1]) for ln in stat_text.splitlines() if ln.startswith("btime ")), 0
    )
    ticks = os.sysconf("SC_CLK_TCK")
    found = []
    for entry in _listdir(ctx.proc_root):
        if not entry.isdigit() or (_read_text(ctx.proc(f"{entry}/comm")) or "").strip() != (
            "containerd"
        ):
            continue
        argv = (_read_text(ctx.proc(f"{entry}/cmdline")) or "").split("\0")
        if os.path.abspath(ctx.host(_daemon_config(argv))) != os.path.abspath(config):
            continue
        fields = (_read_text(ctx.proc(f"{entry}/stat")) or "").rpartition(")")[2].split()
        if len(fields) > 19 and fields[19].isdigit() and btime:
            found.append((int(entry), btime + int(fields[19]) / ticks))
    return found


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def check_containerd_loaded(ctx: Context, config: str) -> Result:
    """The running containerd started after its config files were last changed."""
    id_, title = "engine.containerd.loaded", LOADED_TITLE
    daemons = containerd_daemons(ctx, config)
    if not daemons:
        return skipped(id_, title, f"no containerd running with {config}")
    from gpuctk.containerd import imports, tomlfiles

    try:
        data = tomlfiles.load(config) or {}
        merge: imports.MergeMode = "deep" if data.get("version") == 3 else "replace"
        files = imports.load(config, merge).files
    except GpuctkError as exc:
        return skipped(id_, title, exc.message)
    changed = []
    for path in files:
        try:
            changed.append((os.stat(path).st_mtime, path))
        except OSError:
            continue
    newest, newest_path = max(changed, default=(0.0, config))
    stale = [(pid, start) for pid, start in daemons if start < newest]
    if stale:
        pid, start = stale[0]
        return warning(
            id_,
            title,
            [
                f"{newest_path} changed {newest - start:.0f}s after containerd (pid {pid}) "
                "started: the running daemon does not know the change (a new handler stays "
                "unknown to pods until a restart)"
            ],
            "systemctl restart containerd",
        )
    pids = ", ".join(str(pid) for pid, _ in daemons)
    return ok(id_, title, f"containerd (pid {pids}) started after {len(files)} config file(s)")
