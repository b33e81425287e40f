"""The ld cache rebuilt by the host's ldconfig (gpuctk.hook.verbs.ldconfig), installed by the hook.

Unprivileged in its user namespace, the confined ldconfig can write none of the root's files:
it gets a scratch folder in the root's /etc that only its host id (65534) may write, writes its
cache there (`-C`) and lists with `-v` what it did, the SONAME links it could not make marked
"(SKIPPED)". This process, host root, installs that cache as /etc/ld.so.cache (gpuctk.rootfs:
atomic, on the root's own mount) and makes those links (on the root's own mount, never over a
file), then removes the scratch folder. Where ldconfig ran as host root (no user namespace), it
made its links itself: the same steps install its cache.
"""

from __future__ import annotations

import os
import posixpath
import stat

from gpuctk import rootfs
from gpuctk.errors import GpuctkError
from gpuctk.hook import compiled
from gpuctk.hook.verbs.ldconfig import LdconfigError, run_confined
from gpuctk.hook.verbs.namespaces import UNPRIVILEGED
from gpuctk.log import hook as hooklog

CACHE_LIMIT = 64 << 20  # the largest cache the child may hand back
_SKIPPED = " (SKIPPED)"


def skipped_links(listing: bytes) -> list[tuple[str, str]]:
    """(target, link) for each SONAME link `ldconfig -v` wanted and could not make: its
    "\tSONAME -> FILE (SKIPPED)" lines, under the "FOLDER: (from ...)" line they belong to.
    What an image's SONAMEs or folder names make of this text is only ever a link inside the
    root, on its own mount, never over a file: what the image could hold itself."""
    links: list[tuple[str, str]] = []
    folder: str | None = None
    for raw in listing.split(b"\n"):
        line = raw.decode("utf-8", "surrogateescape")
        if not line.startswith("\t"):
            head = line.split(": (from ", 1)[0] if " (from " in line else line.removesuffix(":")
            folder = head if head.startswith("/") and head != line else None
            continue
        if folder is None or not line.endswith(_SKIPPED):
            continue
        soname, sep, target = line[1 : -len(_SKIPPED)].partition(" -> ")
        if sep and soname and target and "/" not in soname and "/" not in target:
            links.append((target, posixpath.join(folder, soname)))
    return links


def _scratch(root_fd: int) -> tuple[int, int, str]:
    """A new folder in the root's /etc (its own mount) that only UNPRIVILEGED may write:
    (/etc's O_PATH descriptor, the folder's descriptor, its name)."""
    etc = rootfs.open_in_root(root_fd, "/etc", os.O_PATH | os.O_DIRECTORY)
    try:
        if rootfs.mount_id(etc) != rootfs.mount_id(root_fd):
            raise LdconfigError("the container's /etc is on another mount: no ld cache written")
        name = f".gpuctk-ldconfig-{os.getpid()}-{os.urandom(4).hex()}"
        os.mkdir(name, 0o700, dir_fd=etc)
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=etc)
        os.fchown(fd, UNPRIVILEGED, UNPRIVILEGED)
    except BaseException:
        os.close(etc)
        raise
    return etc, fd, name


def _take_cache(folder_fd: int) -> bytes | None:
    """The cache the child wrote in the scratch folder (a regular file, bounded), or None."""
    try:
        fd = os.open("ld.so.cache", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=folder_fd)  # fmt: skip
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > CACHE_LIMIT:
            raise LdconfigError("the host ldconfig's cache is not a regular file of at most "
                                f"{CACHE_LIMIT} bytes: not installed")  # fmt: skip
        chunks, size = [], 0
        while size <= CACHE_LIMIT:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > CACHE_LIMIT:
            raise LdconfigError(f"the host ldconfig's cache grew past {CACHE_LIMIT} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _remove_scratch(etc_fd: int, folder_fd: int, name: str) -> None:
    for entry in os.listdir(folder_fd):
        try:
            os.unlink(entry, dir_fd=folder_fd)
        except OSError:
            try:  # noqa: SIM105 - contextlib would cost the create path an import
                os.rmdir(entry, dir_fd=folder_fd)
            except OSError:
                pass
    try:
        os.rmdir(name, dir_fd=etc_fd)
    except OSError as exc:
        hooklog.warning(f"cannot remove /etc/{name} in the container root: {exc.strerror}")


def rebuild_cache(root_fd: int, root_path: str, exe_fd: int, args: list[str]) -> str:
    """Rebuild the root's /etc/ld.so.cache with the opened host ldconfig, run confined with
    `args` (folders, -f, -X; not -C) by run_confined; the cache it writes in a scratch folder
    is installed here and the SONAME links it could not make are made here. Returns ldconfig's
    messages (its stderr and the confining steps' warnings)."""
    etc_fd, folder_fd, name = _scratch(root_fd)
    try:
        cache = f"/etc/{name}/ld.so.cache"
        output, listing = run_confined(root_fd, root_path, exe_fd, ["-v", "-C", cache, *args])
        data = _take_cache(folder_fd)
        if data is None:
            hooklog.warning("the host ldconfig wrote no ld cache: /etc/ld.so.cache left as it was")
        else:
            rootfs.write_file_in_root(root_fd, "/etc/ld.so.cache", data, 0o644)
        links = skipped_links(listing)
        try:
            outcomes = compiled.links_in_root(root_fd, links, parents=False)
        except GpuctkError as exc:  # the cache is written: its links are ldconfig's extra
            hooklog.warning(f"ldconfig's SONAME links not made: {exc.message}")
            outcomes = []
        for (target, link), done in zip(links, outcomes, strict=False):
            if done == "made":
                hooklog.log("debug", f"linked {link} -> {target} (ldconfig's)", to_stderr=False)
            elif isinstance(done, rootfs.InRootError):
                hooklog.log("debug", f"left {link} alone: {done.message}", to_stderr=False)
    finally:
        try:
            _remove_scratch(etc_fd, folder_fd, name)
        finally:
            os.close(folder_fd)
            os.close(etc_fd)
    return output
