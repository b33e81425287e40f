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

The file is untrusted (it may come from a container image or a driver root): every count and
offset is checked against the data, strings are length-capped, and anything inconsistent
raises ValueError. Nothing here can loop more than nlibs times, and nlibs is capped by the size.
"""

from __future__ import annotations

import os
import struct

from gpuctk.records import record

MAGIC_OLD = b"ld.so-1.7.0"
MAGIC_NEW = b"glibc-ld.so.cache1.1"

FLAG_TYPE_MASK = 0x00FF
FLAG_ELF_LIBC6 = 0x0003
FLAG_REQUIRED_MASK = 0xFF00
FLAG_X8664_LIB64 = 0x0300
FLAG_AARCH64_LIB64 = 0x0A00

MAX_CACHE_SIZE = 64 << 20  # real caches are 30 KB to a few MB
_MAX_STRING = 4096  # PATH_MAX

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


def _string(data: bytes, offset: int) -> str:
    if not 0 <= offset < len(data):
        raise ValueError(f"ld.so.cache string offset {offset} lies outside the file")
    end = data.find(b"\0", offset, offset + _MAX_STRING)
    if end < 0:
        raise ValueError(f"ld.so.cache string at {offset} is not terminated")
    return os.fsdecode(data[offset:end])


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
    entries = []
    for i in range(nlibs):
        flags, key, value, _osv, hwcap = struct.unpack_from(e + "iIIIQ", data, first + i * 24)
        entries.append(
            LdCacheEntry(_string(data, base + key), _string(data, base + value), flags, hwcap)
        )
    return tuple(entries)


def _parse_old(data: bytes) -> tuple[LdCacheEntry, ...]:
    (nlibs,) = struct.unpack_from("<I", data, len(MAGIC_OLD) + 1)
    if nlibs > (len(data) - _OLD_HEADER) // _OLD_ENTRY:
        raise ValueError(f"ld.so.cache claims {nlibs} entries, more than the file holds")
    strings = _OLD_HEADER + nlibs * _OLD_ENTRY
    new_base = (strings + 7) & ~7
    if data[new_base : new_base + len(MAGIC_NEW)] == MAGIC_NEW:
        return _parse_new(data, new_base)
    entries = []
    for i in range(nlibs):
        flags, key, value = struct.unpack_from("<iII", data, _OLD_HEADER + i * _OLD_ENTRY)
        entries.append(LdCacheEntry(_string(data, strings + key), _string(data, strings + value),
                                    flags))  # fmt: skip
    return tuple(entries)


def parse_ld_cache(data: bytes) -> tuple[LdCacheEntry, ...]:
    """Entries of an ld.so.cache image, in file order (glibc's lookup order)."""
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
    return parse_ld_cache(data)


# ---- writing (the shim's ld cache without ldconfig) ----------------------------------------

HWCAP_EXTENSION = 1 << 62  # DL_CACHE_HWCAP_EXTENSION: an entry that points into the extension


_DIGITS = frozenset("0123456789")


def libcmp(a: str, b: str) -> int:
    """glibc's _dl_cache_libcmp: like strcmp, but runs of digits compare as numbers, and a digit
    sorts after any other character."""
    i = j = 0
    while i < len(a):
        a_digit, b_digit = a[i] in _DIGITS, j < len(b) and b[j] in _DIGITS
        if a_digit and b_digit:
            si, sj = i, j
            while i < len(a) and a[i] in _DIGITS:
                i += 1
            while j < len(b) and b[j] in _DIGITS:
                j += 1
            va, vb = int(a[si:i]), int(b[sj:j])
            if va != vb:
                return va - vb
        elif a_digit:
            return 1
        elif b_digit:
            return -1
        elif j >= len(b) or a[i] != b[j]:
            return ord(a[i]) - (ord(b[j]) if j < len(b) else 0)
        else:
            i += 1
            j += 1
    return -(ord(b[j]) if j < len(b) else 0)


def _compare(e1: LdCacheEntry, e2: LdCacheEntry) -> int:
    """ldconfig's entry order (elf/cache.c compare): names in descending libcmp order (the
    loader's binary search relies on it), then higher flags, then more specific hwcaps first."""
    res = libcmp(e2.key, e1.key)
    if res:
        return res
    if e1.flags != e2.flags:
        return 1 if e1.flags < e2.flags else -1
    b1, b2 = e1.hwcap.bit_count(), e2.hwcap.bit_count()
    if b1 != b2:
        return 1 if b2 > b1 else -1
    if e1.hwcap != e2.hwcap:
        return 1 if e2.hwcap > e1.hwcap else -1
    return 0


def build_ld_cache(entries: list[LdCacheEntry]) -> bytes:
    """A new-format ("glibc-ld.so.cache1.1") cache of `entries`, in ldconfig's order, without the
    extension section: entries that point into an extension (glibc-hwcaps) are left out."""
    try:  # the C implementation itself: `functools` would cost the create path ~4 ms
        from _functools import cmp_to_key  # type: ignore[import-not-found]
    except ImportError:  # pragma: no cover - CPython always has it
        from functools import cmp_to_key

    kept = sorted((e for e in entries if not e.hwcap & HWCAP_EXTENSION), key=cmp_to_key(_compare))
    strings = bytearray()
    offsets: dict[str, int] = {}
    start = _NEW_HEADER + len(kept) * _NEW_ENTRY

    def offset(text: str) -> int:
        if text not in offsets:
            offsets[text] = start + len(strings)
            strings.extend(os.fsencode(text) + b"\0")
        return offsets[text]

    table = bytearray()
    for e in kept:
        table += struct.pack("<iIIIQ", e.flags, offset(e.key), offset(e.value), 0, e.hwcap)
    header = MAGIC_NEW + struct.pack("<IIB3xI12x", len(kept), len(strings), 2, 0)
    return bytes(header + table + strings)
