"""cgroup v2 device control: widen the eBPF device program the runtime attached to a container.

On cgroup v2 the device controller is a BPF_PROG_TYPE_CGROUP_DEVICE program attached to the
container's cgroup (runc builds it from linux.resources.devices, libcontainer/cgroups/devices;
crun likewise). Programs attached with BPF_F_ALLOW_MULTI must ALL allow an access, so allowing a
new device takes replacing the program, as libnvidia-container does: each attached program is
read back (its verified instructions, BPF_OBJ_GET_INFO_BY_FD) and loaded again behind a prefix
that allows the new devices:

    r2 = type (u16 at ctx+0)  r3 = access (ctx+0 >> 16)  r4 = major (ctx+4)  r5 = minor (ctx+8)
    per rule: if r2 != TYPE goto next; r6 = r3 & ACCESS; if r6 != r3 goto next;
              if r4 != MAJOR goto next; if r5 != MINOR goto next; r0 = 1; exit
    next: the old program, unchanged (r1 still holds the context; it sets r2-r6 itself)

The prefix only ever returns "allow" for the given (type, major, minor, access) and otherwise
falls through, so the new program allows exactly what the old one did plus the new devices.
(r6, not r2, is the scratch register: a failed access check must not clobber the type that the
next rule compares.) The replacement is atomic (BPF_F_REPLACE, kernel 5.6+); without it the new
program is attached before the old one is detached, so no moment is left without a filter.
A program that uses maps or calls (not one a runtime builds) is refused: its instructions read
back cannot be loaded again.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

from gpuctk.errors import GpuctkError

_SYS_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351, "riscv64": 280}
BPF_PROG_LOAD, BPF_PROG_ATTACH, BPF_PROG_DETACH = 5, 8, 9
BPF_PROG_GET_FD_BY_ID, BPF_OBJ_GET_INFO_BY_FD, BPF_PROG_QUERY = 13, 15, 16
BPF_PROG_TYPE_CGROUP_DEVICE, BPF_CGROUP_DEVICE = 15, 6
BPF_F_ALLOW_OVERRIDE, BPF_F_ALLOW_MULTI, BPF_F_REPLACE = 1, 2, 4
DEV_BLOCK, DEV_CHAR = 1, 2  # BPF_DEVCG_DEV_*
ACC_MKNOD, ACC_READ, ACC_WRITE = 1, 2, 4  # BPF_DEVCG_ACC_*
_ACCESS = {"m": ACC_MKNOD, "r": ACC_READ, "w": ACC_WRITE}
_TYPES = {"b": DEV_BLOCK, "c": DEV_CHAR}
LICENSE = b"Apache-2.0\0"
_INSN = struct.Struct("<BBhi")
MAX_INSNS = 1_000_000

# opcodes (linux/bpf.h, linux/bpf_common.h)
LDX_W, LDX_H = 0x61, 0x69  # BPF_LDX | BPF_MEM | BPF_W / BPF_H
ALU_RSH_K, ALU_AND_K, ALU_MOV_K, ALU_MOV_X = 0x74, 0x54, 0xB4, 0xBC  # 32-bit ALU
JNE_K, EXIT = 0x55, 0x95
_LD_IMM64, _CALL = 0x18, 0x85

Insn = tuple[int, int, int, int, int]  # (code, dst, src, off, imm)


class BpfError(GpuctkError):
    """The container's device program could not be read, built, loaded or attached."""


def rule(kind: str, major: int, minor: int, access: str) -> tuple[int, int, int, int]:
    """(bpf type, major, minor, access mask) of a device rule such as ("c", 195, 0, "rwm")."""
    if kind not in _TYPES:
        raise ValueError(f"device type {kind!r}: only b and c devices have cgroup rules")
    if not access or access.strip("rwm"):
        raise ValueError(f"device access {access!r}: expected letters of rwm")
    for value in (major, minor):
        if not 0 <= value < 1 << 31:
            raise ValueError(f"device number {value} out of range")
    mask = 0
    for letter in access:
        mask |= _ACCESS[letter]
    return _TYPES[kind], major, minor, mask


def allow_prefix(rules: list[tuple[int, int, int, int]]) -> list[Insn]:
    """The instructions that allow `rules` (from `rule`) and fall through for anything else."""
    out: list[Insn] = [
        (LDX_H, 2, 1, 0, 0),
        (LDX_W, 3, 1, 0, 0),
        (ALU_RSH_K, 3, 0, 0, 16),
        (LDX_W, 4, 1, 4, 0),
        (LDX_W, 5, 1, 8, 0),
    ]
    for kind, major, minor, access in rules:
        block: list[tuple[int, int, int, int]] = [(JNE_K, 2, 0, kind)]  # jump to next: off later
        if access != ACC_MKNOD | ACC_READ | ACC_WRITE:
            block += [(ALU_MOV_X, 6, 3, 0), (ALU_AND_K, 6, 0, access), (0x5D, 6, 3, 0)]  # JNE_X
        block += [(JNE_K, 4, 0, major), (JNE_K, 5, 0, minor)]
        size = len(block) + 2
        for i, (code, dst, src, imm) in enumerate(block):
            jump = code in (JNE_K, 0x5D)
            out.append((code, dst, src, size - i - 1 if jump else 0, imm))
        out += [(ALU_MOV_K, 0, 0, 0, 1), (EXIT, 0, 0, 0, 0)]
    return out


def encode(insns: list[Insn]) -> bytes:
    return b"".join(_INSN.pack(c, (s << 4) | d, off, imm) for c, d, s, off, imm in insns)


def decode(data: bytes) -> list[Insn]:
    out = []
    for code, regs, off, imm in _INSN.iter_unpack(data):
        out.append((code, regs & 0xF, regs >> 4, off, imm))
    return out


def reloadable_problem(insns: list[Insn]) -> str | None:
    """Why a program read back from the kernel cannot be loaded again (None: it can)."""
    for i, (code, _dst, src, _off, _imm) in enumerate(insns):
        if code == _CALL:
            return f"instruction {i} calls a helper or function"
        if code == _LD_IMM64 and src != 0:
            return f"instruction {i} references a map or kernel object"
    return None


# --- the bpf(2) system call -------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _bpf(cmd: int, attr: ctypes.Array[ctypes.c_char], what: str) -> int:
    number = _SYS_BPF.get(os.uname().machine)
    if number is None:
        raise BpfError(f"bpf(2): unsupported architecture {os.uname().machine}")
    while True:
        rc = _libc.syscall(ctypes.c_long(number), ctypes.c_long(cmd), attr, ctypes.c_long(128))
        if rc >= 0:
            return int(rc)
        err = ctypes.get_errno()
        if err != errno.EINTR:
            raise OSError(err, f"{what}: {os.strerror(err)}")


def _attr(fmt: str, *values: int) -> ctypes.Array[ctypes.c_char]:
    buf = ctypes.create_string_buffer(128)
    struct.pack_into(fmt, buf, 0, *values)
    return buf


def _addr(buf: ctypes.Array[ctypes.c_char]) -> int:
    return ctypes.addressof(buf)


def attached(cgroup_fd: int) -> tuple[list[int], int]:
    """(program ids, attach flags) of the device programs attached to the cgroup itself."""
    size = 64
    for _ in range(8):
        ids = (ctypes.c_uint32 * size)()
        attr = _attr("<IIIIQI", cgroup_fd, BPF_CGROUP_DEVICE, 0, 0, ctypes.addressof(ids), size)
        try:
            _bpf(BPF_PROG_QUERY, attr, "BPF_PROG_QUERY")
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            size = struct.unpack_from("<I", attr, 24)[0]
            continue
        flags, count = struct.unpack_from("<I", attr, 12)[0], struct.unpack_from("<I", attr, 24)[0]
        return list(ids[:count]), flags
    raise BpfError("BPF_PROG_QUERY: the list of device programs kept changing")


def program_fd(prog_id: int) -> int:
    return _bpf(BPF_PROG_GET_FD_BY_ID, _attr("<III", prog_id, 0, 0), "BPF_PROG_GET_FD_BY_ID")


def instructions(prog_fd: int) -> bytes:
    """The program's instructions as the verifier left them (xlated)."""
    info = ctypes.create_string_buffer(40)
    _bpf(BPF_OBJ_GET_INFO_BY_FD, _attr("<IIQ", prog_fd, 40, _addr(info)), "BPF_OBJ_GET_INFO")
    prog_type, size = struct.unpack_from("<I", info, 0)[0], struct.unpack_from("<I", info, 20)[0]
    if prog_type != BPF_PROG_TYPE_CGROUP_DEVICE:
        raise BpfError(f"attached program has type {prog_type}, not a cgroup device program")
    if size == 0 or size % 8 or size // 8 > MAX_INSNS:
        raise BpfError(f"cannot read the device program back ({size} bytes of instructions)")
    insns = ctypes.create_string_buffer(size)
    info = ctypes.create_string_buffer(40)
    struct.pack_into("<IQ", info, 20, size, 0)
    struct.pack_into("<Q", info, 32, _addr(insns))
    _bpf(BPF_OBJ_GET_INFO_BY_FD, _attr("<IIQ", prog_fd, 40, _addr(info)), "BPF_OBJ_GET_INFO")
    return insns.raw[:size]


def load(code: bytes) -> int:
    """Load a cgroup device program; the verifier's log is in the error when it refuses."""
    insns = ctypes.create_string_buffer(code, len(code))
    lic = ctypes.create_string_buffer(LICENSE, len(LICENSE))
    head = (BPF_PROG_TYPE_CGROUP_DEVICE, len(code) // 8, _addr(insns), _addr(lic))
    try:
        return _bpf(BPF_PROG_LOAD, _attr("<IIQQ", *head), "BPF_PROG_LOAD")
    except OSError as exc:
        log = ctypes.create_string_buffer(1 << 16)
        try:
            return _bpf(
                BPF_PROG_LOAD, _attr("<IIQQIIQ", *head, 1, len(log), _addr(log)), "BPF_PROG_LOAD"
            )
        except OSError:
            text = log.value.decode("utf-8", "replace").strip().splitlines()
            raise BpfError(f"{exc}: {text[-1] if text else 'no verifier log'}") from exc


def _attach(cgroup_fd: int, prog: int, flags: int, replace: int = 0) -> None:
    attr = _attr("<IIIII", cgroup_fd, prog, BPF_CGROUP_DEVICE, flags, replace)
    _bpf(BPF_PROG_ATTACH, attr, "BPF_PROG_ATTACH")


def _detach(cgroup_fd: int, prog: int) -> None:
    _bpf(BPF_PROG_DETACH, _attr("<III", cgroup_fd, prog, BPF_CGROUP_DEVICE), "BPF_PROG_DETACH")


def allow(cgroup_fd: int, rules: list[tuple[int, int, int, int]]) -> int:
    """Allow `rules` in every device program attached to the cgroup; returns how many programs
    were replaced (0: none attached, so nothing is filtered there and nothing is needed)."""
    if not rules:
        return 0
    ids, flags = attached(cgroup_fd)
    prefix = encode(allow_prefix(rules))
    for prog_id in ids:
        old = program_fd(prog_id)
        try:
            insns = instructions(old)
            problem = reloadable_problem(decode(insns))
            if problem:
                raise BpfError(f"device program {prog_id} cannot be extended: {problem}")
            new = load(prefix + insns)
            try:
                if not flags & BPF_F_ALLOW_MULTI:
                    _attach(cgroup_fd, new, flags)  # single-program mode: attaching replaces
                    continue
                try:
                    _attach(cgroup_fd, new, BPF_F_ALLOW_MULTI | BPF_F_REPLACE, old)
                except OSError as exc:
                    if exc.errno not in (errno.EINVAL, errno.E2BIG):
                        raise
                    _attach(cgroup_fd, new, BPF_F_ALLOW_MULTI)  # before 5.6: add, then remove
                    _detach(cgroup_fd, old)
            finally:
                os.close(new)
        finally:
            os.close(old)
    return len(ids)
