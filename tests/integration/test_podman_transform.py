"""`gpuctk cdi transform root` in podman 4.3.1: a spec generated where the driver sat at one
root, moved to another, runs.

The Debian driver root is bind-mounted at A, the spec generated over A (the mounts library
mode: no hook), then A is unmounted and the same files are mounted at B, as a containerised
driver's files are seen at /run/nvidia/driver on the node and at / in the generating
container. The transformed spec mounts the libraries from B; the spec as generated names A,
which no longer exists, and podman refuses it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.devroot import make_node_roots
from fixtures.gpucheck import BIN
from fixtures.podman import CdiPodman, private_podman

from gpuctk.cdi.node.profile import load_profile

pytestmark = pytest.mark.integration

IMAGE = "localhost/gpuctk-test-debian:latest"
TRIPLET = "/usr/lib/x86_64-linux-gnu"


def gpuctk(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(BIN / "gpuctk"), *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory, driver_root: Path) -> Iterator[dict[str, Path]]:
    if os.geteuid() != 0 or shutil.which("podman") is None:
        pytest.skip("needs root and podman")
    work = tmp_path_factory.mktemp("transform")
    a, b = work / "a", work / "b"
    a.mkdir()
    b.mkdir()
    roots = make_node_roots(work / "node", load_profile("l4"))
    subprocess.run(["mount", "--bind", str(driver_root), str(a)], check=True)
    try:
        dirs = {"generated": work / "generated", "moved": work / "moved"}
        for d in dirs.values():
            d.mkdir()
        gpuctk(
            "cdi", "generate", "--simulate", "l4", "--library-mode", "mounts",
            "--driver-capabilities", "utility,compute",
            "--driver-root", str(a), "--dev-root", str(roots.dev_root),
            "--proc-root", str(roots.proc_root), "--sys-root", str(roots.sys_root),
            "--output", str(dirs["generated"] / "nvidia.json"),
        )  # fmt: skip
    finally:
        subprocess.run(["umount", str(a)], check=True)
    gpuctk(
        "cdi", "transform", "root", "--from", str(a), "--to", str(b),
        "-o", str(dirs["moved"] / "nvidia.json"), str(dirs["generated"] / "nvidia.json"),
    )  # fmt: skip
    moved = json.loads((dirs["moved"] / "nvidia.json").read_text())
    sources = [m["hostPath"] for m in moved["containerEdits"]["mounts"]]
    assert sources and all(s.startswith(f"{b}/") for s in sources), sources
    subprocess.run(["mount", "--bind", str(driver_root), str(b)], check=True)
    try:
        yield dirs
    finally:
        subprocess.run(["umount", str(b)], check=False)


@pytest.fixture(scope="module")
def podman(specs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiPodman]:
    Path("/run/cdi").mkdir(parents=True, exist_ok=True)
    with private_podman(tmp_path_factory.mktemp("transform-podman"), IMAGE) as base:
        yield CdiPodman(base, specs, IMAGE)


def run(podman: CdiPodman, spec: str) -> subprocess.CompletedProcess[str]:
    return podman.run(f"ls {TRIPLET}/libcuda.so.1 {TRIPLET}/libnvidia-ml.so.1", spec=spec)


def test_the_moved_spec_runs_from_the_new_root(podman: CdiPodman) -> None:
    done = run(podman, "moved")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{TRIPLET}/libcuda.so.1" in done.stdout.split()


def test_the_spec_as_generated_names_the_old_root(podman: CdiPodman) -> None:
    done = run(podman, "generated")
    assert done.returncode != 0, done.stdout
