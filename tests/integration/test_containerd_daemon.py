"""containerd 1.6 started with the configured files registers the handler, and runc survives.

The daemon runs on a private socket, root and state folder, in its own mount namespace with a
fresh /run (see fixtures.containerd.PrivateContainerd): the host's containerd is not touched.
The CRI plugin logs the configuration it starts with; `ctr plugins ls` shows whether it loaded.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.containerd import (
    SHIM,
    SYSTEMD_SANDBOX,
    PrivateContainerd,
    can_run_daemon,
    gpuctk,
    private_config,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not can_run_daemon(), reason="needs root, containerd, ctr and unshare"),
]


@pytest.fixture
def short_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short folder: the daemon's socket path must fit in sun_path (108 bytes)."""
    return tmp_path_factory.mktemp("ctd", numbered=True)


@pytest.fixture
def daemon(short_tmp: Path) -> Iterator[PrivateContainerd]:
    main = short_tmp / "etc" / "config.toml"
    main.parent.mkdir()
    main.write_text(SYSTEMD_SANDBOX)
    wrapper = private_config(short_tmp, main)
    instance = PrivateContainerd(short_tmp, wrapper)
    try:
        yield instance
    finally:
        instance.stop()


def cri_start_config(log: str) -> str:
    found: list[str] = re.findall(r'msg="Start cri plugin with config (\{.*?\})"', log)
    assert found, log[-3000:]
    return found[-1]


def runtime_entry(config: str, name: str) -> str:
    """The `name:{...}` entry of the Runtimes map in the CRI plugin's logged config."""
    match = re.search(r"Runtimes:map\[(.*?)\] NoPivot", config)
    assert match, config
    entry = re.search(rf"(?:^| ){name}:(\{{.*?BaseRuntimeSpec:[^ ]* [^}}]*\}})", match.group(1))
    assert entry, match.group(1)
    return entry.group(1)


@pytest.mark.parametrize("mode", ["shim", "hook"])
def test_daemon_registers_handler_and_keeps_runc(
    daemon: PrivateContainerd, capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    etc = daemon.base / "etc"
    code, _, err = gpuctk(
        capsys,
        "runtime",
        "configure",
        "--config",
        str(etc / "config.toml"),
        "--drop-in",
        str(etc / "conf.d" / "99-gpuctk.toml"),
        "--mode",
        mode,
        "--set-as-default",
    )
    assert code == 0, err
    daemon.start()

    plugins = daemon.ctr("plugins", "ls").stdout
    cri = [line for line in plugins.splitlines() if re.search(r"\bgrpc\.v1\s+cri\b", line)]
    assert cri and cri[0].split()[-1] == "ok", plugins  # base spec (hook mode) loaded fine

    config = cri_start_config(daemon.log.read_text())
    assert "DefaultRuntimeName:nvidia" in config
    assert "SandboxImage:registry.example.com/pause:3.9" in config
    assert "ConfigPath:/etc/containerd/certs.d" in config
    assert "MaxContainerLogLineSize:65536" in config
    runc = runtime_entry(config, "runc")
    assert "Type:io.containerd.runc.v2" in runc and "SystemdCgroup:true" in runc
    assert "PodAnnotations:[io.example/trace]" in runc
    nvidia = runtime_entry(config, "nvidia")
    assert "Type:io.containerd.runc.v2" in nvidia and "SystemdCgroup:true" in nvidia
    assert "ContainerAnnotations:[cdi.k8s.io/*]" in nvidia
    if mode == "shim":
        assert f"BinaryName:{SHIM}" in nvidia
    else:
        assert f"BaseRuntimeSpec:{etc}/conf.d/99-gpuctk.base-spec.json" in nvidia
