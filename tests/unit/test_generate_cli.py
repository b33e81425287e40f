"""`gpuctk cdi generate` as a user runs it: the real CLI, the fake NVML, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

GPUCTK = str(Path(sys.executable).with_name("gpuctk"))
OLD = b"# an existing spec that a failed run must leave alone\n"


def run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPUCTK, "cdi", "generate", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


@pytest.fixture
def existing(tmp_path: Path) -> Path:
    out = tmp_path / "nvidia.yaml"
    out.write_bytes(OLD)
    return out


def assert_failed_cleanly(p: subprocess.CompletedProcess[str], code: int, words: str) -> None:
    assert p.returncode == code, p.stderr
    lines = p.stderr.strip().splitlines()
    if code == 2:  # a usage error: the --help hint follows the one line
        assert lines[1:] == ["Try 'gpuctk cdi generate --help'."], p.stderr
        lines = lines[:1]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("gpuctk: error: ")
    assert words in lines[0]
    assert p.stdout == ""


def test_simulate_to_stdout_and_json_by_extension(tmp_path: Path) -> None:
    p = run(["--simulate", "l4"])
    assert p.returncode == 0, p.stderr
    first, _, rest = p.stdout.partition("\n")
    assert first.startswith("# simulated (gpuctk cdi generate --simulate l4)"), first
    assert rest.startswith('---\ncdiVersion: "0.5.0"\nkind: nvidia.com/gpu\n')
    out = tmp_path / "spec.json"
    p = run(["--simulate", "h100-8", "--output", str(out)])
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    assert len(doc["devices"]) == 17
    assert oct(out.stat().st_mode & 0o777) == "0o644"
    assert f"wrote {out}" in p.stderr


def test_missing_nvml_library(existing: Path, tmp_path: Path) -> None:
    p = run(["--nvml-library", str(tmp_path / "nope" / "libnvidia-ml.so.1"), "-o", str(existing)])
    assert_failed_cleanly(p, 3, "libnvidia-ml.so.1")
    assert existing.read_bytes() == OLD


def test_no_nvml_anywhere(existing: Path) -> None:
    if Path("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").exists():
        pytest.skip("this machine has a real NVML")
    env = {
        k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "GPUCTK_NVML_LIBRARY")
    }
    p = run(["-o", str(existing)], env=env)
    assert_failed_cleanly(p, 3, "not found")
    assert "--driver-root" in p.stderr
    assert existing.read_bytes() == OLD


def test_nvml_init_failure(existing: Path, fake_nvml_env) -> None:  # type: ignore[no-untyped-def]
    env = fake_nvml_env("h100-8", init_error=9)
    p = run(["--nvml-library", env["FAKE_NVML_LIBRARY"], "-o", str(existing)], env=env)
    assert_failed_cleanly(p, 3, "driver")
    assert existing.read_bytes() == OLD


def test_unreadable_driver_root(existing: Path, tmp_path: Path) -> None:
    p = run(["--simulate", "l4", "--driver-root", str(tmp_path / "missing"), "-o", str(existing)])
    assert_failed_cleanly(p, 4, "driver root")
    assert existing.read_bytes() == OLD


def test_unwritable_output() -> None:
    p = run(["--simulate", "l4", "-o", "/proc/gpuctk-test/nvidia.yaml"])
    assert_failed_cleanly(p, 5, "cannot create the folder /proc/gpuctk-test")
    p = run(["--simulate", "l4", "-o", "/proc/gpuctk-test.yaml"])
    assert p.returncode == 5, p.stderr
    assert "cannot write" in p.stderr


def test_output_folder_is_made(tmp_path: Path) -> None:
    """A fresh node has no /var/run/cdi: generate makes the folder, as nvidia-ctk does."""
    out = tmp_path / "var/run/cdi/nvidia.yaml"
    p = run(["--simulate", "l4", "-o", str(out)])
    assert p.returncode == 0, p.stderr
    assert out.is_file() and (out.parent.stat().st_mode & 0o777) == 0o755


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--vendor", "nvidia com"), ("--vendor", "1vendor"), ("--class", "gpu!"), ("--class", "")],
)
def test_invalid_vendor_or_class(existing: Path, flag: str, value: str) -> None:
    p = run(["--simulate", "l4", flag, value, "-o", str(existing)])
    assert_failed_cleanly(p, 2, flag)
    assert existing.read_bytes() == OLD


def test_unknown_profile_lists_the_known_ones() -> None:
    p = run(["--simulate", "dgx-9000"])
    assert_failed_cleanly(p, 2, "h100-8")


def test_no_gpus_exit_6_and_nothing_written(tmp_path: Path, existing: Path) -> None:
    profile = tmp_path / "empty.yaml"
    profile.write_text("driver_version: '535.309.01'\ncuda_driver_version: '12.2'\ngpus: []\n")
    p = run(["--simulate", str(profile), "-o", str(existing)])
    assert_failed_cleanly(p, 6, "no NVIDIA GPU found")
    assert existing.read_bytes() == OLD


def test_real_discovery_spec_is_valid_and_complete(
    tmp_path: Path,
    fake_nvml_env,  # type: ignore[no-untyped-def]
    driver_root: Path,
) -> None:
    from fixtures.devroot import make_node_roots

    from gpuctk.cdi.node.profile import load_profile
    from gpuctk.cdi.specs.validate import validate_files

    machine = load_profile("a100-mig")
    roots = make_node_roots(tmp_path / "node", machine)
    env = fake_nvml_env("a100-mig")
    out = tmp_path / "nvidia.json"
    p = run(
        [
            "--nvml-library", env["FAKE_NVML_LIBRARY"], "--driver-root", str(driver_root),
            "--dev-root", str(roots.dev_root), "--proc-root", str(roots.proc_root),
            "--sys-root", str(roots.sys_root), "-o", str(out), "--library-mode", "hook",
        ],
        env=env,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    schema = Path(__file__).resolve().parents[3] / "shared" / "vendor-data" / "cdi-schema"
    assert validate_files([out], schema) == {str(out): []}
    # The default (--library-mode auto) over the same real files: the folder spec.
    default = tmp_path / "default.json"
    p = run(
        [
            "--nvml-library", env["FAKE_NVML_LIBRARY"], "--driver-root", str(driver_root),
            "--dev-root", str(roots.dev_root), "--proc-root", str(roots.proc_root),
            "--sys-root", str(roots.sys_root), "-o", str(default),
            "--staging-dir", str(tmp_path / "staging"),
        ],
        env=env,
    )  # fmt: skip
    assert p.returncode == 0 and "driver staged in" in p.stderr, p.stderr
    assert validate_files([default], schema) == {str(default): []}
    edits = json.loads(default.read_text())["containerEdits"]
    assert "/usr/local/nvidia" in {m["containerPath"] for m in edits["mounts"]}
    assert [h["args"][1] for h in edits["hooks"]] == ["createContainer"]  # the stage's entry
    doc = json.loads(out.read_text())
    assert doc["cdiVersion"] == "0.5.0"  # hostPath on device nodes and numeric names
    by_name = {d["name"]: d["containerEdits"] for d in doc["devices"]}
    mig = by_name["1:0"]["deviceNodes"]
    assert mig[0]["path"] == "/dev/nvidia1"
    assert mig[0]["hostPath"] == str(roots.dev_root / "dev" / "nvidia1")
    assert all(n["path"].startswith("/dev/nvidia-caps/") for n in mig[1:]) and len(mig) == 3
    # Whole GPU: its node plus the DRM card and render nodes sysfs lists for it.
    assert by_name["0"]["deviceNodes"][0]["path"] == "/dev/nvidia0"
    assert any(n["path"].startswith("/dev/dri/renderD") for n in by_name["0"]["deviceNodes"])
    mounts = {m["containerPath"] for m in doc["containerEdits"]["mounts"]}
    assert "/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.535.309.01" in mounts
    assert "/usr/bin/nvidia-smi" in mounts


def test_an_unchanged_spec_is_left_alone_until_the_mig_layout_changes(
    tmp_path: Path,
    fake_nvml_env,  # type: ignore[no-untyped-def]
    driver_root: Path,
) -> None:
    from fixtures.devroot import make_node_roots
    from fixtures.fake_nvml import write_fake_profile

    from gpuctk.cdi.node.profile import load_profile
    from gpuctk.records import replace

    machine = load_profile("a100-mig")
    roots = make_node_roots(tmp_path / "node", machine)
    env = fake_nvml_env(machine)
    out = tmp_path / "nvidia.yaml"
    argv = [
        "--nvml-library", env["FAKE_NVML_LIBRARY"], "--driver-root", str(driver_root),
        "--dev-root", str(roots.dev_root), "--proc-root", str(roots.proc_root),
        "--sys-root", str(roots.sys_root), "-o", str(out), "--library-mode", "hook",
    ]  # fmt: skip
    first = run(argv, env=env)
    assert first.returncode == 0, first.stderr
    assert first.stderr.strip().splitlines()[-1].startswith(f"gpuctk: wrote {out}: ")
    before, data = out.stat(), out.read_bytes()
    again = run(argv, env=env)
    assert again.returncode == 0, again.stderr
    (line,) = again.stderr.strip().splitlines()
    assert line.startswith(f"gpuctk: {out} unchanged: ")
    after = out.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert out.read_bytes() == data
    # MIG re-partitioned: GPU 2 keeps only its first MIG device; the fake NVML now says so
    gpu2 = machine.gpus[2]
    fewer = replace(gpu2, mig_devices=gpu2.mig_devices[:1])
    write_fake_profile(
        replace(machine, gpus=(*machine.gpus[:2], fewer, *machine.gpus[3:])),
        Path(env["FAKE_NVML_PROFILE"]),
    )
    third = run(argv, env=env)
    assert third.returncode == 0, third.stderr
    assert third.stderr.strip().splitlines()[-1].startswith(f"gpuctk: wrote {out}: ")
    assert out.stat().st_ino != before.st_ino
    gone = {m.uuid for m in gpu2.mig_devices[1:]}
    assert gone and all(u in data.decode() and u not in out.read_text() for u in gone)


def test_output_dash_is_standard_output(tmp_path: Path) -> None:
    p = subprocess.run(
        [GPUCTK, "cdi", "generate", "--simulate", "l4", "--output", "-", "--format", "json"],
        capture_output=True, text=True, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["kind"] == "nvidia.com/gpu"
    assert not (tmp_path / "-").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a private /dev)")
def test_simulate_ignores_the_hosts_dev(tmp_path: Path) -> None:
    """A simulated machine's nodes are its profile's, whatever this host's /dev holds: here a
    stray /dev/nvidiactl and no /dev/nvidia0 (a workstation with a driver but fewer GPUs)."""
    out = tmp_path / "spec.json"
    script = (
        "mount -t tmpfs tmpfs /dev && mknod /dev/nvidiactl c 195 255 && mknod /dev/null c 1 3 && "
        'exec "$@"'
    )
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
         GPUCTK, "cdi", "generate", "--simulate", "h100-8", "-o", str(out)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    nodes = {n["path"] for d in json.loads(out.read_text())["devices"]
             for n in d["containerEdits"].get("deviceNodes", [])}  # fmt: skip
    assert {f"/dev/nvidia{i}" for i in range(8)} <= nodes
