"""The test images themselves (fixtures.images): what a kind promises is what the tests that use
it rely on.

"bullseye": Debian 11's glibc 2.31 (the Ubuntu 20.04 / Debian 11 base of older CUDA images): libc
and loader are 2.31, the loader knows no glibc-hwcaps, the image's ldconfig reads the cache it
wrote, and dlopen-test (built for 2.31) runs in it.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="building images and chroot need root")

LIBDIR = "lib/x86_64-linux-gnu"


def chroot(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["chroot", str(root), *argv], capture_output=True, text=True, timeout=60, check=False
    )


def inside(root: Path, path: str) -> Path:
    """`path` of the image resolved as the image sees it (absolute links stay in `root`)."""
    p = root / path.lstrip("/")
    for _ in range(40):
        if not p.is_symlink():
            return p
        target = os.readlink(p)
        p = root / target.lstrip("/") if target.startswith("/") else p.parent / target
    raise AssertionError(f"{path}: too many links")


@pytest.fixture
def bullseye(image_rootfs: Callable[[str], Path]) -> Path:
    return image_rootfs("bullseye")


def test_bullseye_glibc_is_2_31(bullseye: Path) -> None:
    # glibc's libc.so.6 prints its banner when run; the 2.31 loader has no --version
    done = chroot(bullseye, f"/{LIBDIR}/libc.so.6")
    assert done.returncode == 0, done.stderr
    assert re.search(r"release version 2\.31\b", done.stdout), done.stdout
    loader = inside(bullseye, "/lib64/ld-linux-x86-64.so.2")
    assert loader.name == "ld-2.31.so"
    libc = inside(bullseye, f"/{LIBDIR}/libc.so.6").read_bytes()
    assert b"release version 2.31." in libc
    # 2.31 defines no symbol version of its own: GLIBC_2.30 is its newest, 2.32 is unknown to it
    assert b"GLIBC_2.30\0" in libc and b"GLIBC_2.32" not in libc


def test_bullseye_loader_knows_no_glibc_hwcaps(bullseye: Path) -> None:
    assert b"glibc-hwcaps" not in inside(bullseye, "/lib64/ld-linux-x86-64.so.2").read_bytes()


def test_bullseye_ld_so_conf_and_cache(bullseye: Path) -> None:
    assert (bullseye / "etc/ld.so.conf").read_text().startswith("include /etc/ld.so.conf.d/")
    assert (
        "/lib/x86_64-linux-gnu" in (bullseye / "etc/ld.so.conf.d/x86_64-linux-gnu.conf").read_text()
    )
    done = chroot(bullseye, "/sbin/ldconfig", "-p")
    assert done.returncode == 0, done.stderr
    assert re.search(
        r"^\s+libc\.so\.6 \(libc6,x86-64.*=> /lib/x86_64-linux-gnu/libc\.so\.6$",
        done.stdout,
        re.MULTILINE,
    ), done.stdout


def test_bullseye_dlopen_test_runs(bullseye: Path) -> None:
    done = chroot(bullseye, "/bin/dlopen-test", "libc.so.6", "libdl.so.2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["OK libc.so.6", "OK libdl.so.2"]
    done = chroot(bullseye, "/bin/dlopen-test", "libnope.so.1")
    assert done.returncode == 1
    assert done.stdout.startswith("FAIL libnope.so.1: ")


def test_bullseye_dlopen_test_needs_nothing_newer_than_2_31(bullseye: Path) -> None:
    text = subprocess.run(
        ["objdump", "-T", str(bullseye / "bin/dlopen-test")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    versions = {tuple(map(int, v.split("."))) for v in re.findall(r"\(GLIBC_([\d.]+)\)", text)}
    assert versions and max(versions) <= (2, 31), sorted(versions)


def test_bullseye_busybox_shell(bullseye: Path) -> None:
    done = chroot(bullseye, "/bin/sh", "-c", "echo hi")
    assert (done.returncode, done.stdout) == (0, "hi\n"), done.stderr
