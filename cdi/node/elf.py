"""Read what discovery needs from an ELF shared object without loading it.

Only the ELF header, the program headers and the dynamic segment are read (a handful of small
`pread`s, whatever the file size). The answer: the class (32 or 64 bits, 32-bit libraries belong
to the compat32 capability), the machine (x86_64, i386, aarch64, ...) and DT_SONAME.
`read_note_section` reads the section headers and one named SHT_NOTE section, size-capped by
the caller (the CUDA forward compatibility note: gpuctk.hook.verbs.cudacompat).

The input is untrusted: every offset and count is checked against the file size and against
fixed caps, so that a truncated or hostile file gives `ValueError` (never IndexError,
struct.error or an unbounded loop).
"""

from __future__ import annotations

import os
import struct

from gpuctk.records import record

ELFCLASS32 = 1
ELFCLASS64 = 2

EM_386 = 3
EM_PPC64 = 21
EM_ARM = 40
EM_X86_64 = 62
EM_AARCH64 = 183

MACHINES = {EM_386: "i386", EM_PPC64: "ppc64", EM_ARM: "arm", EM_X86_64: "x86_64",
            EM_AARCH64: "aarch64"}  # fmt: skip

_PT_LOAD = 1
_PT_DYNAMIC = 2
_DT_NULL = 0
_DT_STRTAB = 5
_DT_SONAME = 14

_MAX_PHNUM = 512  # real libraries have < 20; PN_XNUM (0xffff) is refused
_MAX_DYN = 4096  # entries of the dynamic segment read at most
_MAX_NAME = 1024  # bytes of a SONAME


@record
class ElfInfo:
    """What discovery needs to know about one ELF file."""

    elf_class: int  # 32 or 64
    machine: int  # e_machine (EM_X86_64, EM_386, ...)
    soname: str | None  # DT_SONAME, None when the file has none

    @property
    def arch(self) -> str:
        """A name for the machine ("x86_64", "i386", ...), or "em<number>"."""
        return MACHINES.get(self.machine, f"em{self.machine}")


def _read(fd: int, offset: int, size: int, file_size: int, what: str) -> bytes:
    if offset < 0 or size < 0 or offset + size > file_size:
        raise ValueError(f"ELF {what} lies outside the file")
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise ValueError(f"ELF file truncated while reading {what}")
    return data


def read_elf_fd(fd: int) -> ElfInfo:
    """Parse the ELF file open at `fd`; ValueError if it is not a well-formed ELF object."""
    file_size = os.fstat(fd).st_size
    ident = _read(fd, 0, 16, file_size, "identification")
    if ident[:4] != b"\x7fELF":
        raise ValueError("not an ELF file")
    elf_class, data = ident[4], ident[5]
    if elf_class not in (ELFCLASS32, ELFCLASS64):
        raise ValueError(f"unknown ELF class {elf_class}")
    if data not in (1, 2):
        raise ValueError(f"unknown ELF data encoding {data}")
    e = "<" if data == 1 else ">"
    is64 = elf_class == ELFCLASS64
    # e_type, e_machine, e_version, e_entry, e_phoff, e_shoff, e_flags, e_ehsize,
    # e_phentsize, e_phnum
    hdr_fmt = e + ("HHIQQQIHHH" if is64 else "HHIIIIIHHH")
    hdr = struct.unpack(hdr_fmt, _read(fd, 16, struct.calcsize(hdr_fmt), file_size, "header"))
    machine, phoff, phentsize, phnum = hdr[1], hdr[4], hdr[8], hdr[9]
    ph_fmt = e + ("IIQQQQQQ" if is64 else "IIIIIIII")
    ph_size = struct.calcsize(ph_fmt)
    if phnum > _MAX_PHNUM:
        raise ValueError(f"ELF file has too many program headers ({phnum})")
    if phnum and not ph_size <= phentsize <= 4 * ph_size:
        raise ValueError(f"ELF program header entry size {phentsize} is implausible")
    table = _read(fd, phoff, phentsize * phnum, file_size, "program headers")
    loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
    dynamic: tuple[int, int] | None = None  # (offset, filesz)
    for i in range(phnum):
        fields = struct.unpack_from(ph_fmt, table, i * phentsize)
        if is64:
            p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = fields[:6]
        else:
            p_type, p_offset, p_vaddr, _paddr, p_filesz = fields[:5]
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC and dynamic is None:
            dynamic = (p_offset, p_filesz)
    soname = None if dynamic is None else _soname(fd, e, is64, dynamic, loads, file_size)
    return ElfInfo(elf_class=64 if is64 else 32, machine=machine, soname=soname)


def _soname(
    fd: int,
    e: str,
    is64: bool,
    dynamic: tuple[int, int],
    loads: list[tuple[int, int, int]],
    file_size: int,
) -> str | None:
    dyn_fmt = e + ("qQ" if is64 else "iI")
    dyn_size = struct.calcsize(dyn_fmt)
    offset, filesz = dynamic
    count = min(filesz // dyn_size, _MAX_DYN)
    raw = _read(fd, offset, count * dyn_size, file_size, "dynamic segment")
    strtab: int | None = None
    soname_off: int | None = None
    for tag, value in struct.iter_unpack(dyn_fmt, raw):
        if tag == _DT_NULL:
            break
        if tag == _DT_STRTAB and strtab is None:
            strtab = value
        elif tag == _DT_SONAME and soname_off is None:
            soname_off = value
    if soname_off is None:
        return None
    if strtab is None:
        raise ValueError("ELF file has DT_SONAME but no DT_STRTAB")
    str_offset = _file_offset(strtab, loads)
    if str_offset is None:
        raise ValueError("ELF DT_STRTAB is not inside a loadable segment")
    start = str_offset + soname_off
    if start >= file_size:
        raise ValueError("ELF DT_SONAME lies outside the file")
    name = os.pread(fd, min(_MAX_NAME, file_size - start), start)
    end = name.find(b"\0")
    if end < 0:
        raise ValueError("ELF DT_SONAME is not terminated")
    try:
        return name[:end].decode("ascii") or None
    except UnicodeDecodeError:
        raise ValueError("ELF DT_SONAME is not ASCII") from None


def _file_offset(vaddr: int, loads: list[tuple[int, int, int]]) -> int | None:
    """The file offset of virtual address `vaddr`, through the PT_LOAD segments."""
    for seg_vaddr, seg_offset, seg_filesz in loads:
        if seg_vaddr <= vaddr < seg_vaddr + seg_filesz:
            return seg_offset + (vaddr - seg_vaddr)
    return None


_SHT_NOTE = 7
_MAX_SHNUM = 4096  # real libraries have < 50; SHN_XINDEX (0) with a count elsewhere is refused
_MAX_SHNAME = 256  # bytes of a section name compared


def read_note_section(fd: int, name: str, max_size: int) -> tuple[bytes, int, str] | None:
    """(contents, sh_addralign, struct byte order "<" or ">") of the SHT_NOTE section called
    `name` in the ELF file open at `fd`, found through the section headers; None when the file
    has no such section or it is larger than `max_size` bytes. ValueError if the file is not a
    well-formed ELF object."""
    file_size = os.fstat(fd).st_size
    ident = _read(fd, 0, 16, file_size, "identification")
    if (
        ident[:4] != b"\x7fELF"
        or ident[4] not in (ELFCLASS32, ELFCLASS64)
        or ident[5] not in (1, 2)
    ):
        raise ValueError("not an ELF file")
    e = "<" if ident[5] == 1 else ">"
    is64 = ident[4] == ELFCLASS64
    # e_shoff, e_flags, e_ehsize, e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx
    hdr_fmt = e + ("QIHHHHHH" if is64 else "IIHHHHHH")
    at = 40 if is64 else 32
    hdr = struct.unpack(hdr_fmt, _read(fd, at, struct.calcsize(hdr_fmt), file_size, "header"))
    shoff, shentsize, shnum, shstrndx = hdr[0], hdr[5], hdr[6], hdr[7]
    if shoff == 0 or shnum == 0:
        return None
    # sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, sh_info, sh_addralign
    sh_fmt = e + ("IIQQQQIIQ" if is64 else "IIIIIIIII")
    if shnum > _MAX_SHNUM or shstrndx >= shnum:
        raise ValueError(f"ELF section header count {shnum} or index {shstrndx} is implausible")
    if not struct.calcsize(sh_fmt) + (8 if is64 else 4) <= shentsize <= 256:
        raise ValueError(f"ELF section header entry size {shentsize} is implausible")
    table = _read(fd, shoff, shentsize * shnum, file_size, "section headers")
    sections = [struct.unpack_from(sh_fmt, table, i * shentsize) for i in range(shnum)]
    names_at, names_size = sections[shstrndx][4], sections[shstrndx][5]
    want = name.encode() + b"\0"
    for sh_name, sh_type, _flags, _addr, offset, size, _link, _info, align in sections:
        if sh_type != _SHT_NOTE or sh_name >= names_size:
            continue
        length = min(len(want), names_size - sh_name, _MAX_SHNAME)
        if _read(fd, names_at + sh_name, length, file_size, "section name") != want:
            continue
        if size > max_size:
            return None
        return _read(fd, offset, size, file_size, "note section"), align, e
    return None


def read_elf(path: str) -> ElfInfo:
    """Parse the ELF file at `path`. OSError if it cannot be opened, ValueError if malformed
    or not a regular file (a FIFO or device swapped in is opened without blocking, never read)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if (os.fstat(fd).st_mode & 0o170000) != 0o100000:
            raise ValueError(f"{path} is not a regular file")
        return read_elf_fd(fd)
    finally:
        os.close(fd)


_MEMO: dict[tuple[str, tuple[int, int, int, int]], ElfInfo | None] = {}
_MEMO_MAX = 1024  # entries; cleared when full (no functools: this module is on the create path)


def _cached(path: str, identity: tuple[int, int, int, int]) -> ElfInfo | None:
    key = (path, identity)
    if key in _MEMO:
        return _MEMO[key]
    try:
        info: ElfInfo | None = read_elf(path)
    except (OSError, ValueError):
        info = None
    if len(_MEMO) >= _MEMO_MAX:
        _MEMO.clear()
    _MEMO[key] = info
    return info


def elf_info(path: str) -> ElfInfo | None:
    """`read_elf`, memoised on the file's identity; None when unreadable or not ELF.

    `path` must name a regular file (not a symlink): resolve it first.
    """
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return _cached(path, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
