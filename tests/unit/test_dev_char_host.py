"""/dev/char with a dev root other than `/` (a driver container's /run/nvidia/driver).

runc's systemd driver asks systemd for `DeviceAllow=/dev/char/MAJOR:MINOR` on the HOST, so the
links always live in the host's /dev/char and must resolve there to a node of the same
numbers. A correct link already there (udev's `../nvidia0` to the host's own node) is kept, not
replaced by one into the dev root; a new link names the host's own node when it has one, else
the dev root's node as the host sees it. doctor looks in the host's /dev/char (under
--host-root) and its fix writes there.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from fixtures.devroot import NodeRoots

from gpuctk.cdi.node.profile import load_profile
from gpuctk.doctor.context import Context, Findings
from gpuctk.doctor.devchar import check_dev_char

GPUCTK = str(Path(sys.executable).with_name("gpuctk"))


def host_with(tmp_path: Path, *nodes: tuple[str, int, int]) -> Path:
    """A host root whose dev/ holds the given nodes (name, major, minor) and a dev/char."""
    host = tmp_path / "host"
    (host / "dev/char").mkdir(parents=True)
    for name, major, minor in nodes:
        os.mknod(host / "dev" / name, stat.S_IFCHR | 0o666, os.makedev(major, minor))
    return host


def links(roots: NodeRoots, host: Path) -> dict[str, dict[str, str]]:
    argv = [GPUCTK, "system", "create-dev-char-symlinks", "--driver-root", str(roots.dev_root)]
    argv += ["--dev-char-path", str(host / "dev/char"), "--proc-root", str(roots.proc_root)]
    argv += ["--format", "json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return {os.path.basename(x["link"]): x for x in json.loads(done.stdout)["links"]}


def resolves(link: Path, major: int, minor: int) -> bool:
    st = os.stat(link)
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(major, minor)


def test_a_correct_host_link_is_kept_and_new_ones_resolve_from_the_host(
    tmp_path: Path, node_roots: Callable[..., NodeRoots]
) -> None:
    roots = node_roots(load_profile("l4"))
    host = host_with(tmp_path, ("nvidia0", 195, 0), ("nvidiactl", 195, 255))
    char = host / "dev/char"
    (char / "195:0").symlink_to("../nvidia0")  # udev's link to the host's own node
    inode = os.lstat(char / "195:0").st_ino
    by_name = links(roots, host)
    assert by_name["195:0"]["status"] == "unchanged"
    assert os.readlink(char / "195:0") == "../nvidia0" and os.lstat(char / "195:0").st_ino == inode
    assert os.readlink(char / "195:255") == "../nvidiactl"  # the host's node, where it has one
    modeset = os.readlink(char / "195:254")
    assert modeset == os.path.relpath(roots.dev_root / "dev/nvidia-modeset", char)  # dev root's
    for name in by_name:
        major, minor = (int(x) for x in name.split(":"))
        assert resolves(char / name, major, minor), name
    assert set(links(roots, host)[n]["status"] for n in by_name) == {"unchanged"}
    assert not (roots.dev_root / "dev/char").exists()  # never where runc does not look


def test_doctor_checks_the_host_dev_char_and_its_fix_writes_there(
    tmp_path: Path, node_roots: Callable[..., NodeRoots]
) -> None:
    roots = node_roots(load_profile("l4"))
    host = host_with(tmp_path)
    ctx = Context(dev_root=str(roots.dev_root), proc_root=str(roots.proc_root), host_root=str(host))
    result = check_dev_char(ctx, Findings())
    assert result.status == "warning"
    assert f"{host}/dev/char/195:0 is missing" in result.evidence
    assert result.fix == (
        f"gpuctk system create-dev-char-symlinks --driver-root {roots.dev_root} "
        f"--dev-char-path {host}/dev/char --proc-root {roots.proc_root}"
    )
    argv = result.fix.split()
    done = subprocess.run([GPUCTK, *argv[1:]], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert check_dev_char(ctx, Findings()).status == "ok"
    assert not (roots.dev_root / "dev/char").exists()


def test_doctor_on_a_node_whose_dev_root_is_the_host_root(
    tmp_path: Path, node_roots: Callable[..., NodeRoots]
) -> None:
    """--dev-root and --host-root the same tree (the usual in-container mount): one /dev/char."""
    roots = node_roots(load_profile("l4"))
    ctx = Context(
        dev_root=str(roots.dev_root), proc_root=str(roots.proc_root), host_root=str(roots.dev_root)
    )
    fix = check_dev_char(ctx, Findings()).fix
    assert fix is not None
    done = subprocess.run([GPUCTK, *fix.split()[1:]], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert os.readlink(roots.dev_root / "dev/char/195:0") == "../nvidia0"
    assert check_dev_char(ctx, Findings()).status == "ok"
