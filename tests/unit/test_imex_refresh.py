"""An IMEX channel spec after a driver reload: the channels' major comes from /proc/devices and
can change, so a spec generated before would grant whatever device now holds the old number.

`gpuctk doctor` fails such a spec (cdi.imex) with the command that rewrites it; the refresh
unit's own imex line (run here with the venv's gpuctk) regenerates an existing spec, removes it
when no channel is left, and creates none. The node is fixtures.doctornode's (real files,
mknod'ed channel nodes, a /proc/devices of its own).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from fixtures.devroot import IMEX_MAJOR
from fixtures.doctornode import BIN, DoctorNode, l4_node

DEB = Path(__file__).resolve().parents[2] / "packaging" / "deb"
NEW_MAJOR = IMEX_MAJOR + 7


node = pytest.fixture(l4_node, name="node")


def gpuctk(node: DoctorNode, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "gpuctk"), *args], env=node.env, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip


def imex_spec(node: DoctorNode) -> Path:
    spec = node.spec_dir / "imex.yaml"
    roots = ("--dev-root", str(node.roots.dev_root), "--proc-root", str(node.roots.proc_root))
    done = gpuctk(node, "cdi", "generate", "--mode", "imex", *roots, "--output", str(spec))
    assert done.returncode == 0, done.stderr
    return spec


def reload_driver(node: DoctorNode, major: int | None, nodes_too: bool = False) -> None:
    """The IMEX driver loaded again with another major (or with no channels: None)."""
    devices = Path(node.roots.proc_root) / "devices"
    text = devices.read_text().replace(f"{IMEX_MAJOR} nvidia-caps-imex-channels\n", "")
    if major is not None:
        text = text.replace("\n\nBlock", f"\n{major} nvidia-caps-imex-channels\n\nBlock")
    devices.write_text(text)
    if nodes_too and major is not None:
        folder = Path(node.roots.dev_root) / "dev/nvidia-caps-imex-channels"
        for channel in folder.iterdir():
            minor = os.minor(channel.stat().st_rdev)
            channel.unlink()
            os.mknod(channel, 0o20666, os.makedev(major, minor))


def imex_check(node: DoctorNode) -> dict[str, object]:
    _, report, stderr = node.doctor()
    assert report, stderr
    return node.check(report, "cdi.imex")


def test_doctor_fails_a_spec_with_a_stale_major_and_its_fix_rewrites_it(
    node: DoctorNode,
) -> None:
    assert imex_check(node)["status"] == "skipped"  # the GPU spec names no channel
    spec = imex_spec(node)
    assert f"major: {IMEX_MAJOR}" in spec.read_text()
    assert imex_check(node)["status"] == "ok"
    reload_driver(node, NEW_MAJOR, nodes_too=True)
    check = imex_check(node)
    assert check["status"] == "failed"
    evidence = "\n".join(map(str, check["evidence"]))  # type: ignore[call-overload]
    assert f"{spec}: /dev/nvidia-caps-imex-channels/channel0 is {IMEX_MAJOR}:0" in evidence
    assert f"nvidia-caps-imex-channels major {NEW_MAJOR}" in evidence
    fix = shlex.split(str(check["fix"]))
    assert fix[:3] == ["gpuctk", "cdi", "generate"] and "--if-exists" in fix
    assert fix[fix.index("--mode") + 1] == "imex" and fix[fix.index("--output") + 1] == str(spec)
    done = gpuctk(node, *fix[1:])
    assert done.returncode == 0, done.stderr
    assert f"major: {NEW_MAJOR}" in spec.read_text()
    assert imex_check(node)["status"] == "ok"


def _imex_line() -> list[str]:
    (line,) = [
        line.split("=", 1)[1]
        for line in (DEB / "gpuctk-cdi-refresh.service").read_text().splitlines()
        if line.startswith("ExecStart=") and "--mode imex" in line
    ]
    (default,) = [
        line.split("=", 2)[2]
        for line in (DEB / "gpuctk-cdi-refresh.service").read_text().splitlines()
        if line.startswith("Environment=GPUCTK_IMEX_SPEC=")
    ]
    assert default == "/var/run/cdi/imex.yaml"
    return shlex.split(line.removeprefix("-"))


def run_unit_line(node: DoctorNode, spec: Path) -> subprocess.CompletedProcess[str]:
    argv = [
        str(BIN / "gpuctk") if w == "/usr/bin/gpuctk" else str(spec) if "IMEX_SPEC" in w else w
        for w in _imex_line()
    ]
    roots = ["--dev-root", str(node.roots.dev_root), "--proc-root", str(node.roots.proc_root)]
    return subprocess.run([*argv, *roots], env=node.env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


def test_the_refresh_unit_regenerates_an_existing_imex_spec(node: DoctorNode) -> None:
    absent = node.spec_dir / "imex.yaml"
    done = run_unit_line(node, absent)
    assert done.returncode == 0, done.stderr
    assert not absent.exists()  # none is created
    spec = imex_spec(node)
    reload_driver(node, NEW_MAJOR, nodes_too=True)
    done = run_unit_line(node, spec)
    assert done.returncode == 0, done.stderr
    text = spec.read_text()
    assert f"major: {NEW_MAJOR}" in text and f"major: {IMEX_MAJOR}" not in text


def test_the_refresh_unit_removes_a_spec_whose_channels_are_gone(node: DoctorNode) -> None:
    """The nodes still carry the old major, which /proc/devices no longer gives the IMEX
    driver (or gives none): no channel is left, and the stale spec goes."""
    spec = imex_spec(node)
    reload_driver(node, None)
    assert imex_check(node)["status"] == "failed"
    done = run_unit_line(node, spec)
    assert done.returncode == 0, done.stderr
    assert f"removed {spec}, no device left" in done.stderr
    assert not spec.exists()
    assert imex_check(node)["status"] == "skipped"
