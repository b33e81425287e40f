"""gpuctk.cdi.ldcache: glibc's ld.so.cache, checked against `ldconfig -p`, and fuzzed."""

from __future__ import annotations

import contextlib
import random
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from fixtures.driver_root import make_elf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuctk.cdi import ldcache

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
        ldcache.parse_ld_cache(_new_cache([(0x303, strings_at, strings_at)], b"x" * 5000))
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
