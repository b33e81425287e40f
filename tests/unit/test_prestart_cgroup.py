"""The device cgroup rule builders: v1 devices.allow lines, the v2 eBPF prefix, cgroup lookup.

The eBPF prefix is run here by a small interpreter over the instruction subset device programs
use, in front of the program runc 1.1.5 really attaches for its default spec (read back from the
kernel on this host): the result must allow exactly what runc's allowed plus the new devices.
As root, the kernel's verifier must accept it, and on a real cgroup2 hierarchy a process must get
EPERM before `devbpf.allow` and get through after.
"""

from __future__ import annotations

import errno
import itertools
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from gpuctk.hook.verbs import cgroupdev, devbpf

# runc 1.1.5's device program for `runc spec`'s config (BPF_OBJ_GET_INFO_BY_FD, xlated):
# allow m on any c and b, c 1:3 1:8 1:7 5:0 1:5 1:9 5:2 10:200 rwm, c 136:* rwm; else deny.
RUNC_PROGRAM: list[devbpf.Insn] = [
    (97, 2, 1, 0, 0), (84, 2, 0, 0, 65535), (97, 3, 1, 0, 0), (116, 3, 0, 0, 16),
    (97, 4, 1, 4, 0), (97, 5, 1, 8, 0),
    (85, 2, 0, 5, 1), (188, 1, 3, 0, 0), (84, 1, 0, 0, 1), (93, 1, 3, 2, 0), (180, 0, 0, 0, 1),
    (149, 0, 0, 0, 0),
    (85, 2, 0, 5, 2), (188, 1, 3, 0, 0), (84, 1, 0, 0, 1), (93, 1, 3, 2, 0), (180, 0, 0, 0, 1),
    (149, 0, 0, 0, 0),
    *[
        insn
        for major, minor in ((1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 2), (10, 200))
        for insn in (
            (85, 2, 0, 4, 2), (85, 4, 0, 3, major), (85, 5, 0, 2, minor), (180, 0, 0, 0, 1),
            (149, 0, 0, 0, 0),
        )
    ],
    (85, 2, 0, 3, 2), (85, 4, 0, 2, 136), (180, 0, 0, 0, 1), (149, 0, 0, 0, 0),
    (180, 0, 0, 0, 0), (149, 0, 0, 0, 0),
]  # fmt: skip
MASK32 = (1 << 32) - 1


def run(insns: list[devbpf.Insn], kind: int, major: int, minor: int, access: int) -> int:
    """Interpret a cgroup device program for one access (the opcodes device programs use)."""
    ctx = (access << 16 | kind).to_bytes(4, "little") + major.to_bytes(4, "little")
    ctx += minor.to_bytes(4, "little")
    reg = [0] * 11
    pc = 0
    for _ in range(10_000):
        code, dst, src, off, imm = insns[pc]
        pc += 1
        if code in (0x61, 0x69):  # ldx w / h from the context (r1)
            assert src == 1
            size = 4 if code == 0x61 else 2
            reg[dst] = int.from_bytes(ctx[off : off + size], "little")
        elif code == 0x74:
            reg[dst] = (reg[dst] & MASK32) >> imm
        elif code == 0x54:
            reg[dst] = reg[dst] & imm & MASK32
        elif code == 0xB4:
            reg[dst] = imm & MASK32
        elif code == 0xBC:
            reg[dst] = reg[src] & MASK32
        elif code == 0x55:
            pc += off if reg[dst] != imm else 0
        elif code == 0x5D:
            pc += off if reg[dst] != reg[src] else 0
        elif code == 0x95:
            return reg[0]
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")
    raise AssertionError("program did not finish")


GRID = list(
    itertools.product(
        (devbpf.DEV_BLOCK, devbpf.DEV_CHAR),
        (1, 5, 10, 136, 195, 508),
        (0, 1, 3, 200, 255),
        range(1, 8),
    )
)


def test_runc_program_as_read_back() -> None:
    c = devbpf.DEV_CHAR
    assert run(RUNC_PROGRAM, c, 1, 3, 6) == 1
    assert run(RUNC_PROGRAM, c, 136, 7, 6) == 1
    assert run(RUNC_PROGRAM, c, 195, 0, 6) == 0
    assert run(RUNC_PROGRAM, c, 195, 0, devbpf.ACC_MKNOD) == 1


def test_prefix_allows_new_devices_and_keeps_the_rest() -> None:
    new = [devbpf.rule("c", 195, 0, "rwm"), devbpf.rule("c", 195, 255, "rw")]
    program = devbpf.allow_prefix(new) + RUNC_PROGRAM
    for kind, major, minor, access in GRID:
        old = run(RUNC_PROGRAM, kind, major, minor, access)
        got = run(program, kind, major, minor, access)
        if kind == devbpf.DEV_CHAR and (major, minor) == (195, 0):
            assert got == 1
        elif kind == devbpf.DEV_CHAR and (major, minor) == (195, 255):
            assert got == (1 if access & ~6 == 0 else old), access
        else:
            assert got == old, (kind, major, minor, access)


def test_failed_access_check_does_not_hide_a_later_rule() -> None:
    # r for 195:0 fails the first rule's access check; the second rule must still match
    rules = [devbpf.rule("c", 195, 0, "w"), devbpf.rule("c", 195, 0, "r")]
    deny = [(devbpf.ALU_MOV_K, 0, 0, 0, 0), (devbpf.EXIT, 0, 0, 0, 0)]
    program = [*devbpf.allow_prefix(rules), *deny]
    assert run(program, devbpf.DEV_CHAR, 195, 0, devbpf.ACC_READ) == 1
    assert run(program, devbpf.DEV_CHAR, 195, 0, devbpf.ACC_READ | devbpf.ACC_WRITE) == 0
    assert run(program, devbpf.DEV_BLOCK, 195, 0, devbpf.ACC_READ) == 0


def test_rule_and_encoding() -> None:
    assert devbpf.rule("c", 195, 1, "rw") == (2, 195, 1, 6)
    assert devbpf.rule("b", 8, 0, "m") == (1, 8, 0, 1)
    for bad in (("a", 1, 1, "rwm"), ("c", -1, 0, "r"), ("c", 1, 1, ""), ("c", 1, 1, "rx")):
        with pytest.raises(ValueError):
            devbpf.rule(*bad)
    assert devbpf.decode(devbpf.encode(RUNC_PROGRAM)) == RUNC_PROGRAM
    assert devbpf.reloadable_problem(RUNC_PROGRAM) is None
    assert "map" in str(devbpf.reloadable_problem([(0x18, 1, 1, 0, 5), (0, 0, 0, 0, 0)]))
    assert "calls" in str(devbpf.reloadable_problem([(0x85, 0, 0, 0, 1)]))


HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
UNIFIED = HYBRID + "90 23 0:38 /kube /sys/fs/cgroup rw - cgroup2 none rw\n"
PROC = "9:name=systemd:/\n5:cpu,devices:/kube/ctr\n0::/kube/pod/ctr\n"


def test_hierarchy_and_directory() -> None:
    version, mount = cgroupdev.hierarchy(cgroupdev.parse_mountinfo(HYBRID))
    assert (version, mount.point) == (1, "/sys/fs/cgroup/devices")
    assert cgroupdev.cgroup_dir(mount, cgroupdev.cgroup_of(PROC, 1)) == (
        "/sys/fs/cgroup/devices/kube/ctr"
    )
    version, mount = cgroupdev.hierarchy(cgroupdev.parse_mountinfo(UNIFIED))
    assert (version, mount.root) == (2, "/kube")  # a cgroup namespace's root: stripped
    assert cgroupdev.cgroup_dir(mount, cgroupdev.cgroup_of(PROC, 2)) == "/sys/fs/cgroup/pod/ctr"
    with pytest.raises(cgroupdev.CgroupError, match="outside"):
        cgroupdev.cgroup_dir(mount, "/other/ctr")
    with pytest.raises(cgroupdev.CgroupError, match="unexpected"):
        cgroupdev.cgroup_dir(mount, "/kube/../x")
    with pytest.raises(cgroupdev.CgroupError, match="no cgroup v1"):
        cgroupdev.cgroup_of("0::/x\n", 1)
    with pytest.raises(cgroupdev.CgroupError, match="no device cgroup"):
        cgroupdev.hierarchy(cgroupdev.parse_mountinfo(HYBRID.replace("devices", "cpu")))
    escaped = "41 31 0:38 / /sys/fs/cgroup/my\\040dir rw - cgroup cgroup rw,devices\n"
    assert cgroupdev.hierarchy(cgroupdev.parse_mountinfo(escaped))[1].point == (
        "/sys/fs/cgroup/my dir"
    )


def test_rules_and_v1_lines() -> None:
    entries = [
        {"allow": False, "access": "rwm"},
        {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"},
        {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"},
        {"allow": True, "type": "c", "major": 195, "minor": 255},  # permissions "none"
        {"allow": True, "type": "c", "major": 508, "minor": 1, "access": "rw"},
        {"allow": True, "type": "a"},
        {"allow": True, "type": "b", "major": -1, "minor": 0, "access": "m"},
    ]
    rules = cgroupdev.rules_of(entries)
    assert rules == [("c", 195, 0, "rwm"), ("c", 508, 1, "rw")]
    assert cgroupdev.v1_lines(rules) == ["c 195:0 rwm", "c 508:1 rw"]
    with pytest.raises(cgroupdev.CgroupError):
        cgroupdev.v1_lines([("c", 1, 1, "x")])


def _root_with_bpf() -> None:
    if os.geteuid() != 0:
        pytest.skip("loading BPF programs needs root")


def test_kernel_accepts_the_extended_program() -> None:
    _root_with_bpf()
    code = devbpf.encode(devbpf.allow_prefix([devbpf.rule("c", 195, 0, "rw")]) + RUNC_PROGRAM)
    fd = devbpf.load(code)
    try:
        assert devbpf.instructions(fd) == code
    finally:
        os.close(fd)


OPEN = "import os,sys\ntry: os.open(sys.argv[1], os.O_RDONLY)\nexcept OSError as e: print(e.errno)"


def _open_in(cgroup: Path, node: Path) -> int:
    """errno of opening `node` from a process inside `cgroup`."""

    def join() -> None:
        (cgroup / "cgroup.procs").write_text("0")

    done = subprocess.run(
        [sys.executable, "-c", OPEN, str(node)],
        preexec_fn=join,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return int(done.stdout.strip() or 0)


def test_allow_on_a_real_cgroup(tmp_path: Path) -> None:
    _root_with_bpf()
    unified = next(
        (p for p in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")) if
         (p / "cgroup.procs").exists() and not (p / "devices.allow").exists()),
        None,
    )  # fmt: skip
    if unified is None:
        pytest.skip("no cgroup2 hierarchy mounted")
    cgroup = unified / f"gpuctk-test-{uuid.uuid4().hex[:8]}"
    cgroup.mkdir()
    node = tmp_path / "nvidia0"
    os.mknod(node, 0o20666, os.makedev(195, 0))
    fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        old = devbpf.load(devbpf.encode(RUNC_PROGRAM))
        devbpf._attach(fd, old, devbpf.BPF_F_ALLOW_MULTI)
        os.close(old)
        assert _open_in(cgroup, node) == errno.EPERM  # runc's program blocks it
        assert devbpf.allow(fd, [devbpf.rule("c", 195, 0, "rwm")]) == 1
        assert _open_in(cgroup, node) == errno.ENXIO  # allowed; no driver behind it
        ids, flags = devbpf.attached(fd)
        assert len(ids) == 1 and flags == devbpf.BPF_F_ALLOW_MULTI
        prog = devbpf.program_fd(ids[0])
        try:
            assert devbpf.decode(devbpf.instructions(prog))[-len(RUNC_PROGRAM) :] == RUNC_PROGRAM
        finally:
            os.close(prog)
        other, null = tmp_path / "nvidia1", tmp_path / "null"
        os.mknod(other, 0o20666, os.makedev(195, 1))
        os.mknod(null, 0o20666, os.makedev(1, 3))
        assert _open_in(cgroup, other) == errno.EPERM  # still blocked
        assert _open_in(cgroup, null) == 0  # still allowed
    finally:
        os.close(fd)
        cgroup.rmdir()


def test_allow_with_nothing_attached_changes_nothing(tmp_path: Path) -> None:
    _root_with_bpf()
    unified = Path("/sys/fs/cgroup/unified")
    if not (unified / "cgroup.procs").exists():
        pytest.skip("no hybrid cgroup2 hierarchy here")
    cgroup = unified / f"gpuctk-test-{uuid.uuid4().hex[:8]}"
    cgroup.mkdir()
    try:
        done = cgroupdev.allow(2, str(cgroup), [("c", 195, 0, "rwm")])
        assert "nothing filtered" in done
        fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
        try:
            assert devbpf.attached(fd)[0] == []
        finally:
            os.close(fd)
    finally:
        cgroup.rmdir()
