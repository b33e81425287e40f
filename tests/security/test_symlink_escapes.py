"""Symlink escapes and magic links in the image, against the real gpuctk-hook.

Each image path the hook touches (the library folder, /etc/ld.so.conf.d, /etc, /dev, a library
target, /run) is replaced by a link to the host sentinel tree that mirrors it: absolute,
relative `../..`, a chain of links, a loop. Then the hook does all its createContainer work
(links, modes, ld.so.conf.d, the ld cache). A safe outcome is success with everything inside
the root, or one clear error; the `world` fixture then proves nothing outside the root changed
and nothing from the image ran. Both resolvers run: openat2 and the descriptor walk.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
from pathlib import Path

import pytest
from fixtures.privmounts import in_private_mounts
from secworld import FOLDER, LIB, LIBDIR, World, assert_safe, run_tool

ARGS = [
    "createContainer",
    "--link",
    f"libfoo.so.1.2.3::{FOLDER}/libfoo.so.1",
    "--link",
    f"{LIB}::{LIBDIR}/libfoo.so",
    "--folder",
    FOLDER,
    "--mode",
    "755",
    "--path",
    LIB,
    "--path",
    "/dev/nvidia-caps",
    "--path",
    "/run/nvidia-persistenced",
]
TARGETS = [LIBDIR, "/etc/ld.so.conf.d", "/etc", "/dev", LIB, "/run", FOLDER]
FORMS = ["absolute", "relative", "chain", "loop"]
WALK: dict[str, tuple[str, ...]] = {"openat2": (), "walk": ("openat2",)}  # ENOSYS: older kernels


def plant(world: World, path: str, form: str) -> None:
    outside = str(world.host) + path
    if form == "absolute":
        world.link(path, outside)
    elif form == "relative":
        world.link(path, "../" * 30 + outside.lstrip("/"))
    elif form == "chain":  # relative, relative, absolute: a naive follower ends in `host`
        world.link("/chain1", "chain2")
        world.link("/chain2", "./chain3")
        world.link("/chain3", str(world.host))
        world.link(path, "../" * path.count("/", 1) + "chain1" + path)
    else:  # loop
        world.link("/loop1", "/loop2/a")
        world.link("/loop2", "/loop1/b")
        world.link(path, "/loop1")


@pytest.mark.parametrize("resolver", WALK)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("target", TARGETS)
def test_symlinked_image_path_never_leads_out(
    world: World, bindir: Path, target: str, form: str, resolver: str
) -> None:
    plant(world, target, form)
    done = run_tool(bindir / "gpuctk-hook", ARGS, world.state(), missing=WALK[resolver])
    assert done.stdout == ""
    assert_safe(done)
    if target in ("/dev", "/run") and form != "loop":
        assert done.returncode == 0, done.stderr  # a missing path to chmod is skipped
    if done.returncode == 0 and target not in (LIB, FOLDER, LIBDIR, "/etc"):
        link = world.root / FOLDER.lstrip("/") / "libfoo.so.1"
        assert os.readlink(link) == "libfoo.so.1.2.3"  # the work was done, inside the root


@pytest.mark.parametrize("resolver", WALK)
def test_sentinel_mirrored_inside_the_root_is_where_writes_land(
    world: World, bindir: Path, resolver: str
) -> None:
    """An absolute link to the host folder resolves to <root>/<host folder>: when the image
    has that folder too, the hook's writes go there, and only there."""
    inner = world.root / str(world.host).lstrip("/")
    inner.mkdir(parents=True)
    subprocess.run(["cp", "-a", f"{world.host}/.", str(inner)], check=True)
    world.link("/etc", str(world.host) + "/etc")
    world.link(LIBDIR, str(world.host) + LIBDIR)
    done = run_tool(bindir / "gpuctk-hook", ARGS, world.state(), missing=WALK[resolver])
    assert done.returncode == 0, done.stderr
    assert os.readlink(inner / FOLDER.lstrip("/") / "libfoo.so.1") == "libfoo.so.1.2.3"
    assert stat.S_IMODE((inner / LIB.lstrip("/")).stat().st_mode) == 0o755
    assert FOLDER in (inner / "etc/ld.so.conf.d/00-gpuctk.conf").read_text()


def test_existing_link_named_like_ours_is_replaced_not_followed(world: World, bindir: Path) -> None:
    """The image ships <folder>/libfoo.so.1 -> a host file and ld.so.conf.d/00-gpuctk.conf ->
    the host's ld.so.conf: the hook swaps the link / renames over the file, never writes
    through them."""
    world.link(f"{FOLDER}/libfoo.so.1", str(world.host / "etc/shadow"))
    world.link("/etc/ld.so.conf.d/00-gpuctk.conf", str(world.host / "etc/ld.so.conf"))
    world.link("/etc/ld.so.cache", str(world.host / "etc/shadow"))
    done = run_tool(bindir / "gpuctk-hook", ARGS, world.state())
    assert done.returncode == 0, done.stderr
    assert os.readlink(world.root / FOLDER.lstrip("/") / "libfoo.so.1") == "libfoo.so.1.2.3"
    conf = world.root / "etc/ld.so.conf.d/00-gpuctk.conf"
    assert not conf.is_symlink() and FOLDER in conf.read_text()
    assert not (world.root / "etc/ld.so.cache").is_symlink()


@pytest.fixture
def proc_in_root(world: World) -> World:
    """The root's /proc is a real proc mount, as runc has it when createContainer hooks run."""
    subprocess.run(["mount", "-t", "proc", "proc", str(world.root / "proc")], check=True)
    world.mounted.append(world.root / "proc")
    world.resnap()
    return world


@pytest.mark.parametrize("resolver", WALK)
@pytest.mark.parametrize(
    "magic",
    ["/proc/self/root", "/proc/1/root", "/proc/thread-self/root", "/proc/self/cwd", "helper-cwd"],
)
@pytest.mark.parametrize("target", [LIBDIR, "/etc", "/etc/ld.so.conf.d", "/dev", LIB])
def test_magic_links_before_pivot_root(
    proc_in_root: World, bindir: Path, target: str, magic: str, resolver: str
) -> None:
    world = proc_in_root
    helper = None
    if magic == "helper-cwd":  # another process whose cwd is the host folder
        helper = subprocess.Popen(["sleep", "60"], cwd=world.host)
        prefix = f"/proc/{helper.pid}/cwd"
    elif magic == "/proc/self/cwd":
        prefix = magic  # the hook runs with the host folder as its cwd (below)
    else:
        prefix = magic + str(world.host)
    try:
        world.link(target, prefix + target)
        done = run_tool(
            bindir / "gpuctk-hook",
            ARGS,
            world.state(),
            missing=WALK[resolver],
            cwd=world.host,
        )
    finally:
        if helper is not None:
            helper.kill()
            helper.wait()
    assert done.stdout == ""
    assert_safe(done)


def test_proc_in_root_is_never_written(proc_in_root: World, bindir: Path) -> None:
    """Links and modes aimed straight at /proc paths (a host sysctl, the hook's own fds) are
    refused: /proc is another mount, and writes go only to the root's own file system."""
    args = [
        "createContainer",
        "--link",
        "/etc/shadow::/proc/sys/kernel/core_pattern",
        "--mode",
        "777",
        "--path",
        "/proc/sys/kernel/core_pattern",
    ]
    before = Path("/proc/sys/kernel/core_pattern").read_text()
    done = run_tool(bindir / "gpuctk-hook", args, proc_in_root.state())
    assert_safe(done)
    assert Path("/proc/sys/kernel/core_pattern").read_text() == before
    assert stat.S_IMODE(os.stat("/proc/sys/kernel/core_pattern").st_mode) == 0o644


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("target", ["/dev", "/dev/nvidia-caps", LIBDIR, "/run"])
def test_prestart_device_nodes_and_binds_stay_in_root(world: World, target: str, form: str) -> None:
    """The prestart mode's own writes (mknod, bind targets) through the same hostile links, in a
    private mount namespace: whatever lands, lands inside the root."""

    from gpuctk import rootfs
    from gpuctk.hook.verbs import mknod, nsmount

    plant(world, target, form)
    source = world.tmp / "driver-lib"
    source.write_bytes(b"\x7fELF")

    def body() -> None:
        fd = rootfs.open_root(str(world.root))
        src = nsmount.Source(str(source), ["ro", "nosuid", "nodev", "rbind"])
        try:
            for path, minor in (("/dev/nvidia0", 0), ("/dev/nvidia-caps/nvidia-cap1", 1)):
                node = {"path": path, "type": "c", "major": 195, "minor": minor}
                with contextlib.suppress(mknod.NodeError, rootfs.InRootError):
                    mknod.mknod(fd, node)
            for dest in (f"{LIBDIR}/libcuda.so.1", "/run/nvidia-persistenced/socket"):
                with contextlib.suppress(nsmount.NamespaceError, rootfs.InRootError):
                    nsmount.bind(fd, src, dest)
            prefix = str(world.root) + "/"
            with open("/proc/self/mountinfo") as info:
                points = [line.split()[4] for line in info]
            assert not [p for p in points if p.startswith(str(world.host))], points
            assert all(not p.startswith(str(world.tmp)) or p.startswith(prefix) or
                       p == str(world.root) for p in points)  # fmt: skip
        finally:
            src.close()
            os.close(fd)

    in_private_mounts(body)
