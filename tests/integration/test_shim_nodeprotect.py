"""A GPU container sees `ModifyDeviceFiles: 0` (hook/verbs/nodeprotect.py, hook/verbs/nodeguard.py),
through REAL runc: by gpuctk-runtime (its added `gpuctk-hook disable-device-node-modification`
entry) and by the spec's own createContainer hook entry, with no shim.

The machines tests run on load no NVIDIA driver: the container's procfs has no
/proc/driver/nvidia/params. runc refuses config.json mounts inside /proc, so an earlier
createContainer hook of the test (the container's mount namespace, before pivot_root) mounts a
tmpfs at the container's /proc/driver holding nvidia/params with `ModifyDeviceFiles: 1`, where
the driver's file would be. gpuctk's action runs after it and must cover that file with its copy.
Also: `gpuctk cdi generate --disable-hook create-symlinks` leaves the SONAME link out.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fixtures.gpucheck import PARAMS, Node, fake_driver_hook, generate, shim_edit
from fixtures.images import make_bundle, runtime_argv

pytestmark = pytest.mark.integration

SHIM = str(Path(sys.executable).with_name("gpuctk-runtime"))
LIBDIR = "/usr/lib/x86_64-linux-gnu/nvidia/current"
SHOW = "cat /proc/driver/nvidia/params; echo x > /proc/driver/nvidia/params || echo read-only"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, driver_root: Path) -> Node:
    if os.geteuid() != 0 or shutil.which("runc") is None:
        pytest.skip("runc containers need root and runc")
    base = tmp_path_factory.mktemp("nodeguard")
    return generate(base, driver_root, "h100-8", base / "cdi" / "nvidia.json")


@pytest.fixture(scope="module")
def no_symlinks(tmp_path_factory: pytest.TempPathFactory, driver_root: Path) -> Node:
    if os.geteuid() != 0 or shutil.which("runc") is None:
        pytest.skip("runc containers need root and runc")
    base = tmp_path_factory.mktemp("nodeguard-nolinks")
    out = base / "cdi" / "nvidia.json"
    return generate(base, driver_root, "h100-8", out, extra=("--disable-hook", "create-symlinks"))


def shim_create(
    node: Node, rootfs: Path, tmp_path: Path, script: str, conf: str = "", **env: str
) -> dict[str, Any]:
    """config.json after the shim's `create` (low-level runtime /bin/true)."""
    bundle = make_bundle(
        tmp_path / "bundle", rootfs, ["/bin/sh", "-c", script],
        env=["PATH=/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=0"],
        hooks={"createContainer": [fake_driver_hook(rootfs)]},
    )  # fmt: skip
    return shim_edit(bundle, node.spec_dir, tmp_path / "state", conf, **env)


def runc_run(config: dict[str, Any], tmp_path: Path, runtime: str = "runc") -> str:
    if shutil.which(runtime) is None:
        pytest.skip(f"{runtime} not installed")
    bundle = tmp_path / "run"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(config))
    done = subprocess.run(
        [*runtime_argv(runtime), "run", "--bundle", str(bundle), f"gpuctk-nodeguard-{os.getpid()}"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def guards(config: dict[str, Any]) -> list[list[str]]:
    return [
        h["args"]
        for h in config.get("hooks", {}).get("createContainer", [])
        if h["path"].endswith(("/gpuctk-hook", "/gpuctk-cdi-hook"))
    ]


def test_the_shim_adds_the_guard_and_the_container_sees_0(
    node: Node, fresh_rootfs: Callable[[str], Path], tmp_path: Path
) -> None:
    rootfs = fresh_rootfs("debian")
    config = shim_create(node, rootfs, tmp_path, SHOW)
    # the compiled front where it is installed beside gpuctk-hook: it guards in C
    front = Path(sys.executable).with_name("gpuctk-cdi-hook").exists()
    name = "gpuctk-cdi-hook" if front else "gpuctk-hook"
    assert guards(config) == [[name, "disable-device-node-modification"]]
    hooks = config["hooks"]["createContainer"]
    assert hooks[0]["path"] == "/bin/sh"  # the test's fake driver first, gpuctk's after it
    out = runc_run(config, tmp_path)
    assert "ModifyDeviceFiles: 0\nDeviceFileUID: 0\n" in out, out
    assert "ModifyDeviceFiles: 1" not in out and "read-only" in out, out
    assert not [p for p in os.listdir("/run") if p.startswith(".gpuctk-params-")]


def test_the_shim_setting_turns_the_guard_off(
    node: Node, fresh_rootfs: Callable[[str], Path], tmp_path: Path
) -> None:
    rootfs = fresh_rootfs("debian")
    conf = "disable-device-node-modification = false\n"
    config = shim_create(node, rootfs, tmp_path, SHOW, conf)
    assert guards(config) == []
    assert "ModifyDeviceFiles: 1" in runc_run(config, tmp_path)


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_the_spec_hook_guards_without_the_shim_in_root_work(
    node: Node, fresh_rootfs: Callable[[str], Path], tmp_path: Path, runtime: str
) -> None:
    rootfs = fresh_rootfs("debian")
    config = shim_create(node, rootfs, tmp_path, SHOW, GPUCTK_SHIM_INROOT="0")
    (args,) = guards(config)
    assert args[1] == "createContainer"  # the spec's own entry, run by the runtime as it stands
    out = runc_run(config, tmp_path, runtime)
    assert "ModifyDeviceFiles: 0" in out and "ModifyDeviceFiles: 1" not in out, out


def test_the_spec_hook_leaves_the_guard_out_when_the_shim_setting_says_so(
    node: Node, fresh_rootfs: Callable[[str], Path], tmp_path: Path
) -> None:
    rootfs = fresh_rootfs("debian")
    conf = "disable-device-node-modification = false\n"
    config = shim_create(node, rootfs, tmp_path, SHOW, conf, GPUCTK_SHIM_INROOT="0")
    (args,) = guards(config)
    assert args[-2:] == ["--disable-hook", "disable-device-node-modification"]
    assert "ModifyDeviceFiles: 1" in runc_run(config, tmp_path)


@pytest.mark.parametrize("inroot", ["1", "0"], ids=["shim", "hook"])
def test_disable_hook_create_symlinks_makes_no_soname_link(
    no_symlinks: Node, fresh_rootfs: Callable[[str], Path], tmp_path: Path, inroot: str
) -> None:
    rootfs = fresh_rootfs("debian")
    script = f"ls {LIBDIR}/libcuda.so.1 || echo no-link; ls {LIBDIR}/libcuda.so.535.309.01"
    config = shim_create(no_symlinks, rootfs, tmp_path, script, GPUCTK_SHIM_INROOT=inroot)
    assert not any("--link" in args for args in guards(config))
    out = runc_run(config, tmp_path)
    assert "no-link" in out and f"{LIBDIR}/libcuda.so.535.309.01" in out, out


def test_the_shim_guards_after_create_with_no_hook_process(
    node: Node, fresh_rootfs: Callable[[str], Path], tmp_path: Path
) -> None:
    """A `create --pid-file` on a host whose params file says 1 (the config's proc-root points
    at one): no hook entry; the shim guards the created container itself
    (hook/shim/nodeafter.py)."""
    rootfs = fresh_rootfs("debian")
    proc = tmp_path / "hostproc"
    (proc / "driver/nvidia").mkdir(parents=True)
    (proc / "driver/nvidia/params").write_text(PARAMS)
    toml = tmp_path / "gpuctk.toml"
    toml.write_text(f'runtimes = ["runc"]\nspec-dirs = ["{node.spec_dir}"]\nproc-root = "{proc}"\n')
    bundle = make_bundle(
        tmp_path / "bundle", rootfs, ["/bin/sh", "-c", SHOW],
        env=["PATH=/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=0"],
        hooks={"createContainer": [fake_driver_hook(rootfs)]},
    )  # fmt: skip
    name = f"gpuctk-nodeafter-{os.getpid()}"
    out = tmp_path / "out"
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "GPUCTK_CONFIG": str(toml)}
    try:
        err = tmp_path / "err"
        with out.open("w") as stdout, err.open("w") as stderr:  # the init keeps them open
            done = subprocess.run(
                [SHIM, "create", "--bundle", str(bundle), "--pid-file", str(tmp_path / "pid"),
                 name],
                env=env, stdout=stdout, stderr=stderr, timeout=60, check=False,
            )  # fmt: skip
        assert done.returncode == 0, err.read_text()
        assert guards(json.loads((bundle / "config.json").read_text())) == []
        subprocess.run(["runc", "start", name], check=True, timeout=30)
        for _ in range(200):
            state = subprocess.run(["runc", "state", name], capture_output=True, text=True)
            if '"stopped"' in state.stdout:
                break
            time.sleep(0.05)
        text = out.read_text()
        assert "ModifyDeviceFiles: 0\nDeviceFileUID: 0\n" in text, text
        assert "ModifyDeviceFiles: 1" not in text and "read-only" in text, text
        assert not [p for p in os.listdir("/run/gpuctk") if p.startswith(".params-")]
    finally:
        subprocess.run(["runc", "delete", "--force", name], capture_output=True, check=False)


@pytest.mark.parametrize("case", ["a process that is not the container", "create fails"])
def test_after_create_the_shim_checks_the_pid_and_keeps_the_runtime_status(
    node: Node, fresh_rootfs: Callable[[str], Path], tmp_path: Path, case: str
) -> None:
    """A pid file naming a process whose root is not the container's: exit 1, that process
    left alone; a runtime `create` that fails: its status, nothing guarded."""
    rootfs = fresh_rootfs("debian")
    proc = tmp_path / "hostproc"
    (proc / "driver/nvidia").mkdir(parents=True)
    (proc / "driver/nvidia/params").write_text(PARAMS)
    other = subprocess.Popen(["sleep", "60"])
    runtime = tmp_path / "fake-runtime"
    if case == "create fails":
        runtime.write_text("#!/bin/sh\nexit 3\n")
    else:
        runtime.write_text(f'#!/bin/sh\necho {other.pid} > "{tmp_path}/pid"\n')
    runtime.chmod(0o755)
    toml = tmp_path / "gpuctk.toml"
    toml.write_text(
        f'runtimes = ["{runtime}"]\nspec-dirs = ["{node.spec_dir}"]\nproc-root = "{proc}"\n'
    )
    bundle = make_bundle(
        tmp_path / "bundle", rootfs, ["/bin/true"], env=["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0"]
    )
    try:
        done = subprocess.run(
            [SHIM, "create", "--bundle", str(bundle), "--pid-file", str(tmp_path / "pid"), "c"],
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "GPUCTK_CONFIG": str(toml)},
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if case == "create fails":
            assert done.returncode == 3, done.stderr
        else:
            assert done.returncode == 1
            assert f"process {other.pid} has not {rootfs} as its root" in done.stderr
        assert other.poll() is None  # never signalled
    finally:
        other.kill()
        other.wait()
