"""Which driver stages running containers mount, read from the mount tables in /proc.

A container's bind mount of a stage keeps the stage's folder, not its files: removing the stage
(shutil.rmtree unlinks every file) empties /usr/local/nvidia in every container that mounts it.
So `--prune-stages` (gpuctk.cdi.stageprune.prune_stages) asks this module first.

How a mount is matched to a stage: by filesystem and path within it, not by host path. A line of
/proc/<pid>/mountinfo names the filesystem (field 3, major:minor) and the folder of it that the
mount shows (field 4, its root, a path inside that filesystem): a container's bind mount of
`/var/lib/gpuctk/driver/<stage>/lib64` reads `253:1 /var/lib/gpuctk/driver/<stage>/lib64` when
the staging dir is on the root filesystem, `0:52 /<stage>/lib64` when it is a filesystem of its
own (a tmpfs, a separate /var), `/@/var/lib/...` on a btrfs subvolume. The mount point (field 5)
is a path in the container's root and says nothing about the host. So each stage is located
once, through this process's own table: the mount whose mount point is the longest prefix of
the stage's real path (the last listed of equals: the top of a stack) gives the filesystem, and
its root plus the rest of the path gives the stage's path inside it. A mount anywhere whose
filesystem is the same and whose root is that path or under it shows the stage. This needs no
mapping of each container's mounts back to host paths (the other way: find each foreign mount's
filesystem in the host table and join), and it holds for any staging dir filesystem.

Work is bounded: one read of each mount namespace's table (processes are grouped by the inode
of /proc/<pid>/ns/mnt; a namespace is read once, from the first of its processes whose table
could be read), each read capped at MOUNTINFO_CAP bytes. A process that is gone or unreadable
is skipped (its namespace is tried again through its next process). A table over the cap
cannot be searched whole: then every stage asked about counts as mounted (nothing is removed),
and the note says why. Only the processes of this PID namespace are seen: run the prune where
the container runtimes' processes are visible (the host, or a pod with hostPID).
"""

from __future__ import annotations

import os
import re

MOUNTINFO_CAP = 16 << 20  # bytes of one mount table read; a node's table is rarely over 1 MiB

_ESCAPE = re.compile(r"\\([0-7]{3})")


def unescape(field: str) -> str:
    """A mountinfo path field as a path (the kernel writes space, tab, newline and backslash as
    octal escapes)."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse(text: str) -> list[tuple[str, str, str]]:
    """(major:minor, root, mount point) of each line of a mountinfo text; bad lines skipped."""
    out = []
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) >= 5 and ":" in fields[2]:
            out.append((fields[2], unescape(fields[3]), unescape(fields[4])))
    return out


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def locate(path: str, table: list[tuple[str, str, str]]) -> tuple[str, str] | None:
    """(major:minor, path inside that filesystem) of the real absolute `path` per the mount
    `table` of the namespace it is named in; None when no mount point holds it."""
    best: tuple[str, str, str] | None = None
    for entry in table:
        point = entry[2]
        if _under(path, point) and (best is None or len(point) >= len(best[2])):
            best = entry
    if best is None:
        return None
    dev, root, point = best
    rest = path[len(point) :].lstrip("/") if point != "/" else path.lstrip("/")
    inside = root.rstrip("/") + "/" + rest if rest else root
    return dev, inside


def _read(path: str, cap: int) -> str | None:
    """Up to cap + 1 bytes of `path` as text, or None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(cap + 1).decode("utf-8", "surrogateescape")
    except OSError:
        return None


def mounted(
    stages: list[str], proc: str = "/proc", cap: int = MOUNTINFO_CAP
) -> tuple[dict[str, int], str]:
    """{stage: how many mount namespaces mount it or a path under it} for the stages (real
    absolute paths) that some namespace mounts, and a note ("" or why every stage was counted
    as mounted: a table over `cap`, or this process's own table unreadable)."""
    own = _read(os.path.join(proc, "self/mountinfo"), cap)
    if own is None or len(own) > cap:
        return {s: 0 for s in stages}, f"cannot read {proc}/self/mountinfo whole"
    table = parse(own)
    where = {s: found for s in stages if (found := locate(s, table)) is not None}
    if len(where) < len(stages):
        lost = [s for s in stages if s not in where]
        return {s: 0 for s in stages}, f"no mount of this namespace holds {lost[0]}"
    counts: dict[str, int] = {}
    seen: set[tuple[int, int]] = set()
    try:
        pids = [name for name in os.listdir(proc) if name.isdigit()]
    except OSError as exc:
        return {s: 0 for s in stages}, f"cannot list {proc}: {exc.strerror}"
    for pid in pids:
        try:
            ns = os.stat(os.path.join(proc, pid, "ns/mnt"))
        except OSError:
            continue  # gone, or a kernel that hides it
        key = (ns.st_dev, ns.st_ino)
        if key in seen:
            continue
        text = _read(os.path.join(proc, pid, "mountinfo"), cap)
        if text is None:
            continue  # gone: the next process of its namespace, if any, is read instead
        if len(text) > cap:
            note = f"{proc}/{pid}/mountinfo is over {cap >> 20} MiB: not searched"
            return {s: 0 for s in stages}, note
        seen.add(key)
        hits = {
            stage
            for dev, root, _ in parse(text)
            for stage, (sdev, inside) in where.items()
            if dev == sdev and _under(root, inside)
        }
        for stage in hits:
            counts[stage] = counts.get(stage, 0) + 1
    return counts, ""
