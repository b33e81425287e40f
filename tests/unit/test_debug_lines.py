"""`gpuctk --debug cdi generate`: debug lines on stderr (`gpuctk: debug: ...`), never stdout;
without --debug none, and standard output the same byte for byte either way."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fixtures.containerd import gpuctk
from fixtures.devroot import make_node_roots
from fixtures.fake_nvml import write_fake_profile

from gpuctk.cdi.node.profile import load_profile

PREFIX = "gpuctk: debug: "


def debug_lines(err: str) -> list[str]:
    return [line.removeprefix(PREFIX) for line in err.splitlines() if line.startswith(PREFIX)]


def test_simulate_prints_debug_lines_only_with_debug(capsys: pytest.CaptureFixture[str]) -> None:
    code, plain_out, plain_err = gpuctk(capsys, "cdi", "generate", "--simulate", "h100-8")
    assert code == 0 and debug_lines(plain_err) == []
    code, out, err = gpuctk(capsys, "--debug", "cdi", "generate", "--simulate", "h100-8")
    assert code == 0
    assert out == plain_out  # stdout is the spec alone, with or without --debug
    assert PREFIX not in out
    lines = debug_lines(err)
    assert "driver root /, dev root /, proc root /proc, sys root /sys" in lines
    assert "profile h100-8: driver 535.309.01, CUDA 12.2, 8 GPU(s)" in lines
    gpus = [line for line in lines if line.startswith("GPU ")]
    assert len(gpus) == 8 and gpus[0].startswith("GPU 0: NVIDIA H100 80GB HBM3 GPU-")
    assert any(line.startswith("--mode nvml, library mode hook (asked: auto)") for line in lines)
    assert lines[-1].endswith("bytes of yaml for standard output")


def test_nvml_and_stage_are_traced(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, driver_root: Path, fake_nvml_lib: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the device nodes of the node roots need mknod (root)")
    roots = make_node_roots(tmp_path / "node", load_profile("h100-8-mig7"))
    os.environ["FAKE_NVML_PROFILE"] = str(write_fake_profile("h100-8-mig7", tmp_path / "p.txt"))
    try:
        code, out, err = gpuctk(
            capsys, "--debug", "cdi", "generate", "--nvml-library", str(fake_nvml_lib),
            "--driver-root", str(driver_root), "--dev-root", str(roots.dev_root),
            "--proc-root", str(roots.proc_root), "--sys-root", str(roots.sys_root),
            "--staging-dir", str(tmp_path / "stages"), "--output", str(tmp_path / "s.yaml"),
        )  # fmt: skip
    finally:
        del os.environ["FAKE_NVML_PROFILE"]
    assert code == 0, err
    assert out == ""
    lines = debug_lines(err)
    assert f"NVML: loading {fake_nvml_lib} (--nvml-library)" in lines
    assert any(line.startswith("MIG device 0:0: ") for line in lines)
    assert any(line.startswith("--mode nvml, library mode folder (asked: auto)") for line in lines)
    assert f"staging the driver in {tmp_path / 'stages'} (an identical stage is reused)" in lines
    assert any(line.endswith(f"bytes of yaml for {tmp_path / 's.yaml'}") for line in lines)
