"""A new stage across filesystems copies only what changed: a file an older stage copied from
the same source is hard-linked from it (gpuctk.cdi.stage), and a prune drops the records of
stages it removes (gpuctk.cdi.stageprune)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctk.cdi import stage, stageprune
from gpuctk.cdi.node.driverfiles import DriverFile, DriverFiles

V = "535.309.01"
LIB = "/usr/lib/x86_64-linux-gnu"


@pytest.fixture
def staging(tmp_path: Path) -> Iterator[Path]:
    """A staging dir on another filesystem than tmp_path (a tmpfs: /dev/shm), so that the
    driver's files cannot be hard-linked into it: the kernel says EXDEV, as on a node whose
    driver sits on a read-only filesystem of its own."""
    if not os.path.isdir("/dev/shm") or os.stat("/dev/shm").st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the test's temp folder")
    top = tempfile.mkdtemp(dir="/dev/shm")
    yield Path(top) / "staging"
    shutil.rmtree(top)


def driver(root: Path, big: str = "x" * 4096) -> DriverFiles:
    libs = []
    for name, soname, cap in [("libcuda", "libcuda.so.1", "compute"),
                              ("libnvidia-ml", "libnvidia-ml.so.1", "utility")]:  # fmt: skip
        host = root / LIB.lstrip("/") / f"{name}.so.{V}"
        if not host.exists():
            host.parent.mkdir(parents=True, exist_ok=True)
            host.write_text(f"{name} {big}")
        libs.append(DriverFile(str(host), f"{LIB}/{name}.so.{V}", "library", cap, soname, "x86_64"))
    smi = root / "usr/bin/nvidia-smi"
    if not smi.exists():
        smi.parent.mkdir(parents=True, exist_ok=True)
        smi.write_text("nvidia-smi")
        smi.chmod(0o755)
    binary = DriverFile(str(smi), "/usr/bin/nvidia-smi", "binary", "utility", None, None)
    return DriverFiles(libraries=tuple(libs), binaries=(binary,))


def test_a_new_stage_shares_the_unchanged_copies(tmp_path: Path, staging: Path) -> None:
    said: list[str] = []
    first = Path(stage.stage_driver(driver(tmp_path / "drv"), V, str(staging), said.append))
    assert said[-1].startswith(f"driver staged in {first}: 0 hard-linked, 3 copied")
    # One library replaced by rename (an upgrade of one package): a new stage, which copies
    # that file and hard-links the two unchanged ones from the first stage's copies.
    host = tmp_path / "drv" / LIB.lstrip("/") / f"libnvidia-ml.so.{V}"
    new = host.with_name("new")
    new.write_text("upgraded")
    new.rename(host)
    second = Path(stage.stage_driver(driver(tmp_path / "drv"), V, str(staging), said.append))
    assert second != first
    assert said[-1].startswith(
        f"driver staged in {second}: 0 hard-linked, 2 shared with an older stage, 1 copied"
    )
    for rel in (f"lib64/libcuda.so.{V}", "bin/nvidia-smi"):
        assert (second / rel).stat().st_ino == (first / rel).stat().st_ino, rel
    ml = f"lib64/libnvidia-ml.so.{V}"
    assert (second / ml).read_text() == "upgraded" and (first / ml).read_text() != "upgraded"
    assert (second / ml).stat().st_ino != (first / ml).stat().st_ino
    # The records sit beside the stages, not in them (containers mount the stage).
    records = sorted(p.name for p in staging.iterdir() if p.name.endswith(".sources"))
    assert records == sorted([f".{first.name}.sources", f".{second.name}.sources"])
    assert not any(p.name.endswith(".sources") for p in second.rglob("*"))
    # A prune that removes the first stage removes its record; the second stage's shared
    # files are intact.
    said.clear()
    removed = stageprune.prune_stages(str(staging), str(second), (), said.append)
    assert removed == [str(first)]
    assert sorted(p.name for p in staging.iterdir()) == [f".{second.name}.sources", second.name]
    assert (second / f"lib64/libcuda.so.{V}").read_text().startswith("libcuda ")


def test_a_source_changed_in_place_is_copied_again(tmp_path: Path, staging: Path) -> None:
    """The record's identity is the digest's (device, inode, size, mtime): a file rewritten in
    place (same inode, new size or mtime) is never taken from an older stage's copy."""
    files = driver(tmp_path / "drv")
    first = Path(stage.stage_driver(files, V, str(staging)))
    smi = tmp_path / "drv/usr/bin/nvidia-smi"
    smi.write_text("nvidia-smi, rewritten in place")
    said: list[str] = []
    second = Path(stage.stage_driver(files, V, str(staging), said.append))
    assert "2 shared with an older stage, 1 copied" in said[-1]
    assert (second / "bin/nvidia-smi").read_text() == "nvidia-smi, rewritten in place"
    assert (first / "bin/nvidia-smi").read_text() == "nvidia-smi"


def test_a_damaged_record_only_costs_a_copy(tmp_path: Path, staging: Path) -> None:
    files = driver(tmp_path / "drv")
    first = Path(stage.stage_driver(files, V, str(staging)))
    (staging / f".{first.name}.sources").write_text('{"lib64/x": 5, "bin/y": [1]}')
    (tmp_path / "drv/usr/bin/nvidia-smi").write_text("changed")
    said: list[str] = []
    second = Path(stage.stage_driver(files, V, str(staging), said.append))
    assert "3 copied" in said[-1] and "shared" not in said[-1]
    assert (second / f"lib64/libcuda.so.{V}").read_text().startswith("libcuda ")


def test_a_record_naming_a_path_outside_its_stage_is_not_followed(
    tmp_path: Path, staging: Path
) -> None:
    """The records live in a folder root alone can write; still, a record whose path leaves
    its stage (`..`, absolute) or names a link is never linked from: the file is copied."""
    files = driver(tmp_path / "drv")
    first = Path(stage.stage_driver(files, V, str(staging)))
    secret = staging / "secret"
    secret.write_text("x" * len((tmp_path / "drv/usr/bin/nvidia-smi").read_text()))
    host = str(tmp_path / "drv/usr/bin/nvidia-smi")
    st = os.stat(host)
    identity = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]
    (first / "bin/nvidia-smi").unlink()
    (first / "bin/nvidia-smi").symlink_to(secret)
    record = {"../secret": [host, identity], "bin/nvidia-smi": [host, identity]}
    (staging / f".{first.name}.sources").write_text(json.dumps(record))
    (tmp_path / "drv" / LIB.lstrip("/") / f"libcuda.so.{V}").write_text("changed")
    second = Path(stage.stage_driver(files, V, str(staging)))
    smi = second / "bin/nvidia-smi"
    assert not smi.is_symlink() and smi.read_text() == "nvidia-smi"
    assert smi.stat().st_ino != secret.stat().st_ino


def test_a_record_another_prune_removed_first_is_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two prunes at once (the refresh unit, an operator's run): both find the record of a
    stage gone; the one that comes second finds it removed and goes on."""
    staging = tmp_path / "staging"
    staging.mkdir(mode=0o755)
    (staging / f".{V}-0123456789abcdef.sources").write_text("{}")
    found = stage.sources_records

    def raced(folder: str) -> list[tuple[str, str]]:
        records = found(folder)
        for _, record in records:
            os.unlink(record)  # the other prune was quicker
        return records

    monkeypatch.setattr(stageprune, "sources_records", raced)
    assert stageprune.prune_stages(str(staging), str(staging / "none"), (), print) == []
    assert list(staging.iterdir()) == []
