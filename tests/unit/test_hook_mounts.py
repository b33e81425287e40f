"""gpuctk.hook.verbs.mounts: the read-only root window, mountinfo's escapes, and the libc calls made
without `ctypes` (mount, umount2, unshare, and the capability structures of gpuctk.libc.buffer).

Mount tests run in a forked child with a private mount namespace (fixtures.privmounts).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from fixtures.privmounts import in_private_mounts

from gpuctk import libc
from gpuctk.errors import OutputError
from gpuctk.hook.verbs import mounts

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounts need root")


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        (rb"/plain/path", b"/plain/path"),
        (rb"/with\040space", b"/with space"),
        (rb"/tab\011and\012newline", b"/tab\tand\nnewline"),
        (rb"/back\134slash", b"/back\\slash"),
        (rb"/\040\040", b"/  "),
        (rb"/not\08escape", rb"/not\08escape"),  # 8 is not an octal digit
        (rb"/short\04", rb"/short\04"),
        (rb"/end\\", rb"/end\\"),
    ],
)
def test_unescape_octal(field: bytes, expected: bytes) -> None:
    assert mounts.unescape_octal(field) == expected


@needs_root
def test_mount_points_read_escaped_names(tmp_path: Path) -> None:
    """A mount point whose name has a space and a backslash is listed by its real name."""
    target = tmp_path / "a dir\\x"
    target.mkdir()

    def body() -> None:
        mounts.mount("tmpfs", str(target), "tmpfs", 0)
        assert str(target) in mounts._mount_points()
        mounts.detach(str(target))
        assert str(target) not in mounts._mount_points()

    in_private_mounts(body)


@needs_root
def test_writable_root_opens_and_closes_the_window(tmp_path: Path) -> None:
    """A read-only bind-mounted root is writable inside the block and read-only after it,
    also when the block fails; a writable root is left alone."""
    root = tmp_path / "root"
    root.mkdir()

    def body() -> None:
        mounts.mount(str(root), str(root), None, mounts.MS_BIND)
        mounts.mount(None, str(root), None, mounts.MS_REMOUNT | mounts.MS_BIND | mounts.MS_RDONLY)
        fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
        try:
            assert mounts.read_only(fd)
            with mounts.writable_root(fd, "r") as remounted:
                assert remounted
                (root / "written").write_text("x")
            assert mounts.read_only(fd)
            with pytest.raises(KeyError), mounts.writable_root(fd, "r"):
                assert not mounts.read_only(fd)
                raise KeyError("the block failed")
            assert mounts.read_only(fd), "left writable after an error"
        finally:
            os.close(fd)
        mounts.detach(str(root))
        fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
        try:
            with mounts.writable_root(fd, "r") as remounted:
                assert not remounted
        finally:
            os.close(fd)

    in_private_mounts(body)
    assert (root / "written").read_text() == "x"


@needs_root
def test_writable_root_refuses_a_root_that_is_not_a_mount(tmp_path: Path) -> None:
    """Read-only because its parent mount is: never remount the parent for it."""
    outer = tmp_path / "outer"
    (outer / "root").mkdir(parents=True)

    def body() -> None:
        mounts.mount(str(outer), str(outer), None, mounts.MS_BIND)
        mounts.mount(None, str(outer), None, mounts.MS_REMOUNT | mounts.MS_BIND | mounts.MS_RDONLY)
        fd = os.open(outer / "root", os.O_PATH | os.O_DIRECTORY)
        try:
            with (
                pytest.raises(OutputError, match="on a read-only file system"),
                mounts.writable_root(fd, "r"),
            ):
                pass  # pragma: no cover
        finally:
            os.close(fd)

    in_private_mounts(body)


def test_capget_through_a_buffer() -> None:
    """capget(2) fills a libc.buffer like ctypes' structures did: this process's own sets,
    the same numbers /proc/self/status shows."""
    header = libc.buffer(struct.pack("=Ii", 0x20080522, 0))
    data = libc.buffer(bytes(24))
    assert libc.function("capget")(header, data) == 0, os.strerror(libc.get_errno())
    eff0, perm0, inh0, eff1, perm1, inh1 = struct.unpack("=6I", data.raw)
    status = dict(
        line.split(":\t", 1) for line in Path("/proc/self/status").read_text().splitlines()
    )
    assert int(status["CapEff"], 16) == eff1 << 32 | eff0
    assert int(status["CapPrm"], 16) == perm1 << 32 | perm0
    assert int(status["CapInh"], 16) == inh1 << 32 | inh0
