"""Before/after pictures of the host paths an attack aims at, and of the mounts on them.

    snap = HostSnapshot([outside_dir, "/etc/ld.so.cache", ...], mount_roots=[tmp_path])
    ... attack ...
    snap.assert_unchanged()          # AssertionError listing every difference

For each watched path, every entry below it (links never followed): file type and mode, owner,
size, mtime, inode, link text, SHA-256 of regular files (the first 64 MiB). Mounts: the lines
of /proc/self/mountinfo whose mount point is under one of `mount_roots` or is one of the system
folders in SYSTEM_MOUNT_POINTS (other engineers' tests mount elsewhere on this machine at the
same time, so the whole table cannot be compared).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable

SYSTEM_MOUNT_POINTS = frozenset(
    [
        "/",
        "/etc",
        "/usr",
        "/usr/lib",
        "/lib",
        "/bin",
        "/sbin",
        "/dev",
        "/proc",
        "/sys",
        "/run",
        "/tmp",
        "/etc/cdi",
        "/var/run/cdi",
        "/run/cdi",
        "/usr/lib/x86_64-linux-gnu",
    ]
)
# Real host files a hook that escaped would most likely touch (stat + hash, never written here).
HOST_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/ld.so.preload",
    "/etc/shadow",
    "/etc/passwd",
    "/sbin/ldconfig",
    "/usr/lib/x86_64-linux-gnu/libc.so.6",
)
_HASH_LIMIT = 64 << 20


def _entry(path: str) -> tuple[object, ...]:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ("missing",)
    extra: object = None
    if stat.S_ISLNK(st.st_mode):
        extra = os.readlink(path)
    elif stat.S_ISREG(st.st_mode):
        digest = hashlib.sha256()
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError as exc:
            extra = f"unreadable: {exc.errno}"
        else:
            with os.fdopen(fd, "rb") as f:
                left = _HASH_LIMIT
                while left > 0:
                    chunk = f.read(min(left, 1 << 20))
                    if not chunk:
                        break
                    digest.update(chunk)
                    left -= len(chunk)
            extra = digest.hexdigest()
    elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        extra = st.st_rdev
    return (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, st.st_ino, extra)


def tree(top: str) -> dict[str, tuple[object, ...]]:
    """Every entry under `top` (and `top` itself), links not followed."""
    out = {top: _entry(top)}
    if os.path.isdir(top) and not os.path.islink(top):
        for dirpath, dirnames, filenames in os.walk(top):
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                out[path] = _entry(path)
    return out


def _unescape(field: str) -> str:
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts(roots: Iterable[str]) -> list[tuple[str, ...]]:
    """(mount point, fs type, source, options) of the mounts on or under `roots` and on the
    system folders, sorted (mount ids left out: they differ after an unmount and a remount)."""
    prefixes = tuple(r.rstrip("/") + "/" for r in roots)
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as info:
        for line in info:
            fields = line.split()
            point = _unescape(fields[4])
            sep = fields.index("-")
            if point in SYSTEM_MOUNT_POINTS or (point + "/").startswith(prefixes):
                found.append((point, fields[sep + 1], fields[sep + 2], fields[5], fields[sep + 3]))
    return sorted(found)


class HostSnapshot:
    """Watched paths (trees) and mounts, taken at construction; compare with `changes`."""

    def __init__(
        self,
        paths: Iterable[str | os.PathLike[str]] = (),
        *,
        mount_roots: Iterable[str | os.PathLike[str]] = (),
        host_files: Iterable[str] = HOST_FILES,
    ) -> None:
        self.paths = [os.fspath(p) for p in paths] + list(host_files)
        self.mount_roots = [os.fspath(p) for p in mount_roots]
        self.before = self._take()

    def _take(self) -> tuple[dict[str, tuple[object, ...]], list[tuple[str, ...]]]:
        files: dict[str, tuple[object, ...]] = {}
        for path in self.paths:
            files.update(tree(path))
        return files, mounts(self.mount_roots)

    def changes(self) -> list[str]:
        """What differs from the first picture, in words ([] when nothing)."""
        files, now_mounts = self._take()
        old_files, old_mounts = self.before
        out = []
        for path in sorted(set(files) | set(old_files)):
            if files.get(path) != old_files.get(path):
                out.append(f"{path}: {old_files.get(path)} -> {files.get(path)}")
        for m in sorted(set(now_mounts) - set(old_mounts)):
            out.append(f"new mount: {m}")
        for m in sorted(set(old_mounts) - set(now_mounts)):
            out.append(f"mount gone: {m}")
        return out

    def assert_unchanged(self, what: str = "the attack") -> None:
        changed = self.changes()
        assert not changed, f"{what} changed the host:\n  " + "\n  ".join(changed[:40])
