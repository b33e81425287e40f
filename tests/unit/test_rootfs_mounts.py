"""An image's link to another mount: the create path never reads a file there.

As a hostile image author would: the image's /etc/ld.so.cache (or musl path file) is a symlink
to a file of another mount inside the root, a real procfs at <root>/proc (as the container's
/proc is when the hook runs; /proc/kmsg there drains the host's kernel log) or a tmpfs standing
for a volume. Each case runs in a private mount namespace of its own (`unshare -m`), where the
mounts are made and gpuctk.rootfs is called in a child Python; nothing is mounted on the host.
A normal image (the file a regular file of the root) is still read. Each runs with openat2 and
with the descriptor walk. Also: the compat folder's reader never opens a FIFO.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpuctk.hook.verbs import cudacompat

TIMEOUT = 60

CHILD = r"""
import json, subprocess, sys
from gpuctk import rootfs
from gpuctk.hook.verbs import inroot, ldmerge

root, walk = sys.argv[1], sys.argv[2] == "walk"
subprocess.run(["mount", "-t", "proc", "proc", root + "/proc"], check=True)
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "vol", root + "/vol"], check=True)
with open(root + "/vol/secret", "w") as f:
    f.write("volume secret\n")
rootfs._openat2_state = not walk  # the probe's answer on an older kernel, or this one's
fd = rootfs.open_root(root)
out = {}

def attempt(name, call):
    try:
        value = call()
        out[name] = ["ok", value.decode("latin-1") if isinstance(value, bytes) else value]
    except rootfs.InRootError as exc:
        out[name] = ["InRootError", exc.errno]
    except ValueError as exc:
        out[name] = ["ValueError", str(exc)]

attempt("proc", lambda: rootfs.read_file_in_root(fd, "/etc/proc-link", 1 << 16))
attempt("vol", lambda: rootfs.read_file_in_root(fd, "/etc/vol-link", 1 << 16))
attempt("plain", lambda: rootfs.read_file_in_root(fd, "/etc/plain", 1 << 16))
attempt("params", lambda: rootfs.read_file_in_root(fd, "/proc/version", 1 << 16, any_mount=True))
attempt("cache", lambda: ldmerge.read_image_cache(fd))
attempt("musl", lambda: inroot.update_musl_path(fd, "x86_64", ["/usr/lib/nvidia"]))
with open(root + "/vol/secret") as f:
    out["secret_after"] = f.read()
print(json.dumps(out))
"""


def can_unshare() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = ["unshare", "-m", "--propagation", "private", "true"]
    return subprocess.run(probe, capture_output=True, check=False, timeout=TIMEOUT).returncode == 0


@pytest.fixture(params=["openat2", "walk"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.skipif(not can_unshare(), reason="needs root and unshare -m")
def test_links_to_other_mounts_are_not_read(tmp_path: Path, mode: str) -> None:
    root = tmp_path / "root"
    for d in ("etc", "proc", "vol"):
        (root / d).mkdir(parents=True)
    (root / "etc/proc-link").symlink_to("/proc/version")  # harmless; /proc/kmsg in the attack
    (root / "etc/vol-link").symlink_to("../vol/secret")
    (root / "etc/ld.so.cache").symlink_to("/proc/self/status")
    (root / "etc/ld-musl-x86_64.path").symlink_to("/vol/secret")
    (root / "etc/plain").write_text("image file\n")
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    cmd = ["unshare", "-m", "--propagation", "private", sys.executable, str(script)]
    done = subprocess.run(
        [*cmd, str(root), mode], capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["proc"][0] == "InRootError" and out["proc"][1] == 18, out["proc"]  # EXDEV
    assert out["vol"][0] == "InRootError" and out["vol"][1] == 18, out["vol"]
    assert out["plain"] == ["ok", "image file\n"]  # a normal image is read as before
    assert out["params"][0] == "ok" and out["params"][1].startswith("Linux")  # the guard's read
    # the ld cache: not read, and the caller's fallback (ldconfig) serves
    assert out["cache"][0] == "ValueError" and "another mount" in out["cache"][1], out["cache"]
    # the musl path file: not read; replaced in the image's /etc by one of the root's own
    assert out["musl"] == ["ok", True]
    assert out["secret_after"] == "volume secret\n"
    musl = root / "etc/ld-musl-x86_64.path"
    assert not musl.is_symlink()
    assert "volume secret" not in musl.read_text()
    assert musl.read_text().startswith("/usr/lib/nvidia\n")


def test_compat_reader_never_opens_a_fifo(tmp_path: Path) -> None:
    """A FIFO in the compat folder (a co-tenant's race in prestart mode) is looked at, not
    opened: a writer blocked in open(2) stays blocked (an open for reading would wake it)."""
    fifo = tmp_path / "libcuda.so.999.1"
    os.mkfifo(fifo)
    opened = threading.Event()

    def writer() -> None:
        fd = os.open(fifo, os.O_WRONLY)  # blocks until someone opens the FIFO for reading
        opened.set()
        os.close(fd)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert cudacompat.note_drivers(dir_fd, fifo.name) is None
        assert not opened.wait(0.5), "the reader opened the FIFO"
    finally:
        os.close(dir_fd)
        unblock = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # let the writer go
        thread.join(5)
        os.close(unblock)
    assert opened.is_set()
