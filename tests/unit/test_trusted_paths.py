"""gpuctk.fs's trusted-path walk: what root may act on outside a container root.

Every folder from / is owned by root (or the euid) and not group/world-writable, a sticky one
being crossed only to an entry owned by root/euid; the file itself likewise; a symlink is
followed only from a folder that passed; each refusal is one line naming the component at
fault, its owner or mode, and the fix. Run as root: other owners are made with chown."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctk import fs, writes
from gpuctk.errors import OutputError, TrustError

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="other owners need chown (root)")


@pytest.fixture
def top(tmp_path: Path) -> Path:
    """A root-owned 0755 folder (pytest's tmp chain: root's, under sticky /tmp)."""
    tmp_path.chmod(0o755)
    return tmp_path


def refused(call: object, *args: object, **kw: object) -> str:
    with pytest.raises(TrustError) as info:
        result = call(*args, **kw)  # type: ignore[operator]
        os.close(result[0] if isinstance(result, tuple) else result)
    message = str(info.value)
    assert "\n" not in message and "; fix: " in message
    return message


def opens(path: Path | str, **kw: int) -> os.stat_result:
    fd, st = fs.open_trusted_file(str(path), **kw)
    os.close(fd)
    return st


def test_root_owned_chain_and_files_are_trusted(top: Path) -> None:
    (top / "a/b").mkdir(parents=True)
    (top / "a/b/f").write_text("x")
    assert opens(top / "a/b/f").st_size == 1
    fd = fs.open_trusted_dir(str(top / "a/b"))
    try:
        got, st = fs.trusted_file(fd, "f", folder=str(top / "a/b"))
        assert os.read(got, 10) == b"x" and st.st_size == 1
        os.close(got)
    finally:
        os.close(fd)
    listing = fs.open_trusted_dir(str(top / "a/b"), flags=os.O_RDONLY)
    try:
        assert os.listdir(listing) == ["f"]
    finally:
        os.close(listing)


def test_a_relative_path_starts_at_the_working_folder(
    top: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (top / "f").write_text("x")
    monkeypatch.chdir(top)
    assert opens("f").st_size == 1


@pytest.mark.parametrize(
    "owner, mode, words",
    [
        (NOBODY, 0o644, f"the file is owned by uid {NOBODY}, not root; fix: chown root {{f}}"),
        (0, 0o664, "the file is group-writable (mode 0664); fix: chmod go-w {f}"),
        (0, 0o646, "the file is world-writable (mode 0646); fix: chmod go-w {f}"),
        (0, 0o666, "the file is group- and world-writable (mode 0666); fix: chmod go-w {f}"),
    ],
)
def test_a_file_others_can_write_is_refused(top: Path, owner: int, mode: int, words: str) -> None:
    f = top / "f"
    f.write_text("x")
    os.chown(f, owner, 0)
    f.chmod(mode)
    assert refused(fs.open_trusted_file, str(f)) == words.format(f=f)


def test_a_fifo_is_refused_without_blocking(top: Path) -> None:
    os.mkfifo(top / "fifo", 0o644)
    assert refused(fs.open_trusted_file, str(top / "fifo")).startswith("the file is not a regular")


@pytest.mark.parametrize(
    "owner, mode, words",
    [
        (NOBODY, 0o755, f"folder {{d}} is owned by uid {NOBODY}, not root; fix: chown root {{d}}"),
        (0, 0o775, "folder {d} is group-writable (mode 0775); fix: chmod go-w {d}"),
        (0, 0o777, "folder {d} is group- and world-writable (mode 0777); fix: chmod go-w {d}"),
    ],
)
def test_an_ancestor_others_can_write_is_refused(
    top: Path, owner: int, mode: int, words: str
) -> None:
    d = top / "d"
    (d / "inner").mkdir(parents=True)
    (d / "inner/f").write_text("x")
    os.chown(d, owner, 0)
    d.chmod(mode)
    assert refused(fs.open_trusted_file, str(d / "inner/f")) == words.format(d=d)
    assert refused(fs.open_trusted_dir, str(d / "inner")) == words.format(d=d)


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o775])
def test_the_folder_asked_for_must_not_be_writable_by_others_even_sticky(
    top: Path, mode: int
) -> None:
    d = top / "d"
    d.mkdir()
    d.chmod(mode)
    assert refused(fs.open_trusted_dir, str(d)).startswith("the folder is ")
    assert f"(mode {mode:04o}); fix: chmod go-w {d}" in refused(fs.open_trusted_dir, str(d))


def test_a_sticky_folder_is_crossed_only_to_entries_of_root(top: Path) -> None:
    shared = top / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "root-file").write_text("x")
    (shared / "root-dir").mkdir()
    (shared / "root-dir/f").write_text("x")
    assert opens(shared / "root-file").st_size == 1
    assert opens(shared / "root-dir/f").st_size == 1
    os.chown(shared / "root-dir", NOBODY, NOBODY)
    message = refused(fs.open_trusted_file, str(shared / "root-dir/f"))
    assert message == (
        f"folder {shared}/root-dir is owned by uid {NOBODY}, not root, in {shared}, which "
        f"others can write; fix: chown root {shared}/root-dir"
    )
    shared.chmod(0o777)  # the same without the sticky bit: anyone may rename root's entries
    message = refused(fs.open_trusted_file, str(shared / "root-file"))
    assert (
        message
        == f"folder {shared} is group- and world-writable (mode 0777); fix: chmod go-w {shared}"
    )


def test_a_name_missing_from_a_folder_others_can_write_is_refused(top: Path) -> None:
    (top / "gone").mkdir()
    with pytest.raises(FileNotFoundError):
        opens(top / "gone/f")  # nobody else can create it there later
    shared = top / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    message = refused(fs.open_trusted_file, str(shared / "f"))
    assert message == (
        f"the file does not exist, and {shared} lets others create it (mode 1777); "
        "fix: create it as root first"
    )


def test_a_root_owned_symlink_in_a_trusted_folder_is_followed(top: Path) -> None:
    (top / "real").mkdir()
    (top / "real/f").write_text("x")
    (top / "var").mkdir()
    (top / "var/run").symlink_to("../real")  # as /var/run -> /run
    (top / "abs").symlink_to(top / "real/f")
    assert opens(top / "var/run/f").st_size == 1
    assert opens(top / "abs").st_size == 1
    if os.path.islink("/var/run"):
        os.close(fs.open_trusted_dir("/var/run"))


def test_a_symlink_is_judged_by_where_it_leads(top: Path) -> None:
    (top / "target").write_text("x")
    (top / "target").chmod(0o666)
    (top / "link").symlink_to(top / "target")
    message = refused(fs.open_trusted_file, str(top / "link"))
    assert message.startswith(f"file {top}/target is group- and world-writable")
    (top / "elsewhere").mkdir()
    os.chown(top / "elsewhere", NOBODY, NOBODY)
    (top / "elsewhere/f").write_text("x")
    (top / "link2").symlink_to(top / "elsewhere/f")
    assert refused(fs.open_trusted_file, str(top / "link2")).startswith(f"folder {top}/elsewhere")


def test_a_symlink_others_own_in_a_sticky_folder_is_not_followed(top: Path) -> None:
    shared = top / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (top / "f").write_text("x")
    (shared / "link").symlink_to(top / "f")
    assert opens(shared / "link").st_size == 1  # root's link: only root can replace it
    os.lchown(shared / "link", NOBODY, NOBODY)
    message = refused(fs.open_trusted_file, str(shared / "link"))
    assert message.startswith(f"the symlink is owned by uid {NOBODY}, not root, in {shared}")


def test_dot_dot_is_walked_not_collapsed(top: Path) -> None:
    """`w/../f` names f only if w can be crossed (w might be a link somewhere else)."""
    (top / "f").write_text("x")
    (top / "w").mkdir()
    (top / "w").chmod(0o777)
    assert "folder" in refused(fs.open_trusted_file, f"{top}/w/../f")
    (top / "sub/inner").mkdir(parents=True)
    (top / "sub/x").write_text("y")
    (top / "l").symlink_to("sub/inner")
    assert opens(f"{top}/l/../x").st_size == 1  # the kernel's reading: sub/inner/.. is sub


def test_links_are_bounded(top: Path) -> None:
    (top / "loop").symlink_to("loop")
    with pytest.raises(OSError) as info:
        opens(top / "loop")
    assert info.value.errno == errno.ELOOP
    (top / "f").write_text("x")
    previous = "f"
    for i in range(fs.MAX_LINKS):
        (top / f"l{i}").symlink_to(previous)
        previous = f"l{i}"
    assert opens(top / previous).st_size == 1
    (top / "one-more").symlink_to(previous)
    with pytest.raises(OSError) as info:
        opens(top / "one-more")
    assert info.value.errno == errno.ELOOP


def test_a_file_in_the_middle_is_not_a_folder(top: Path) -> None:
    (top / "f").write_text("x")
    with pytest.raises(NotADirectoryError):
        opens(top / "f/g")
    with pytest.raises(IsADirectoryError):
        opens(top)


def test_o_path_looks_without_opening(top: Path) -> None:
    (top / "exe").write_text("#!/bin/sh\n")
    (top / "exe").chmod(0o711)
    assert opens(top / "exe", flags=os.O_PATH).st_mode & 0o111


def test_a_private_folder_is_this_uids_alone(top: Path) -> None:
    made = top / "state"
    assert fs.private_folder(str(made), create=True)
    assert made.stat().st_mode & 0o777 == 0o700
    (top / "link").symlink_to(made)
    assert not fs.private_folder(str(top / "link"))
    assert "symlink" in refused(fs.open_private_dir, str(top / "link"))
    os.chown(made, NOBODY, NOBODY)
    assert not fs.private_folder(str(made))
    parent = top / "theirs"
    parent.mkdir()
    os.chown(parent, NOBODY, NOBODY)
    assert not fs.private_folder(str(parent / "state"), create=True)
    assert not (parent / "state").exists()  # never made below a folder others own


def test_atomic_write_owns_the_file_before_its_rename(
    top: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[int, int]] = []
    real = os.rename

    def rename(src: str, dst: str, **kw: int | None) -> None:
        st = os.stat(src, dir_fd=kw.get("src_dir_fd"))
        seen.append((st.st_uid, st.st_gid))
        real(src, dst, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "rename", rename)
    writes.atomic_write(str(top / "f"), b"data", 0o640, durable=False, uid=NOBODY, gid=NOBODY)
    assert seen == [(NOBODY, NOBODY)]
    st = (top / "f").stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (NOBODY, NOBODY, 0o640)
    fd = fs.open_trusted_dir(str(top))
    try:
        writes.atomic_write("f2", b"in the folder", dir_fd=fd)
    finally:
        os.close(fd)
    assert (top / "f2").read_bytes() == b"in the folder" and seen[-1] == (0, 0)
    assert sorted(p.name for p in top.iterdir()) == ["f", "f2"]  # no temp file left
    with pytest.raises(OutputError, match="cannot write"):
        writes.atomic_write(str(top / "none/f"), b"")


@pytest.fixture
def shared_area() -> Iterator[Path]:
    """A root-owned 0755 folder in /tmp that another uid can reach (pytest's is 0700)."""
    area = Path(tempfile.mkdtemp(prefix="gpuctk-trust-", dir="/tmp"))
    area.chmod(0o755)
    try:
        yield area
    finally:
        shutil.rmtree(area)


def test_a_rootless_caller_trusts_root_and_itself(shared_area: Path) -> None:
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv needed")
    mine = shared_area / "mine"
    mine.mkdir()
    os.chown(mine, NOBODY, NOBODY)
    (mine / "f").write_text("x")
    os.chown(mine / "f", NOBODY, NOBODY)
    other = shared_area / "other"
    other.mkdir()
    os.chown(other, 1, 1)
    (other / "f").write_text("x")
    code = (
        "import os, sys\nfrom gpuctk import fs\nfrom gpuctk.errors import TrustError\n"
        "os.close(fs.open_trusted_file(sys.argv[1])[0])\n"
        "try:\n    fs.open_trusted_file(sys.argv[2])\nexcept TrustError as e:\n    print(e)\n"
    )
    as_nobody = ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups"]
    done = subprocess.run(
        [*as_nobody, sys.executable, "-c", code, str(mine / "f"), str(other / "f")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"folder {other} is owned by uid 1, not root or uid {NOBODY}; fix: chown root {other}"
    )
