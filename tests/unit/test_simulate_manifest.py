"""`gpuctk cdi generate --simulate PROFILE` on a node without that driver: the driver files come
from the shipped manifest (gpuctk.cdi.node.manifest), so the spec is what a real node with the
profile's driver gets, every mount included.

The manifest is what discovery finds in the Debian 12 driver root of fixtures.driver_root, and
is checked against a fresh run over that root (fixtures.driver_manifest makes both). The
README's first command is run through an installed copy of the package (fixtures.appvenv), not
the editable checkout, and its spec is compared with the same profile over the fixture root.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures.driver_manifest import COMMAND, manifest_text, shipped_path

from gpuctk.cdi.node import manifest
from gpuctk.cdi.node.driverfiles import discover_driver_files
from gpuctk.cdi.node.profile import available_profiles, load_profile

EDITABLE = Path(sys.executable).with_name("gpuctk")
VERSION = load_profile("h100-8").driver_version
SIMULATED = f"(simulated: a Debian 12 install of driver {VERSION})"


def gpuctk(launcher: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCTK_", "PYTHON"))}
    return subprocess.run(
        [str(launcher), *args],
        capture_output=True, text=True, timeout=120, check=False, cwd=cwd, env=env,
    )  # fmt: skip


def generate(launcher: Path, *args: str) -> tuple[dict[str, Any], str, str]:
    """(spec, its text, stderr) of `gpuctk ARGS` (a `cdi generate`) to standard output."""
    p = gpuctk(launcher, *args)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout) if "json" in args else yaml.safe_load(p.stdout)
    return doc, p.stdout, p.stderr


def host_has_the_driver() -> bool:
    return bool(discover_driver_files("/", VERSION).libraries)


@pytest.fixture(autouse=True)
def no_host_driver() -> None:
    if host_has_the_driver():
        pytest.skip(f"this host has driver {VERSION}: --simulate discovers it, not the manifest")


# --- the shipped manifest ------------------------------------------------------------------


def test_shipped_manifest_is_what_the_fixture_root_gives(driver_root: Path) -> None:
    version, text = manifest_text(driver_root)
    path = shipped_path(version)
    assert path.is_file(), f"no manifest for driver {version}: run {COMMAND}"
    assert path.read_text() == text, f"{path} is stale: run {COMMAND}"


def test_every_profile_has_a_manifest() -> None:
    for name in available_profiles():
        version = load_profile(name).driver_version
        assert manifest.manifest_path(version), f"{name}: no manifest for driver {version}"


def test_loaded_manifest_equals_discovery_over_the_fixture_root(driver_root: Path) -> None:
    loaded = manifest.load(VERSION, str(driver_root))
    assert loaded is not None and loaded.driver_version == VERSION
    assert loaded.files == discover_driver_files(str(driver_root), VERSION)
    assert loaded.install == f"a Debian 12 install of driver {VERSION}"
    at_root = manifest.load(VERSION)
    assert at_root is not None
    assert all(f.host_path.startswith("/usr/") for f in at_root.files.libraries)


def test_no_manifest_for_an_unknown_version() -> None:
    assert manifest.load("999.1.1") is None
    assert manifest.manifest_path("../535.309.01") is None


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ([], "JSON object"),
        ({"libraries": {}}, "must be a list"),
        ({"libraries": [{"path": "lib.so", "capability": "compute"}]}, "absolute path"),
        ({"libraries": [{"path": "/a/../b", "capability": "compute"}]}, "without '..'"),
        ({"binaries": [{"path": "/usr/bin/x", "capability": "utility", "mode": 1}]}, "unknown"),
        ({"configs": [{"path": "/etc/x"}]}, "capability"),
        ({"symlinks": [["a"]]}, "pair"),
        *(({"libraries": [{"path": "/l/libcuda.so.1.2", "capability": "compute",
                           "soname": "libcuda.so.1", "links": links}]}, "links must be")
          for links in (["libc.so.6"], ["a\nb"], ["libcuda.so.1.2"], ["libcuda.so.1"],
                        ["libcuda.so", "libcuda.so"], "libcuda.so", [1])),
        ({"libraries": [{"path": "/l/libx.so.1.2", "capability": "compute", "links": ["liby.so"]}]},
         "links must be"),  # no SONAME: libx.so alone
        ({"binaries": [{"path": "/usr/bin/x", "capability": "utility", "links": ["x.so"]}]},
         r"links must be \[\]"),
        ({"ld_folders": ["/usr/lib"]}, "driver_version"),
    ],
)  # fmt: skip
def test_malformed_manifests_are_refused(doc: Any, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        manifest.from_document(doc)


# --- the README's first command, installed --------------------------------------------------


@pytest.fixture
def installed(installed_bin: Path) -> Path:
    """The `gpuctk` launcher of the packaged, non-editable venv (tests/conftest.py)."""
    return installed_bin / "gpuctk"


def stripped(value: Any, prefix: str) -> Any:
    """`value` with `prefix` taken off the front of every hostPath in it."""
    if isinstance(value, dict):
        return {
            k: (v.removeprefix(prefix) if k == "hostPath" else stripped(v, prefix))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [stripped(v, prefix) for v in value]
    return value


def test_readme_spec_mounts_what_a_real_install_gives(installed: Path, driver_root: Path) -> None:
    simulated, text, err = generate(installed, "cdi", "generate", "--simulate", "h100-8")
    real, _, real_err = generate(
        installed, "cdi", "generate", "--simulate", "h100-8", "--driver-root", str(driver_root),
        "--library-mode", "hook",  # what the default is for simulated files (no stage)
    )  # fmt: skip
    assert SIMULATED in err and "warning" not in err and "simulated" not in real_err
    assert text.startswith("# simulated")
    mounts = simulated["containerEdits"]["mounts"]
    assert len(mounts) >= 40  # libraries, binaries, firmware, configs: none left out
    assert f"{len(mounts)} mounts {SIMULATED}" in err
    expected = stripped(real, str(driver_root))
    assert [(m["containerPath"], m["hostPath"]) for m in mounts] == [
        (m["containerPath"], m["hostPath"]) for m in expected["containerEdits"]["mounts"]
    ]
    assert mounts == expected["containerEdits"]["mounts"]
    assert simulated["devices"] == expected["devices"]
    assert simulated == expected  # hooks, env and device nodes too


# --- the spec as a file ----------------------------------------------------------------------


def test_simulated_spec_validates_and_lists(tmp_path: Path) -> None:
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    out = spec_dir / "nvidia.yaml"
    p = gpuctk(EDITABLE, "cdi", "generate", "--simulate", "h100-8", "--output", str(out))
    assert p.returncode == 0, p.stderr
    assert f"wrote {out}" in p.stderr and SIMULATED in p.stderr
    assert out.read_text().startswith("# simulated")
    p = gpuctk(EDITABLE, "cdi", "validate", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"{out}: valid" in p.stdout
    p = gpuctk(EDITABLE, "cdi", "list", "--spec-dir", str(spec_dir), "--strict")
    assert p.returncode == 0, p.stderr
    names = p.stdout.split()
    assert "nvidia.com/gpu=0" in names and "nvidia.com/gpu=all" in names and len(names) == 17
    p = gpuctk(EDITABLE, "cdi", "generate", "--simulate", "h100-8", "--output", str(out))
    assert p.returncode == 0 and f"{out} unchanged" in p.stderr, p.stderr


def test_comment_in_yaml_only() -> None:
    doc, text, _ = generate(EDITABLE, "cdi", "generate", "--simulate", "l4")
    first, _, rest = text.partition("\n")
    assert first == (
        "# simulated (gpuctk cdi generate --simulate l4): host paths are those of a Debian 12 "
        f"install of driver {VERSION}, not a spec for this node"
    )
    assert rest.startswith("---\ncdiVersion: ")
    as_json, text, err = generate(
        EDITABLE, "cdi", "generate", "--simulate", "l4", "--format", "json"
    )
    assert SIMULATED in err and text.startswith("{") and "#" not in text
    assert as_json == doc


def test_driver_root_with_the_driver_uses_discovery(driver_root: Path) -> None:
    doc, text, err = generate(
        EDITABLE, "cdi", "generate", "--simulate", "h100-8", "--driver-root", str(driver_root),
        "--library-mode", "hook",
    )  # fmt: skip
    assert "simulated" not in err and text.startswith("---\n")
    mounts = doc["containerEdits"]["mounts"]
    assert mounts and all(m["hostPath"].startswith(f"{driver_root}/") for m in mounts)


def test_capabilities_apply_to_the_manifest() -> None:
    doc, _, err = generate(
        EDITABLE, "cdi", "generate", "--simulate", "h100-8", "--driver-capabilities", "utility"
    )
    paths = [m["containerPath"] for m in doc["containerEdits"]["mounts"]]
    assert SIMULATED in err and "/usr/bin/nvidia-smi" in paths
    assert not any("libcuda" in p or "vulkan" in p for p in paths)


def test_a_version_without_a_manifest_keeps_the_warning(tmp_path: Path) -> None:
    profile = tmp_path / "other.yaml"
    text = (Path(manifest.MANIFESTS).parent / "l4.yaml").read_text()
    profile.write_text(text.replace(f"driver_version: {VERSION}", "driver_version: 999.1.1"))
    doc, text, err = generate(EDITABLE, "cdi", "generate", "--simulate", str(profile))
    assert "warning: no driver libraries for 999.1.1" in err and "simulated" not in err
    assert "mounts" not in doc.get("containerEdits", {}) and text.startswith("---\n")


def test_folder_mode_needs_real_files(tmp_path: Path) -> None:
    p = gpuctk(
        EDITABLE, "cdi", "generate", "--simulate", "l4", "--library-mode", "folder",
        "--staging-dir", str(tmp_path / "stage"),
    )  # fmt: skip
    assert p.returncode == 2 and "--library-mode folder copies" in p.stderr, p.stderr
    assert not (tmp_path / "stage").exists()
