"""The container's ld cache without running ldconfig: the image's own cache plus the driver.

Both in-root paths use it: gpuctk-runtime before runc (gpuctk.hook.shim.shimroot) and gpuctk-hook
in its createContainer step (gpuctk.hook.verbs.actions), so a container's cache is the same
whichever engine applied the spec. Each injected library is added under its SONAME: a mounted
driver file whose name is its own SONAME, or a SONAME link (the spec's `--link`) that leads to
one. Flags and SONAMEs come from the ELF headers of the HOST files (the mount sources), never
from files of the image; the entries are built here in ldconfig's format
(gpuctk.cdi.node.ldcache.build_ld_cache).

The image's cache is hostile input read as root. It is read here only as bytes, bounded (a
cache over MAX_CACHE is not read at all), from inside the root (gpuctk.rootfs), and parsed and
merged by one reader, the C one the folder spec's entry runs (hook/ldcache.c, through
gpuctk-cdi-hook's `merge-ld-cache`: write_cache): time and memory linear in its size. A cache
it does not take (malformed, past its limits: a name that is no file name, more strings or
digits than a real cache's) is not merged: the caller leaves the container to the confined host
ldconfig (with its time limit), which builds the cache from the image's folders instead, as for
an image with no cache.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat

from gpuctk import rootfs
from gpuctk.cdi.node import facts
from gpuctk.errors import GpuctkError
from gpuctk.fs import stat_identity
from gpuctk.hook import compiled

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: typing's import is costly at every start
if TYPE_CHECKING:
    from typing import Any

    from gpuctk.cdi.node.ldcache import LdCacheEntry

LD_CACHE = "/etc/ld.so.cache"
MERGE_VERB = compiled.MERGE_VERB  # gpuctk-cdi-hook's merge, run by merged()
IMAGE_FD_OPT = "--image-fd"
ENTRIES_FD_OPT = "--entries-fd"
STAGE_CACHE_OPT = facts.LD_CACHE_OPT
NOT_MERGED = 3  # its exit status when a cache is not one it takes
CACHE_MAGIC = b"glibc-ld.so.cache1.1"  # what the merge writes (gpuctk.cdi.node.ldcache.MAGIC_NEW)
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


def write_cache(
    root_fd: int, old: bytes, added: list[LdCacheEntry], stage_cache: str | None = None
) -> None:
    """Write the root's cache: merged(old, added, stage_cache), through gpuctk.rootfs."""
    rootfs.write_file_in_root(root_fd, LD_CACHE, merged(old, added, stage_cache), 0o644)


def merged(old: bytes, added: list[LdCacheEntry], stage_cache: str | None = None) -> bytes:
    """The entries of `old` (the image's cache) that the added ones do not replace, and
    `added`, then those of `stage_cache` (a folder spec's own cache on the host, --ld-cache:
    read only when it is a regular file of root's that nobody else can write, as the spec's
    entry reads it), in ldconfig's order, merged by gpuctk-cdi-hook (`merge-ld-cache`,
    hook/ldcache.c: the one reader of an image's cache, the spec's entry's merge). ValueError,
    one line, whenever no merged cache comes back (a cache it does not take or past its limits,
    a stage cache it cannot use, no gpuctk-cdi-hook or an older one, one that did not finish):
    the callers then leave the cache to ldconfig, as for an image without one. Time and memory
    are linear in the caches' sizes (each at most MAX_CACHE); the result is at most their
    strings."""
    from gpuctk.cdi.node.ldcache import build_ld_cache

    fds = [compiled.memfd("image-ld-cache", old), compiled.memfd("entries", build_ld_cache(added))]
    try:
        args = [MERGE_VERB, IMAGE_FD_OPT, str(fds[0]), ENTRIES_FD_OPT, str(fds[1])]
        if stage_cache is not None:
            args += [STAGE_CACHE_OPT, stage_cache]
        done = compiled.run(args, tuple(fds), "the ld cache merge")
    except GpuctkError as exc:
        raise ValueError(exc.message) from None
    finally:
        for fd in fds:
            os.close(fd)
    if done.returncode != 0 or not done.stdout.startswith(CACHE_MAGIC):
        why = compiled.why(done) if done.returncode else "no cache came back"
        raise ValueError(f"the ld cache merge: {why}")
    return done.stdout
