"""The adversarial suite's world: a hostile image on a tmpfs, host sentinels, real binaries.

`world` gives a fake image root on its own tmpfs (mounted in the test's tmp dir, as a runtime's
rootfs is its own mount), a sentinel tree `host` beside it that mirrors the image paths an
escape would write to, a marker folder that planted code would write to, and a HostSnapshot of
the sentinel, the real host files and the mounts taken before the attack. Teardown asserts that
no marker appeared and nothing outside the root changed: every test gets that check for free.

The binaries are the production ones: isolated-mode launchers (`#!python -I`, written by
gpuctk.install.launchers, as packaging installs them) of gpuctk-hook and gpuctk-runtime for the
venv's interpreter.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.nosyscall import without
from snapshot import HostSnapshot

from gpuctk.install import launchers

LIBDIR = "/usr/lib/x86_64-linux-gnu"
FOLDER = f"{LIBDIR}/nvidia/current"
LIB = f"{FOLDER}/libfoo.so.1.2.3"
HOOK_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
MARKER_C = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) {
    int fd = open("%s/preload-ran", O_WRONLY | O_CREAT, 0644);
    if (fd >= 0) close(fd);
    fd = open("preload-ran-in-cwd", O_WRONLY | O_CREAT, 0644);
    if (fd >= 0) close(fd);
}
"""


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the adversarial suite runs as root (tmpfs, mounts, mknod)")


@pytest.fixture(scope="session")
def bindir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Isolated launchers of gpuctk, gpuctk-runtime and gpuctk-hook for this interpreter.
    GPUCTK_SEC_BINDIR names another folder of them (mutation checks: a sabotaged build must
    fail this suite)."""
    if os.environ.get("GPUCTK_SEC_BINDIR"):
        return Path(os.environ["GPUCTK_SEC_BINDIR"])
    out = tmp_path_factory.mktemp("launchers")
    launchers.write_launchers(str(out), sys.executable)
    return out


@pytest.fixture(scope="session")
def libmarker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Factory: marker folder -> a shared library whose constructor drops `preload-ran` there."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc needed for the planted library")
    base = tmp_path_factory.mktemp("marker-libs")
    made: dict[str, Path] = {}

    def build(markers: Path) -> Path:
        key = str(markers)
        if key not in made:
            src, out = base / f"m{len(made)}.c", base / f"libmarker{len(made)}.so"
            src.write_text(MARKER_C % markers)
            subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
            made[key] = out
        return made[key]

    return build


class World:
    """A hostile image root (tmpfs), a host sentinel tree, markers and the snapshot."""

    def __init__(self, tmp: Path, libfoo: Path, marker_lib: Path) -> None:
        self.tmp = tmp
        self.root = tmp / "rootfs"
        self.host = tmp / "host"
        self.markers = tmp / "markers"
        self.bundle = tmp / "bundle"
        for d in (self.root, self.markers, self.bundle):
            d.mkdir()
        tmpfs = ["mount", "-t", "tmpfs", "-o", "mode=755", "gpuctk-sec", str(self.root)]
        subprocess.run(tmpfs, check=True)
        self.mounted = [self.root]
        for top in (self.root, self.host):  # the sentinel mirrors the image
            for d in ("etc/ld.so.conf.d", FOLDER, "lib", "sbin", "bin", "dev/nvidia-caps", "run"):
                (top / d.lstrip("/")).mkdir(parents=True, exist_ok=True)
            (top / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
            (top / "etc/ld.so.conf.d/libc.conf").write_text("/usr/local/lib\n")
            shutil.copy(libfoo, top / LIB.lstrip("/"))
            (top / LIB.lstrip("/")).chmod(0o644)
            (top / "dev/nvidia-caps").chmod(0o700)
            (top / "run/nvidia-persistenced").mkdir()
            (top / "run/nvidia-persistenced").chmod(0o700)
        (self.host / "etc/shadow").write_text("root:host-secret:::::::\n")
        for d in ("proc", "sys", "tmp", "usr/sbin"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        fake = f"#!/bin/sh\ntouch {self.markers}/image-binary-ran /image-binary-ran\n"
        for binary in ("sbin/ldconfig", "sbin/ldconfig.real", "usr/sbin/ldconfig", "bin/sh"):
            (self.root / binary).write_text(fake)
            (self.root / binary).chmod(0o755)
        shutil.copy(marker_lib, self.root / "lib/libmarker.so")
        (self.root / "lib/libmarker.so").chmod(0o644)
        (self.root / "etc/ld.so.preload").write_text("/lib/libmarker.so\n")
        self.write_config({})
        self.resnap()

    def resnap(self) -> None:
        """Take the "before" picture again (after a test's own set-up of mounts or files)."""
        self.snap = HostSnapshot([self.host, self.bundle], mount_roots=[self.tmp])

    def write_config(self, extra: dict[str, Any]) -> None:
        config = {"ociVersion": "1.0.2", "root": {"path": str(self.root)}, "process": {}, **extra}
        (self.bundle / "config.json").write_text(json.dumps(config))

    def state(self, **over: Any) -> bytes:
        doc = {"ociVersion": "1.0.2", "id": "sec", "status": "creating", "pid": 0}
        doc["bundle"] = str(self.bundle)
        doc.update(over)
        return json.dumps(doc).encode()

    def link(self, path: str, target: str) -> None:
        """Replace the image's `path` with a symlink to `target`."""
        p = self.root / path.lstrip("/")
        if p.is_symlink() or p.is_file():
            p.unlink()
        elif p.is_dir():
            shutil.rmtree(p)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.symlink_to(target)

    def marker_names(self) -> list[str]:
        found = sorted(os.listdir(self.markers))
        found += [f"/{n} in the root" for n in ("image-binary-ran",) if (self.root / n).exists()]
        return found

    def close(self) -> None:
        for path in reversed(self.mounted):
            subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def world(tmp_path: Path, libfoo: Path, libmarker: Any) -> Iterator[World]:
    needs_root()
    w = World(tmp_path, libfoo, libmarker(tmp_path / "markers"))
    try:
        yield w
        assert w.marker_names() == [], "code from the image ran"
        w.snap.assert_unchanged()
    finally:
        w.close()


def run_tool(
    exe: Path,
    args: list[str],
    stdin: bytes = b"",
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 60,
    missing: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """Run one of the launchers, `missing` system calls failing with ENOSYS (an older kernel:
    fixtures.nosyscall); the hook never writes stdout."""
    done = subprocess.run(
        without(missing, [str(exe), *args]),
        input=stdin.decode("latin-1"),
        capture_output=True,
        text=True,
        env={**HOOK_ENV, **(env or {})},
        cwd=cwd,
        timeout=timeout,
        check=False,
    )
    return done


def assert_safe(done: subprocess.CompletedProcess[str], prog: str = "gpuctk-hook") -> None:
    """A safe outcome: success, or exactly one clear error line on stderr and exit 1 (never a
    traceback or an internal error)."""
    lines = done.stderr.splitlines()
    errors = [line for line in lines if f"{prog}: " in line and "warning" not in line]
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
    if done.returncode != 0:
        assert done.returncode == 1, done.stderr
        assert len(errors) == 1, done.stderr
