"""A local user against `gpuctk config` and `gpuctk migrate`, which root runs.

Writing (--output, --in-place): the file named is written, following a link only when root
(or this euid) made it: a link another account planted, in /tmp or in its own folder, would
point root's write at any file (/etc/shadow). Reading (--from, --config-file): only a regular
file is read, never a FIFO (open would wait for a writer forever), a device (/dev/zero, a
watchdog) or a socket; a file whose size reads 0 (an empty file, /proc's files, /proc/kmsg:
its read waits for, and takes, the kernel's messages) is empty.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import pytest

from gpuctk.cli import main
from gpuctk.errors import InputError
from gpuctk.install import config_edit

OTHER = 65534  # nobody
VICTIM = "root:x:0:0:root:/root:/bin/bash\n"


def gpuctk(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A root file in a root folder: what a planted link points at."""
    if os.geteuid() != 0:
        pytest.skip("needs root (a link owned by another uid)")
    folder = tmp_path / "etc"
    folder.mkdir(mode=0o755)
    path = folder / "passwd"
    path.write_text(VICTIM)
    return path


@pytest.fixture
def sticky(tmp_path: Path) -> Path:
    """A /tmp: world-writable, sticky."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    folder.chmod(0o1777)
    return folder


def plant_link(at: Path, target: Path) -> Path:
    at.symlink_to(target)
    os.lchown(at, OTHER, OTHER)
    return at


@pytest.mark.parametrize("command", [["config", "default", "-o"], ["config", "-o"]])
def test_a_link_another_user_planted_is_not_written_through(
    victim: Path, sticky: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    link = plant_link(sticky / "config.toml", victim)
    code, err = gpuctk(capsys, *command, str(link))
    assert code != 0 and "symlink owned by uid 65534" in err
    assert victim.read_text() == VICTIM
    assert link.is_symlink()


def test_a_folder_link_another_user_planted_is_not_written_through(
    victim: Path, sticky: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plant_link(sticky / "d", victim.parent)
    code, err = gpuctk(capsys, "config", "default", "-o", str(sticky / "d" / "passwd"))
    assert code != 0 and "symlink owned by uid 65534" in err
    assert victim.read_text() == VICTIM


def test_in_place_through_a_planted_link_is_refused(
    victim: Path, sticky: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty root file (/etc/ld.so.preload) reads as a config with nothing set."""
    empty = victim.parent / "ld.so.preload"
    empty.write_text("")
    link = plant_link(sticky / "config.toml", empty)
    code, _ = gpuctk(capsys, "config", "-c", str(link), "-i", "--set", "log-level=debug")
    assert code != 0 and empty.read_text() == ""


def test_a_link_root_made_is_followed(
    victim: Path, sticky: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = victim.parent / "config.toml"
    (sticky / "config.toml").symlink_to(target)
    code, _ = gpuctk(capsys, "config", "default", "-o", str(sticky / "config.toml"))
    assert code == 0 and target.read_text() == config_edit.default_text()


def test_a_fifo_is_never_opened_for_reading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A writer stands by so that a reader that does open the FIFO gets a valid NVIDIA file
    (and the test ends either way); the refusal comes without it."""
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    fed: list[bool] = []

    def writer() -> None:
        with contextlib.suppress(BrokenPipeError), open(fifo, "w") as f:  # waits for a reader
            f.write("[nvidia-container-runtime]\nlog-level = 'debug'\n")
        fed.append(True)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    code, err = gpuctk(capsys, "migrate", "--dry-run", "--from", str(fifo),
                       "--config-file", str(tmp_path / "out.toml"))  # fmt: skip
    if not fed:  # let the writer go: a reader held open until it is done, whenever its open
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # call comes (before or after this)
        try:
            thread.join()
        finally:
            os.close(reader)
    thread.join()
    assert code != 0 and "not a regular file" in err


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null"])
def test_a_device_is_not_read(path: str) -> None:
    with pytest.raises(InputError, match="not a regular file"):
        config_edit.read_text(path)


def test_a_file_of_size_zero_is_not_read() -> None:
    """/proc/self/status stands for /proc/kmsg, which a test must not read."""
    assert os.stat("/proc/self/status").st_size == 0
    assert config_edit.read_text("/proc/self/status") == ""
