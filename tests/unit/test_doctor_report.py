"""`gpuctk doctor`'s building blocks: results, exit codes, JSON and table, /proc parsers,
and the import budget (no jsonschema, pynvml or gpuctk.hook just to load the command)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuctk.cdi.node.devchar import parse_char_majors as char_majors
from gpuctk.doctor import report
from gpuctk.doctor.driver import join_fixes, kernel_version
from gpuctk.doctor.report import failed, ok, skipped, warning

GPUCTK = str(Path(sys.executable).with_name("gpuctk"))

PROC_VERSION = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.309.01  Release Build  "
    "(pbuilder@debian)  Tue Jan 16 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)
PROC_VERSION_OPEN = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.14  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Thu Feb 22 01:25:25 UTC 2024\n"
)
PROC_DEVICES = """Character devices:
  1 mem
195 nvidia-frontend
226 drm
508 nvidia-uvm
509 nvidia-caps

Block devices:
  7 loop
195 nvidia-frontend-block
"""


@pytest.mark.parametrize(
    ("results", "code"),
    [
        ([ok("a.x", "t"), skipped("a.y", "t")], 0),
        ([], 0),
        ([ok("a.x", "t"), warning("a.y", "t", ["e"], "fix")], 1),
        ([warning("a.y", "t", ["e"], "f"), failed("a.z", "t", ["e"], "f"), ok("a.x", "t")], 2),
    ],
)
def test_exit_code_is_the_worst_status(results: list[report.Result], code: int) -> None:
    assert report.exit_code(results) == code
    assert json.loads(report.to_json(results))["exitCode"] == code


def test_json_shape_is_stable() -> None:
    results = [
        ok("driver.module", "kernel module loaded", "535.309.01"),
        failed("cdi.layout", "layout", ["GPU 1 gone"], "gpuctk cdi generate -o /x.yaml"),
    ]
    body = json.loads(report.to_json(results))
    assert body == {
        "version": 1,
        "exitCode": 2,
        "summary": {"ok": 1, "warning": 0, "failed": 1, "skipped": 0},
        "checks": [
            {
                "id": "driver.module",
                "layer": "driver",
                "title": "kernel module loaded",
                "status": "ok",
                "evidence": ["535.309.01"],
                "fix": None,
            },
            {
                "id": "cdi.layout",
                "layer": "cdi",
                "title": "layout",
                "status": "failed",
                "evidence": ["GPU 1 gone"],
                "fix": "gpuctk cdi generate -o /x.yaml",
            },
        ],
    }


def test_table_groups_by_layer_and_shows_fixes_only_for_problems() -> None:
    results = [
        ok("driver.module", "kernel module loaded", "quiet evidence"),
        warning("driver.persistence", "persistence", ["no socket"], "systemctl enable --now x"),
        skipped("engine.crio", "CRI-O", "not installed"),
    ]
    table = report.to_table(results)
    assert table.splitlines() == [
        "DRIVER",
        "  ok    driver.module       kernel module loaded",
        "  WARN  driver.persistence  persistence",
        "        no socket",
        "        fix: systemctl enable --now x",
        "ENGINE",
        "  skip  engine.crio         CRI-O",
        "        not installed",
        "",
        "1 ok, 1 warning(s), 0 failed, 1 skipped (exit 1)",
    ]
    assert "quiet evidence" in report.to_table(results, verbose=True)
    assert "\x1b[" not in table
    coloured = report.to_table(results, colour=True)
    assert "\x1b[32mok  \x1b[0m" in coloured and "\x1b[33m\x1b[1mWARN\x1b[0m" in coloured


def test_kernel_version_proprietary_and_open_modules() -> None:
    assert kernel_version(PROC_VERSION) == "535.309.01"
    assert kernel_version(PROC_VERSION_OPEN) == "550.54.14"
    assert kernel_version("garbage\n") is None


def test_char_majors_reads_only_character_devices() -> None:
    majors = char_majors(PROC_DEVICES)
    assert majors == {
        "mem": 1,
        "nvidia-frontend": 195,
        "drm": 226,
        "nvidia-uvm": 508,
        "nvidia-caps": 509,
    }


def test_join_fixes_caps_the_command() -> None:
    fixes = [f"nvidia-modprobe -c={i}" for i in range(6)] + ["nvidia-modprobe -c=0"]
    assert join_fixes(fixes) == (
        "nvidia-modprobe -c=0 && nvidia-modprobe -c=1 && nvidia-modprobe -c=2 && "
        "nvidia-modprobe -c=3   # and 2 more like it"
    )


def test_loading_the_command_imports_no_heavy_module() -> None:
    code = (
        "import sys, gpuctk.doctor.cli, gpuctk.doctor.report\n"
        "heavy = [m for m in ('jsonschema', 'pynvml', 'yaml', 'tomlkit', 'gpuctk.hook',"
        " 'gpuctk.containerd') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_help_documents_the_exit_codes_and_layers() -> None:
    done = subprocess.run([GPUCTK, "doctor", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Exit status: 0 every check ok, 1 warnings, 2 a check failed" in done.stdout
    for layer in ("driver", "nvml", "cdi", "runtime", "engine", "kubernetes", "probe"):
        assert layer in done.stdout
    assert "docs/commands.md#gpuctk-doctor" in done.stdout  # the layers' checks in full


def test_a_bug_in_one_layer_does_not_lose_the_report(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from gpuctk.doctor import cli, k8s
    from gpuctk.doctor.context import Context, Findings

    def boom(ctx: Context, found: Findings) -> list[report.Result]:
        raise RuntimeError("boom")

    monkeypatch.setattr(k8s, "k8s_checks", boom)
    root = str(tmp_path)
    ctx = Context(dev_root=root, proc_root=root, sys_root=root, host_root=root, simulate="l4",
                  path=str(tmp_path / "no-bin"))  # fmt: skip
    results = cli.run_checks(ctx)
    layers = [r.layer for r in results]
    assert layers.index("engine") < layers.index("kubernetes") < layers.index("probe")
    internal = [r for r in results if r.id == "kubernetes.internal"]
    assert len(internal) == 1 and internal[0].status == "failed"
    assert internal[0].evidence == ("internal error: RuntimeError: boom",)
    assert report.exit_code(results) == 2
