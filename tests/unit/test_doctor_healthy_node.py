"""`gpuctk doctor` on a healthy node the way real ones are (an H200 node, say): persistence mode
on without nvidia-persistenced, and no /dev/nvidia-modeset on a headless compute node, are no
warnings. Persistence mode is what NVML says (the fake NVML answers it here)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from fixtures.doctornode import DoctorNode, generate_spec, l4_node
from fixtures.fake_nvml import write_fake_profile

from gpuctk.cdi.node.profile import load_profile

node = pytest.fixture(l4_node, name="node")


def _nvml_persistence(node: DoctorNode, on: bool) -> None:
    """NVML (the fake) reports persistence mode `on` for every GPU."""
    write_fake_profile(load_profile(node.profile), Path(node.env["FAKE_NVML_PROFILE"]), on)


def _no_daemon(node: DoctorNode) -> None:
    for sock in node.sockets:
        if sock.getsockname().endswith("socket"):
            sock.close()
    (node.host / "var/run/nvidia-persistenced/socket").unlink()


def _bad(report: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["status"] for c in report["checks"] if c["status"] in ("warning", "failed")}


def test_persistence_mode_on_without_the_daemon_is_healthy(node: DoctorNode) -> None:
    _nvml_persistence(node, True)
    _no_daemon(node)
    code, report, stderr = node.doctor()
    assert code == 0, (_bad(report), stderr)
    check = node.check(report, "driver.persistence")
    assert check["status"] == "ok"
    assert "NVML: persistence mode enabled on all 1 GPU(s)" in check["evidence"]
    assert any("nvidia-persistenced is not running (optional" in e for e in check["evidence"])


def test_persistence_mode_off_is_a_warning_even_with_the_daemons_socket(node: DoctorNode) -> None:
    _nvml_persistence(node, False)
    code, report, _ = node.doctor()
    assert _bad(report) == {"driver.persistence": "warning"} and code == 1
    check = node.check(report, "driver.persistence")
    assert check["evidence"][0].startswith("NVML: persistence mode disabled on GPU(s) 0")
    assert check["fix"].startswith("systemctl enable --now nvidia-persistenced")


def test_a_headless_node_without_nvidia_modeset_is_healthy(node: DoctorNode) -> None:
    modeset = node.roots.dev_root / "dev/nvidia-modeset"
    modeset.unlink()
    for link in (node.host / "dev/char").iterdir():
        if os.readlink(link).endswith("nvidia-modeset"):
            link.unlink()
    # the spec as generate writes it on such a node: no modeset node either
    generate_spec(node.spec, node.profile, node.driver_root, node.roots, node.env)
    code, report, stderr = node.doctor()
    assert code == 0, (_bad(report), stderr)
    check = node.check(report, "driver.device-nodes")
    assert check["status"] == "ok"
    assert any(e.startswith(f"{modeset}: absent: normal on a headless node")
               for e in check["evidence"])  # fmt: skip


def test_a_wrong_nvidia_modeset_node_still_fails(node: DoctorNode) -> None:
    modeset = node.roots.dev_root / "dev/nvidia-modeset"
    modeset.unlink()
    os.mknod(modeset, 0o20666, os.makedev(195, 253))
    code, report, _ = node.doctor()
    assert code == 2
    check = node.check(report, "driver.device-nodes")
    assert check["status"] == "failed"
    assert f"{modeset}: is 195:253, the driver says 195:254" in check["evidence"]
