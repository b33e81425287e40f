"""`gpuctk cdi generate --mode management` and `--mode imex`, through the real CLI."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures.devroot import NodeRoots

from gpuctk.cdi.node.capabilities import UTILITY, capability_of
from gpuctk.cdi.node.profile import load_profile
from gpuctk.cdi.specs.validate import schema_checker, validate_spec_dict

GPUCTK = str(Path(sys.executable).with_name("gpuctk"))
SCHEMA = Path(__file__).resolve().parents[3] / "shared" / "vendor-data" / "cdi-schema"
IMEX_MAJOR = 234


def generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPUCTK, "cdi", "generate", "--format", "json", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def valid(doc: dict[str, object]) -> None:
    checker = schema_checker(SCHEMA)
    assert checker is not None, f"vendored schema not found at {SCHEMA}"
    assert validate_spec_dict(doc, "spec", schema=checker) == []


def one_line_error(p: subprocess.CompletedProcess[str], code: int, words: str) -> None:
    assert p.returncode == code, p.stderr
    lines = p.stderr.strip().splitlines()
    if code == 2:  # a usage error: the --help hint follows the one line
        assert lines[1:] == ["Try 'gpuctk cdi generate --help'."], p.stderr
        lines = lines[:1]
    assert len(lines) == 1 and words in lines[0], p.stderr
    assert p.stdout == ""


def mknod(path: Path, major: int, minor: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(major, minor))
    except PermissionError as exc:
        pytest.skip(f"mknod needs root or CAP_MKNOD: {exc}")


def test_management_on_the_debian_root_mounts_utility_files_only(driver_root: Path) -> None:
    p = generate(
        "--mode", "management", "--simulate", "a100-mig", "--driver-root", str(driver_root)
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    valid(doc)
    assert doc["kind"] == "management.nvidia.com/gpu"
    assert [d["name"] for d in doc["devices"]] == ["all"]
    paths = [n["path"] for n in doc["devices"][0]["containerEdits"]["deviceNodes"]]
    machine = load_profile("a100-mig")
    assert {f"/dev/nvidia{g.minor}" for g in machine.gpus} | {"/dev/nvidiactl"} <= set(paths)
    assert any(p.startswith("/dev/nvidia-caps/") for p in paths)  # the MIG devices' caps
    mounts = [m["containerPath"] for m in doc["containerEdits"]["mounts"]]
    names = {m.rsplit("/", 1)[1] for m in mounts}
    assert "nvidia-smi" in names and any(n.startswith("libnvidia-ml.so") for n in names)
    libs = [n for n in names if n.startswith("lib")]
    assert libs and all(capability_of(n) == UTILITY for n in libs), libs
    assert not any(n.startswith("libcuda") for n in names)


def test_management_takes_every_node_of_the_dev_root(
    node_roots: Callable[[object], NodeRoots],
) -> None:
    machine = load_profile("a100-mig")
    roots = node_roots(machine)
    dev = roots.dev_root / "dev"
    mknod(dev / "nvidia-nvswitch0", 195, 200)  # the fabric's, not a GPU's: left out
    mknod(dev / "nvidia-caps-imex-channels" / "channel5", IMEX_MAJOR, 5)  # beside the fixture's
    where = ("--dev-root", str(roots.dev_root), "--proc-root", str(roots.proc_root))
    p = generate("--mode", "management", "--simulate", "a100-mig", *where)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    valid(doc)
    nodes = doc["devices"][0]["containerEdits"]["deviceNodes"]
    expected = {
        "/" + str(Path(root, f).relative_to(roots.dev_root))
        for root, _, files in os.walk(dev)
        for f in files
        if "/dri" not in root and f != "nvidia-nvswitch0"
    }
    assert {n["path"] for n in nodes} == expected
    assert all(n["hostPath"] == f"{roots.dev_root}{n['path']}" for n in nodes)


def test_management_refuses_device_ids() -> None:
    p = generate("--mode", "management", "--simulate", "l4", "--device-id", "0")
    one_line_error(p, 2, "--device-id")


def test_a_wrong_mode_is_a_usage_error() -> None:
    p = generate("--mode", "wsl", "--simulate", "l4")
    assert p.returncode == 2 and "--mode" in p.stderr and p.stdout == ""


def imex_roots(tmp_path: Path) -> tuple[Path, Path]:
    dev_root, proc = tmp_path / "root", tmp_path / "proc"
    proc.mkdir()
    (proc / "devices").write_text(
        f"Character devices:\n195 nvidia-frontend\n{IMEX_MAJOR} nvidia-caps-imex-channels\n"
    )
    folder = dev_root / "dev" / "nvidia-caps-imex-channels"
    for n in (0, 1, 2047):
        mknod(folder / f"channel{n}", IMEX_MAJOR, n)
    mknod(folder / "channel5", 99, 5)  # another driver's major: not a channel
    return dev_root, proc


def test_imex_channels(tmp_path: Path) -> None:
    dev_root, proc = imex_roots(tmp_path)
    roots = ("--dev-root", str(dev_root), "--proc-root", str(proc))
    p = generate("--mode", "imex", *roots)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    valid(doc)
    assert doc["kind"] == "nvidia.com/imex-channel"
    assert [d["name"] for d in doc["devices"]] == ["0", "1", "2047", "all"]
    node = doc["devices"][2]["containerEdits"]["deviceNodes"][0]
    assert node["path"] == "/dev/nvidia-caps-imex-channels/channel2047"
    assert node["hostPath"] == f"{dev_root}{node['path']}"
    assert (node["type"], node["major"], node["minor"]) == ("c", IMEX_MAJOR, 2047)
    assert len(doc["devices"][3]["containerEdits"]["deviceNodes"]) == 3
    assert doc["containerEdits"] == {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}
    p = generate("--mode", "imex", *roots, "--device-id", "channel1")
    assert [d["name"] for d in json.loads(p.stdout)["devices"]] == ["1", "all"]
    one_line_error(generate("--mode", "imex", *roots, "--device-id", "7"), 2, "channel7")
    one_line_error(generate("--mode", "imex", *roots, "--device-id", "x"), 2, "IMEX channel")


def test_imex_without_channels(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    p = generate("--mode", "imex", "--dev-root", str(tmp_path))
    assert p.returncode not in (0, 2) and "no IMEX channel" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
