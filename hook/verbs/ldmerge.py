"""The container's ld cache without running ldconfig: the image's own cache plus the driver.

Both in-root paths use it: gpuctk-runtime before runc (gpuctk.hook.shim.shimroot) and gpuctk-hook
in its createContainer step (gpuctk.hook.verbs.actions), so a container's cache is the same
whichever engine applied the spec. The image's `/etc/ld.so.cache` is parsed and kept; each injected
library is added under its SONAME: a mounted driver file whose name is its own SONAME, or a
SONAME link (the spec's `--link`) that leads to one. Flags and SONAMEs come from the ELF
headers of the HOST files (the mount sources), never from files of the image. The result is in
ldconfig's order and format (gpuctk.cdi.node.ldcache.build_ld_cache), so the loader and `ldconfig
-p`
see what ldconfig would have written for those libraries.

The image's cache is hostile input read as root: the merge costs time and memory linear in its
size, and a cache over MAX_CACHE is not read at all. Such a cache, a malformed one, or one past
the reader's limits (a name that is no file name, more strings or digits than a real cache's:
gpuctk.cdi.node.ldcache) is not merged: the shim leaves the container to gpuctk-hook, whose
confined host ldconfig (with its time limit) builds the cache from the image's folders
instead, as for an image with no cache.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat

from gpuctk import rootfs
from gpuctk.fs import read_limited, root_seen, stat_identity

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: typing's import is costly at every start
if TYPE_CHECKING:
    from typing import Any

    from gpuctk.cdi.node.ldcache import LdCacheEntry

LD_CACHE = "/etc/ld.so.cache"
MAX_CACHE = 4 << 20  # gpuctk.cdi.node.ldcache.MAX_CACHE_SIZE (not imported: only merges load it)


def host_identity(host: str) -> tuple[int, int, int, int, int] | None:
    try:
        return stat_identity(os.stat(host))
    except OSError:
        return None


def elf_facts(host: str) -> tuple[Any, ...] | None:
    """(identity, cache flags or None, SONAME) of the host file `host`; None if it is not a
    readable regular ELF file (a device or FIFO is never opened)."""
    from gpuctk.cdi.node.elf import read_elf_fd
    from gpuctk.cdi.node.ldcache import CACHE_FLAGS

    try:
        if not stat.S_ISREG(os.stat(host).st_mode):
            return None
        fd = os.open(host, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        info = read_elf_fd(fd)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return (stat_identity(st), CACHE_FLAGS.get((info.elf_class, info.machine)), info.soname)


def chain_end(links: dict[str, str], link: str) -> str:
    """Where `link` leads through the spec's own link chain (the last path not a link)."""
    path, seen = link, set()
    while path in links and path not in seen:
        seen.add(path)
        step = links[path]
        path = posixpath.normpath(
            step if step.startswith("/") else posixpath.join(posixpath.dirname(path), step)
        )
    return path


def facts_for(host: str, known: dict[str, Any]) -> tuple[Any, ...] | None:
    """elf_facts(host), from `known` while the host file is the one they were read from;
    what is read is recorded in `known`."""
    facts = known.get(host)
    if not isinstance(facts, tuple) or len(facts) != 3 or facts[0] != host_identity(host):
        facts = known[host] = elf_facts(host)
    return facts


def library_entries(
    files: list[tuple[str, str]], folders: list[str], known: dict[str, Any]
) -> list[LdCacheEntry]:
    """A cache entry for each (container path, host file) in `folders` whose name ldconfig
    caches: the host file's SONAME or its development link, the name in the container standing
    for a SONAME it lacks, as for ldconfig (cached_name). ELF facts through facts_for(host,
    known)."""
    from gpuctk.cdi.node.ldcache import LdCacheEntry, cached_name

    wanted = set(folders)
    entries = []
    for dest, host in files:
        dest = posixpath.normpath(dest)
        if posixpath.dirname(dest) not in wanted:
            continue
        facts = facts_for(host, known)
        if facts is None:
            continue
        _, flags, soname = facts
        name = posixpath.basename(dest)
        if flags is not None and cached_name(name, soname, name):
            entries.append(LdCacheEntry(name, dest, flags))
    return entries


def read_image_cache(root_fd: int) -> bytes | None:
    """The image's cache (None when it has none). ValueError, naming the file and its size,
    when it is over MAX_CACHE: no more of it is read, and the caller merges nothing; the same
    when the image's link leads it to another mount (its /proc, /sys, /dev or a volume): that
    file is never opened (gpuctk.rootfs), and the caller's fallback (ldconfig) serves."""
    try:
        return rootfs.read_file_in_root(root_fd, LD_CACHE, MAX_CACHE)
    except rootfs.InRootError as exc:
        if exc.errno == errno.EXDEV:
            raise ValueError(f"the image's {LD_CACHE} leads to another mount: not read") from None
        st = rootfs.stat_in_root(root_fd, LD_CACHE)
        if st is None or not stat.S_ISREG(st.st_mode) or st.st_size <= MAX_CACHE:
            raise
        raise ValueError(
            f"the image's {LD_CACHE} is {st.st_size} bytes, over the {MAX_CACHE}-byte limit"
        ) from None


def read_stage_cache(path: str) -> list[LdCacheEntry]:
    """The entries of a stage's own cache (gpuctk.cdi.stage.CACHE), the host file `path` a
    folder spec names: read only when it is a regular file of root's (as gpuctk.fs.root_seen
    shows root: in a user namespace that maps no host root, an owner it does not map passes
    too, the cache then trusted as far as the stage's libraries beside it) that nobody else
    can write (looked at through an O_PATH descriptor, its last part not followed, before it
    is opened), as gpuctk-cdi-hook reads it. OSError or ValueError otherwise."""
    from gpuctk.cdi.node.ldcache import parse_ld_cache

    at = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(at)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != root_seen() or st.st_mode & 0o022:
            raise ValueError(f"{path} is not a regular file of root's that only root can write")
        if st.st_size > MAX_CACHE:
            raise ValueError(f"{path} is over the {MAX_CACHE}-byte limit")
        fd = os.open(f"/proc/self/fd/{at}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            data = read_limited(fd, MAX_CACHE)
        finally:
            os.close(fd)
    finally:
        os.close(at)
    return list(parse_ld_cache(data, max_size=MAX_CACHE))


def write_cache(root_fd: int, old: bytes, added: list[LdCacheEntry]) -> int:
    """Write the root's cache: the entries of `old` (the image's cache) that `added` does not
    replace, then `added`. Returns how many of the image's entries were kept. ValueError if
    `old` is not a cache this reader knows or is past its limits; nothing is written then.
    Time and memory are linear in len(old) (at most MAX_CACHE) and len(added), and what is
    written is at most about twice len(old), plus `added` (gpuctk.cdi.node.ldcache)."""
    from gpuctk.cdi.node.ldcache import build_ld_cache, parse_ld_cache

    new_keys = {(e.key, e.flags) for e in added}
    kept = [e for e in parse_ld_cache(old, max_size=MAX_CACHE) if (e.key, e.flags) not in new_keys]
    rootfs.write_file_in_root(root_fd, LD_CACHE, build_ld_cache([*kept, *added]), 0o644)
    return len(kept)
