"""`gpuctk system create-dev-char-symlinks` over mknod'ed nodes (fixtures.devroot), run as a
user runs it.

Every NVIDIA node kind gets `MAJOR:MINOR -> ../NODE` resolving to a node of the same numbers; a
second run changes nothing (same link inodes); a wrong link is replaced by a rename; a link of
another device, a non-link entry and a node with an NVIDIA name but another driver's major are
left alone; a folder others can write is refused; `--create-all` makes the nodes the driver's
/proc files list, with its modes, and honours `ModifyDeviceFiles: 0`.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures.devroot import (
    CAPS_MAJOR,
    IMEX_CHANNELS,
    IMEX_MAJOR,
    UVM_MAJOR,
    NodeRoots,
    ci_minor,
    gi_minor,
)

from gpuctk.cdi.node import devchar
from gpuctk.cdi.node.profile import load_profile

GPUCTK = str(Path(sys.executable).with_name("gpuctk"))
Roots = Callable[..., NodeRoots]


def links(roots: NodeRoots, *extra: str) -> subprocess.CompletedProcess[str]:
    dev = roots.dev_root / "dev"
    argv = [GPUCTK, "system", "create-dev-char-symlinks", "--driver-root", str(roots.dev_root)]
    argv += ["--dev-char-path", str(dev / "char"), "--proc-root", str(roots.proc_root)]
    argv += ["--sys-root", str(roots.sys_root), *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def node(node_roots: Roots) -> NodeRoots:
    """a100-mig's nodes, the fixture's IMEX channels, and a decoy: `nvidia9` with the mem
    driver's major."""
    roots = node_roots(load_profile("a100-mig"))
    dev = roots.dev_root / "dev"
    os.mknod(dev / "nvidia9", stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null's numbers
    return roots


def expected(roots: NodeRoots) -> dict[str, str]:
    """link name -> target for every NVIDIA node of the fixture (the decoy aside)."""
    gpus = load_profile("a100-mig").gpus
    want = {"195:255": "../nvidiactl", "195:254": "../nvidia-modeset",
            f"{UVM_MAJOR}:0": "../nvidia-uvm", f"{UVM_MAJOR}:1": "../nvidia-uvm-tools",
            f"{CAPS_MAJOR}:1": "../nvidia-caps/nvidia-cap1",
            f"{CAPS_MAJOR}:2": "../nvidia-caps/nvidia-cap2"}  # fmt: skip
    for c in IMEX_CHANNELS:
        want[f"{IMEX_MAJOR}:{c}"] = f"../nvidia-caps-imex-channels/channel{c}"
    for g in gpus:
        want[f"195:{g.minor}"] = f"../nvidia{g.minor}"
        for m in g.mig_devices:
            for minor in (gi_minor(g.minor, m.gi), ci_minor(g.minor, m.gi, m.ci)):
                want[f"{CAPS_MAJOR}:{minor}"] = f"../nvidia-caps/nvidia-cap{minor}"
    return want


def test_every_node_kind_is_linked_to_a_node_of_its_numbers(node: NodeRoots) -> None:
    p = links(node)
    assert p.returncode == 0, p.stderr
    char = node.dev_root / "dev/char"
    want = expected(node)
    assert {n: os.readlink(char / n) for n in os.listdir(char)} == want  # the decoy: no 1:3
    for name in want:
        major, minor = (int(x) for x in name.split(":"))
        st = os.stat(char / name)  # the relative link resolves from the link folder
        assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(major, minor), name
    assert oct(stat.S_IMODE(char.stat().st_mode)) == "0o755"
    assert p.stderr.strip().splitlines() == [
        f"gpuctk: {char}: {len(want)} created ({len(want)} NVIDIA nodes in {char.parent})"
    ]
    assert len(p.stdout.splitlines()) == len(want)


def test_a_second_run_changes_nothing(node: NodeRoots) -> None:
    assert links(node).returncode == 0
    char = node.dev_root / "dev/char"
    before = {n: os.lstat(char / n) for n in os.listdir(char)}
    p = links(node, "--format", "json")
    assert p.returncode == 0, p.stderr
    assert {x["status"] for x in json.loads(p.stdout)["links"]} == {"unchanged"}
    after = {n: os.lstat(char / n) for n in os.listdir(char)}
    assert {n: (s.st_ino, s.st_mtime_ns) for n, s in after.items()} == {
        n: (s.st_ino, s.st_mtime_ns) for n, s in before.items()
    }
    assert links(node).stdout == ""  # table: only changes are listed


def test_a_wrong_link_is_replaced_and_others_are_left_alone(node: NodeRoots) -> None:
    char = node.dev_root / "dev/char"
    char.mkdir()
    (char / "195:0").symlink_to("../null")  # wrong: 195:0 is nvidia0
    (char / "1:3").symlink_to("../null")  # another device's link
    (char / "195:1").write_text("not a link\n")  # not a link: left alone
    other = os.lstat(char / "1:3")
    p = links(node, "--format", "json")
    assert p.returncode == 0, p.stderr
    by_link = {x["link"]: x for x in json.loads(p.stdout)["links"]}
    assert by_link[f"{char}/195:0"]["status"] == "replaced"
    assert by_link[f"{char}/195:0"]["was"] == "../null"
    assert by_link[f"{char}/195:1"]["status"] == "not-a-link"
    assert os.readlink(char / "195:0") == "../nvidia0"
    assert (char / "195:1").read_text() == "not a link\n"
    assert os.lstat(char / "1:3").st_ino == other.st_ino and os.readlink(char / "1:3") == "../null"
    assert not [n for n in os.listdir(char) if n.startswith(".")]  # no temporary link left


def test_a_wrong_link_is_renamed_over_never_removed(
    node: NodeRoots, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev = str(node.dev_root / "dev")
    char = node.dev_root / "dev/char"
    char.mkdir()
    (char / "195:0").symlink_to("../null")
    renames: list[tuple[str, str]] = []
    real_rename = os.rename

    def rename(src: str, dst: str, **kw: int) -> None:
        renames.append((src, dst))
        assert os.readlink(char / "195:0") == "../null"  # still there until the rename
        real_rename(src, dst, **kw)

    monkeypatch.setattr(os, "unlink", lambda *a, **k: pytest.fail(f"unlink{a}"))
    monkeypatch.setattr(os, "rename", rename)
    nodes = [devchar.Node("nvidia0", 195, 0)]
    (change,) = devchar.update_links(dev, str(char), nodes)
    assert change.status == "replaced"
    ((src, dst),) = renames
    assert dst == "195:0" and src.startswith(".195:0.") and src.endswith(".tmp")
    assert os.readlink(char / "195:0") == "../nvidia0"


def test_a_folder_others_can_write_is_refused(node: NodeRoots) -> None:
    char = node.dev_root / "dev/char"
    char.mkdir()
    char.chmod(0o777)
    p = links(node)
    assert p.returncode == 4, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith("gpuctk: error: ") and "world-writable" in line
    assert f"chmod go-w {char}" in line
    assert os.listdir(char) == []
    char.chmod(0o755)
    caps = node.dev_root / "dev/nvidia-caps"
    os.chown(caps, 12345, 12345)  # a node folder someone else owns
    p = links(node)
    assert p.returncode == 4 and "owned by uid 12345" in p.stderr
    assert os.listdir(char) == []


def test_dry_run_changes_nothing(node: NodeRoots) -> None:
    p = links(node, "--dry-run", "--format", "json")
    assert p.returncode == 0, p.stderr
    assert {x["status"] for x in json.loads(p.stdout)["links"]} == {"would-create"}
    assert not (node.dev_root / "dev/char").exists()


def _driver_proc_files(roots: NodeRoots, caps: dict[str, int], params: str) -> None:
    """What the loaded driver lists: its GPUs, the MIG capabilities that exist, its params."""
    driver = roots.proc_root / "driver/nvidia"
    for g in load_profile("a100-mig").gpus:
        info = driver / "gpus" / g.pci_bus_id.lower() / "information"
        info.parent.mkdir(parents=True, exist_ok=True)
        info.write_text(f"Model: \t\t {g.name}\nDevice Minor: \t {g.minor}\n")
    for path, mode in caps.items():
        cap = driver / "capabilities" / path
        cap.parent.mkdir(parents=True, exist_ok=True)
        cap.write_text(f"DeviceFileMinor: 0\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n")
    (driver / "params").write_text(params)


def test_create_all_makes_the_missing_nodes_as_the_driver_lists_them(node: NodeRoots) -> None:
    dev = node.dev_root / "dev"
    gpu1 = load_profile("a100-mig").gpus[1]
    mig = gpu1.mig_devices[0]
    gi = gi_minor(gpu1.minor, mig.gi)
    for name in ("nvidiactl", "nvidia0", f"nvidia-caps/nvidia-cap{gi}", "nvidia-caps/nvidia-cap1"):
        os.unlink(dev / name)
    caps = {"mig/config": 256, f"gpu{gpu1.minor}/mig/gi{mig.gi}/access": 292}
    _driver_proc_files(node, caps, "ModifyDeviceFiles: 1\nDeviceFileMode: 438\n")
    p = links(node, "--create-all")
    assert p.returncode == 0, p.stderr
    for name, numbers, mode in (
        ("nvidiactl", (195, 255), 0o666),
        ("nvidia0", (195, 0), 0o666),
        ("nvidia-caps/nvidia-cap1", (CAPS_MAJOR, 1), 0o400),
        (f"nvidia-caps/nvidia-cap{gi}", (CAPS_MAJOR, gi), 0o444),
    ):
        st = os.lstat(dev / name)
        assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(*numbers), name
        assert stat.S_IMODE(st.st_mode) == mode, name
        assert f"made node {dev}/{name} c {numbers[0]}:{numbers[1]} {mode:04o} 0:0" in p.stdout
        assert os.readlink(dev / "char" / f"{numbers[0]}:{numbers[1]}") == f"../{name}"
    assert "made node" not in links(node, "--create-all").stdout  # all there now


def test_create_all_makes_nothing_when_the_driver_forbids_it(node: NodeRoots) -> None:
    dev = node.dev_root / "dev"
    os.unlink(dev / "nvidiactl")
    _driver_proc_files(node, {}, "ModifyDeviceFiles: 0\n")
    p = links(node, "--create-all")
    assert p.returncode != 0
    (line,) = p.stderr.strip().splitlines()[-1:]
    assert "ModifyDeviceFiles: 0" in line and "the nodes that exist are linked" in line
    assert not os.path.lexists(dev / "nvidiactl")
    assert os.readlink(dev / "char/195:0") == "../nvidia0"  # the others are linked all the same
