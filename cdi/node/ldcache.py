"""Parse glibc's ld.so.cache without running ldconfig.

Two layouts exist (glibc sysdeps/generic/dl-cache.h):

- new, "glibc-ld.so.cache1.1" (the only one glibc >= 2.32 writes by default): a 48-byte header
  (magic, version, nlibs, len_strings, an endianness flag, extension_offset) then nlibs 24-byte
  entries (flags, key, value, osversion, hwcap); key and value are offsets from the start of
  that header to NUL-terminated strings.
- old, "ld.so-1.7.0": a 16-byte header (magic, nlibs) then nlibs 12-byte entries (flags, key,
  value) whose offsets count from the end of the entry array. The "compat" layout that glibc <
  2.32 wrote is an old cache with a new one after it, at the next 8-byte boundary; the new part
  wins when present, as in glibc's loader.

The file is untrusted (it may come from a container image or a driver root), and reading it,
and writing it back with more entries, must cost time and memory linear in its size, which is
capped (MAX_CACHE_SIZE): every count and offset is checked against the data; nlibs is capped
by the size; each string offset is decoded once; a name (key) is a file name, at most NAME_MAX
bytes and without "/" (ldconfig's keys are SONAMEs), a path (value) is shorter than PATH_MAX,
the distinct strings together are at most 1.5 times the file and the names' runs of digits one
per 16 bytes of it; the writer sorts by one bytes key per distinct name, made without Python
code per character or per number (so its cost is the names' bytes and runs), and writes a
string that is the tail of another once, so what it writes is at most the file's entries plus
its strings. Anything inconsistent raises ValueError.
"""

from __future__ import annotations

import os
import struct
import sys
from itertools import accumulate, compress, repeat

from gpuctk.records import record

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: typing's import is costly at every start
if TYPE_CHECKING:
    from collections.abc import Callable

MAGIC_OLD = b"ld.so-1.7.0"
MAGIC_NEW = b"glibc-ld.so.cache1.1"

FLAG_TYPE_MASK = 0x00FF
FLAG_ELF_LIBC6 = 0x0003
FLAG_REQUIRED_MASK = 0xFF00
FLAG_X8664_LIB64 = 0x0300
FLAG_AARCH64_LIB64 = 0x0A00
# ELF (class, machine) -> the flags ldconfig gives a library: FLAG_ELF_LIBC6 | the
# architecture's required bits (x86-64, i386, AArch64)
CACHE_FLAGS = {(64, 62): 0x0303, (32, 3): 0x0003, (64, 183): 0x0A03}

# The largest cache read at all: real ones are 30 KB to a few hundred KB (~100 bytes an entry);
# 4 MiB holds ~40,000 libraries. Every cost of parsing and rewriting is linear in the size.
MAX_CACHE_SIZE = 4 << 20
_MAX_STRING = 4096  # PATH_MAX, with the NUL: a longer string is no path glibc would load
_NAME_MAX = 255  # a key is a file name (a SONAME): at most NAME_MAX bytes, no "/"
_RUN_BYTES = 16  # at most one run of digits in the names per this many bytes of the file
_CLASS = b"x" * 0x30 + b"0" * 10 + b"x" * 0xC6  # byte -> "0" for a digit, "x" for any other
# os.fsencode and os.fsdecode, without their Python frames (they run once per string)
_FS = (sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())

_OLD_HEADER = 16  # magic[11] + pad + uint32 nlibs
_OLD_ENTRY = 12  # int32 flags, uint32 key, uint32 value
_NEW_HEADER = 48
_NEW_ENTRY = 24  # int32 flags, uint32 key, uint32 value, uint32 osversion, uint64 hwcap

_TYPE_NAMES = {0: "libc4", 1: "ELF", 2: "libc5", 3: "libc6"}
_REQUIRED_NAMES = {
    0x0000: "", 0x0100: "64bit", 0x0200: "IA-64", 0x0300: "x86-64", 0x0400: "64bit",
    0x0500: "64bit", 0x0600: "N32", 0x0700: "64bit", 0x0800: "x32", 0x0900: "hard-float",
    0x0A00: "AArch64", 0x0B00: "soft-float",
}  # fmt: skip


def library_name(name: str) -> bool:
    """Whether ldconfig looks at a file of this name in a folder: lib* or ld-*, with .so."""
    return name.startswith(("lib", "ld-")) and ".so" in name


def cached_name(name: str, soname: str | None, file: str = "") -> bool:
    """Whether gpuctk's ld caches list a library reached by the file name `name` whose SONAME
    is `soname`: under the SONAME itself, or under its development link, libX.so for
    libX.so.N, the two names `ldconfig -p` lists for a library installed the usual way
    (libz.so.1 and libz.so); ldconfig's own rules for other names are not followed, but
    like it, only a library_name. `file`: the name that stands for a SONAME the library
    lacks (ldconfig takes the name it found it by)."""
    soname = soname or file
    if not soname or "/" in name or not library_name(name):
        return False
    return name == soname or (name.endswith(".so") and soname.startswith(name + "."))


@record
class LdCacheEntry:
    """One cache entry: `key` (the SONAME a program asks for) resolves to `value` (a path)."""

    key: str
    value: str
    flags: int
    hwcap: int = 0

    @property
    def required(self) -> int:
        """The architecture bits (FLAG_X8664_LIB64, ...; 0 for i386 and other 32-bit ABIs)."""
        return self.flags & FLAG_REQUIRED_MASK

    @property
    def description(self) -> str:
        """The flags as `ldconfig -p` prints them: "libc6,x86-64", "libc6", ..."""
        kind = _TYPE_NAMES.get(self.flags & FLAG_TYPE_MASK, "unknown")
        req = self.required
        name = _REQUIRED_NAMES.get(req, str(req))
        return f"{kind},{name}" if name else kind


def _string_reader(data: bytes) -> tuple[Callable[[int], str], Callable[[int], str]]:
    """(path, name) readers of the strings at offsets of `data`: each offset decoded once, a
    path shorter than _MAX_STRING, a name at most _NAME_MAX bytes with no "/", all the
    distinct strings together at most 1.5 times the file, and the names' runs of digits (each
    a number in the writer's sort key) at most one per _RUN_BYTES of file. ldconfig stores a
    name as the tail of its path, so a real cache's decoded strings weigh its strings plus its
    names: 0.77 to 0.90 of the file in the caches measured (a host's of 545 libraries, a Debian
    image's), 1.5 for names of ~100 bytes under /usr/lib/<triplet>/; they hold a run of digits
    per 58 to 68 bytes of file."""
    memo: dict[int, str] = {}
    names: dict[int, str] = {}
    budget = len(data) + len(data) // 2 + _MAX_STRING
    left = [budget, len(data) // _RUN_BYTES + _NAME_MAX]

    def path(offset: int) -> str:
        text = memo.get(offset)
        if text is not None:
            return text
        if not 0 <= offset < len(data):
            raise ValueError(f"ld.so.cache string offset {offset} lies outside the file")
        end = data.find(b"\0", offset, offset + _MAX_STRING)
        if end < 0:
            raise ValueError(
                f"ld.so.cache string at {offset} is not terminated within {_MAX_STRING} bytes"
            )
        left[0] -= end - offset + 1
        if left[0] < 0:
            raise ValueError(
                f"ld.so.cache strings overlap: more than {budget} bytes of them in a "
                f"{len(data)}-byte file"
            )
        text = memo[offset] = data[offset:end].decode(*_FS)
        return text

    def name(offset: int) -> str:
        text = names.get(offset)
        if text is not None:
            return text
        if 0 <= offset < len(data):
            end = data.find(b"\0", offset, offset + _NAME_MAX + 1)
            if end < 0:
                raise ValueError(
                    f"ld.so.cache name at {offset} is longer than {_NAME_MAX} bytes: no SONAME"
                )
            if data.find(b"/", offset, end) >= 0:
                raise ValueError(f"ld.so.cache name at {offset} has a '/': no SONAME")
            left[1] -= (b"x" + data[offset:end].translate(_CLASS)).count(b"x0")
            if left[1] < 0:
                raise ValueError(
                    f"ld.so.cache names hold more than {len(data) // _RUN_BYTES + _NAME_MAX} "
                    f"runs of digits in a {len(data)}-byte file"
                )
        text = names[offset] = path(offset)
        return text

    return path, name


def _parse_new(data: bytes, base: int) -> tuple[LdCacheEntry, ...]:
    if len(data) - base < _NEW_HEADER:
        raise ValueError("ld.so.cache is truncated inside its header")
    endian_flag = data[base + 28] & 3
    if endian_flag == 1:
        raise ValueError("ld.so.cache has an invalid endianness flag")
    e = ">" if endian_flag == 3 else "<"
    nlibs, _len_strings = struct.unpack_from(e + "II", data, base + 20)
    first = base + _NEW_HEADER
    if nlibs > (len(data) - first) // _NEW_ENTRY:
        raise ValueError(f"ld.so.cache claims {nlibs} entries, more than the file holds")
    path, name = _string_reader(data)
    return tuple(
        LdCacheEntry(name(base + key), path(base + value), flags, hwcap)
        for flags, key, value, _osv, hwcap in struct.iter_unpack(
            e + "iIIIQ", data[first : first + nlibs * _NEW_ENTRY]
        )
    )


def _parse_old(data: bytes) -> tuple[LdCacheEntry, ...]:
    (nlibs,) = struct.unpack_from("<I", data, len(MAGIC_OLD) + 1)
    if nlibs > (len(data) - _OLD_HEADER) // _OLD_ENTRY:
        raise ValueError(f"ld.so.cache claims {nlibs} entries, more than the file holds")
    strings = _OLD_HEADER + nlibs * _OLD_ENTRY
    new_base = (strings + 7) & ~7
    if data[new_base : new_base + len(MAGIC_NEW)] == MAGIC_NEW:
        return _parse_new(data, new_base)
    path, name = _string_reader(data)
    return tuple(
        LdCacheEntry(name(strings + key), path(strings + value), flags)
        for flags, key, value in struct.iter_unpack("<iII", data[_OLD_HEADER:strings])
    )


def parse_ld_cache(data: bytes, *, max_size: int = MAX_CACHE_SIZE) -> tuple[LdCacheEntry, ...]:
    """Entries of an ld.so.cache image, in file order (glibc's lookup order). Time and memory
    are linear in len(data), which must be at most `max_size`."""
    if len(data) > max_size:
        raise ValueError(f"ld.so.cache of {len(data)} bytes is over the {max_size}-byte limit")
    if data.startswith(MAGIC_NEW):
        return _parse_new(data, 0)
    if data.startswith(MAGIC_OLD):
        if len(data) < _OLD_HEADER:
            raise ValueError("ld.so.cache is truncated inside its header")
        return _parse_old(data)
    raise ValueError("not an ld.so.cache file (unknown magic)")


def read_ld_cache(path: str, *, max_size: int = MAX_CACHE_SIZE) -> tuple[LdCacheEntry, ...]:
    """Read and parse the cache at `path`. OSError if unreadable, ValueError if malformed."""
    with open(path, "rb") as f:
        data = f.read(max_size + 1)
    if len(data) > max_size:
        raise ValueError(f"{path} is larger than {max_size} bytes: not an ld.so.cache")
    return parse_ld_cache(data, max_size=max_size)


# ---- writing (the shim's ld cache without ldconfig) ----------------------------------------

HWCAP_EXTENSION = 1 << 62  # DL_CACHE_HWCAP_EXTENSION: an entry that points into the extension

# Where C's `char` is signed (glibc compares SONAMEs as `char`: on x86 a byte >= 0x80 is
# negative, so it sorts before the end of a name and before every ASCII character).
_SIGNED_CHAR_MACHINES = frozenset({"x86_64", "i386", "i486", "i586", "i686"})
# byte -> itself for a digit, a space for any other: bytes.split() then yields the digit runs
_DIGITS = bytes(c if 0x30 <= c <= 0x39 else 0x20 for c in range(256))
_NUMBER = struct.Struct(">BI").pack  # (marker, number) -> the 5 bytes that sort_key gives it
_WRAP = (0xFFFFFFFF).__and__  # glibc accumulates a number in an `int`: modulo 2**32,
_SIGN = (0x80000000).__xor__  # and compares it signed: the sign bit flipped, it compares unsigned


def _key_table(signed_char: bool) -> tuple[bytes, bytes, int]:
    """(byte -> its rank among non-digit characters, the end-of-name byte, the number marker),
    for sort_key. The ranks keep glibc's order: by (signed or unsigned) char value, the end of
    a name where C's NUL falls in that order, and a number after every other character."""
    ranked = [c for c in range(1, 256) if not 0x30 <= c <= 0x39]
    if signed_char:
        ranked = [c for c in ranked if c >= 0x80] + [0] + [c for c in ranked if c < 0x80]
    else:
        ranked = [0, *ranked]
    table = bytearray(256)
    for rank, c in enumerate(ranked, start=1):
        table[c] = rank
    return bytes(table), bytes([table[0]]), len(ranked) + 1


_KEY_TABLES: dict[bool, tuple[bytes, bytes, int]] = {}  # made on first use


def _wrapped(digits: bytes) -> int:
    """int(digits) modulo 2**32, for a run of digits too long for int() (sys.int_max_str_digits):
    only for names longer than any cache holds."""
    value = 0
    for at in range(0, len(digits), 9):
        chunk = digits[at : at + 9]
        value = (value * 10 ** len(chunk) + int(chunk)) & 0xFFFFFFFF
    return value


def sort_key(name: str, signed_char: bool | None = None) -> bytes:
    """Bytes that compare as glibc's _dl_cache_libcmp compares `name` (strcmp, but a run of
    digits compares as its number, and a number after any other character): each character's
    rank, and for a run of digits a marker and its number in 4 bytes. Made by a few passes of C
    over the name (translate, split, map, join): no Python code runs per character or per
    number. `signed_char`: the machine's C `char` (default: this machine's)."""
    if signed_char is None:
        signed_char = os.uname().machine in _SIGNED_CHAR_MACHINES
    tables = _KEY_TABLES.get(signed_char)
    if tables is None:
        tables = _KEY_TABLES[signed_char] = _key_table(signed_char)
    table, end_of_name, marker = tables
    raw = name.encode(*_FS)
    ranked = raw.translate(table)  # a digit becomes 0, which no other byte's rank is
    if 0 not in ranked:
        return ranked + end_of_name
    runs = raw.translate(_DIGITS).split()
    values = map(int, runs) if len(raw) <= _NAME_MAX else map(_wrapped, runs)
    numbers = map(_NUMBER, repeat(marker), map(_SIGN, map(_WRAP, values)))
    words = ranked.split(b"\0")  # a word before each run, and one after the last
    if len(words) > len(runs) + 1:  # the empty words between the digits of a run
        words = [words[0], *filter(None, words[1:-1]), words[-1]]
    return b"".join(map(bytes.__add__, words, numbers)) + words[-1] + end_of_name


def build_ld_cache(entries: list[LdCacheEntry], *, signed_char: bool | None = None) -> bytes:
    """A new-format ("glibc-ld.so.cache1.1") cache of `entries`, in ldconfig's order, without the
    extension section: entries that point into an extension (glibc-hwcaps) are left out.

    ldconfig's order (elf/cache.c compare): names in descending _dl_cache_libcmp order (the
    loader's binary search relies on it), then higher flags, then more specific hwcaps first;
    equal entries keep their order. One bytes key per distinct name (sort_key), so no Python
    runs per comparison or per character compared; memory is linear in the entries and their
    distinct strings, and the result is at most the entries and the strings that are the tail
    of no other (_string_table)."""
    if signed_char is None:
        signed_char = os.uname().machine in _SIGNED_CHAR_MACHINES
    keys: dict[str, bytes] = {}

    def order(e: LdCacheEntry) -> tuple[bytes, int, int, int]:
        key = keys.get(e.key)
        if key is None:
            key = keys[e.key] = sort_key(e.key, signed_char)
        return key, e.flags, e.hwcap.bit_count(), e.hwcap

    kept = [e for e in entries if not e.hwcap & HWCAP_EXTENSION]
    kept.sort(key=order, reverse=True)  # reverse=True keeps equal entries in their order
    start = _NEW_HEADER + len(kept) * _NEW_ENTRY
    strings, offsets = _string_table({e.key for e in kept} | {e.value for e in kept}, start)
    table = bytearray()
    for e in kept:
        table += struct.pack("<iIIIQ", e.flags, offsets[e.key], offsets[e.value], 0, e.hwcap)
    header = MAGIC_NEW + struct.pack("<IIB3xI12x", len(kept), len(strings), 2, 0)
    return bytes(header + table + strings)


def _string_table(texts: set[str], start: int) -> tuple[bytes, dict[str, int]]:
    """The strings section for `texts` at file offset `start`, and each one's offset there. A
    string that is the tail of another is not written again (as ldconfig's string table does:
    a name is the tail of its path), so the strings of one parsed cache take no more room than
    they did in its file: strings that end at different NULs there do not overlap."""
    if not texts:
        return b"", {}
    listed = list(texts)
    tails = [text.encode(*_FS)[::-1] for text in listed]
    order = sorted(range(len(tails)), key=tails.__getitem__)
    ordered = list(map(tails.__getitem__, order))
    # in this order a string is the tail of another iff of the next one (and so of the next
    # one not a tail: its host, with which it ends); all in C, no Python code per string
    hosts = [*map(False.__eq__, map(bytes.startswith, ordered[1:], ordered)), True]
    lengths = list(map((1).__add__, map(len, compress(ordered, hosts))))
    strings = (b"\0" + b"\0".join(compress(ordered, hosts)))[::-1]  # the last host first
    nul = list(map((start + len(strings) - 1).__sub__, accumulate(lengths, initial=0)))
    ends = map(nul.__getitem__, accumulate(hosts, initial=0))  # each string's host's NUL
    starts = map(int.__sub__, ends, map(len, ordered))
    offsets = dict(zip(map(listed.__getitem__, order), starts, strict=True))
    return strings, offsets
