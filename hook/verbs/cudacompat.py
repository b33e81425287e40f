"""CUDA forward compatibility: an image's cuda-compat libraries ahead of the node's driver.

An image built for a newer CUDA than the node's driver supports ships the cuda-compat package
in `/usr/local/cuda/compat`: `libcuda.so.<version>` and its companions (ptxjitcompiler, nvvm),
with their SONAME links. When that libcuda's major version is above the node driver's (the
version in the name of the injected `libcuda.so.<version>`), the folder comes first: it is
listed in `/etc/ld.so.conf.d/00-compat-gpuctk.conf` (before 00-gpuctk.conf, so an image's later
ldconfig keeps it first) and its libraries enter the ld cache ahead of the driver's under the
same SONAMEs, so `libcuda.so.1` resolves to the compat file. Otherwise (the same or an older
major version, a name that is no version, no single libcuda.so.X.Y in the folder) the folder is
left out.

Newer cuda-compat packages say which driver branches they serve: their libcuda carries an ELF
note section `.note.cuda.fwd_compatibility` (owner `NVIDIA Corporation`, a JSON description
such as `{"Format": 1, "CUDA Version": "12.9", "Driver": [535, 550, 570], "Device": [...]}`).
Where that note is present and readable, it decides, as in NVIDIA's `enable-cuda-compat` hook
(cmd/nvidia-cdi-hook/cudacompat): the folder comes first when the host driver's major version
is in `Driver` and the compat libcuda's full version is above the host driver's; otherwise it is
left out, whatever the file name says. A file without the note, or with one that is not
NVIDIA's or not valid JSON of that shape, falls back to the file name rule above. The
reference's `--host-cuda-version` (compared with `CUDA Version`) serves only its CSV mode for
Jetson, where no host driver version is known; gpuctk has no CSV mode and never looks at a
compat folder without the host driver's version, so it has no counterpart.

The folder is the image's: resolved inside the root (gpuctk.rootfs), at most MAX_ENTRIES names
listed, each file opened by a plain name from the folder's descriptor O_PATH | O_NOFOLLOW, its
type checked, and only a regular file reopened (O_NONBLOCK) through that descriptor; its ELF
header read bounded (gpuctk.cdi.node.elf), the note section at most MAX_NOTE bytes, its JSON at
most MAX_DRIVERS branches;
a SONAME link is followed only to a plain name in the same folder, at most MAX_HOPS times.
"""

from __future__ import annotations

import os
import posixpath
import stat

from gpuctk import rootfs

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: typing's import is costly at every start
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import TypeVar

    from gpuctk.cdi.node.ldcache import LdCacheEntry

    _T = TypeVar("_T")

COMPAT_DIR = "/usr/local/cuda/compat"
COMPAT_CONF = "/etc/ld.so.conf.d/00-compat-gpuctk.conf"  # sorts before 00-gpuctk.conf
LIBCUDA = "libcuda.so."
MAX_ENTRIES = 256  # a cuda-compat folder holds about a dozen names
MAX_HOPS = 8
NOTE_SECTION = ".note.cuda.fwd_compatibility"
NOTE_OWNER = b"NVIDIA Corporation"
MAX_NOTE = 16 * 1024  # the note NVIDIA writes is a few hundred bytes
MAX_DRIVERS = 256
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC  # via /proc/self/fd


def parse_version(text: str) -> tuple[int, ...] | None:
    """(535, 309, 1) for "535.309.01"; None unless 2 to 4 dot-separated runs of ASCII digits."""
    parts = text.split(".")
    if not 2 <= len(parts) <= 4:
        return None
    if not all(p and len(p) <= 9 and p.isascii() and p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def library_version(name: str) -> tuple[int, ...] | None:
    """The version in a `libcuda.so.<version>` file name; None for any other name."""
    if not name.startswith(LIBCUDA):
        return None
    return parse_version(name[len(LIBCUDA) :])


def host_version(paths: Iterable[str]) -> tuple[int, ...] | None:
    """The node driver's version, from the injected libcuda.so.<version> among `paths`
    (container or host paths); None when there is none, or two that disagree."""
    found = {v for v in (library_version(posixpath.basename(p)) for p in paths) if v}
    return found.pop() if len(found) == 1 else None


def use_compat(
    compat: tuple[int, ...] | None,
    host: tuple[int, ...] | None,
    drivers: tuple[int, ...] | None = None,
) -> bool:
    """True when the compat libcuda is to come first: without a note (`drivers` None), when its
    major version is above the host driver's; with one, when the host driver's branch is in
    the note's `drivers` and the compat version is above the host's."""
    if compat is None or host is None:
        return False
    if drivers is None:
        return compat[0] > host[0]
    pad = (0, 0, 0, 0)  # 550.54 is 550.54.0
    return host[0] in drivers and (compat + pad)[:4] > (host + pad)[:4]


def parse_note(data: bytes, align: int, order: str) -> tuple[int, ...] | None:
    """The driver branches (`Driver`) of a `.note.cuda.fwd_compatibility` section's contents
    (`align`: its sh_addralign, `order`: "<" or ">"); None unless it holds NVIDIA's note with a
    JSON object whose `Driver` is a list of integers (keys matched as Go's encoding/json
    matches them, without regard to case)."""
    import struct

    if len(data) < 12:
        return None
    namesz, descsz, _type = struct.unpack(order + "III", data[:12])
    if namesz == 0 or descsz == 0:
        return None
    step = align if align in (4, 8) else 4
    name_end = 12 + namesz + (-namesz % step)
    if data[12 : 12 + namesz].strip(b"\0") != NOTE_OWNER:
        return None
    desc = data[name_end : name_end + descsz].strip(b"\0")
    from gpuctk import jsonfast

    try:
        doc = jsonfast.loads(desc.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    fields = {k.lower(): v for k, v in doc.items() if isinstance(k, str)}
    drivers = fields.get("driver", [])
    if drivers is None:
        drivers = []
    if not isinstance(drivers, list) or len(drivers) > MAX_DRIVERS:
        return None
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in drivers):
        return None
    return tuple(drivers)


def _read_regular(dir_fd: int, name: str, read: Callable[[int], _T]) -> _T | None:
    """`read` of the regular file `name` in the folder; None when it is no such file or `read`
    raises OSError or ValueError. The name is opened O_PATH without following a link and its
    type checked first; only a regular file is then opened for reading, through that same
    descriptor (a device node or FIFO raced into the folder is never opened)."""
    try:
        pfd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(pfd).st_mode):
            return None
        fd = os.open(f"/proc/self/fd/{pfd}", _READ_FLAGS)
    except OSError:
        return None
    finally:
        os.close(pfd)
    try:
        return read(fd)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def note_drivers(dir_fd: int, name: str) -> tuple[int, ...] | None:
    """The driver branches of the forward compatibility note of the regular file `name` in the
    folder; None when it has none (or is no readable ELF file)."""
    from gpuctk.cdi.node.elf import read_note_section

    found = _read_regular(dir_fd, name, lambda fd: read_note_section(fd, NOTE_SECTION, MAX_NOTE))
    return parse_note(*found) if found is not None else None


class Compat:
    """The compat folder chosen for a container, and its ld cache entries."""

    __slots__ = ("entries", "folder", "version")

    def __init__(self, folder: str, version: tuple[int, ...], entries: list[LdCacheEntry]) -> None:
        self.folder = folder
        self.version = version
        self.entries = entries


def _names(dir_fd: int) -> list[os.DirEntry[str]] | None:
    """The folder's entries, sorted; None when it holds more than MAX_ENTRIES."""
    out: list[os.DirEntry[str]] = []
    with os.scandir(dir_fd) as it:
        for entry in it:
            if len(out) == MAX_ENTRIES:
                return None
            out.append(entry)
    return sorted(out, key=lambda e: e.name)


def _facts(dir_fd: int, name: str) -> tuple[int | None, str | None] | None:
    """(cache flags, SONAME) of the regular file `name` in the folder; None if it is not one."""
    from gpuctk.cdi.node.elf import read_elf_fd
    from gpuctk.cdi.node.ldcache import CACHE_FLAGS

    info = _read_regular(dir_fd, name, read_elf_fd)
    if info is None:
        return None
    return CACHE_FLAGS.get((info.elf_class, info.machine)), info.soname


def _target(dir_fd: int, name: str, kinds: dict[str, bool]) -> str | None:
    """The file that `name` leads to through links to plain names in the folder."""
    for _ in range(MAX_HOPS):
        if not kinds.get(name, False):
            return name if name in kinds else None
        try:
            step = os.readlink(name, dir_fd=dir_fd)
        except OSError:
            return None
        if "/" in step or step in ("", ".", ".."):
            return None
        name = step
    return None


def _entries(dir_fd: int, entries: list[os.DirEntry[str]], folder: str) -> list[LdCacheEntry]:
    """A cache entry for each name in the folder that ldconfig caches for the file it leads
    to: its SONAME, or its development link (cached_name: libcuda.so for libcuda.so.1); the
    name stands for a SONAME the file lacks, as for ldconfig."""
    from gpuctk.cdi.node.ldcache import LdCacheEntry, cached_name, library_name

    kinds: dict[str, bool] = {}  # name -> is a symlink (regular files and links only)
    for e in entries:
        if e.is_symlink():
            kinds[e.name] = True
        elif e.is_file(follow_symlinks=False):
            kinds[e.name] = False
    known: dict[str, tuple[int | None, str | None] | None] = {}
    out: list[LdCacheEntry] = []
    for name in kinds:
        if not library_name(name):
            continue
        target = _target(dir_fd, name, kinds)
        if target is None:
            continue
        if target not in known:
            known[target] = _facts(dir_fd, target)
        facts = known[target]
        if facts is not None and facts[0] is not None and cached_name(name, facts[1], name):
            out.append(LdCacheEntry(name, posixpath.join(folder, name), facts[0]))
    return out


def find(root_fd: int, host: tuple[int, ...] | None) -> Compat | None:
    """The image's compat folder when it is to come first (the module docstring), else None."""
    if host is None:
        return None
    try:
        dir_fd = rootfs.open_in_root(root_fd, COMPAT_DIR, os.O_RDONLY | os.O_DIRECTORY)
    except rootfs.InRootError:
        return None
    try:
        entries = _names(dir_fd)
        if entries is None:
            return None
        cuda = [
            (e.name, v)
            for e in entries
            if (v := library_version(e.name)) and e.is_file(follow_symlinks=False)
        ]
        if len(cuda) != 1:
            return None
        if not use_compat(cuda[0][1], host, note_drivers(dir_fd, cuda[0][0])):
            return None
        found = _entries(dir_fd, entries, COMPAT_DIR)
    except OSError:
        return None
    finally:
        os.close(dir_fd)
    return Compat(COMPAT_DIR, cuda[0][1], found)


def write_conf(root_fd: int, compat: Compat | None) -> None:
    """List the compat folder in COMPAT_CONF; without one, empty a COMPAT_CONF already there
    (a root used again after a driver upgrade), and write nothing otherwise."""
    if compat is None:
        st = rootfs.stat_in_root(root_fd, COMPAT_CONF, follow=False)
        if st is None or not stat.S_ISREG(st.st_mode):
            return
        text = "# written by gpuctk: the CUDA compat libraries are not newer than the driver\n"
    else:
        text = f"# written by gpuctk: CUDA forward compatibility\n{compat.folder}\n"
    rootfs.write_file_in_root(root_fd, COMPAT_CONF, text.encode(), 0o644, parents=True)


def ahead(compat: Compat | None, entries: list[LdCacheEntry]) -> list[LdCacheEntry]:
    """`entries` (the driver's) with the compat folder's before them, as ldconfig orders two
    folders that hold the same SONAME: the first listed wins."""
    return [*compat.entries, *entries] if compat is not None else entries
