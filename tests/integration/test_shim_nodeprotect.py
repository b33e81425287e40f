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


@pytest.mark.parametrize("host", ["1", "0"])
def test_a_pid_file_create_gets_the_entry_whatever_the_hosts_params_say(
    node: Node, fresh_rootfs: Callable[[str], Path], tmp_path: Path, host: str
) -> None:
    """A `create --pid-file` as containerd, podman and CRI-O run it, a host params file at
    /proc (a config's proc-root, read by nothing, pointing at one that says 1 or 0): the
    config gets the C guard's entry either way (the rule the compiled create's plans follow),
    and the container, whose own file says 1, sees 0 and cannot write it."""
    rootfs = fresh_rootfs("debian")
    proc = tmp_path / "hostproc"
    (proc / "driver/nvidia").mkdir(parents=True)
    (proc / "driver/nvidia/params").write_text(PARAMS.replace("s: 1", f"s: {host}"))
    toml = tmp_path / "gpuctk.toml"
    toml.write_text(f'runtimes = ["runc"]\nspec-dirs = ["{node.spec_dir}"]\nproc-root = "{proc}"\n')
    bundle = make_bundle(
        tmp_path / "bundle", rootfs, ["/bin/sh", "-c", SHOW],
        env=["PATH=/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=0"],
        hooks={"createContainer": [fake_driver_hook(rootfs)]},
    )  # fmt: skip
    name = f"gpuctk-pidfile-{os.getpid()}"
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
        config = json.loads((bundle / "config.json").read_text())
        assert guards(config) == [["gpuctk-cdi-hook", "disable-device-node-modification"]]
        subprocess.run(["runc", "start", name], check=True, timeout=30)
        for _ in range(200):
            state = subprocess.run(["runc", "state", name], capture_output=True, text=True)
            if '"stopped"' in state.stdout:
                break
            time.sleep(0.05)
        text = out.read_text()
        assert "ModifyDeviceFiles: 0\nDeviceFileUID: 0\n" in text, text
        assert "ModifyDeviceFiles: 1" not in text and "read-only" in text, text
    finally:
        subprocess.run(["runc", "delete", "--force", name], capture_output=True, check=False)
