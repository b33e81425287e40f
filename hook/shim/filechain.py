"""The files a front plan makes root use, and each step to them: decided once, checked after.

gpuctk-runtime's compiled create (hook/shimfront.c) applies a front plan
(gpuctk.hook.shim.frontplan) without Python, so it must not use a host file Python would refuse.
Rather than check them again with rules of its own, it checks that nothing changed since Python
did: when a plan is written, every hook file, mount source and device node's host path, the
low-level runtime and the log file must pass gpuctk's trusted-path rules (gpuctk.fs,
gpuctk.cdi.specs.hostpaths, gpuctk.hook.shim.runtime_main.find_runtime: the ones the Python
shim applies), and then `chain` records each step the kernel takes to reach them (chain_of):
each folder from /, each link and each step of its target, with its inode, type, mode and
owner from lstat. The front takes the plan only while every step is unchanged (lstat again),
which nobody but root can bring about once the rules passed: only root can write those folders
(in a sticky one, the entry is root's). The log file it appends to must be the plan's `log_id`
inode. Steps on procfs are never recorded: its links keep their identity while what they lead
to changes.
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from gpuctk.cdi.specs.shape import EditsDoc


def trusted_chain(
    edits: EditsDoc, runtime: str, log_file: str
) -> tuple[dict[str, list[int]], list[int]] | None:
    """(chain_of every file the front's create makes root use, the log file's [dev, ino] or
    []), once each passes gpuctk's rules (the same ones the Python shim applies); None if one
    does not."""
    from gpuctk.cdi.specs import hostpaths
    from gpuctk.errors import InputError
    from gpuctk.fs import append_trusted
    from gpuctk.hook.shim.runtime_main import find_runtime

    hooks = edits.get("hooks") or []
    sources = [path for _, path in hostpaths.host_sources(edits)]
    if hostpaths.source_problems(edits) or hostpaths.hook_problems(hooks):
        return None
    try:
        if find_runtime([runtime]) != runtime:
            return None
    except InputError:
        return None
    log_id: list[int] = []
    if log_file:
        if append_trusted(log_file, b"") is not None:
            return None
        try:
            st = os.stat(log_file)  # what the front opens (its last name no link)
        except OSError:
            return None
        log_id = [st.st_dev, st.st_ino]
    paths = [runtime, *(h["path"] for h in hooks), *sources]
    chain = chain_of([*paths, log_file] if log_file else paths)
    return (chain, log_id) if chain is not None else None


def chain_of(paths: Iterable[str]) -> dict[str, list[int]] | None:
    """Each step the kernel takes to reach each of `paths`: / and every name after it, each
    link and then each step of its target, as path (no link on the way but its last name) ->
    [dev, ino, mode, uid, gid] from lstat. None: a step missing or not looked at, a relative
    path, more than MAX_LINKS links, or a step on procfs, whose links (/proc/PID/cwd, fd/N)
    keep their identity while what they lead to changes."""
    from gpuctk.fs import MAX_LINKS

    steps: dict[str, list[int]] = {}
    try:
        proc = os.lstat("/proc/self").st_dev  # a link only procfs has
    except OSError:
        proc = None
    try:
        for path in paths:
            if not path.startswith("/"):
                return None
            todo, done, links = path.split("/")[::-1], "", 0
            here = "/"
            while True:
                st = os.lstat(here)
                if st.st_dev == proc:
                    return None
                steps[here] = [st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_gid]
                if stat.S_ISLNK(st.st_mode):
                    links += 1
                    target = os.readlink(here)
                    if links > MAX_LINKS or not target:
                        return None
                    done = "" if target.startswith("/") else done
                    todo.extend(target.split("/")[::-1])
                else:
                    done = here.rstrip("/")
                name = ""
                while todo and name in ("", ".", ".."):
                    name = todo.pop()
                    if name == "..":
                        done = done.rpartition("/")[0]
                if name in ("", ".", ".."):
                    break
                here = f"{done}/{name}"
    except OSError:
        return None
    return steps


def holds(chain: Any) -> bool:
    """Whether each [path, dev, ino, mode, uid, gid] of a plan's `chain` still holds (lstat)."""
    try:
        for path, *ident in chain:
            st = os.lstat(path)
            if ident != [st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_gid]:
                return False
    except (OSError, TypeError, ValueError):
        return False
    return isinstance(chain, list)
