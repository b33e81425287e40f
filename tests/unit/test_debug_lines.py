"""`gpuctk --debug cdi generate`, `runtime configure|unconfigure` and `doctor`: debug lines on
stderr (`gpuctk: debug: ...`), never stdout; without --debug (or with --quiet) none, and standard
output the same byte for byte either way."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from fixtures.containerd import SYSTEMD_SANDBOX, gpuctk
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


def test_runtime_configure_and_unconfigure_trace_their_plan(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    main, drop_in = tmp_path / "config.toml", tmp_path / "conf.d" / "99-gpuctk.toml"
    main.write_text(SYSTEMD_SANDBOX)
    (tmp_path / "conf.d").mkdir()
    paths = ["--config", str(main), "--drop-in", str(drop_in)]
    argv = ["runtime", "configure", "--config-source", "file", *paths]
    dry = [*argv, "--dry-run", "--set-as-default", "--cdi-enabled"]
    code, plain_out, plain_err = gpuctk(capsys, *dry)
    assert code == 0 and debug_lines(plain_err) == []
    code, out, err = gpuctk(capsys, "--debug", *dry)
    assert code == 0 and out == plain_out and PREFIX not in out
    lines = debug_lines(err)
    assert lines[:4] == [
        f"runtime configure: engine containerd, handler 'nvidia' (shim mode), main config "
        f"{main}, drop-in {drop_in}, config source file",
        "containerd binary: not asked (--config-source file): the files alone count",
        f"main config {main}: read, version 2, imports tables replaced, containerd 1.x; "
        f"drop-in {drop_in}: absent",
        "main config edit: import the drop-in (new keys: imports)",
    ]
    assert "CRI table from 1 file(s) (main config, imports; not the drop-in): 4 key(s)" in lines
    assert (
        f"drop-in {drop_in}: version 2, plugins.io.containerd.grpc.v1.cri: a copy of the CRI "
        "table (4 key(s)) with containerd.runtimes.nvidia, containerd.default_runtime_name, "
        "enable_cdi, cdi_spec_dirs (options from handler 'runc')"
    ) in lines
    assert lines[-3:] == [
        f"plan: write {drop_in} (containerd drop-in)",
        f"plan: write {main}.gpuctk-backup (backup of the main config)",
        f"plan: write {main} (containerd main config)",
    ]
    code, _, err = gpuctk(capsys, "--debug", "--quiet", *dry)
    assert code == 0 and debug_lines(err) == []

    assert gpuctk(capsys, *argv)[0] == 0  # written: a second run changes nothing
    code, out, err = gpuctk(capsys, "--debug", *argv)
    assert code == 0 and out == "nothing to change: the configuration is already in place\n"
    assert "main config edit: none, it imports the drop-in" in debug_lines(err)
    assert f"plan: write {drop_in} (containerd drop-in): unchanged, skipped" in debug_lines(err)
    code, plain_out, _ = gpuctk(capsys, "runtime", "unconfigure", "--dry-run", *paths)
    code, out, err = gpuctk(capsys, "--debug", "runtime", "unconfigure", "--dry-run", *paths)
    assert code == 0 and out == plain_out
    lines = debug_lines(err)
    assert f'drop-in {drop_in}: gpuctk-state: {{"added": ["imports"], "created": false, ' \
        '"dirs": [], "files": []}' in lines  # fmt: skip
    assert f"plan: remove {drop_in} (containerd drop-in)" in lines


@pytest.mark.skipif(shutil.which("containerd") is None, reason="needs the containerd binary")
def test_runtime_configure_traces_the_containerd_it_asks(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    main, drop_in = tmp_path / "config.toml", tmp_path / "99-gpuctk.toml"
    main.write_text(SYSTEMD_SANDBOX)
    binary = shutil.which("containerd")
    argv = ["runtime", "configure", "--dry-run", "--config-source", "command",
            "--config", str(main), "--drop-in", str(drop_in)]  # fmt: skip
    code, plain_out, _ = gpuctk(capsys, *argv)
    code, out, err = gpuctk(capsys, "--debug", *argv)
    assert code == 0 and out == plain_out
    lines = debug_lines(err)
    assert any(line.startswith(f"containerd binary: {binary}, version ") for line in lines)
    assert f"`{binary} config dump` (the drop-in left out): layout version 2" in lines


def test_doctor_traces_each_layer_and_check(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node with nothing but a spec and a containerd config under --host-root, NVML
    simulated: one line of inputs per layer, one line per check, the report unchanged."""
    monkeypatch.delenv("GPUCTK_CONFIG", raising=False)
    spec_dir, main = tmp_path / "cdi", tmp_path / "etc/containerd/config.toml"
    spec_dir.mkdir()
    main.parent.mkdir(parents=True)
    main.write_text(SYSTEMD_SANDBOX)
    code, _, _ = gpuctk(capsys, "cdi", "generate", "--simulate", "h100-8",
                        "--output", str(spec_dir / "nvidia.yaml"))  # fmt: skip
    assert code == 0
    argv = ["doctor", "--simulate", "h100-8", "--host-root", str(tmp_path),
            "--driver-root", str(tmp_path), "--dev-root", str(tmp_path),
            "--proc-root", str(tmp_path / "proc"), "--sys-root", str(tmp_path / "sys"),
            "--spec-dir", str(spec_dir), "--config-source", "file"]  # fmt: skip
    _, plain_out, plain_err = gpuctk(capsys, *argv, "--format", "json")
    assert json.loads(plain_out)["exitCode"] == 2 and debug_lines(plain_err) == []
    _, out, err = gpuctk(capsys, "--debug", *argv, "--format", "json")
    assert out == plain_out and PREFIX not in out
    lines = debug_lines(err)
    layers = [line.split(" layer reads: ")[0] for line in lines if " layer reads: " in line]
    order = ("driver", "nvml", "runtime", "cdi", "engine", "kubernetes", "probe")
    assert layers == [f"doctor: {layer}" for layer in order]
    assert (
        f"doctor: driver layer reads: driver root {tmp_path}, dev root {tmp_path}, proc root "
        f"{tmp_path}/proc, sys root {tmp_path}/sys, host root {tmp_path}"
    ) in lines
    assert "doctor: nvml layer reads: machine profile h100-8 (--simulate), NVML not loaded" in lines
    runtime = f"doctor: runtime layer reads: runtime config {tmp_path}/etc/gpuctk/config.toml"
    assert any(line.startswith(f"{runtime} (default, absent); PATH ") for line in lines)
    assert (
        f"doctor: cdi layer reads: spec dirs {spec_dir} (a folder) (from --spec-dir); "
        "kind nvidia.com/gpu"
    ) in lines
    assert f"doctor: CDI spec files read: {spec_dir}/nvidia.yaml" in lines
    assert f"doctor: containerd config from the files (plugin tables replaced): {main}" in lines
    checks = json.loads(out)["checks"]
    for check in checks:  # one line per check, with its status and first evidence
        mine = [line for line in lines if line.startswith(f"doctor: {check['id']}: ")]
        assert mine == [mine[0]] and mine[0].startswith(
            f"doctor: {check['id']}: {check['status']}: {(check['evidence'] or ['no evidence'])[0]}"
        ), (check, mine)
    assert f"doctor: driver.module: failed: {tmp_path}/proc/driver/nvidia/version: missing" \
        in " ".join(lines)  # fmt: skip
    table = gpuctk(capsys, *argv)[1]
    assert "(exit 2)" in table and gpuctk(capsys, "--debug", *argv)[1] == table

    def broken(ctx: object, found: object) -> list[object]:
        raise RuntimeError("boom")

    monkeypatch.setattr("gpuctk.doctor.k8s.k8s_checks", broken)
    _, out, err = gpuctk(capsys, "--debug", *argv, "--format", "json")
    assert "kubernetes.internal" in {c["id"] for c in json.loads(out)["checks"]}
    assert "doctor: kubernetes layer failed: traceback: Traceback (most recent call last):" \
        in debug_lines(err)  # fmt: skip
    assert "RuntimeError: boom" in err
