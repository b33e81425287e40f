"""gpuctk-hook as a createContainer hook under REAL runc and crun.

Each container starts on a fresh overlay of a pristine image (tests/fixtures/images.py) with a
host library bind-mounted read-only at /usr/lib/x86_64-linux-gnu/nvidia/current/libfoo.so.1.2.3,
as a CDI spec mounts a driver library, and the hook entry the generator writes:
`gpuctk-hook createContainer --link libfoo.so.1.2.3::<dir>/libfoo.so.1 --folder <dir>` with an
explicit env. Inside, the container proves the result the way a CUDA program needs it: the
library loads by SONAME from a folder the loader only knows through the ld cache (or musl's path
file), and `ldconfig -p` lists it where the image has an ldconfig.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fixtures.images import hook_path, make_bundle, run_container, runtime_argv, unique_name

pytestmark = pytest.mark.integration

FOLDER = "/usr/lib/x86_64-linux-gnu/nvidia/current"
HOOK_ENV = [
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "GPUCTK_DRIVER_VERSION=535.309.01",
    "GPUCTK_CUDA_VERSION=12.2",
    "GPUCTK_GPUS=0",
]
RUNTIMES = ["runc", "crun"]


def _need(runtime: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("real runtimes need root")
    if shutil.which(runtime) is None:
        pytest.skip(f"{runtime} not installed")
    if not os.path.exists(hook_path()):
        pytest.skip("gpuctk-hook console script not installed in the venv")


def _hook(*extra: str) -> dict[str, list[dict[str, Any]]]:
    args = ["gpuctk-hook", "createContainer", "--link", f"libfoo.so.1.2.3::{FOLDER}/libfoo.so.1"]
    return {
        "createContainer": [
            {"path": hook_path(), "args": [*args, "--folder", FOLDER, *extra], "env": HOOK_ENV}
        ]
    }


def _run(
    runtime: str,
    tmp_path: Path,
    rootfs: Path,
    libfoo: Path,
    script: str,
    hook_args: tuple[str, ...] = (),
    **kw: Any,
) -> str:
    mount = {
        "destination": f"{FOLDER}/libfoo.so.1.2.3",
        "type": "bind",
        "source": str(libfoo),
        "options": ["rbind", "ro", "nosuid", "nodev"],
    }
    bundle = make_bundle(
        tmp_path / "bundle",
        rootfs,
        ["/bin/sh", "-c", script],
        hooks=_hook(*hook_args),
        mounts=[mount],
        **kw,
    )
    done = run_container(runtime_argv(runtime), bundle, unique_name(f"gpuctk-hook-{runtime}"))
    assert done.returncode == 0, f"{runtime} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_debian_image_finds_the_library_by_soname(
    runtime: str, tmp_path: Path, fresh_rootfs: Any, libfoo: Path
) -> None:
    _need(runtime)
    rootfs = fresh_rootfs("debian")
    out = _run(runtime, tmp_path, rootfs, libfoo, "ldconfig -p; dlopen-test libfoo.so.1")
    assert f"libfoo.so.1 (libc6,x86-64) => {FOLDER}/libfoo.so.1" in out
    assert "OK libfoo.so.1" in out
    assert os.readlink(rootfs / FOLDER.lstrip("/") / "libfoo.so.1") == "libfoo.so.1.2.3"
    conf = (rootfs / "etc/ld.so.conf.d/00-gpuctk.conf").read_text()
    assert FOLDER in conf.splitlines()


def test_control_without_the_hook_the_library_is_not_found(
    tmp_path: Path, fresh_rootfs: Any, libfoo: Path
) -> None:
    _need("runc")
    rootfs = fresh_rootfs("debian")
    mount = {
        "destination": f"{FOLDER}/libfoo.so.1.2.3",
        "type": "bind",
        "source": str(libfoo),
        "options": ["rbind", "ro"],
    }
    script = f"dlopen-test libfoo.so.1 {FOLDER}/libfoo.so.1.2.3"
    bundle = make_bundle(tmp_path / "b", rootfs, ["/bin/sh", "-c", script], mounts=[mount])
    done = run_container(runtime_argv("runc"), bundle, unique_name("gpuctk-hook-control"))
    assert "FAIL libfoo.so.1" in done.stdout
    assert f"OK {FOLDER}/libfoo.so.1.2.3" in done.stdout


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_image_without_ld_so_conf(
    runtime: str, tmp_path: Path, fresh_rootfs: Any, libfoo: Path
) -> None:
    _need(runtime)
    rootfs = fresh_rootfs("no-ldsoconf")
    out = _run(
        runtime,
        tmp_path,
        rootfs,
        libfoo,
        "cat /etc/ld.so.conf; ldconfig -p; dlopen-test libfoo.so.1",
    )
    assert "include /etc/ld.so.conf.d/*.conf" in out
    assert f"=> {FOLDER}/libfoo.so.1" in out
    assert "OK libfoo.so.1" in out


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_image_without_ldconfig_uses_the_host_one(
    runtime: str, tmp_path: Path, fresh_rootfs: Any, libfoo: Path
) -> None:
    _need(runtime)
    rootfs = fresh_rootfs("no-ldconfig")
    out = _run(runtime, tmp_path, rootfs, libfoo, "dlopen-test libfoo.so.1")
    assert "OK libfoo.so.1" in out
    cache = rootfs / "etc/ld.so.cache"
    listing = subprocess.run(
        ["/sbin/ldconfig", "-p", "-C", str(cache)], capture_output=True, text=True, check=True
    ).stdout
    assert f"=> {FOLDER}/libfoo.so.1" in listing
    assert not (rootfs / "sbin/ldconfig").exists()


PROBE_C = r"""
#include <fcntl.h>
#include <unistd.h>
int main(void) {  /* stands in for ldconfig: leaves a file its host uid and gid own */
    return open("/tmp/probe-made", O_WRONLY | O_CREAT | O_EXCL, 0644) < 0;
}
"""


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_host_ldconfig_runs_unprivileged_in_a_real_container(
    runtime: str, tmp_path: Path, fresh_rootfs: Any, libfoo: Path
) -> None:
    """Run by runc and crun (the hook in the container's pid and mount namespaces, with the
    host's /proc), the named host ldconfig builds the cache the container uses and makes the
    SONAME link, as host uid/gid 65534 in its own user namespace: a probe in its place makes
    a file that 65534 owns."""
    _need(runtime)
    rootfs = fresh_rootfs("debian")
    (rootfs / FOLDER.lstrip("/")).mkdir(parents=True, exist_ok=True)
    shutil.copy(libfoo, rootfs / FOLDER.lstrip("/") / "libfoo.so.1.2.3")  # no link, no entry
    named = ("--ldconfig-path", "/sbin/ldconfig")
    out = _run(runtime, tmp_path, rootfs, libfoo, "ldconfig -p; dlopen-test libfoo.so.1", named)
    assert f"libfoo.so.1 (libc6,x86-64) => {FOLDER}/libfoo.so.1" in out
    assert "OK libfoo.so.1" in out
    assert os.readlink(rootfs / FOLDER.lstrip("/") / "libfoo.so.1") == "libfoo.so.1.2.3"
    assert (rootfs / "etc/ld.so.cache").stat().st_uid == 0
    assert not [p for p in (rootfs / "etc").iterdir() if "gpuctk-ldconfig" in p.name]

    source, probe = tmp_path / "probe.c", tmp_path / "probe"
    source.write_text(PROBE_C)
    if subprocess.run(["gcc", "-static", "-o", str(probe), str(source)], check=False).returncode:
        pytest.skip("gcc -static unavailable (libc6-dev's libc.a)")
    rootfs = fresh_rootfs("debian")
    (rootfs / "tmp").mkdir(exist_ok=True)
    (rootfs / "tmp").chmod(0o1777)
    (tmp_path / "second").mkdir()
    _run(runtime, tmp_path / "second", rootfs, libfoo, "true", ("--ldconfig-path", str(probe)))
    made = (rootfs / "tmp/probe-made").stat()
    assert (made.st_uid, made.st_gid) == (65534, 65534), "ldconfig ran as host root"


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_musl_image_gets_the_folder_in_its_path_file(
    runtime: str, tmp_path: Path, fresh_rootfs: Any, libfoo: Path
) -> None:
    _need(runtime)
    rootfs = fresh_rootfs("musl")
    out = _run(
        runtime, tmp_path, rootfs, libfoo, "cat /etc/ld-musl-x86_64.path; dlopen-test libfoo.so.1"
    )
    assert FOLDER in out.splitlines()
    assert "OK libfoo.so.1" in out
    assert not (rootfs / "etc/ld.so.cache").exists()
    assert not (rootfs / "etc/ld.so.conf.d").exists()


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_read_only_root_stays_read_only(
    runtime: str, tmp_path: Path, fresh_rootfs: Any, libfoo: Path
) -> None:
    _need(runtime)
    rootfs = fresh_rootfs("debian")
    script = "dlopen-test libfoo.so.1; touch /probe 2>&1 || echo RO-OK"
    out = _run(runtime, tmp_path, rootfs, libfoo, script, readonly=True)
    assert "OK libfoo.so.1" in out
    assert "RO-OK" in out
    assert not (rootfs / "probe").exists()


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_planted_ldconfig_and_preload_never_run(
    runtime: str, tmp_path: Path, fresh_rootfs: Any, libfoo: Path
) -> None:
    _need(runtime)
    rootfs = fresh_rootfs("debian")
    marker = tmp_path / "host-marker"
    fake = rootfs / "sbin/ldconfig"
    fake.unlink()
    fake.write_text(f"#!/bin/sh\necho ran > /ldconfig-ran\necho ran > {marker}\n")
    fake.chmod(0o755)
    out = _run(runtime, tmp_path, rootfs, libfoo, "dlopen-test libfoo.so.1")
    assert "OK libfoo.so.1" in out
    assert not (rootfs / "ldconfig-ran").exists()
    assert not marker.exists()


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_unknown_verb_never_blocks_a_container(
    runtime: str, tmp_path: Path, fresh_rootfs: Any
) -> None:
    _need(runtime)
    rootfs = fresh_rootfs("debian")
    hooks = {
        "createContainer": [
            {
                "path": hook_path(),
                "args": ["gpuctk-hook", "verb-from-2030", "--x", "y"],
                "env": HOOK_ENV,
            }
        ]
    }
    bundle = make_bundle(tmp_path / "b", rootfs, ["/bin/sh", "-c", "echo started"], hooks=hooks)
    done = run_container(runtime_argv(runtime), bundle, unique_name(f"gpuctk-hook-{runtime}"))
    assert done.returncode == 0, done.stderr
    assert "started" in done.stdout


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_hook_error_fails_the_container_with_its_message(
    runtime: str, tmp_path: Path, fresh_rootfs: Any
) -> None:
    """runc shows a failing hook's stderr; crun 1.8 does not (only `exit code: 1`), so the
    message must also be in the hook's log file (GPUCTK_HOOK_LOG in the hook entry's env)."""
    _need(runtime)
    rootfs = fresh_rootfs("debian")
    log = tmp_path / "hook.log"
    args = ["gpuctk-hook", "update-ldcache", "--folder", "/lib", "--ldconfig-path", "/bin/true"]
    env = [*HOOK_ENV, f"GPUCTK_HOOK_LOG={log}"]
    hooks = {"createContainer": [{"path": hook_path(), "args": args, "env": env}]}
    bundle = make_bundle(tmp_path / "b", rootfs, ["/bin/sh", "-c", "echo started"], hooks=hooks)
    done = run_container(runtime_argv(runtime), bundle, unique_name(f"gpuctk-hook-{runtime}"))
    assert done.returncode != 0
    assert "started" not in done.stdout
    assert "level=error" in log.read_text() and "dynamically linked" in log.read_text()
    if runtime == "runc":
        assert "dynamically linked" in done.stderr
