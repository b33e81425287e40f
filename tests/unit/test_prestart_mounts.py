"""Device nodes and bind mounts as the prestart mode makes them, inside a root, through fds.

Mount tests run in a forked child that has unshared a private mount namespace (nothing it mounts
is seen outside), for both the new mount API (open_tree / mount_setattr / move_mount) and the
fallback for kernels before 5.12. Hostile roots: folders that are symlinks to `/` or `..`.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest
from fixtures.privmounts import in_private_mounts

from gpuctk import rootfs
from gpuctk.hook.verbs import mknod, nsmount

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod and mounts need root")


def test_options() -> None:
    attr, recursive = nsmount.options_attr(["ro", "nosuid", "nodev", "rbind", "rprivate"])
    assert (attr.attr_set, attr.attr_clr, attr.propagation, recursive) == (
        1 | 2 | 4,
        0,
        nsmount.MS_PRIVATE,
        True,
    )
    attr, recursive = nsmount.options_attr(["rw", "noexec", "bind", "relatime"])
    assert (attr.attr_set, attr.attr_clr, recursive) == (8, 0x1 | 0x70, False)
    with pytest.raises(ValueError, match="mode=755"):
        nsmount.options_attr(["bind", "mode=755"])
    with pytest.raises(nsmount.NamespaceError, match=r"cannot mount /x: .*mode=755"):
        nsmount.Source("/x", ["bind", "mode=755"])


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A container root whose /dev is a symlink to `/` and /usr/lib a symlink to `../..`."""
    top = tmp_path / "root"
    (top / "usr").mkdir(parents=True)
    (top / "dev").symlink_to("/")
    (top / "usr/lib").symlink_to("../..")
    (top / "etc").mkdir()
    return top


def _open(root: Path) -> int:
    return rootfs.open_root(str(root))


@needs_root
def test_mknod_inside_the_root(root: Path, tmp_path: Path) -> None:
    fd = _open(root)
    try:
        dev = {"path": "/dev/gpu/nvidia0", "type": "c", "major": 195, "minor": 0}
        assert mknod.mknod(fd, {**dev, "fileMode": 0o640, "uid": 5, "gid": 6}) is True
        made = root / "gpu/nvidia0"  # /dev -> / resolved inside the root, not the host's /
        st = made.lstat()
        assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(195, 0)
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o640, 5, 6)
        assert not Path("/gpu").exists()
        assert mknod.mknod(fd, {**dev, "fileMode": 0o666}) is False  # same node: kept
        assert stat.S_IMODE(made.lstat().st_mode) == 0o666
        assert mknod.mknod(fd, {**dev, "minor": 1}) is True  # another node there: replaced
        assert made.lstat().st_rdev == os.makedev(195, 1)
        (root / "gpu/dir").mkdir()
        with pytest.raises(mknod.NodeError, match="a folder is there"):
            mknod.mknod(fd, {**dev, "path": "/dev/gpu/dir"})
        with pytest.raises(mknod.NodeError, match="invalid"):
            mknod.mknod(fd, {**dev, "type": "x"})
    finally:
        os.close(fd)


def _bind_checks(root: Path, tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir(exist_ok=True)
    lib = host / "libcuda.so.535"
    lib.write_bytes(b"\x7fELF driver")
    sock = host / "sockdir"
    sock.mkdir(exist_ok=True)
    fd = _open(root)
    sources = [
        nsmount.Source(str(lib), ["ro", "nosuid", "nodev", "rbind", "rprivate"]),
        nsmount.Source(str(sock), ["nosuid", "nodev", "noexec", "rbind"]),
    ]
    try:
        nsmount.bind(fd, sources[0], "/usr/lib/x86_64-linux-gnu/libcuda.so.535")
        nsmount.bind(fd, sources[1], "/run/nvidia-persistenced")
    finally:
        for source in sources:
            source.close()
        os.close(fd)
    # /usr/lib -> ../.. resolved inside the root: the file lands at <root>/x86_64-linux-gnu
    inside = root / "x86_64-linux-gnu/libcuda.so.535"
    assert inside.read_bytes() == b"\x7fELF driver"
    flags = os.statvfs(inside).f_flag
    assert flags & os.ST_RDONLY and flags & os.ST_NOSUID and flags & os.ST_NODEV
    try:
        inside.write_bytes(b"x")
        raise AssertionError("the read-only bind was writable")
    except OSError as exc:
        assert exc.errno == errno.EROFS
    run = root / "run/nvidia-persistenced"
    (run / "socket").write_text("ok")  # sockets' folders stay writable
    assert (sock / "socket").read_text() == "ok"
    assert os.statvfs(run).f_flag & os.ST_NOEXEC
    assert not os.path.exists("/x86_64-linux-gnu/libcuda.so.535")


@needs_root
@pytest.mark.parametrize("new_api", [True, False], ids=["open_tree", "fallback"])
def test_bind_through_descriptors(root: Path, tmp_path: Path, new_api: bool) -> None:
    def body() -> None:
        nsmount._new_api = new_api  # the probe's answer on an older kernel, or this one's
        _bind_checks(root, tmp_path)

    def ours() -> list[str]:  # the mounts at or below this test's folders: other processes
        # (an engine's cleanup, a container of another run) may mount elsewhere meanwhile
        with open("/proc/self/mountinfo") as f:
            return [line for line in f if f" {tmp_path}" in line or f" {root}" in line]

    before = ours()
    in_private_mounts(body)
    assert ours() == before  # nothing leaked into the test's namespace


@needs_root
def test_bind_type_mismatch_is_an_error(root: Path, tmp_path: Path) -> None:
    def body() -> None:
        (tmp_path / "file").write_text("f")
        (root / "etc/folder").mkdir()
        fd = _open(root)
        source = nsmount.Source(str(tmp_path / "file"), ["ro", "rbind"])
        try:
            nsmount.bind(fd, source, "/etc/folder")
        except nsmount.NamespaceError as exc:
            assert "/etc/folder" in str(exc)
        else:
            raise AssertionError("a file was mounted on a folder")
        finally:
            source.close()
            os.close(fd)

    in_private_mounts(body)


def test_container_checks() -> None:
    with pytest.raises(nsmount.NamespaceError, match="names no container process"):
        nsmount.Container(1).open()
    if os.geteuid() != 0:
        return
    me = nsmount.Container(os.getpid())
    try:
        with pytest.raises(nsmount.NamespaceError, match="shares the runtime's mount namespace"):
            me.open()
    finally:
        me.close()
    gone = nsmount.Container(2**22 + 12345)
    with pytest.raises(nsmount.NamespaceError, match="container process"):
        gone.open()
