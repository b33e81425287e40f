"""CUDA forward compatibility by the ELF note `.note.cuda.fwd_compatibility`
(hook/verbs/cudacompat.py, cdi/node/elf.py read_note_section), on synthetic ELF files: the note
decides where it is present (in the shim's path and the hook's alike), the file name where it is
not."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.driver_root import make_elf
from test_cudacompat import compat_image, driver, first, image_cache, merge

from gpuctk.cdi.node.elf import read_elf_fd, read_note_section
from gpuctk.hook.verbs import actions, cudacompat

HOST = (535, 309, 1)
LIBDIR = "/usr/lib/x86_64-linux-gnu"
COMPAT = cudacompat.COMPAT_DIR
SECTION = cudacompat.NOTE_SECTION


def with_note(
    elf: bytes,
    desc: bytes,
    *,
    owner: bytes = b"NVIDIA Corporation",
    section: str = SECTION,
    sh_type: int = 7,
) -> bytes:
    """`elf` (make_elf's 64-bit little-endian object) with section headers: the null section, a
    note section `section` holding one note (`owner`, `desc`) and .shstrtab."""

    def pad(data: bytes, to: int) -> bytes:
        return data + bytes(-len(data) % to)

    name = owner + b"\0"
    note = struct.pack("<III", len(name), len(desc), 1) + pad(name, 4) + pad(desc, 4)
    body = pad(elf, 8)
    note_off = len(body)
    body += note
    names = b"\0" + section.encode() + b"\0.shstrtab\0"
    names_off = len(body)
    body = pad(body + names, 8)
    shoff = len(body)
    shdr = "<IIQQQQIIQQ"
    headers = struct.pack(shdr, *([0] * 10))
    headers += struct.pack(shdr, 1, sh_type, 2, 0, note_off, len(note), 0, 0, 4, 0)
    headers += struct.pack(shdr, len(section) + 2, 3, 0, 0, names_off, len(names), 0, 0, 1, 0)
    out = bytearray(body + headers)
    struct.pack_into("<Q", out, 40, shoff)
    struct.pack_into("<HHH", out, 58, 64, 3, 2)
    return bytes(out)


def note(*drivers: int, cuda: str = "12.9") -> bytes:
    doc = {"Format": 1, "CUDA Version": cuda, "Driver": list(drivers), "Device": [8, 9]}
    return json.dumps(doc).encode()


def put_note(real: Path, version: str, desc: bytes, **kw: object) -> None:
    lib = real / f"libcuda.so.{version}"
    lib.write_bytes(with_note(lib.read_bytes(), desc, **kw))  # type: ignore[arg-type]


@pytest.fixture
def root_fd(tmp_path: Path) -> Iterator[int]:
    (tmp_path / "root").mkdir()
    fd = os.open(tmp_path / "root", os.O_PATH | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def test_the_section_reads_back_and_the_elf_facts_stay(tmp_path: Path) -> None:
    path = tmp_path / "lib.so"
    path.write_bytes(with_note(make_elf("libcuda.so.1"), note(535, 550)))
    fd = os.open(path, os.O_RDONLY)
    try:
        found = read_note_section(fd, SECTION, 4096)
        assert found is not None
        data, align, order = found
        assert (align, order) == (4, "<")
        assert cudacompat.parse_note(data, align, order) == (535, 550)
        assert read_note_section(fd, SECTION, 16) is None  # larger than the cap
        assert read_note_section(fd, ".note.other", 4096) is None
        assert read_elf_fd(fd).soname == "libcuda.so.1"
    finally:
        os.close(fd)
    readelf = shutil.which("readelf")
    if readelf:  # binutils reads the synthetic file the same way
        out = subprocess.run([readelf, "-p", SECTION, str(path)], capture_output=True, text=True)
        assert '"Driver": [535, 550]' in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize(
    "mangle",
    [
        lambda b: b[:-20],  # section headers cut short
        lambda b: b[:60] + struct.pack("<H", 5000) + b[62:],  # too many sections
        lambda b: b[:62] + struct.pack("<H", 9) + b[64:],  # .shstrtab index past the table
        lambda b: b[:58] + struct.pack("<H", 4) + b[60:],  # implausible entry size
    ],
)
def test_hostile_section_headers_are_value_errors(tmp_path: Path, mangle: object) -> None:
    path = tmp_path / "lib.so"
    path.write_bytes(mangle(with_note(make_elf("libcuda.so.1"), note(535))))  # type: ignore[operator]
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(ValueError):
            read_note_section(fd, SECTION, 4096)
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("version", "drivers"),
    [("550.54.15", (535,)), ("535.400.01", (535, 550)), ("575.57.08", (470, 535, 570))],
    ids=["newer-major", "same-branch-newer", "listed"],
)
def test_a_note_naming_the_host_branch_puts_a_newer_compat_first(
    tmp_path: Path, root_fd: int, version: str, drivers: tuple[int, ...]
) -> None:
    real = compat_image(tmp_path / "root", version)
    put_note(real, version, note(*drivers))
    found = cudacompat.find(root_fd, HOST)
    assert found is not None and found.folder == COMPAT
    assert {e.key for e in found.entries} >= {"libcuda.so.1"}  # the SONAME still read


@pytest.mark.parametrize(
    ("version", "drivers"),
    [("575.57.08", (550, 570)), ("535.200.01", (535,)), ("535.309.01", (535,)), ("575.57.08", ())],
    ids=["host-branch-not-listed", "older", "same", "no-branches"],
)
def test_a_note_that_leaves_the_host_out_or_is_older_is_ignored(
    tmp_path: Path, root_fd: int, version: str, drivers: tuple[int, ...]
) -> None:
    real = compat_image(tmp_path / "root", version)
    put_note(real, version, note(*drivers))
    assert cudacompat.find(root_fd, HOST) is None


@pytest.mark.parametrize(
    ("desc", "kw"),
    [
        (b"not json", {}),
        (note(470), {"owner": b"Someone Else"}),
        (note(470), {"sh_type": 1}),  # PROGBITS, not a note
        (json.dumps({"Driver": ["535"]}).encode(), {}),
        (json.dumps({"Driver": [True]}).encode(), {}),
        (b"[535]", {}),
    ],
    ids=["bad-json", "other-owner", "not-a-note", "strings", "bools", "not-an-object"],
)
@pytest.mark.parametrize(("version", "wins"), [("550.54.15", True), ("470.256.02", False)])
def test_no_usable_note_falls_back_to_the_file_name(
    tmp_path: Path, root_fd: int, desc: bytes, kw: dict[str, object], version: str, wins: bool
) -> None:
    real = compat_image(tmp_path / "root", version)
    put_note(real, version, desc, **kw)
    assert (cudacompat.find(root_fd, HOST) is not None) is wins


def test_keys_match_without_regard_to_case() -> None:
    desc = b'{"driver": [535]}'
    data = struct.pack("<III", 19, len(desc), 1) + b"NVIDIA Corporation\0\0" + desc
    assert cudacompat.parse_note(data, 4, "<") == (535,)
    assert cudacompat.parse_note(data[:8], 4, "<") is None


@pytest.mark.parametrize(("drivers", "wins"), [((535,), COMPAT), ((550,), LIBDIR)])
def test_shim_and_hook_agree_on_the_note(
    tmp_path: Path, root_fd: int, drivers: tuple[int, ...], wins: str
) -> None:
    """The same-branch compat 535.400.01: the file name rule says no; the note decides."""
    version = "535.400.01"
    root = tmp_path / "root"
    real = compat_image(root, version)
    put_note(real, version, note(*drivers))
    image_cache(root)
    files = driver(tmp_path)
    merge(root_fd, files)
    assert first(root / "etc/ld.so.cache", "libcuda.so.1") == f"{wins}/libcuda.so.1"
    (root / "etc/ld.so.cache").unlink()
    image_cache(root)
    (root / LIBDIR.lstrip("/")).mkdir(parents=True)
    binds = dict(files)
    for dest, host in binds.items():
        (root / dest.lstrip("/")).write_bytes(Path(host).read_bytes())
    actions.update_loader(root_fd, str(root), [LIBDIR], None, False, (binds, {}))
    assert first(root / "etc/ld.so.cache", "libcuda.so.1") == f"{wins}/libcuda.so.1"
