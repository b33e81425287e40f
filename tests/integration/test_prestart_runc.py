"""REAL runc with `gpuctk-hook prestart` in config.json and NO shim.

The spec comes from `gpuctk cdi generate --simulate h100-8` over the Debian 535 driver root and
mknod'ed device nodes, in a temp spec dir named by the hook's GPUCTK_CONFIG. Each container runs
on a fresh overlay of the debian image; config.json is never rewritten: everything the container
gets comes from the hook, in the container's mount namespace and device cgroup. Inside:

- exactly the requested /dev/nvidia* nodes: /dev/nvidia0 plus the control nodes for
  NVIDIA_VISIBLE_DEVICES=0, no /dev/nvidia1, and the GPU's /dev/dri nodes only when
  NVIDIA_DRIVER_CAPABILITIES asks for graphics;
- opening /dev/nvidia0 gives ENXIO (the device cgroup allows it; no driver behind it), while a
  GPU node bind-mounted by config.json without a cgroup rule (/dev/blocked-gpu) gives EPERM: the
  cgroup does filter, and the hook's rule is what lets nvidia0 through;
- libcuda.so.535.309.01 mounted at its path and `ldconfig -p` listing libcuda.so.1;
- NVIDIA_DRIVER_CAPABILITIES=utility: no libcuda; NVIDIA_VISIBLE_DEVICES unset: nothing at all.

The same under cgroup v2 (runc in `unshare -m` with cgroup2 mounted on /sys/fs/cgroup, where it
attaches an eBPF device program that the hook replaces). After every run the host's mount table
is what it was before.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures import gpucheck
from fixtures.devroot import make_node_roots
from fixtures.images import hook_path, make_bundle, run_container, unique_name

from gpuctk.cdi.node.profile import load_profile

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
LIBDIR = "/usr/lib/x86_64-linux-gnu/nvidia/current"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CONTROL = {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}
SCRIPT = r"""
for f in /dev/nvidia* /dev/nvidia-caps/* /dev/dri/*; do [ -c "$f" ] && echo "NODE $f"; done
for f in /dev/nvidia[0-9]* /dev/blocked-gpu; do
    [ -c "$f" ] && (: < "$f") 2>&1 | sed "s|^|OPEN $f |"
done
ls LIBDIR 2>/dev/null | sed 's/^/LIB /'
ldconfig -p | grep -q 'libcuda.so.1 ' && echo LDCACHE libcuda.so.1
awk '$5 ~ /libcuda.so.535.309.01$/ {print "MOUNTOPTS", $6}' /proc/self/mountinfo
true
""".replace("LIBDIR", LIBDIR)
V2 = 'mount -t cgroup2 none /sys/fs/cgroup && exec runc "$@"'


class Node:
    """The simulated machine: spec dir, its gpuctk config file and the mknod'ed nodes."""

    def __init__(self, base: Path, driver_root: Path) -> None:
        self.roots = make_node_roots(base / "node", load_profile("h100-8"))
        self.spec_dir = base / "cdi"
        self.spec_dir.mkdir()
        cmd = [
            str(BIN / "gpuctk"), "cdi", "generate", "--simulate", "h100-8",
            "--driver-root", str(driver_root), "--dev-root", str(self.roots.dev_root),
            "--proc-root", str(self.roots.proc_root), "--sys-root", str(self.roots.sys_root),
            "--hook-path", hook_path(), "--output", str(self.spec_dir / "nvidia.json"),
            "--library-mode", "hook",
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        self.spec: dict[str, Any] = json.loads((self.spec_dir / "nvidia.json").read_text())
        self.toml = base / "gpuctk.toml"
        self.toml.write_text(f'spec-dirs = ["{self.spec_dir}"]\n')

    def nodes(self, name: str, drm: bool = False) -> set[str]:
        """The spec's nodes for device `name` (fixtures.gpucheck.Node.nodes)."""
        return gpucheck.Node(self.spec_dir, self.spec).nodes(name, drm=drm)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, driver_root: Path) -> Node:
    if os.geteuid() != 0 or shutil.which("runc") is None:
        pytest.skip("needs root and runc")
    return Node(tmp_path_factory.mktemp("prestart-runc"), driver_root)


CHECKOUT = Path(__file__).resolve().parents[2]


def mountinfo(base: Path) -> list[str]:
    """The host's mounts that involve this checkout or this run's pytest folder `base` (a
    leaked bind shows there, by its source or its target); other processes may mount
    elsewhere meanwhile."""
    ours = (f" {CHECKOUT}/", f" {base}/")
    with open("/proc/self/mountinfo") as f:
        return sorted(line for line in f.read().splitlines() if any(o in line for o in ours))


@pytest.fixture
def prestart(
    node: Node, tmp_path: Path, fresh_rootfs: Callable[[str], Path]
) -> Iterator[Callable[..., subprocess.CompletedProcess[str]]]:
    """Factory: (env, cgroup2=False, readonly=False, stage="prestart", prepare=None) -> the
    finished `runc run`; `prepare` gets the rootfs before the container starts."""
    count = 0

    def run(
        env: list[str],
        cgroup2: bool = False,
        readonly: bool = False,
        stage: str = "prestart",
        prepare: Callable[[Path], object] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        nonlocal count
        count += 1
        rootfs = fresh_rootfs("debian")
        if prepare is not None:
            prepare(rootfs)
        hook = {
            "path": hook_path(),
            "args": ["gpuctk-hook", stage],
            "env": [PATH_ENV, f"GPUCTK_CONFIG={node.toml}", f"GPUCTK_HOOK_LOG={tmp_path}/hook.log"],
        }
        blocked = {
            "destination": "/dev/blocked-gpu",
            "type": "bind",
            "source": str(node.roots.dev_root / "dev/nvidia7"),
            "options": ["rbind", "nosuid"],
        }
        bundle = make_bundle(
            tmp_path / f"bundle-{count}",
            rootfs,
            ["/bin/sh", "-c", SCRIPT],
            env=[PATH_ENV, *env],
            hooks={stage: [hook]},
            mounts=[blocked],
            readonly=readonly,
        )
        config_before = (bundle / "config.json").read_bytes()
        argv = ["unshare", "-m", "sh", "-c", V2, "runc"] if cgroup2 else ["runc"]
        before = mountinfo(tmp_path.parent)
        done = run_container(argv, bundle, unique_name("gpuctk-prestart"))
        assert mountinfo(tmp_path.parent) == before  # nothing left mounted on the host
        assert (bundle / "config.json").read_bytes() == config_before  # no shim involved
        return done

    yield run


def seen(out: str, tag: str) -> set[str]:
    return {line.split(" ", 1)[1] for line in out.splitlines() if line.startswith(tag + " ")}


def opened(out: str, path: str) -> str:
    lines = [ln for ln in out.splitlines() if ln.startswith(f"OPEN {path} ")]
    assert len(lines) == 1, out
    return lines[0]


def check_gpu0(node: Node, done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    nodes = seen(done.stdout, "NODE")
    assert nodes == node.nodes("0")
    assert {n for n in nodes if n.startswith("/dev/nvidia")} == CONTROL | {"/dev/nvidia0"}
    assert "/dev/nvidia1" not in nodes
    assert "No such device or address" in opened(done.stdout, "/dev/nvidia0")  # ENXIO: allowed
    assert "Operation not permitted" in opened(done.stdout, "/dev/blocked-gpu")  # EPERM: blocked
    assert "libcuda.so.535.309.01" in seen(done.stdout, "LIB")
    assert "LDCACHE libcuda.so.1" in done.stdout.splitlines()
    (opts,) = seen(done.stdout, "MOUNTOPTS")
    assert {"ro", "nosuid", "nodev"} <= set(opts.split(","))  # mounted read-only


@pytest.mark.parametrize("stage", ["prestart", "createRuntime"])
def test_one_gpu(node: Node, prestart: Any, stage: str) -> None:
    check_gpu0(node, prestart(["NVIDIA_VISIBLE_DEVICES=0"], stage=stage))


def test_one_gpu_cgroup_v2(node: Node, prestart: Any) -> None:
    check_gpu0(node, prestart(["NVIDIA_VISIBLE_DEVICES=0"], cgroup2=True))


def test_one_gpu_readonly_root(node: Node, prestart: Any) -> None:
    check_gpu0(node, prestart(["NVIDIA_VISIBLE_DEVICES=0"], readonly=True))


def test_driver_capabilities_utility(node: Node, prestart: Any) -> None:
    done = prestart(["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=utility"])
    assert done.returncode == 0, done.stderr
    libs = seen(done.stdout, "LIB")
    assert "libnvidia-ml.so.535.309.01" in libs
    assert not any(lib.startswith("libcuda.so") for lib in libs)
    assert "LDCACHE libcuda.so.1" not in done.stdout
    assert "No such device or address" in opened(done.stdout, "/dev/nvidia0")


def test_graphics_brings_the_drm_nodes(node: Node, prestart: Any) -> None:
    """The /dev/dri card and render nodes come with graphics (or display) only, as in the
    NVIDIA runtime's legacy mode; the default (utility,compute) leaves them out."""
    done = prestart(["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute,graphics"])
    assert done.returncode == 0, done.stderr
    nodes = seen(done.stdout, "NODE")
    drm = node.nodes("0", drm=True) - node.nodes("0")
    assert drm and {p for p in drm if p.startswith("/dev/dri/renderD")}
    assert nodes == node.nodes("0", drm=True)


def test_nothing_requested(node: Node, prestart: Any, tmp_path: Path) -> None:
    done = prestart([])
    assert done.returncode == 0, done.stderr
    assert seen(done.stdout, "NODE") == set()
    assert "Operation not permitted" in opened(done.stdout, "/dev/blocked-gpu")
    assert not seen(done.stdout, "LIB") and "LDCACHE" not in done.stdout
    log = tmp_path / "hook.log"
    assert not log.exists() or "injected" not in log.read_text()


def test_failure_inside_the_container_leaves_nothing(node: Node, prestart: Any) -> None:
    # a folder where the spec mounts a file: the hook fails after other mounts were made
    def prepare(rootfs: Path) -> None:
        (rootfs / LIBDIR.lstrip("/") / "libcuda.so.535.309.01").mkdir(parents=True)

    done = prestart(["NVIDIA_VISIBLE_DEVICES=0"], prepare=prepare)  # mountinfo checked there
    assert done.returncode != 0
    assert "cannot mount" in done.stderr and "libcuda.so.535.309.01" in done.stderr


def test_unknown_device_fails_cleanly(node: Node, prestart: Any) -> None:
    done = prestart(["NVIDIA_VISIBLE_DEVICES=9"])
    assert done.returncode != 0
    assert "nvidia.com/gpu=9" in done.stderr and "known:" in done.stderr
