"""gpuctk.rootfs against hostile roots: nothing outside the root is ever read, created or changed.

Each test runs twice: with openat2 (RESOLVE_IN_ROOT) and with the descriptor-walk fallback. A
sentinel folder outside the root (with a file, a folder and a symlink in it) is snapshotted
before and after every attack and must be identical.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.images import snapshot_tree as snapshot

from gpuctk import rootfs


def symlink_in_root(fd: int, target: str, path: str, *, parents: bool = True) -> bool:
    """One link by the link policy as gpuctk-hook runs it (gpuctk.hook.compiled.links_in_root:
    its folder opened by gpuctk.rootfs, the link made by gpuctk-cdi-hook): True where it was
    made or swapped; its InRootError raised."""
    from gpuctk.hook import compiled

    (done,) = compiled.links_in_root(fd, [(target, path)], parents=parents)
    if isinstance(done, rootfs.InRootError):
        raise done
    return done == "made"


@pytest.fixture(params=["openat2", "walk"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "openat2" and not rootfs.have_openat2():
        pytest.skip("openat2 not available here")
    # the probe's answer on an older kernel (the walk), or this one's
    monkeypatch.setattr(rootfs, "_openat2_state", request.param == "openat2")
    yield request.param


def assert_unreadable(fd: int, path: str) -> None:
    """Reading `path` finds nothing, or fails (EACCES, ELOOP): it never reaches the outside."""
    try:
        assert rootfs.read_file_in_root(fd, path, 100) is None
    except rootfs.InRootError as exc:
        assert exc.errno in (errno.EACCES, errno.ELOOP, errno.EXDEV), exc


@pytest.fixture
def world(tmp_path: Path, mode: str) -> Iterator[tuple[Path, Path, int]]:
    """(root, outside, root_fd): a root and a sentinel folder beside it, checked after."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "etc").mkdir(parents=True)
    (outside / "lib").mkdir(parents=True)
    (outside / "secret").write_text("secret\n")
    (outside / "ld.so.conf").write_text("host\n")
    (outside / "link").symlink_to("secret")
    before = snapshot(outside)
    fd = rootfs.open_root(str(root))
    yield root, outside, fd
    os.close(fd)
    assert snapshot(outside) == before, "something outside the root changed"


def test_openat2_is_available_on_this_kernel() -> None:
    assert rootfs.have_openat2()


def test_plain_files(world: tuple[Path, Path, int]) -> None:
    root, _, fd = world
    rootfs.write_file_in_root(fd, "/etc/ld.so.conf.d/x.conf", b"/a\n", 0o640, parents=True)
    target = root / "etc/ld.so.conf.d/x.conf"
    assert target.read_bytes() == b"/a\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert rootfs.read_file_in_root(fd, "etc/ld.so.conf.d/x.conf", 100) == b"/a\n"
    assert rootfs.read_file_in_root(fd, "/etc/missing", 100) is None
    assert rootfs.listdir_in_root(fd, "/etc/ld.so.conf.d") == ["x.conf"]
    rootfs.chmod_in_root(fd, "/etc/ld.so.conf.d/x.conf", 0o600)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in target.parent.iterdir()] == ["x.conf"]  # no temp file left


@pytest.mark.parametrize(
    "link",
    [
        "ABS",  # absolute symlink to the outside folder's host path
        "../outside",
        "../../../../../../../../outside",
        "chain1",  # etc -> chain1 -> chain2 -> ../outside
        "/proc/self/root/OUTSIDE",  # magic link text, with no procfs in the root
    ],
)
def test_folder_symlink_escapes_stay_in_root(world: tuple[Path, Path, int], link: str) -> None:
    root, outside, fd = world
    (root / "etc").rmdir()
    if link == "ABS":
        link = str(outside)
    elif link == "chain1":
        (root / "chain2").symlink_to("../outside")
        (root / "chain1").symlink_to("chain2")
    link = link.replace("OUTSIDE", str(outside).lstrip("/"))
    (root / "etc").symlink_to(link)
    for path in ("/etc/secret", "/etc/link", "/etc/ld.so.conf"):
        assert rootfs.read_file_in_root(fd, path, 100) is None
    assert rootfs.listdir_in_root(fd, "/etc") == []
    with pytest.raises(rootfs.InRootError):
        rootfs.write_file_in_root(fd, "/etc/ld.so.conf", b"pwned\n")
    with pytest.raises(rootfs.InRootError):
        symlink_in_root(fd, "x", "/etc/lib/pwned", parents=False)
    with pytest.raises(rootfs.InRootError):
        rootfs.chmod_in_root(fd, "/etc/secret", 0o777)
    # a folder that is a dangling link in the root is an error, as for `mkdir -p`
    with pytest.raises(rootfs.InRootError):
        rootfs.write_file_in_root(fd, "/etc/ld.so.conf", b"ok\n", parents=True)


def test_final_symlinks_are_replaced_not_followed(world: tuple[Path, Path, int]) -> None:
    root, outside, fd = world
    (root / "etc/ld.so.conf").symlink_to(outside / "ld.so.conf")
    (root / "etc/rel").symlink_to("../../outside/ld.so.conf")
    assert rootfs.read_file_in_root(fd, "/etc/ld.so.conf", 100) is None
    assert rootfs.read_file_in_root(fd, "/etc/rel", 100) is None
    rootfs.write_file_in_root(fd, "/etc/ld.so.conf", b"mine\n")
    assert not (root / "etc/ld.so.conf").is_symlink()
    assert (root / "etc/ld.so.conf").read_text() == "mine\n"
    with pytest.raises(rootfs.InRootError):
        rootfs.chmod_in_root(fd, "/etc/rel", 0o777)


def test_loops_and_long_chains_fail_cleanly(world: tuple[Path, Path, int]) -> None:
    root, _, fd = world
    (root / "a").symlink_to("b")
    (root / "b").symlink_to("/a")
    with pytest.raises(rootfs.InRootError) as info:
        rootfs.open_in_root(fd, "/a/x")
    assert info.value.errno == errno.ELOOP
    for i in range(60):
        (root / f"c{i}").symlink_to(f"c{i + 1}")
    (root / "c60").mkdir()
    with pytest.raises(rootfs.InRootError):
        rootfs.open_in_root(fd, "/c0")
    assert rootfs.stat_in_root(fd, "/c30") is not None  # 30 links: within the bound


def test_dotdot_is_clamped_at_the_root(world: tuple[Path, Path, int]) -> None:
    root, _, fd = world
    st = rootfs.stat_in_root(fd, "/../../../etc/../..")
    assert st is not None and st.st_ino == root.stat().st_ino
    assert rootfs.read_file_in_root(fd, "../outside/secret", 100) is None


def test_symlink_creation_rules(world: tuple[Path, Path, int]) -> None:
    root, _, fd = world
    lib = "/usr/lib/nvidia/libfoo.so.1"
    assert symlink_in_root(fd, "libfoo.so.1.2.3", lib)
    assert os.readlink(root / lib.lstrip("/")) == "libfoo.so.1.2.3"
    assert not symlink_in_root(fd, "libfoo.so.1.2.3", lib)  # already right
    assert symlink_in_root(fd, "libfoo.so.1.2.4", lib)  # swapped atomically
    assert os.readlink(root / lib.lstrip("/")) == "libfoo.so.1.2.4"
    (root / "usr/lib/nvidia/real.so").write_text("x")
    assert not symlink_in_root(fd, "other", "/usr/lib/nvidia/real.so")
    assert (root / "usr/lib/nvidia/real.so").read_text() == "x"
    assert sorted(p.name for p in (root / "usr/lib/nvidia").iterdir()) == ["libfoo.so.1", "real.so"]


def test_many_links_are_made_a_folder_open_once(world: tuple[Path, Path, int]) -> None:
    """An image's SONAME links can be many (ldrebuild): each folder is opened once and the C
    is run on LINKS_PER_RUN links at a time; the outcomes stay in order, no descriptor left."""
    from gpuctk.hook import compiled

    root, _, fd = world
    links = [(f"t{i}", f"/usr/lib/many/l{i}") for i in range(600)]
    links += [("x", "/usr/lib/other/y"), ("a\0b", "/usr/lib/other/z"), ("x", "/usr/lib/\0/w")]
    before = sorted(os.listdir("/proc/self/fd"))
    out = compiled.links_in_root(fd, links)
    assert out[:601] == ["made"] * 601
    assert all(isinstance(e, rootfs.InRootError) for e in out[601:]), out[601:]
    assert sorted(os.listdir("/proc/self/fd")) == before
    assert os.readlink(root / "usr/lib/many/l599") == "t599"


def test_nul_bytes_and_root_names_are_refused(world: tuple[Path, Path, int]) -> None:
    _, _, fd = world
    with pytest.raises(rootfs.InRootError):
        rootfs.open_in_root(fd, "/etc/\0x")
    with pytest.raises(rootfs.InRootError):
        rootfs.write_file_in_root(fd, "/", b"x")
    with pytest.raises(rootfs.InRootError):
        symlink_in_root(fd, "a\0b", "/etc/x")


def test_fifo_is_not_read(world: tuple[Path, Path, int]) -> None:
    root, _, fd = world
    os.mkfifo(root / "etc/fifo")
    with pytest.raises(rootfs.InRootError):
        rootfs.read_file_in_root(fd, "/etc/fifo", 100)


@pytest.fixture
def procfs_root(world: tuple[Path, Path, int]) -> Iterator[tuple[Path, Path, int]]:
    root = world[0]
    (root / "proc").mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "proc", "proc", str(root / "proc")]).returncode
    ):
        pytest.skip("needs root to mount procfs in the test root")
    yield world
    subprocess.run(["umount", "-l", str(root / "proc")], check=False)


@pytest.mark.parametrize(
    "link", ["/proc/self/root", "/proc/1/root", "/proc/self/cwd", "proc/thread-self/root"]
)
def test_magic_links_in_the_root_never_lead_out(
    procfs_root: tuple[Path, Path, int], link: str
) -> None:
    root, outside, fd = procfs_root
    inner = str(outside).lstrip("/")
    for path in (f"{link}/{inner}/secret", f"{link}/{inner}/ld.so.conf"):
        assert_unreadable(fd, path)
    with pytest.raises(rootfs.InRootError):
        rootfs.write_file_in_root(fd, f"{link}/{inner}/ld.so.conf", b"pwned\n")
    (root / "etc/lnk").symlink_to(f"{link}/{inner}")
    assert_unreadable(fd, "/etc/lnk/secret")
    with pytest.raises(rootfs.InRootError):
        rootfs.chmod_in_root(fd, "/etc/lnk/secret", 0o777)
    with pytest.raises(rootfs.InRootError):
        symlink_in_root(fd, "x", "/etc/lnk/lib/pwned", parents=False)


def test_folder_swapped_for_a_symlink_while_writing(world: tuple[Path, Path, int]) -> None:
    """A thread flips /etc/d between a real folder and a symlink to the outside folder (by
    atomic rename) while the main thread keeps writing through it."""
    root, outside, fd = world
    real, evil = root / "etc/d.real", root / "etc/d.evil"
    real.mkdir()
    evil.symlink_to(outside)
    (root / "etc/d").symlink_to("d.real")
    stop = threading.Event()

    def flip() -> None:
        tmp = root / "etc/d.tmp"
        while not stop.is_set():
            for src in (real, evil):
                if tmp.is_symlink() or tmp.exists():
                    tmp.unlink() if tmp.is_symlink() else tmp.rmdir()
                if src is real:
                    tmp.symlink_to("d.real")
                else:
                    tmp.symlink_to(str(outside))
                os.replace(tmp, root / "etc/d")

    flipper = threading.Thread(target=flip)
    flipper.start()
    wrote = failed = 0
    deadline = time.monotonic() + 20
    ops = (
        lambda i: rootfs.write_file_in_root(fd, f"/etc/d/ld.so.conf.{i % 3}", b"x\n"),
        lambda i: symlink_in_root(fd, "t", f"/etc/d/link{i % 3}", parents=False),
        lambda i: rootfs.chmod_in_root(fd, "/etc/d/ld.so.conf.0", 0o600),
    )
    try:
        # At least 400 attempts of each operation, and on until some went through the real
        # folder (on a loaded machine the flipper can win many times in a row).
        i = 0
        while i < 400 or (wrote == 0 and time.monotonic() < deadline):
            for op in ops:
                try:
                    op(i)
                    wrote += 1
                except rootfs.InRootError:
                    failed += 1
            i += 1
    finally:
        stop.set()
        flipper.join()
    assert wrote > 0
    print(f"race: {wrote} writes through the real folder, {failed} refused")


def test_writes_into_a_bind_mounted_folder_are_refused(world: tuple[Path, Path, int]) -> None:
    """A folder of the root that is a bind mount of host storage is not the root's own file
    system: nothing is created there and nothing read from it (EXDEV; tests/unit/
    test_rootfs_mounts.py has the image's links to the container's procfs)."""
    root, outside, fd = world
    (root / "etc/ld.so.conf.d").mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "--bind", str(outside), str(root / "etc/ld.so.conf.d")], check=False
        ).returncode
    ):
        pytest.skip("needs root for a bind mount")
    try:
        with pytest.raises(rootfs.InRootError) as info:
            rootfs.read_file_in_root(fd, "/etc/ld.so.conf.d/secret", 100)
        assert info.value.errno == errno.EXDEV
        assert rootfs.read_file_in_root(fd, "/etc/ld.so.conf.d/secret", 100, any_mount=True)
        for write in (
            lambda: rootfs.write_file_in_root(fd, "/etc/ld.so.conf.d/x.conf", b"x"),
            lambda: symlink_in_root(fd, "x", "/etc/ld.so.conf.d/lnk"),
            lambda: rootfs.mkdir_p_in_root(fd, "/etc/ld.so.conf.d/sub/dir"),
            lambda: rootfs.write_file_in_root(fd, "/etc/ld.so.conf.d/a/b", b"x", parents=True),
        ):
            with pytest.raises(rootfs.InRootError) as info:
                write()
            assert info.value.errno == errno.EXDEV
    finally:
        subprocess.run(["umount", "-l", str(root / "etc/ld.so.conf.d")], check=False)
