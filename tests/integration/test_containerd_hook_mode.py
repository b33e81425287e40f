"""--mode hook: the base OCI spec gpuctk writes is a complete spec runc runs, with the hook.

containerd's CRI plugin starts each container of the handler from this file (CRI cannot be driven
here without a pod sandbox image), so the test does what CRI does with it: takes the spec, sets
the process and the root, and has the real runc run it. The hook (a recording script standing in
for gpuctk-hook) must run as a prestart hook, get the OCI state on stdin and ONLY the explicit
env the spec gives it, never the container's. Then the same file with the REAL gpuctk-hook
(`--hook-config` naming a temp spec dir) gives a container GPU 0 and nothing else.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures.containerd import gpuctk
from fixtures.gpucheck import SCRIPT, check_nodes, generate, seen
from fixtures.images import hook_path, run_container, unique_name

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("runc") is None, reason="needs root and runc"
    ),
]


def minimal_rootfs(root: Path) -> None:
    """/bin/sh and the libraries it needs, copied from the host."""
    sh = os.path.realpath("/bin/sh")
    out = subprocess.run(["ldd", sh], capture_output=True, text=True, check=True).stdout
    files = [sh] + [p for p in out.split() if p.startswith("/")]
    for path in files:
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    (root / "bin").mkdir(exist_ok=True)
    if not (root / "bin" / "sh").exists():
        os.symlink(sh, root / "bin" / "sh")


def test_runc_runs_base_spec_with_prestart_hook(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = tmp_path / "record"
    record.mkdir()
    hook = tmp_path / "hook.sh"
    hook.write_text(
        f'#!/bin/sh\ncat > {record}/state.json\nenv > {record}/env\necho "$@" > {record}/args\n'
    )
    hook.chmod(0o755)
    etc = tmp_path / "etc"
    code, _, err = gpuctk(
        capsys,
        "runtime",
        "configure",
        "--config-source",
        "file",
        "--config",
        str(etc / "config.toml"),
        "--drop-in",
        str(etc / "conf.d" / "99-gpuctk.toml"),
        "--mode",
        "hook",
        "--hook-path",
        str(hook),
        "--create",
    )
    assert code == 0, err
    spec = json.loads((etc / "conf.d" / "99-gpuctk.base-spec.json").read_text())

    bundle = tmp_path / "bundle"
    minimal_rootfs(bundle / "rootfs")
    spec["process"]["args"] = ["/bin/sh", "-c", "echo ran > /proof"]
    spec["process"]["env"] = ["PATH=/bin", "LD_PRELOAD=/container-only.so", "SECRET=container"]
    spec["root"] = {"path": "rootfs"}
    (bundle / "config.json").write_text(json.dumps(spec))
    container = f"gpuctk-hook-mode-{uuid.uuid4().hex[:8]}"
    proc = subprocess.run(
        ["runc", "--root", str(tmp_path / "runc"), "run", "--bundle", str(bundle), container],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert (bundle / "rootfs" / "proof").read_text() == "ran\n"  # the spec is complete

    state = json.loads((record / "state.json").read_text())
    assert state["id"] == container and state["bundle"] == str(bundle)
    assert (record / "args").read_text() == "prestart\n"  # argv[0] gpuctk-hook, then the verb
    env = dict(line.split("=", 1) for line in (record / "env").read_text().splitlines())
    assert env["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert "LD_PRELOAD" not in env and "SECRET" not in env  # not the container's environment


def test_written_base_spec_gives_gpus_with_the_real_hook(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    driver_root: Path,
    fresh_rootfs: Callable[[str], Path],
) -> None:
    """The base spec as written (real gpuctk-hook, --hook-config naming a temp spec dir), with
    only the process and root set as CRI sets them, run by real runc: GPU 0 and nothing else.

    Needs no CRI client; test_containerd_hook_gpu drives the same file through containerd's CRI.
    """
    node = generate(tmp_path / "node", driver_root, "h100-8", tmp_path / "cdi" / "nvidia.json")
    toml = tmp_path / "gpuctk.toml"
    toml.write_text(f'spec-dirs = ["{node.spec_dir}"]\n')
    etc = tmp_path / "etc"
    code, _, err = gpuctk(
        capsys,
        "runtime", "configure", "--config-source", "file",
        "--config", str(etc / "config.toml"), "--drop-in", str(etc / "conf.d" / "99-gpuctk.toml"),
        "--mode", "hook", "--hook-path", hook_path(), "--hook-config", str(toml), "--create",
    )  # fmt: skip
    assert code == 0, err
    spec = json.loads((etc / "conf.d" / "99-gpuctk.base-spec.json").read_text())
    spec["process"]["args"] = ["/bin/sh", "-c", SCRIPT]
    spec["process"]["env"] = ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "NVIDIA_VISIBLE_DEVICES=0"]
    spec["root"] = {"path": str(fresh_rootfs("debian"))}
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(spec))
    done = run_container(["runc"], bundle, unique_name("gpuctk-hook-mode-gpu"))
    check_nodes(done, node.nodes("0"))
    assert "/dev/nvidia1" not in seen(done.stdout, "NODE")
    assert "LDCACHE libcuda.so.1" in done.stdout.splitlines()
