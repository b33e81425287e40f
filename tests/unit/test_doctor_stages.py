"""A folder-mode spec whose stage is gone: `gpuctk doctor` names it with the fix, and
the refresh unit rebuilds it.

The node is fixtures.doctornode's (real files, the fake NVML, the Debian 535 driver root) with
a folder-mode spec; the doctor runs as a user runs it (the real CLI, JSON out), and the refresh
unit's own ExecStart line runs with the venv's gpuctk.
"""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from fixtures.doctornode import BIN, DoctorNode, generate_spec, l4_node

from gpuctk.cdi import stage
from gpuctk.doctor.stages import stage_of

DEB = Path(__file__).resolve().parents[2] / "packaging" / "deb"
V = "535.309.01"


node = pytest.fixture(l4_node, name="node")


def folder_spec(node: DoctorNode, staging: Path) -> Path:
    """(Re)write the node's spec in folder mode, staging in `staging`; the stage it names."""
    extra = ("--library-mode", "folder", "--staging-dir", str(staging))
    generate_spec(node.spec, node.profile, node.driver_root, node.roots, node.env, extra)
    (found,) = {s for line in node.spec.read_text().split() if (s := stage_of(line))}
    return Path(found)


def stages_check(node: DoctorNode) -> tuple[int, dict[str, object]]:
    code, report, stderr = node.doctor()
    assert report, stderr
    return code, node.check(report, "cdi.stages")


def test_stage_of() -> None:
    s = f"/var/lib/gpuctk/driver/{V}-0123456789abcdef"
    assert stage_of(s) == stage_of(f"{s}/lib64") == s
    assert stage_of(f"/lib/firmware/nvidia/{V}/gsp_ga10x.bin") is None
    assert stage_of("relative") is None


def test_doctor_names_a_missing_stage_and_its_fix_rebuilds_it(
    node: DoctorNode, tmp_path: Path
) -> None:
    staging = tmp_path / "staging"
    folder = folder_spec(node, staging)
    code, check = stages_check(node)
    assert check["status"] == "ok", (check["evidence"], check["fix"])
    assert code == 0
    assert check["evidence"] == [f"{folder} exists"]
    shutil.rmtree(folder)  # by hand, or by another tool
    code, check = stages_check(node)
    assert code == 2 and check["status"] == "failed"
    assert check["evidence"] == [
        f"{node.spec}: its driver stage {folder} is missing",
        "every container given these devices fails to start (runc, crun: no such file or "
        "directory)",
    ]
    fix = str(check["fix"])
    assert fix.startswith("gpuctk cdi generate ")
    assert f"--staging-dir {staging} --output {node.spec}" in fix
    argv = shlex.split(fix)
    done = subprocess.run([str(BIN / "gpuctk"), *argv[1:]], env=node.env, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (folder / "lib64").is_dir()  # the same stage: the driver did not change
    assert stages_check(node)[1]["status"] == "ok"
    # A stage with a folder gone: generate would reuse it as it is, so the fix removes it first.
    shutil.rmtree(folder / "lib64")
    code, check = stages_check(node)
    assert (
        code == 2
        and check["evidence"][0] == f"{node.spec}: {folder}/lib64 (in its driver stage) is missing"
    )
    assert str(check["fix"]).startswith(f"rm -r {folder} && gpuctk cdi generate ")
    fix = str(check["fix"]).replace("gpuctk ", f"{BIN}/gpuctk ")
    done = subprocess.run(["sh", "-c", fix], env=node.env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (folder / "lib64").is_dir() and stages_check(node)[1]["status"] == "ok"


def test_no_folder_mode_spec_is_skipped(node: DoctorNode) -> None:
    assert stages_check(node)[1]["status"] == "skipped"  # the node's spec is a hook-mode one


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((DEB / name).read_text())
    return parser


def test_the_refresh_unit_reruns_when_a_stage_is_removed(node: DoctorNode, tmp_path: Path) -> None:
    """The path unit watches the default staging dir (a stage removed: a run at once, besides
    the timer's each minute), and the service's own command rebuilds the stage its spec names
    (here with the node's roots and staging dir in GPUCTK_CDI_ARGS, as /etc/default/gpuctk
    would set them)."""
    watched = [
        line.split("=", 1)[1]
        for line in (DEB / "gpuctk-cdi-refresh.path").read_text().splitlines()
        if line.startswith("PathChanged=")
    ]
    assert stage.DEFAULT_STAGING_DIR in watched
    from gpuctk.cdi.cli import generate  # the click command: its --staging-dir default

    (default,) = [p.default for p in generate.params if p.name == "staging_dir"]
    assert default == stage.DEFAULT_STAGING_DIR
    staging = tmp_path / "staging"
    folder = folder_spec(node, staging)
    shutil.rmtree(folder)
    line = _unit("gpuctk-cdi-refresh.service")["Service"]["ExecStart"]
    args = ["--simulate", "l4", "--driver-root", str(node.driver_root), "--dev-root",
            str(node.roots.dev_root), "--proc-root", str(node.roots.proc_root), "--sys-root",
            str(node.roots.sys_root), "--hook-path", str(BIN / "gpuctk-hook"), "--staging-dir",
            str(staging)]  # fmt: skip
    argv = [
        str(BIN / "gpuctk") if w == "/usr/bin/gpuctk" else w
        for w in shlex.split(line.replace("$GPUCTK_CDI_ARGS", shlex.join(args)))
    ]
    argv[argv.index("--output") + 1] = str(node.spec)
    before = node.spec.read_bytes()
    done = subprocess.run(argv, env=node.env, capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"driver staged in {folder}" in done.stderr
    assert (folder / "lib64").is_dir() and node.spec.read_bytes() == before
