"""gpuctk.cdi.node.ldcache: glibc's ld.so.cache, checked against `ldconfig -p`, and fuzzed."""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from fixtures.driver_root import make_elf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuctk.cdi.node import ldcache
from gpuctk.hook.verbs import ldmerge as hook_ldmerge

LDCONFIG = shutil.which("ldconfig") or shutil.which("/sbin/ldconfig")
needs_ldconfig = pytest.mark.skipif(LDCONFIG is None, reason="glibc's ldconfig is not installed")
_LINE = re.compile(r"\s+(\S+) \((.*)\) => (.*)$")


def ldconfig_p(cache: Path) -> list[tuple[str, str, str]]:
    assert LDCONFIG is not None
    out = subprocess.run([LDCONFIG, "-p", "-C", str(cache)], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    return [(m[1], m[2], m[3]) for m in map(_LINE.match, out.splitlines()[1:]) if m]


def ours(cache: Path) -> list[tuple[str, str, str]]:
    return [(e.key, e.description, e.value) for e in ldcache.read_ld_cache(str(cache))]


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Caches in the three formats ldconfig writes, over folders with 64- and 32-bit libraries."""
    if LDCONFIG is None:
        pytest.skip("glibc's ldconfig is not installed")
    base = tmp_path_factory.mktemp("ldcache")
    lib64, lib32 = base / "lib64", base / "lib32"
    lib64.mkdir()
    lib32.mkdir()
    (lib64 / "libcuda.so.535.309.01").write_bytes(make_elf("libcuda.so.1"))
    (lib64 / "libnvidia-ml.so.535.309.01").write_bytes(make_elf("libnvidia-ml.so.1"))
    (lib32 / "libcuda.so.535.309.01").write_bytes(make_elf("libcuda.so.1", elf_class=32,
                                                           machine=3))  # fmt: skip
    conf = base / "ld.so.conf"
    conf.write_text(f"{lib64}\n{lib32}\n")
    out = {}
    for fmt in ("new", "old", "compat"):
        cache = base / f"ld.{fmt}.cache"
        subprocess.run([LDCONFIG, "-X", "-c", fmt, "-C", str(cache), "-f", str(conf)],
                       check=True, capture_output=True)  # fmt: skip
        out[fmt] = cache
    return out


@needs_ldconfig
def test_host_cache_matches_ldconfig() -> None:
    host = Path("/etc/ld.so.cache")
    if not host.is_file():
        pytest.skip("this host has no /etc/ld.so.cache")
    assert ours(host) == ldconfig_p(host)
    assert len(ours(host)) > 10


@pytest.mark.parametrize("fmt", ["new", "old", "compat"])
def test_formats_match_ldconfig(caches: dict[str, Path], fmt: str) -> None:
    entries = ours(caches[fmt])
    assert entries == ldconfig_p(caches[fmt])
    mine = {(k, d) for k, d, v in entries if "/lib64/" in v or "/lib32/" in v}
    assert ("libcuda.so.1", "libc6,x86-64") in mine
    # The i386 one: no arch bits ("ELF" rather than "libc6": it does not link libc.so.6).
    assert ("libcuda.so.1", "ELF") in mine
    assert ("libnvidia-ml.so.1", "libc6,x86-64") in mine


def test_compat_uses_the_embedded_new_cache(caches: dict[str, Path]) -> None:
    data = caches["compat"].read_bytes()
    assert data.startswith(ldcache.MAGIC_OLD)
    new_at = data.find(ldcache.MAGIC_NEW)
    assert new_at > 0 and new_at % 8 == 0
    # Break the old part's strings: the result must not change, since the new part wins.
    (nlibs,) = struct.unpack_from("<I", data, 12)
    broken = bytearray(data)
    for i in range(nlibs):
        struct.pack_into("<II", broken, 16 + 12 * i + 4, 0xFFFFFF, 0xFFFFFF)
    assert ldcache.parse_ld_cache(bytes(broken)) == ldcache.parse_ld_cache(data)
    # Old entries alone carry no hwcap; the new ones are what was parsed.
    assert ldcache.parse_ld_cache(data) == ldcache.parse_ld_cache(data[new_at:])


def test_entry_fields(caches: dict[str, Path]) -> None:
    entries = ldcache.read_ld_cache(str(caches["new"]))
    cuda64 = next(e for e in entries if e.key == "libcuda.so.1" and e.required)
    assert cuda64.required == ldcache.FLAG_X8664_LIB64
    assert cuda64.flags & ldcache.FLAG_TYPE_MASK == ldcache.FLAG_ELF_LIBC6
    assert cuda64.value.endswith("/lib64/libcuda.so.1")


@pytest.mark.parametrize(
    "data",
    [b"", b"garbage" * 10, ldcache.MAGIC_OLD, ldcache.MAGIC_NEW, ldcache.MAGIC_NEW + bytes(27)],
)
def test_bad_files(data: bytes) -> None:
    with pytest.raises(ValueError):
        ldcache.parse_ld_cache(data)


def _new_cache(entries: list[tuple[int, int, int]], strings: bytes, nlibs: int | None = None,
               endian: int = 2) -> bytes:  # fmt: skip
    header = ldcache.MAGIC_NEW + struct.pack(
        "<IIB3sI12s", len(entries) if nlibs is None else nlibs, len(strings), endian, b"", 0, b""
    )
    body = b"".join(struct.pack("<iIIIQ", f, k, v, 0, 0) for f, k, v in entries)
    return header + body + strings


def test_handmade_cache_and_bounds() -> None:
    strings_at = 48 + 24
    strings = b"libx.so.1\0/lib/libx.so.1\0"
    good = _new_cache([(0x303, strings_at, strings_at + 10)], strings)
    (entry,) = ldcache.parse_ld_cache(good)
    assert (entry.key, entry.value, entry.description) == ("libx.so.1", "/lib/libx.so.1",
                                                           "libc6,x86-64")  # fmt: skip
    with pytest.raises(ValueError, match="more than the file holds"):
        ldcache.parse_ld_cache(_new_cache([(0x303, strings_at, strings_at)], strings, 1 << 31))
    with pytest.raises(ValueError, match="outside"):
        ldcache.parse_ld_cache(_new_cache([(0x303, 1 << 30, strings_at)], strings))
    with pytest.raises(ValueError, match="not terminated"):
        ldcache.parse_ld_cache(_new_cache([(0x303, strings_at, strings_at + 10)],
                                          b"libx.so.1\0" + b"x" * 5000))  # fmt: skip
    with pytest.raises(ValueError, match="endianness"):
        ldcache.parse_ld_cache(_new_cache([], b"", endian=1))


def test_big_endian_cache() -> None:
    strings = b"liby.so.2\0/l/liby.so.2\0"
    header = ldcache.MAGIC_NEW + struct.pack(">IIB3sI12s", 1, len(strings), 3, b"", 0, b"")
    body = struct.pack(">iIIIQ", 0x0503, 72, 82, 0, 0)
    (entry,) = ldcache.parse_ld_cache(header + body + strings)
    assert (entry.key, entry.value, entry.description) == ("liby.so.2", "/l/liby.so.2",
                                                           "libc6,64bit")  # fmt: skip


def test_size_cap(tmp_path: Path) -> None:
    big = tmp_path / "ld.so.cache"
    big.write_bytes(ldcache.MAGIC_NEW + bytes(2000))
    with pytest.raises(ValueError, match="larger than"):
        ldcache.read_ld_cache(str(big), max_size=1000)


def test_every_truncation_and_random_corruption(caches: dict[str, Path]) -> None:
    rng = random.Random(42)
    for fmt in ("new", "old", "compat"):
        data = caches[fmt].read_bytes()
        for n in sorted({rng.randrange(len(data)) for _ in range(100)} | set(range(0, 80))):
            with contextlib.suppress(ValueError):
                ldcache.parse_ld_cache(data[:n])
        for _ in range(400):
            mutated = bytearray(data)
            for _ in range(rng.randint(1, 6)):
                mutated[rng.randrange(min(len(mutated), 400))] = rng.randrange(256)
            try:
                entries = ldcache.parse_ld_cache(bytes(mutated))
            except ValueError:
                continue
            assert len(entries) <= len(data) // 12


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.binary(max_size=600),
       magic=st.sampled_from([ldcache.MAGIC_NEW, ldcache.MAGIC_OLD + b"\0"]))  # fmt: skip
def test_hypothesis_garbage(body: bytes, magic: bytes) -> None:
    with contextlib.suppress(ValueError):
        ldcache.parse_ld_cache(magic + body)


# ---- hostile caches: time and memory linear in the size, and a size cap -------------------


def one_string_cache(size: int, *, spread: bool = False) -> bytes:
    """A valid new-format cache of at most `size` bytes: as many entries as fit, each naming the
    one 4095-byte string at the end as its path (or, with `spread`, each a different tail of
    it) and its last 255 bytes as its name. Read naively, every entry is 4 KiB of text."""
    string = b"/" + b"a" * 3838 + b"/lib" + b"a" * 252 + b"\0"
    n = (size - 48 - len(string)) // 24
    at = 48 + 24 * n
    name = at + len(string) - 256
    header = ldcache.MAGIC_NEW + struct.pack("<IIB3xI12x", n, len(string), 2, 0)
    rows = (
        struct.pack("<iIIIQ", 0x303, name, at + (i % 3840 if spread else 0), 0, 0) for i in range(n)
    )
    return header + b"".join(rows) + string


class TooMuchWork(Exception):
    pass


@contextlib.contextmanager
def python_lines(limit: int) -> Iterator[list[int]]:
    """Count the Python lines run inside (a measure of work that no other load changes);
    TooMuchWork, at once, when more than `limit` have run."""
    count = [0]

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        if event == "line":
            count[0] += 1
            if count[0] > limit:
                raise TooMuchWork(f"more than {limit} Python lines run")
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        yield count
    finally:
        sys.settrace(previous)


@pytest.mark.parametrize("size", [1 << 20, 4 << 20], ids=["1MiB", "4MiB"])
def test_a_cache_of_one_long_string_costs_memory_linear_in_its_size(
    size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # read naively: a 4 KiB string and a 255-byte one per 24-byte entry, ~180 times the file
    data = one_string_cache(size)
    tracemalloc.start()
    try:
        entries = ldcache.parse_ld_cache(data)
        assert tracemalloc.get_traced_memory()[1] < 16 * size
        tracemalloc.reset_peak()
        keys: list[str] = []
        real_key = ldcache.sort_key
        monkeypatch.setattr(ldcache, "sort_key", lambda *a: keys.append(a[0]) or real_key(*a))
        out = ldcache.build_ld_cache(list(entries))
        built = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert built < 16 * size
    assert len(entries) == (size - 48 - 4096) // 24
    assert len({id(e.key) for e in entries} | {id(e.value) for e in entries}) == 2  # decoded once
    assert len(keys) == 1  # one sort key per distinct name, not a comparison per pair
    assert len(out) <= len(data) + 4096  # the result is as bounded as the input
    assert ldcache.parse_ld_cache(out) == entries


def test_a_cache_of_one_long_string_costs_work_linear_in_its_size() -> None:
    data = one_string_cache(1 << 20)
    n = (len(data) - 48) // 24
    with python_lines(100 * n) as lines:  # a comparison per character would run ~4000 per pair
        ldcache.build_ld_cache(list(ldcache.parse_ld_cache(data)))
    assert lines[0] > n  # it did count


def test_overlapping_strings_are_refused_within_a_budget() -> None:
    # 3840 different tails of one string: 8 MB of text from a 1 MiB file, more than any real
    # cache (whose strings together are about its size: a name is the tail of its path)
    data = one_string_cache(1 << 20, spread=True)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="strings overlap"):
            ldcache.parse_ld_cache(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * len(data)


def test_strings_up_to_path_max() -> None:
    at = 48 + 24
    longest = b"/" + b"x" * 4094 + b"\0"
    (entry,) = ldcache.parse_ld_cache(_new_cache([(0x303, at, at + 2)], b"x\0" + longest))
    assert len(entry.value) == 4095
    with pytest.raises(ValueError, match="not terminated within 4096 bytes"):
        ldcache.parse_ld_cache(_new_cache([(0x303, at, at + 2)], b"x\0/" + longest))


def test_a_cache_over_the_size_cap_is_refused_unread(tmp_path: Path) -> None:
    cap = ldcache.MAX_CACHE_SIZE
    assert hook_ldmerge.MAX_CACHE == cap <= 4 << 20  # the size the costs above are bounded at
    at_cap = one_string_cache(cap)
    assert len(ldcache.parse_ld_cache(at_cap)) == (cap - 48 - 4096) // 24
    over = at_cap + bytes(cap + 1 - len(at_cap))
    with pytest.raises(ValueError, match=f"of {cap + 1} bytes is over the {cap}-byte limit"):
        ldcache.parse_ld_cache(over)
    (tmp_path / "ld.so.cache").write_bytes(over)
    with pytest.raises(ValueError, match="larger than"):
        ldcache.read_ld_cache(str(tmp_path / "ld.so.cache"))


# ---- the writer's order: glibc's _dl_cache_libcmp, as a sort key --------------------------


def glibc_libcmp(a: bytes, b: bytes, signed_char: bool) -> int:
    """elf/dl-cache.c _dl_cache_libcmp, step by step as C runs it: `char` signed or not, and
    the numbers accumulated in an `int` (32 bits, wrapping)."""

    def at(s: bytes, i: int) -> int:
        c = s[i] if i < len(s) else 0
        return c - 256 if signed_char and c >= 128 else c

    def number(s: bytes, i: int) -> tuple[int, int]:
        value = 0
        while 0x30 <= at(s, i) <= 0x39:
            value = (value * 10 + at(s, i) - 0x30) & 0xFFFFFFFF
            i += 1
        return (value - (1 << 32) if value >= 1 << 31 else value), i

    i = j = 0
    while at(a, i) != 0:
        if 0x30 <= at(a, i) <= 0x39:
            if not 0x30 <= at(b, j) <= 0x39:
                return 1
            (va, i), (vb, j) = number(a, i), number(b, j)
            if va != vb:
                return va - vb
        elif 0x30 <= at(b, j) <= 0x39:
            return -1
        elif at(a, i) != at(b, j):
            return at(a, i) - at(b, j)
        else:
            i, j = i + 1, j + 1
    return at(a, i) - at(b, j)


def _sign(x: int) -> int:
    return (x > 0) - (x < 0)


_PIECES = [b"lib", b".so", b".", b"-", b"_", b"A", b"z", b"~", b"\x7f", b"\x80", b"\xc3\xa9",
           b"\xff", b"0", b"00", b"1", b"01", b"9", b"10", b"123456789", b"999999999"]  # fmt: skip
_names = st.lists(st.sampled_from(_PIECES), max_size=8).map(b"".join)


@settings(max_examples=500)
@given(a=_names, b=_names, signed_char=st.booleans())
def test_sort_key_orders_as_glibc_compares(a: bytes, b: bytes, signed_char: bool) -> None:
    # numbers up to 9 digits: glibc's own comparison is an order there (beyond, its int wraps)
    ka, kb = (ldcache.sort_key(os.fsdecode(s), signed_char) for s in (a, b))
    assert _sign((ka > kb) - (ka < kb)) == _sign(glibc_libcmp(a, b, signed_char))


@pytest.mark.parametrize("signed_char", [False, True])
def test_sort_key_wraps_long_numbers_as_glibc(signed_char: bool) -> None:
    def key(name: str) -> bytes:
        return ldcache.sort_key(name, signed_char)

    assert key("libz.so.4294967297") == key("libz.so.1")  # 2**32 + 1 in an int is 1
    # as ldconfig orders them: 12345678901 and 2345678901 are negative in an int
    assert key("libz.so.1") > key("libz.so.12345678901") > key("libz.so.2345678901")
    assert key("lib01.so") == key("lib1.so") and key("lib.so") < key("lib0.so")
    digits = "7" * 4000
    assert key(f"lib{digits}.so") == key(f"lib{int(digits) % (1 << 32)}.so")


@needs_ldconfig
def test_writer_orders_odd_names_as_ldconfig(tmp_path: Path) -> None:
    # bytes >= 0x80 (signed `char` on x86: before ASCII, and before the end of a name),
    # numbers past 2**31, a number against a letter: ldconfig's own order, from any input order
    assert LDCONFIG is not None
    names = [b"liba.so.1", b"lib\xc3\xa9.so.1", b"lib\xff.so.1", b"lib\x80.so", b"lib.so.1",
             b"lib~.so.1", b"lib9.so.1", b"libz.so.12345678901", b"libz.so.2345678901",
             b"libq.so.1a", b"libq.so.a1", b"lib\x7f.so", b"lib!.so", b"libA.so",
             b"libq.so.999999999", b"libq.so.1000000000"]  # fmt: skip
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/ld.so.conf").write_text("")
    (root / "lib").mkdir()  # a trusted folder: the only one with libraries in this root
    for name in names:
        (root / "lib" / os.fsdecode(name)).write_bytes(make_elf(None))
    subprocess.run([LDCONFIG, "-X", "-r", str(root), "-C", "/etc/ld.so.cache"], check=True,
                   capture_output=True)  # fmt: skip
    real = ldcache.read_ld_cache(str(root / "etc/ld.so.cache"))
    assert sorted(os.fsencode(e.key) for e in real) == sorted(names)
    for order in (real, real[::-1], sorted(real, key=lambda e: e.value)):
        assert ldcache.parse_ld_cache(ldcache.build_ld_cache(list(order))) == real


@needs_ldconfig
def test_writer_keeps_the_host_caches_order() -> None:
    host = Path("/etc/ld.so.cache")
    if not host.is_file():
        pytest.skip("this host has no /etc/ld.so.cache")
    real = ldcache.read_ld_cache(str(host))
    # Entries ldconfig cannot tell apart (one name and flags in two folders: /lib32 and /lib
    # where libc6-i386 is installed) stay in the order its folder scan met them, which the
    # writer keeps: they are shuffled as one group.
    groups: list[list[ldcache.LdCacheEntry]] = []
    for e in real:
        if groups and (groups[-1][0].key, groups[-1][0].flags, groups[-1][0].hwcap) == (
            e.key,
            e.flags,
            e.hwcap,
        ):
            groups[-1].append(e)
        else:
            groups.append([e])
    rng = random.Random(7)
    for _ in range(3):
        rng.shuffle(groups)
        shuffled = [e for group in groups for e in group]
        assert ldcache.parse_ld_cache(ldcache.build_ld_cache(shuffled)) == real


# ---- hostile caches within the size cap: names of digit runs, overlapping tails --------------


def digit_run_cache(size: int, name_len: int, strings: int, *, tagged: bool = False) -> bytes:
    """A cache of at most `size` bytes with `strings` strings of "0a0a..." (`name_len` bytes),
    an entry naming each even tail of each of them (the whole string as its path), repeated to
    fill the file: every name a run of one-digit numbers. `tagged`: each string ends in three
    letters of its own, and only the tails that hold them are names (all different)."""

    def one(s: int) -> bytes:
        if not tagged:
            return b"0a" * (name_len // 2) + b"\0"
        tag = bytes(0x41 + s // 40**i % 40 for i in range(3))
        return b"0a" * (name_len // 2 - 2) + b"0" + tag + b"\0"

    blob = b"".join(map(one, range(strings)))
    n = (size - 48 - len(blob)) // 24
    at = 48 + 24 * n
    tails = range(0, name_len - 3 if tagged else name_len, 2)
    keys = [at + s * (name_len + 1) + o for s in range(strings) for o in tails]
    header = ldcache.MAGIC_NEW + struct.pack("<IIB3xI12x", n, len(blob), 2, 0)
    rows = (
        struct.pack("<iIIIQ", 0x303, k, at + (k - at) // (name_len + 1) * (name_len + 1), 0, 0)
        for k in (keys[i % len(keys)] for i in range(n))
    )
    return header + b"".join(rows) + blob


def test_a_name_longer_than_name_max_or_with_a_slash_is_refused() -> None:
    # the review's cache: 4 MiB, two 4000-byte "0a0a..." strings, a name at every even tail
    data = digit_run_cache(4 << 20, 4000, 2)
    with python_lines(100_000), pytest.raises(ValueError, match="longer than 255 bytes"):
        ldcache.parse_ld_cache(data)
    at = 48 + 24
    longest = b"l" * 255 + b"\0"
    (entry,) = ldcache.parse_ld_cache(_new_cache([(0x303, at, at)], longest))
    assert len(entry.key) == 255
    with pytest.raises(ValueError, match="longer than 255 bytes"):
        ldcache.parse_ld_cache(_new_cache([(0x303, at, at)], b"l" + longest))
    with pytest.raises(ValueError, match="has a '/'"):
        ldcache.parse_ld_cache(_new_cache([(0x303, at, at)], b"/lib/libx.so.1\0"))
    # a path may be longer than a name, and hold slashes
    path = b"/" + b"x" * 4000 + b"/libx.so.1\0"
    entries = ldcache.parse_ld_cache(_new_cache([(0x303, at + len(path) - 10, at)], path))
    assert [(e.key, len(e.value)) for e in entries] == [("libx.so.1", 4011)]


@pytest.mark.parametrize("size", [1 << 20, 4 << 20], ids=["1MiB", "4MiB"])
def test_names_of_digit_runs_cost_work_per_name_not_per_digit(size: int) -> None:
    # the review's shape within the name limit: 254-byte names of up to 127 one-digit numbers
    # (8000 runs of digits for 255 bytes of file), as many as the limit on runs admits
    strings = size // 16 // 8100
    data = digit_run_cache(size, 254, strings, tagged=True)
    names = 126 * strings
    tracemalloc.start()
    try:
        with python_lines(50 * (size // 24 + names)) as lines:
            entries = ldcache.parse_ld_cache(data)
            parsed = tracemalloc.get_traced_memory()[1]
            tracemalloc.reset_peak()
            out = ldcache.build_ld_cache(list(entries))
        built = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    distinct = sorted({e.key for e in entries})
    assert len(distinct) == names
    assert lines[0] > len(entries)
    assert parsed < 16 * len(data) and built < 16 * len(data)
    assert len(out) <= len(data) + 4096  # strings that are tails of others are written once
    assert ldcache.parse_ld_cache(out) == tuple(
        sorted(entries, key=lambda e: ldcache.sort_key(e.key), reverse=True)
    )
    with python_lines(20 * names):  # ~3 per digit run: 190 a name of these
        for name in distinct:
            ldcache.sort_key(name)
    with pytest.raises(ValueError, match="runs of digits"):
        ldcache.parse_ld_cache(digit_run_cache(size, 254, 2 * strings + 1, tagged=True))


def test_a_refused_cache_is_left_as_it_is_for_the_hosts_ldconfig(tmp_path: Path) -> None:
    # what the shim and gpuctk-hook do with the image's cache (gpuctk-cdi-hook's merge refuses
    # it): a ValueError, nothing written (they then leave the cache to the host's confined
    # ldconfig, with one warning line)
    from gpuctk import rootfs

    (tmp_path / "etc").mkdir()
    data = digit_run_cache(4 << 20, 4000, 2)
    (tmp_path / "etc/ld.so.cache").write_bytes(data)
    fd = rootfs.open_root(str(tmp_path))
    try:
        old = hook_ldmerge.read_image_cache(fd)
        assert old == data
        refused = pytest.raises(ValueError, match="is past this reader")
        with python_lines(100_000), refused:
            hook_ldmerge.write_cache(fd, old, [])
    finally:
        os.close(fd)
    assert (tmp_path / "etc/ld.so.cache").read_bytes() == data


def test_cached_name_takes_the_names_ldconfig_caches(tmp_path: Path) -> None:
    """The names cached_name gives an entry, each asked with the name it is found by standing
    for a SONAME the file lacks (as gpuctk's merges ask it), are the keys ldconfig itself
    caches for the same folder: SONAME and development links, every lib*.so* name of a file
    without SONAME, and no name ldconfig does not look at (an Xorg module's)."""
    if shutil.which("gcc") is None or not os.path.exists("/sbin/ldconfig"):
        pytest.skip("needs gcc and ldconfig")
    folder = tmp_path / "root/opt/lib"
    folder.mkdir(parents=True)
    (tmp_path / "x.c").write_text("int x(void) { return 1; }\n")
    sonames = {"libx.so.1.0": "libx.so.1", "libnosoname.so.2": None, "nvidia_drv.so": None}
    for name, soname in sonames.items():
        flag = [f"-Wl,-soname,{soname}"] if soname else []
        subprocess.run(["gcc", "-shared", "-fPIC", "-nostdlib", *flag, "-o", str(folder / name),
                        str(tmp_path / "x.c")], check=True)  # fmt: skip
    links = {
        "libx.so.1": "libx.so.1.0",
        "libx.so": "libx.so.1",
        "libnosoname.so": "libnosoname.so.2",
    }
    for link, target in links.items():
        (folder / link).symlink_to(target)
    (tmp_path / "root/etc").mkdir()
    (tmp_path / "root/etc/ld.so.conf").write_text("/opt/lib\n")
    subprocess.run(
        ["/sbin/ldconfig", "-r", str(tmp_path / "root")], capture_output=True, check=False
    )
    theirs = {e.key for e in ldcache.read_ld_cache(str(tmp_path / "root/etc/ld.so.cache"))}

    def file_of(name: str) -> str:
        return file_of(links[name]) if name in links else name

    ours = {n for n in [*sonames, *links] if ldcache.cached_name(n, sonames[file_of(n)], n)}
    assert ours == theirs == {"libx.so.1", "libx.so", "libnosoname.so.2", "libnosoname.so"}
