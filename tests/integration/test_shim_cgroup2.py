"""gpuctk-runtime in front of REAL runc (and crun) on cgroup v2, where devices are eBPF-filtered.

This host runs cgroup v1; each container runs in `unshare -m` with cgroup2 mounted on
/sys/fs/cgroup (ARCHITECTURE.md), so runc sees a unified hierarchy and enforces the spec's
`linux.resources.devices` with an eBPF device program instead of devices.allow. The shim only
edits config.json; the device rules it adds there are what runc compiles into that program.

The spec comes from `gpuctk cdi generate --simulate` (h100-8, and a100-mig for the MIG device)
over the Debian 535 driver root and mknod'ed nodes. Inside each container:

- /proc/self/cgroup: runc placed the container in a cgroup of its own on the v2 hierarchy (the
  `0::` line), while its v1 devices cgroup is the root one, which filters nothing: any EPERM
  below comes from the eBPF program;
- exactly the requested /dev/nvidia*, /dev/nvidia-caps/* and /dev/dri/* nodes;
- opening each injected GPU node gives ENXIO: the eBPF program let the open through and there is
  no driver behind it;
- a node the container makes itself with mknod (a GPU it did NOT request, runc's default rules
  allow mknod of any node) gives EPERM on open: the device program really is enforcing, and it
  is the shim's rules that let the requested nodes through;
- `ldconfig -p` lists libcuda.so.1 (the createContainer hook ran).

crun is tried the same way, after a probe that runs PLAIN crun (no shim) on cgroup v2: on this
host crun 1.8.1 cannot start any container there (see _skip_unless_crun_runs_on_v2), so its cases
skip with crun's own message; where crun can run, they run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.gpucheck import SCRIPT, Node, check_nodes, need_runtime, seen, shim_machines
from fixtures.images import make_bundle, run_container, unique_name

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
SHIM = str(BIN / "gpuctk-runtime")
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The shim (and so the runtime it execs) in a private mount namespace with cgroup2 on
# /sys/fs/cgroup: the namespace, and the mount, go when the runtime exits.
V2 = 'mount -t cgroup2 none /sys/fs/cgroup && exec "$0" "$@"'
# After SCRIPT (fixtures.gpucheck): the container's cgroup lines, and the open of a node made
# inside the container for a device that was not requested.
PROBE = r"""
sed 's/^/CGROUP /' /proc/self/cgroup
mknod /dev/unrequested c 195 MINOR && (: < /dev/unrequested) 2>&1 | sed 's/^/MKNOD /'
true
"""
_CRUN_V2: dict[str, str | None] = {}  # why plain crun cannot run on cgroup v2 here (probed once)


@pytest.fixture(scope="module")
def machines(tmp_path_factory: pytest.TempPathFactory, driver_root: Path) -> dict[str, Node]:
    return shim_machines(tmp_path_factory.mktemp("shim-v2-machines"), driver_root)


@pytest.fixture
def shim_v2(
    tmp_path: Path, fresh_rootfs: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., subprocess.CompletedProcess[str]]]:
    """Factory: (runtime, node, env, unrequested_minor) -> the finished `run` through the shim."""
    count = 0

    def run(
        runtime: str, node: Node, env: list[str], minor: int
    ) -> subprocess.CompletedProcess[str]:
        nonlocal count
        count += 1
        need_runtime(runtime)
        if runtime == "crun":
            _skip_unless_crun_runs_on_v2(tmp_path, fresh_rootfs)
        toml = tmp_path / f"gpuctk-{count}.toml"
        toml.write_text(
            f'runtimes = ["{shutil.which(runtime)}"]\nspec-dirs = ["{node.spec_dir}"]\n'
            f'log-file = "{tmp_path}/gpuctk.log"\n'
        )
        monkeypatch.setenv("GPUCTK_CONFIG", str(toml))
        script = SCRIPT + PROBE.replace("MINOR", str(minor))
        bundle = make_bundle(
            tmp_path / f"bundle-{count}",
            fresh_rootfs("debian"),
            ["/bin/sh", "-c", script],
            env=[PATH_ENV, *env],
        )
        config = json.loads((bundle / "config.json").read_text())
        for caps in config["process"]["capabilities"].values():
            caps.append("CAP_MKNOD")  # so that the container can make its own node
        (bundle / "config.json").write_text(json.dumps(config))
        argv = ["unshare", "-m", "sh", "-c", V2, SHIM]
        name = unique_name(f"gpuctk-shim-v2-{runtime}")
        try:
            return run_container(argv, bundle, name)
        finally:
            remove_v2_cgroup(name)

    yield run


def remove_v2_cgroup(name: str) -> None:
    """rmdir the container's (empty) cgroup on the v2 hierarchy, if the runtime left it."""
    script = 'mount -t cgroup2 none /sys/fs/cgroup && rmdir "/sys/fs/cgroup/$0" 2>/dev/null; true'
    subprocess.run(["unshare", "-m", "sh", "-c", script, name], capture_output=True, check=False)


def _skip_unless_crun_runs_on_v2(tmp_path: Path, fresh_rootfs: Callable[[str], Path]) -> None:
    """Skip when PLAIN crun (no shim, no GPU) cannot run `true` on cgroup v2 on this host.

    crun 1.8.1 raises RLIMIT_MEMLOCK to infinity before it loads its eBPF device program, even
    on kernels (5.11+) that account BPF memory to the memory cgroup and need no memlock, and it
    fails the container when that setrlimit fails. Here root lacks CAP_SYS_RESOURCE and the hard
    memlock limit is 8 MiB, so it always fails ("setrlimit (RLIM_MEMLOCK): Operation not
    permitted"): a limit of this host, not of gpuctk. Where crun can run, the tests run.
    """
    if "crun" not in _CRUN_V2:
        bundle = make_bundle(tmp_path / "crun-probe", fresh_rootfs("debian"), ["/bin/true"])
        name = unique_name("gpuctk-crun-v2")
        try:
            done = run_container(["unshare", "-m", "sh", "-c", V2, "crun"], bundle, name)
        finally:
            remove_v2_cgroup(name)  # a failed crun create leaves its cgroup behind
        _CRUN_V2["crun"] = None if done.returncode == 0 else done.stderr.strip()
    reason = _CRUN_V2["crun"]
    if reason is not None:
        pytest.skip(f"plain crun cannot run on cgroup v2 here (no shim involved): {reason}")


def check_v2(done: subprocess.CompletedProcess[str], expected: set[str]) -> None:
    """check_nodes, plus: on cgroup v2, and an unrequested mknod'ed node is blocked (EPERM)."""
    check_nodes(done, expected)
    cgroups = dict(line.split(":", 2)[1:] for line in seen(done.stdout, "CGROUP"))
    assert cgroups[""] not in ("", "/"), done.stdout  # runc put it in its own v2 cgroup
    assert cgroups.get("devices", "/") == "/", done.stdout  # and no v1 devices cgroup filters it
    (line,) = seen(done.stdout, "MKNOD")
    assert "Operation not permitted" in line, done.stdout  # EPERM: the device program blocks it
    assert "LDCACHE libcuda.so.1" in done.stdout.splitlines()


RUNTIMES = ["runc", "crun"]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_one_gpu(runtime: str, machines: dict[str, Node], shim_v2: Callable[..., Any]) -> None:
    node = machines["h100-8"]
    done = shim_v2(runtime, node, ["NVIDIA_VISIBLE_DEVICES=0"], 1)
    check_v2(done, node.nodes("0"))
    assert "/dev/nvidia0" in seen(done.stdout, "NODE")
    assert "/dev/nvidia1" not in seen(done.stdout, "NODE")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_mig_device(runtime: str, machines: dict[str, Node], shim_v2: Callable[..., Any]) -> None:
    node = machines["a100-mig"]
    done = shim_v2(runtime, node, ["NVIDIA_VISIBLE_DEVICES=1:0"], 0)
    expected = node.nodes("1:0")
    assert "/dev/nvidia1" in expected and any("/nvidia-caps/" in p for p in expected)
    check_v2(done, expected)
    assert "/dev/nvidia0" not in seen(done.stdout, "NODE")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_all_gpus(runtime: str, machines: dict[str, Node], shim_v2: Callable[..., Any]) -> None:
    node = machines["h100-8"]
    # every GPU is requested: the unrequested node is a minor no GPU has (195:200)
    done = shim_v2(runtime, node, ["NVIDIA_VISIBLE_DEVICES=all"], 200)
    check_v2(done, node.nodes("all"))
    assert {f"/dev/nvidia{i}" for i in range(8)} <= seen(done.stdout, "NODE")
