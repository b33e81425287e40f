"""Who may write the CDI specs the shim and the hook act on: the spec-dir trust policy.

A CDI spec is code for a root process: its mounts, device nodes and hooks are carried out as root
in every container that asks for a device. So the spec dirs the container-create path reads
(gpuctk-runtime, gpuctk-hook prestart / precreate, through gpuctk.cdi.registry) are trusted only
as far as the account that can write them:

- a spec dir must be owned by root (or by the user gpuctk runs as: a rootless engine) and must
  not be writable by its group or by others (sticky or not: a world-writable /tmp-like dir lets
  anyone plant a file, even if not replace one);
- a spec file must be a regular file with the same owner rule, not group- or world-writable.
  Its owner and mode are checked on the descriptor the bytes are then read from (no race
  between the check and the read); a symlink is judged by the file it leads to.

A refused dir or file is skipped (never read), logged as a warning naming it and the fix, and
named again if a request then cannot be resolved. The folders above a spec dir are not checked
(whoever can rename /etc or /var/run is root already).
"""

from __future__ import annotations

import os
import stat

_WRITABLE = stat.S_IWGRP | stat.S_IWOTH


def _owner_problem(st: os.stat_result, what: str) -> str | None:
    uid = os.geteuid()
    if st.st_uid not in (0, uid):
        allowed = "root" if uid == 0 else f"root or uid {uid}"
        return f"{what} is owned by uid {st.st_uid}, not {allowed}"
    if st.st_mode & _WRITABLE:
        who = (
            "group- and world-"
            if st.st_mode & _WRITABLE == _WRITABLE
            else ("group-" if st.st_mode & stat.S_IWGRP else "world-")
        )
        return f"{what} is {who}writable (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def file_problem(st: os.stat_result) -> str | None:
    """Why a spec file with this stat must not be used, or None (a `check_stat` for specfile)."""
    problem = _owner_problem(st, "the file")
    if problem:
        return f"{problem}; spec files must be written by root only (chown root, chmod go-w)"
    return None


def dir_problem(path: str) -> str | None:
    """Why the spec dir `path` must not be read, or None (also None when it does not exist)."""
    try:
        st = os.stat(path)
    except OSError:
        return None  # missing or unreadable: the listing says so
    if not stat.S_ISDIR(st.st_mode):
        return None
    problem = _owner_problem(st, "the folder")
    if problem:
        return f"{problem}; spec dirs must be writable by root only (chown root, chmod go-w)"
    return None
