"""`gpuctk install` / `uninstall` against a fake node root, run as the DaemonSet runs them.

The fake node: /usr is an overlay of this machine's /usr (writes land in an upper folder, so
what install put under /usr is exactly that folder), /bin, /lib... link into it as on Debian,
/var/run is an ABSOLUTE link to /run (install must resolve it inside the root), and
/etc/containerd holds a real kubeadm-style config. The application copied is the relocatable
venv the deb ships (packaging/deb/build.py venv), run from its own interpreter, not the
development venv. containerd 1.6 then dumps the node's config chrooted into the root, so
imports resolve as on the node.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures.appvenv import app_venv, have_system_python
from fixtures.containerd import CRI, SYSTEMD_SANDBOX, have_containerd

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (overlay mounts, chroot)"),
    pytest.mark.skipif(not have_containerd(), reason="containerd is not installed"),
    pytest.mark.skipif(not have_system_python(), reason="no /usr/bin/python3"),
]

CLI = "import sys; from gpuctk.cli import main; main(sys.argv[1:])"


def snapshot(root: Path) -> dict[str, object]:
    """Every entry under root: file bytes, link targets (not followed), folders as None."""
    out: dict[str, object] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path))
            else:
                out[rel] = None if path.is_dir() else (path.stat().st_mode, path.read_bytes())
    return out


class Node:
    def __init__(self, base: Path) -> None:
        self.root = base / "host"
        self.upper = base / "usr-upper"
        self.restarts = base / "restarts"

    def state(self) -> dict[str, Any]:
        """Everything install may touch: /etc, /run, /var, and what was written under /usr."""
        usr = {  # folders the overlay copied up because something was written below them
            k: v
            for k, v in snapshot(self.upper).items()
            if v is not None or not Path("/usr", k).is_dir()
        }
        return {d: snapshot(self.root / d) for d in ("etc", "run", "var")} | {"usr": usr}

    def gpuctk(self, *argv: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        venv = app_venv()
        return subprocess.run(
            [str(venv / "bin" / "python3"), "-I", "-c", CLI, *argv],
            capture_output=True,
            text=True,
            check=False,
            **kw,
        )

    def install_argv(self, *extra: str) -> list[str]:
        restart = f"sh -c 'echo restart >> {self.restarts}'"
        return [
            "install",
            "--host-root",
            str(self.root),
            "--simulate",
            "h100-8",
            "--config-source",
            "command",
            "--restart-command",
            restart,
            *extra,
        ]

    def chroot(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["chroot", str(self.root), *argv],
            capture_output=True,
            text=True,
            check=False,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        )

    def dump(self) -> dict[str, Any]:
        proc = self.chroot(
            "containerd", "--config", "/etc/containerd/config.toml", "config", "dump"
        )
        assert proc.returncode == 0, proc.stderr
        return tomllib.loads(proc.stdout)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path)
    root = n.root
    (root / "usr").mkdir(parents=True)
    n.upper.mkdir()
    (tmp_path / "usr-work").mkdir()
    opts = f"lowerdir=/usr,upperdir={n.upper},workdir={tmp_path / 'usr-work'}"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(root / "usr")], check=True)
    try:
        for name in ("bin", "sbin", "lib", "lib64"):
            if os.path.islink(f"/{name}"):
                (root / name).symlink_to(os.readlink(f"/{name}"))
        for d in ("etc/containerd", "run", "var/lib", "tmp"):
            (root / d).mkdir(parents=True)
        (root / "tmp").chmod(0o1777)
        (root / "var" / "run").symlink_to("/run")
        (root / "etc" / "containerd" / "config.toml").write_text(SYSTEMD_SANDBOX)
        yield n
    finally:
        subprocess.run(["umount", "-l", str(root / "usr")], check=False)


def _restarts(node: Node) -> int:
    return len(node.restarts.read_text().splitlines()) if node.restarts.exists() else 0


def test_install_twice_then_uninstall(node: Node) -> None:
    before_dump = node.dump()
    pristine = node.state()

    proc = node.gpuctk(*node.install_argv("--restart"))
    assert proc.returncode == 0, proc.stderr
    root = node.root
    # 1. the copy, with gpuctk's marker; 2. isolated launchers naming the copy's interpreter
    assert (root / "usr/local/gpuctk/bin/python3").exists()
    assert (root / "usr/local/gpuctk/.gpuctk-install.json").is_file()
    for name in ("gpuctk", "gpuctk-runtime", "gpuctk-hook"):
        text = (root / "usr/local/bin" / name).read_text()
        if name == "gpuctk-runtime":  # the sh front: Python only for create/run, isolated
            assert text.startswith("#!/bin/sh\n")
            assert '\nexec /usr/local/gpuctk/bin/python3 -IS -c "$pycode"' in text
        else:
            assert text.startswith("#!/usr/local/gpuctk/bin/python3 -I")  # isolated mode
    # the launchers work on the node, from the copy alone (not the checkout or the cache)
    ver = node.chroot("/usr/local/bin/gpuctk", "--version")
    assert ver.returncode == 0 and "gpuctk" in ver.stdout, ver.stderr
    where = node.chroot(
        "/usr/local/gpuctk/bin/python3", "-I", "-c", "import gpuctk.cli; print(gpuctk.cli.__file__)"
    )
    assert where.stdout.startswith("/usr/local/gpuctk/lib/"), where
    # 3. the spec: /var/run -> /run resolved inside the node's root, host paths inside
    spec = yaml.safe_load((root / "run/cdi/nvidia.yaml").read_text())
    assert {d["name"] for d in spec["devices"]} >= {"0", "7", "all"}
    assert [h["path"] for h in spec["containerEdits"]["hooks"]] == ["/usr/local/bin/gpuctk-hook"]
    # 4. containerd, as containerd 1.6 itself reads it on the node
    after = node.dump()
    runtimes = after["plugins"][CRI]["containerd"]["runtimes"]
    assert runtimes["nvidia"]["options"]["BinaryName"] == "/usr/local/bin/gpuctk-runtime"
    assert runtimes["nvidia"]["options"]["SystemdCgroup"] is True
    assert runtimes["runc"] == before_dump["plugins"][CRI]["containerd"]["runtimes"]["runc"]
    assert after["plugins"][CRI]["sandbox_image"] == "registry.example.com/pause:3.9"
    assert "/etc/containerd/conf.d/99-gpuctk.toml" in after["imports"]
    # 5. restarted once, because the configuration changed
    assert _restarts(node) == 1

    installed = node.state()
    again = node.gpuctk(*node.install_argv("--restart"))
    assert again.returncode == 0, again.stderr
    assert "unchanged" in again.stdout and "already configured" in again.stdout
    assert _restarts(node) == 1  # nothing changed: no restart
    assert node.state() == installed

    gone = node.gpuctk(
        "uninstall",
        "--host-root",
        str(root),
        "--restart-command",
        f"sh -c 'echo restart >> {node.restarts}'",
        "--restart",
    )
    assert gone.returncode == 0, gone.stderr
    assert _restarts(node) == 2
    assert node.state() == pristine
    assert node.dump() == before_dump

    nothing = node.gpuctk("uninstall", "--host-root", str(root))
    assert nothing.returncode == 0 and "nothing to uninstall" in nothing.stdout


def test_without_restart_flag_nothing_is_restarted(node: Node) -> None:
    proc = node.gpuctk(*node.install_argv())
    assert proc.returncode == 0, proc.stderr
    assert "restart containerd to apply" in proc.stdout
    assert _restarts(node) == 0
    assert node.gpuctk("uninstall", "--host-root", str(node.root)).returncode == 0
    assert _restarts(node) == 0


def test_sigterm_uninstalls(node: Node) -> None:
    """The DaemonSet's container: install, wait, and on SIGTERM undo everything, exit 0."""
    pristine = node.state()
    venv = app_venv()
    proc = subprocess.Popen(
        [
            str(venv / "bin/python3"),
            "-I",
            "-c",
            CLI,
            *node.install_argv("--restart", "--uninstall-on-exit"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # blocks until install is done (no timing involved)
            if "waiting for SIGTERM" in line:
                break
        else:
            proc.wait()
            pytest.fail(f"install ended early: exit {proc.returncode}")
        assert (node.root / "etc/containerd/conf.d/99-gpuctk.toml").is_file()
        assert (node.root / "run/cdi/nvidia.yaml").is_file()
        # the agent only waits: no process of its own runs on the node meanwhile
        assert Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text() == ""
        proc.send_signal(signal.SIGTERM)
        assert proc.wait() == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _restarts(node) == 2  # configured, then unconfigured
    assert node.state() == pristine


def test_generation_failure_leaves_containerd_alone(node: Node) -> None:
    config = node.root / "etc/containerd/config.toml"
    before = config.read_bytes()
    proc = node.gpuctk("install", "--host-root", str(node.root), "--simulate", "no-such-profile")
    assert proc.returncode != 0
    assert "CDI spec generation failed" in proc.stderr
    assert config.read_bytes() == before
    assert not (node.root / "etc/containerd/conf.d").exists()
    # what was copied is recorded, so uninstall still cleans up
    assert node.gpuctk("uninstall", "--host-root", str(node.root)).returncode == 0
    assert not (node.root / "usr/local/gpuctk").exists()
    assert not (node.upper / "local/bin/gpuctk").exists()


def test_node_without_containerd_config(node: Node) -> None:
    """containerd on its defaults (no config.toml): install creates it, uninstall removes it."""
    (node.root / "etc/containerd/config.toml").unlink()
    pristine = node.state()
    proc = node.gpuctk(*node.install_argv("--config-source", "file"))
    assert proc.returncode == 0, proc.stderr
    runtimes = node.dump()["plugins"][CRI]["containerd"]["runtimes"]
    assert runtimes["nvidia"]["options"]["BinaryName"] == "/usr/local/bin/gpuctk-runtime"
    assert runtimes["runc"]["runtime_type"] == "io.containerd.runc.v2"  # the built-in kept
    assert node.gpuctk("uninstall", "--host-root", str(node.root)).returncode == 0
    assert node.state() == pristine
