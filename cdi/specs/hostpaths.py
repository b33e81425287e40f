"""Host paths named by CDI edits, checked before root uses them.

runc follows links in a mount source and runs each hook as root, so every mount `hostPath`,
device-node host path and hook file must be one root alone can have made: every folder above
it root's (or this euid's) and not group/world-writable, the entry itself looked at once from
its folder without following a link (gpuctk.fs trusted-path rules). gpuctk.cdi.specs.apply refuses
edits these functions find a problem with; gpuctk.cdi.node.driverroot holds the generator's
sources to the same rule (source_problem, one folder memo per run).
"""

from __future__ import annotations

import os

from gpuctk.cdi.specs.apply import BIND_TYPES
from gpuctk.errors import TrustError
from gpuctk.fs import MAX_LINKS, open_trusted_dir, open_trusted_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any


def hook_problems(hooks: Iterable[Mapping[str, Any]]) -> list[str]:
    """ "CDI hook PATH: refused: WHY" for each hook (absolute paths, `problems` checked) that
    must not be run as root, by the spec-trust rules (gpuctk.cdi.specs.spectrust): its file and
    every folder above it writable by root (or this euid) alone, a file missing from folders
    only root can write let through (the runtime says so)."""
    found = []
    for path in dict.fromkeys(str(h.get("path")) for h in hooks):
        try:
            fd, _ = open_trusted_file(path, flags=os.O_PATH)
        except FileNotFoundError:
            continue  # nobody but root can put it there
        except TrustError as exc:
            found.append(f"CDI hook {path}: refused: {exc.message}")
            continue
        except OSError as exc:
            found.append(f"CDI hook {path}: refused: cannot look at it: {exc.strerror or exc}")
            continue
        os.close(fd)
    return found


_STEP_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def source_problem(path: str, folders: dict[str, int], depth: int = 0) -> str | None:
    """Why the host path `path` must not be mounted (or its device node read) as root, or
    None: every folder above it root's (or this euid's) and not group/world-writable
    (gpuctk.fs.open_trusted_dir; a sticky one crossed only to an entry of root's), the entry
    itself looked at once from that folder (fstatat, no link followed): a regular file or
    folder of root's that others cannot write (or a sticky folder of root's, as /tmp/.X11-unix:
    nobody else can swap it), a socket or FIFO of root's, a device node, or
    a symlink (root's, since only root can write its folder) whose target passes the same
    way. Missing from a folder only root can write: None (nobody else can put it there; the
    runtime reports it). `folders`: folder -> O_PATH descriptor (-1: not trusted as a folder
    to look into) for ONE call, closed by close_folders; never kept across creates."""
    if not path.startswith("/"):
        return "not an absolute path; fix: name the host path from /"
    folder, _, name = path.rpartition("/")
    folder = folder or "/"
    if name in ("", ".", ".."):
        return _walk_problem(path)
    fd = folder_fd(folder, folders)
    if fd < 0:  # a sticky /tmp, or worse: the whole walk says which
        return _walk_problem(path)
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot look at it: {exc.strerror or exc}"
    fmt = st.st_mode & 0o170000
    if fmt == 0o120000:  # a symlink
        if depth >= MAX_LINKS:
            return "too many levels of symbolic links"
        try:
            target = os.readlink(name, dir_fd=fd)
        except OSError as exc:
            return f"cannot read the symlink: {exc.strerror or exc}"
        dest = target if target.startswith("/") else f"{folder.rstrip('/')}/{target}"
        problem = source_problem(dest, folders, depth + 1)
        return f"it is a symlink to {target}, and {problem}" if problem else None
    if fmt in (0o020000, 0o060000):  # a device node: only root can make one
        return None
    noun = {0o040000: "folder", 0o100000: "file", 0o140000: "socket", 0o010000: "FIFO"}.get(fmt)
    if noun is None:
        return "it is not a file, folder, socket, FIFO or device node"
    if st.st_uid != 0 and st.st_uid != os.geteuid():
        return f"the {noun} is owned by uid {st.st_uid}, not root; fix: chown root {path}"
    sticky_dir = fmt == 0o040000 and st.st_mode & 0o1000  # /tmp/.X11-unix: root's, not swapped
    if st.st_mode & 0o022 and fmt in (0o040000, 0o100000) and not sticky_dir:
        words = "group-writable" if st.st_mode & 0o020 else "world-writable"
        if st.st_mode & 0o022 == 0o022:
            words = "group- and world-writable"
        mode = st.st_mode & 0o7777
        return f"the {noun} is {words} (mode {mode:04o}); fix: chmod go-w {path}"
    return None


def folder_fd(folder: str, folders: dict[str, int]) -> int:
    """An O_PATH descriptor of `folder` if gpuctk.fs.open_trusted_dir trusts it, else -1;
    remembered in `folders` (one call's memo, see source_problem)."""
    fd = folders.get(folder)
    if fd is not None:
        return fd
    parent, _, name = folder.rpartition("/")
    step = name not in ("", ".", "..") and folder.count("/") < 256  # bounded recursion
    at = folder_fd(parent or "/", folders) if step else -1
    fd = -1
    if at >= 0:  # one step from a folder already trusted: the same verdict as a whole walk
        try:
            fd = os.open(name, _STEP_FLAGS, dir_fd=at)
        except OSError:
            pass  # missing, or not to be looked at: the whole walk of a source says why
        else:
            try:
                st = os.fstat(fd)
            except OSError:
                st = None
            fmt = st.st_mode & 0o170000 if st is not None else 0
            if st is None or not (
                fmt == 0o040000 and st.st_uid in (0, os.geteuid()) and not st.st_mode & 0o022
            ):
                os.close(fd)
                fd = -1
                if fmt == 0o120000:
                    at = -1  # a symlink: the whole walk follows it (root's: its folder passed)
    if at < 0:  # "/", or a sticky /tmp, a symlink, "..", or worse on the way
        try:
            fd = open_trusted_dir(folder)
        except (TrustError, OSError):
            fd = -1
    folders[folder] = fd
    return fd


def _walk_problem(path: str) -> str | None:
    """source_problem by the whole walk from / (gpuctk.fs): a folder, else a regular file."""
    try:
        try:
            fd = open_trusted_dir(path)
        except NotADirectoryError:
            fd = open_trusted_file(path, flags=os.O_PATH)[0]
    except FileNotFoundError:
        return None
    except TrustError as exc:
        return exc.message
    except OSError as exc:
        return f"cannot look at it: {exc.strerror or exc}"
    os.close(fd)
    return None


def close_folders(folders: dict[str, int]) -> None:
    for fd in folders.values():
        if fd >= 0:
            os.close(fd)
    folders.clear()


def _is_bind(mount: Mapping[str, Any]) -> bool:
    """Whether runc takes the CDI mount for a bind mount (its source is a host path)."""
    options = mount.get("options") or ()
    return (mount.get("type") or "") in BIND_TYPES or "bind" in options or "rbind" in options


def host_sources(edits: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Each host path runc opens for `edits`, with what names it: ("CDI mount DEST: source",
    PATH) for each mount source (a bind mount's, or an absolute one) and ("CDI device PATH:
    host path", HOST) for each device node's host path: its `hostPath`, else its `path`, which
    runc reads on the host where the spec leaves the node's numbers out, and bind-mounts from
    the host in a user namespace (where it cannot make nodes) whatever the spec says."""
    found = []
    for mount in edits.get("mounts") or ():
        host = mount["hostPath"]
        if host.startswith("/") or _is_bind(mount):  # else a file system's name ("tmpfs")
            found.append((f"CDI mount {mount['containerPath']}: source", host))
    for node in edits.get("deviceNodes") or ():
        host = node.get("hostPath")  # else the node's own path, as runc takes it on the host
        what = "host path" if host else "path on the host"
        found.append((f"CDI device {node['path']}: {what}", host or node["path"]))
    return found


def source_problems(edits: Mapping[str, Any]) -> list[str]:
    """ "CDI mount DEST: source PATH refused: WHY" and "CDI device PATH: host path HOST
    refused: WHY" (or "path on the host ...") for each of host_sources that source_problem
    refuses. Each folder is walked once per call."""
    folders: dict[str, int] = {}
    found = []
    try:
        for what, host in host_sources(edits):
            problem = source_problem(host, folders)
            if problem:
                found.append(f"{what} {host} refused: {problem}")
    finally:
        close_folders(folders)
    return found


def host_device_info(path: str) -> tuple[str, int, int]:
    """(type, major, minor) of the device node at `path` on the host (not following links)."""
    st = os.lstat(path)
    fmt = st.st_mode & 0o170000
    if fmt == 0o060000:
        kind = "b"
    elif fmt == 0o020000:
        kind = "c"
    elif fmt == 0o010000:
        kind = "p"
    else:
        raise ValueError("not a device node")
    return kind, os.major(st.st_rdev), os.minor(st.st_rdev)
