"""Paths inside a driver root, resolved as if it were the root of the filesystem.

A driver root is `/` on the host, or the folder that holds a containerised driver's own
filesystem (/run/nvidia/driver). Every symlink is followed INSIDE it: an absolute target is
taken relative to the root and ".." stops at it, as if chrooted (a containerised driver's
/usr/lib/libcuda.so.1 -> /etc/alternatives/... must not escape to the node's /etc). A symlink is
followed only out of a folder nobody else can write, and a path may be recorded as a mount
source only when root alone can have made it (gpuctk.cdi.specs.hostpaths.source_problem, the
gpuctk.fs trusted-path rules); each path refused is kept with its reason, for the caller's one
warning.

`DriverRoot` memoises each step and each trusted folder for one discovery run
(gpuctk.cdi.node.driverfiles); `resolve_in_root` answers for one path.
"""

from __future__ import annotations

import os
import posixpath
import stat

from gpuctk.cdi.specs.hostpaths import close_folders, folder_fd, source_problem

MAX_SYMLINKS = 40  # as the kernel's MAXSYMLINKS


class DriverRoot:
    """Path resolution confined to a root, memoised for one discovery run."""

    def __init__(self, root: str) -> None:
        self.prefix = "" if root == "/" else root.rstrip("/")
        self._memo: dict[str, str | None] = {}
        self._folders: dict[
            str, int
        ] = {}  # trusted folders (gpuctk.cdi.specs.hostpaths.source_problem)
        self.left_out: dict[str, str] = {}  # host path -> why it is not recorded

    def close(self) -> None:
        close_folders(self._folders)

    def trusted(self, real: str) -> bool:
        """Whether the real container path `real` may be recorded as a mount source; if not,
        why is kept in `left_out`."""
        host = self.host(real)
        problem = source_problem(host, self._folders)
        if problem:
            self.left_out.setdefault(host, problem)
        return problem is None

    def _link_problem(self, child: str, st: os.stat_result) -> str | None:
        """Why the symlink at `child` must not be followed: only out of a trusted folder."""
        folder = self.host(posixpath.dirname(child))
        if folder_fd(folder, self._folders) >= 0:
            return None
        if st.st_uid != 0 and st.st_uid != os.geteuid():
            return (
                f"the symlink is owned by uid {st.st_uid}, in {folder}, which others can "
                "write; fix: remove it, and make the path it stands for as root"
            )
        return f"the symlink is in {folder}, which others can write or swap; fix: move it"

    def host(self, path: str) -> str:
        return self.prefix + path if path != "/" else (self.prefix or "/")

    def resolve(self, path: str, depth: int = 0) -> str | None:
        """The real container path `path` leads to, or None if it does not exist."""
        cur = "/"
        for name in path.split("/"):
            if name in ("", "."):
                continue
            if name == "..":
                cur = posixpath.dirname(cur)
                continue
            child = cur + name if cur == "/" else f"{cur}/{name}"
            if child in self._memo:
                real = self._memo[child]
            else:
                real = self._memo[child] = self._step(child, depth)
            if real is None:
                return None
            cur = real
        return cur

    def _step(self, child: str, depth: int) -> str | None:
        try:
            st = os.lstat(self.host(child))
            if not stat.S_ISLNK(st.st_mode):
                return child
            problem = self._link_problem(child, st)
            if problem:
                self.left_out.setdefault(self.host(child), problem)
                return None
            if depth >= MAX_SYMLINKS:
                return None
            target = os.readlink(self.host(child))
        except (OSError, ValueError):
            return None
        base = target if target.startswith("/") else f"{posixpath.dirname(child)}/{target}"
        return self.resolve(base, depth + 1)

    def stat(self, path: str) -> tuple[str, os.stat_result] | None:
        """(real path, stat) of `path` resolved in the root, or None."""
        real = self.resolve(path)
        if real is None:
            return None
        try:
            return real, os.stat(self.host(real), follow_symlinks=False)
        except OSError:
            return None


def resolve_in_root(root: str, path: str) -> str | None:
    """The real path (container form) that `path` resolves to inside `root`, or None (also
    when a symlink on the way is in a folder others can write)."""
    r = DriverRoot(os.path.abspath(root))
    try:
        return r.resolve(path)
    finally:
        r.close()
