"""gpuctk.cdi.node.elf: DT_SONAME, class and machine from ELF files, robust to bad input."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import struct
from pathlib import Path

import pytest
from fixtures.driver_root import make_elf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuctk.cdi.node import elf


def _write(tmp_path: Path, data: bytes, name: str = "lib.so") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_host_libc_soname() -> None:
    libc = None
    for d in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/lib64"):
        if os.path.exists(f"{d}/libc.so.6"):
            libc = os.path.realpath(f"{d}/libc.so.6")
            break
    if libc is None:
        pytest.skip("no libc.so.6 in the usual places")
    info = elf.read_elf(libc)
    assert info.soname == "libc.so.6"
    assert info.elf_class == 64


def test_executable_without_soname() -> None:
    true = shutil.which("true")
    assert true is not None
    info = elf.read_elf(os.path.realpath(true))
    assert info.soname is None
    assert info.elf_class in (32, 64)


@pytest.mark.parametrize(
    ("elf_class", "machine", "arch"), [(64, elf.EM_X86_64, "x86_64"), (32, elf.EM_386, "i386"),
                                       (64, elf.EM_AARCH64, "aarch64"), (64, 9999, "em9999")]
)  # fmt: skip
def test_synthetic(tmp_path: Path, elf_class: int, machine: int, arch: str) -> None:
    path = _write(tmp_path, make_elf("libcuda.so.1", elf_class=elf_class, machine=machine))
    info = elf.read_elf(path)
    assert info == elf.ElfInfo(elf_class=elf_class, machine=machine, soname="libcuda.so.1")
    assert info.arch == arch


def test_no_soname(tmp_path: Path) -> None:
    assert elf.read_elf(_write(tmp_path, make_elf(None))).soname is None


@pytest.mark.parametrize(
    "data",
    [b"", b"\x7fEL", b"#!/bin/sh\necho hi\n" * 10, b"\x7fELF\x03\x01" + bytes(100),
     b"\x7fELF\x02\x07" + bytes(100)],
)  # fmt: skip
def test_not_elf(tmp_path: Path, data: bytes) -> None:
    with pytest.raises(ValueError):
        elf.read_elf(_write(tmp_path, data))


def test_every_truncation_is_a_value_error(tmp_path: Path) -> None:
    data = make_elf("libnvidia-ml.so.1")
    for n in range(len(data)):
        path = _write(tmp_path, data[:n])
        with pytest.raises(ValueError):
            elf.read_elf(path)


def test_soname_outside_file_and_unterminated(tmp_path: Path) -> None:
    data = bytearray(make_elf("libx.so.1"))
    # DT_SONAME value (string offset) of the 64-bit image: second dynamic entry's value.
    dyn_off = len(data) - 3 * 16
    struct.pack_into("<Q", data, dyn_off + 16 + 8, 1 << 40)
    with pytest.raises(ValueError):
        elf.read_elf(_write(tmp_path, bytes(data)))
    data = bytearray(make_elf("libx.so.1"))
    end = len(data)
    data += b"XYZ"  # a name that runs to the end of the file: no NUL
    struct.pack_into("<Q", data, dyn_off + 16 + 8, end - (64 + 2 * 56))  # from DT_STRTAB
    with pytest.raises(ValueError):
        elf.read_elf(_write(tmp_path, bytes(data)))


def test_huge_counts_rejected_without_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = bytearray(make_elf("libx.so.1"))
    struct.pack_into("<H", data, 56, 0xFFFF)  # e_phnum
    with pytest.raises(ValueError):
        elf.read_elf(_write(tmp_path, bytes(data)))


def test_reads_only_headers_of_a_big_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "big.so"
    path.write_bytes(make_elf("libbig.so.1"))
    with open(path, "r+b") as f:
        f.truncate(256 << 20)  # sparse: 256 MiB
    read = []
    real_pread = os.pread

    def counting(fd: int, n: int, offset: int) -> bytes:
        read.append(n)
        return real_pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", counting)
    assert elf.read_elf(str(path)).soname == "libbig.so.1"
    assert sum(read) < 8192 and len(read) <= 6


def test_elf_info_is_memoised_on_identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "libm.so.1"
    path.write_bytes(make_elf("libm.so.1"))
    calls = []
    real = elf.read_elf
    monkeypatch.setattr(elf, "read_elf", lambda p: calls.append(p) or real(p))
    elf._MEMO.clear()
    assert elf.elf_info(str(path)) == elf.elf_info(str(path))
    assert len(calls) == 1
    path.write_bytes(make_elf("libm.so.2") + b"\0")  # new identity (size changes)
    assert elf.elf_info(str(path)).soname == "libm.so.2"  # type: ignore[union-attr]
    assert len(calls) == 2
    assert elf.elf_info(str(tmp_path / "missing")) is None
    (tmp_path / "text.so").write_text("not elf")
    assert elf.elf_info(str(tmp_path / "text.so")) is None


def test_random_corruption_only_value_errors(tmp_path: Path) -> None:
    rng = random.Random(1234)
    seeds = [make_elf("libcuda.so.1"), make_elf("libcuda.so.1", elf_class=32, machine=3)]
    path = tmp_path / "fuzz.so"
    for _ in range(3000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        path.write_bytes(bytes(data))
        try:
            info = elf.read_elf(str(path))
        except ValueError:
            continue
        assert info.elf_class in (32, 64)


_PREFIXES = [b"", b"\x7fELF\x02\x01\x01", b"\x7fELF\x01\x02\x01"]


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=400), prefix=st.sampled_from(_PREFIXES))
def test_hypothesis_garbage(tmp_path: Path, data: bytes, prefix: bytes) -> None:
    path = tmp_path / "h.so"
    path.write_bytes(prefix + data)
    with contextlib.suppress(ValueError):
        elf.read_elf(str(path))


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """A FIFO where a library was (swapped in after a stat) is never waited on: no writer
    ever opens it, so a blocking open or read would hang the caller."""
    fifo = tmp_path / "libfake.so.1"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        elf.read_elf(str(fifo))
