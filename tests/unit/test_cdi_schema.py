"""gpuctk's own CDI JSON schema (cdi/specs/cdi-schema.json), shipped in the package.

Every spec gpuctk writes passes both it and the CDI project's schema (vendored under
../shared/vendor-data/cdi-schema); every broken spec the project's schema refuses, ours
refuses too, and ours refuses more (unknown keys, names, paths, ...). `gpuctk cdi validate`
uses it in an installed copy (a non-editable venv of the checkout, started through its
isolated-mode launcher).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.devroot import make_node_roots
from fixtures.fakesys import make_two_socket

from gpuctk.cdi.node.profile import available_profiles, load_profile
from gpuctk.cdi.specs import schema as schema_module
from gpuctk.cdi.specs.schema import SHIPPED_SCHEMA, SchemaChecker, load_checker
from gpuctk.cdi.specs.validate import check_files, validate_spec_dict

REPO = Path(__file__).resolve().parents[2]
UPSTREAM_DIR = REPO.parent / "shared" / "vendor-data" / "cdi-schema"
HAVE_UPSTREAM = (UPSTREAM_DIR / "schema.json").is_file()
GPUCTK = str(Path(sys.executable).with_name("gpuctk"))
IMEX_MAJOR = 234


@pytest.fixture(scope="module")
def ours() -> SchemaChecker:
    return load_checker()


@pytest.fixture(scope="module")
def upstream() -> SchemaChecker | None:
    return load_checker(UPSTREAM_DIR) if HAVE_UPSTREAM else None


def test_the_schema_is_gpuctks_own_draft_7_file_beside_the_module() -> None:
    import jsonschema

    assert Path(schema_module.__file__).parent / "cdi-schema.json" == SHIPPED_SCHEMA
    doc = json.loads(SHIPPED_SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(doc)
    assert doc["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert "gpuctk" in doc["$id"] and "gpuctk" in doc["title"]
    assert "$ref" not in json.dumps(doc).replace('"$ref": "#/definitions/', "")  # one file
    checker = load_checker()
    assert checker.shipped and checker.path == SHIPPED_SCHEMA
    assert not load_checker(UPSTREAM_DIR).shipped if HAVE_UPSTREAM else True


# --- every spec gpuctk writes passes both schemas --------------------------------------------


def generate(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    p = subprocess.run(
        [GPUCTK, "cdi", "generate", "--format", "json", *args],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    return dict(json.loads(p.stdout))


def accepted(doc: Any, ours: SchemaChecker, upstream: SchemaChecker | None) -> None:
    assert ours.problems(doc) == []
    assert validate_spec_dict(doc, "spec", schema=ours) == []
    if upstream is None:
        pytest.skip(f"upstream CDI schema not present at {UPSTREAM_DIR}: ours checked only")
    assert upstream.problems(doc) == []


@pytest.mark.parametrize("library_mode", ["hook", "mounts"])
@pytest.mark.parametrize("profile", available_profiles())
def test_simulated_specs_pass_both(
    profile: str, library_mode: str, ours: SchemaChecker, upstream: SchemaChecker | None
) -> None:
    doc = generate("--simulate", profile, "--library-mode", library_mode)
    if "mig" in profile:
        assert any(":" in d["name"] for d in doc["devices"])  # MIG devices are in it
    accepted(doc, ours, upstream)


def test_folder_mode_and_management_specs_pass_both(
    tmp_path: Path, driver_root: Path, ours: SchemaChecker, upstream: SchemaChecker | None
) -> None:
    root = ("--driver-root", str(driver_root))
    folder = generate(
        "--simulate", "h100-8-mig7", *root, "--library-mode", "folder",
        "--staging-dir", str(tmp_path / "staging"),
    )  # fmt: skip
    (hook,) = folder["containerEdits"]["hooks"]  # the stage's entry (gpuctk-cdi-hook)
    assert hook["args"][1] == "createContainer"
    assert hook["args"][-4:-1] == ["--folder", "/usr/local/nvidia/lib64", "--ld-cache"]
    assert "--link" in hook["args"]  # the staged firmware and config files
    management = generate("--simulate", "a100-mig", *root, "--mode", "management")
    assert management["kind"] == "management.nvidia.com/gpu"
    for doc in (folder, management):
        accepted(doc, ours, upstream)


def test_discovered_spec_passes_both(
    tmp_path: Path,
    fake_nvml_env: Any,
    driver_root: Path,
    ours: SchemaChecker,
    upstream: SchemaChecker | None,
) -> None:
    roots = make_node_roots(tmp_path / "node", load_profile("a100-mig"))
    env = fake_nvml_env("a100-mig")
    doc = generate(
        "--nvml-library", env["FAKE_NVML_LIBRARY"], "--driver-root", str(driver_root),
        "--dev-root", str(roots.dev_root), "--proc-root", str(roots.proc_root),
        "--sys-root", str(roots.sys_root), "--staging-dir", str(tmp_path / "staging"), env=env,
    )  # fmt: skip
    assert doc["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"]
    accepted(doc, ours, upstream)


def test_imex_spec_passes_both(
    tmp_path: Path, ours: SchemaChecker, upstream: SchemaChecker | None
) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "devices").write_text(f"Character devices:\n{IMEX_MAJOR} nvidia-caps-imex-channels\n")
    folder = tmp_path / "root" / "dev" / "nvidia-caps-imex-channels"
    folder.mkdir(parents=True)
    try:
        os.mknod(folder / "channel0", stat.S_IFCHR | 0o666, os.makedev(IMEX_MAJOR, 0))
    except PermissionError as exc:
        pytest.skip(f"mknod needs root or CAP_MKNOD: {exc}")
    doc = generate("--mode", "imex", "--dev-root", str(tmp_path / "root"), "--proc-root", str(proc))
    assert doc["kind"] == "nvidia.com/imex-channel"
    accepted(doc, ours, upstream)


def test_nic_spec_passes_both(
    tmp_path: Path, ours: SchemaChecker, upstream: SchemaChecker | None
) -> None:
    sysfs = make_two_socket(tmp_path / "sys")
    out = tmp_path / "nvidia.json"
    p = subprocess.run(
        [GPUCTK, "cdi", "generate", "--simulate", "h100-8", "--sys-root", str(sysfs), "--nics",
         "--output", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    nic = json.loads((tmp_path / "nvidia-nic.json").read_text())
    assert nic["kind"] == "nvidia.com/nic"
    accepted(nic, ours, upstream)


# --- broken specs ---------------------------------------------------------------------------

GOOD: dict[str, Any] = {
    "cdiVersion": "1.1.0",
    "kind": "nvidia.com/gpu",
    "annotations": {"example.com/owner": "gpuctk"},
    "devices": [
        {
            "name": "0",
            "annotations": {"note": "first"},
            "containerEdits": {
                "deviceNodes": [
                    {"path": "/dev/nvidia0", "hostPath": "/drv/dev/nvidia0", "type": "c",
                     "major": 195, "minor": 0, "fileMode": 438, "permissions": "rw",
                     "uid": 0, "gid": 0},
                ],
                "netDevices": [{"hostInterfaceName": "ens1f0", "name": "eth1"}],
            },
        },
    ],
    "containerEdits": {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "mounts": [
            {"hostPath": "/drv/lib/libcuda.so.1", "containerPath": "/usr/lib/libcuda.so.1",
             "options": ["ro", "nosuid", "nodev", "rbind"], "type": "bind"},
            {"hostPath": "tmpfs", "containerPath": "/run/x", "type": "tmpfs"},
        ],
        "hooks": [
            {"hookName": "createContainer", "path": "/usr/bin/gpuctk-hook",
             "args": ["gpuctk-hook", "createContainer"], "env": ["PATH=/usr/bin"], "timeout": 10},
        ],
        "intelRdt": {"closID": "gpu", "schemata": ["L3:0=ff"], "enableMonitoring": True},
        "additionalGids": [44],
    },
}  # fmt: skip


def good() -> dict[str, Any]:
    return copy.deepcopy(GOOD)


Edit = Callable[[dict[str, Any]], None]


def _set(dotted: str, value: Any) -> Edit:
    """An edit that sets (or, for value ..., deletes) the key at `dotted` (a.b[0].c)."""

    def edit(doc: dict[str, Any]) -> None:
        parts: list[Any] = []
        for piece in dotted.replace("]", "").split("."):
            name, *indexes = piece.split("[")
            parts += [name, *map(int, indexes)]
        target: Any = doc
        for part in parts[:-1]:
            target = target[part]
        if value is ...:
            del target[parts[-1]]
        else:
            target[parts[-1]] = value

    return edit


def _both(first: Edit, second: Edit) -> Edit:
    def edit(doc: dict[str, Any]) -> None:
        first(doc)
        second(doc)

    return edit


NODE = "devices[0].containerEdits.deviceNodes[0]"
MOUNT = "containerEdits.mounts[0]"
HOOK = "containerEdits.hooks[0]"

# Refused by the CDI project's schema, so refused by ours too.
BOTH_REFUSE = {
    "no cdiVersion": _set("cdiVersion", ...),
    "no kind": _set("kind", ...),
    "no devices": _set("devices", ...),
    "devices not a list": _set("devices", {"0": {}}),
    "device without name": _set("devices[0].name", ...),
    "device without edits": _set("devices[0].containerEdits", ...),
    "device name a number": _set("devices[0].name", 0),
    "kind a list": _set("kind", ["nvidia.com/gpu"]),
    "cdiVersion a number": _set("cdiVersion", 1.1),
    "annotation value a number": _set("annotations", {"a": 1}),
    "env not a list": _set("containerEdits.env", "A=1"),
    "node without path": _set(f"{NODE}.path", ...),
    "node major a string": _set(f"{NODE}.major", "195"),
    "node uid negative": _set(f"{NODE}.uid", -1),
    "node gid too big": _set(f"{NODE}.gid", 2**32),
    "mount without containerPath": _set(f"{MOUNT}.containerPath", ...),
    "mount without hostPath": _set(f"{MOUNT}.hostPath", ...),
    "mount options a string": _set(f"{MOUNT}.options", "ro"),
    "hook without path": _set(f"{HOOK}.path", ...),
    "hook without hookName": _set(f"{HOOK}.hookName", ...),
    "hook args a string": _set(f"{HOOK}.args", "x"),
    "hook timeout negative": _set(f"{HOOK}.timeout", -1),
    "net device without name": _set("devices[0].containerEdits.netDevices[0].name", ...),
    "additionalGids negative": _set("containerEdits.additionalGids", [-1]),
    "intelRdt flag a string": _set("containerEdits.intelRdt.enableMonitoring", "yes"),
}

# Accepted by the CDI project's schema, refused by ours.
ONLY_OURS_REFUSE = {
    "unknown top-level key": _set("Devices", []),
    "unknown device key": _set("devices[0].label", "x"),
    "unknown edits key": _set("containerEdits.envs", ["A=1"]),
    "unknown device-edits key": _set("devices[0].containerEdits.mount", []),
    "unknown node key": _set(f"{NODE}.mode", 438),
    "unknown mount key": _set(f"{MOUNT}.readOnly", True),
    "unknown hook key": _set(f"{HOOK}.timeoutSeconds", 5),
    "unknown netDevice key": _set("devices[0].containerEdits.netDevices[0].mtu", 9000),
    "unknown intelRdt key": _set("containerEdits.intelRdt.clos", "x"),
    "unknown cdiVersion": _set("cdiVersion", "9.9.9"),
    "kind without class": _set("kind", "nvidia.com"),
    "kind with a space": _set("kind", "nvidia com/gpu"),
    "bad device name": _set("devices[0].name", "gpu 0"),
    "device name ends in a dash": _set("devices[0].name", "gpu-"),
    "device name ends in a line feed": _set("devices[0].name", "gpu0\n"),
    "kind ends in a line feed": _set("kind", "nvidia.com/gpu\n"),
    "no device at all": _set("devices", []),
    "device edits empty": _set("devices[0].containerEdits", {}),
    "bad annotation key": _set("annotations", {"Bad Key/x": "v"}),
    "env without =": _set("containerEdits.env", ["NOEQUALS"]),
    "env with an empty key": _set("containerEdits.env", ["=x"]),
    "relative node path": _set(f"{NODE}.path", "dev/nvidia0"),
    "relative node hostPath": _set(f"{NODE}.hostPath", "drv/dev/nvidia0"),
    "node type x": _set(f"{NODE}.type", "x"),
    "node major negative": _set(f"{NODE}.major", -1),
    "fileMode beyond 0o7777": _set(f"{NODE}.fileMode", 0o10000),
    "type u without a major": _both(_set(f"{NODE}.type", "u"), _set(f"{NODE}.major", ...)),
    "fifo with numbers": _set(f"{NODE}.type", "p"),
    "minor without a major": _both(_set(f"{NODE}.major", ...), _set(f"{NODE}.minor", 3)),
    "permissions rwx": _set(f"{NODE}.permissions", "rwx"),
    "relative mount containerPath": _set(f"{MOUNT}.containerPath", "usr/lib/x"),
    "relative bind mount hostPath": _set(f"{MOUNT}.hostPath", "lib/libcuda.so.1"),
    "empty mount option": _set(f"{MOUNT}.options", ["ro", ""]),
    "hook stage unknown": _set(f"{HOOK}.hookName", "preStart"),
    "relative hook path": _set(f"{HOOK}.path", "gpuctk-hook"),
    "hook env without =": _set(f"{HOOK}.env", ["PATH"]),
    "hook timeout zero": _set(f"{HOOK}.timeout", 0),
    "interface name too long": _set(
        "devices[0].containerEdits.netDevices[0].name", "a-very-long-ifname"
    ),
    "interface name with a slash": _set("devices[0].containerEdits.netDevices[0].name", "a/b"),
    "closID with a slash": _set("containerEdits.intelRdt.closID", "a/b"),
    "netDevices before 1.1.0": _set("cdiVersion", "0.7.0"),
    "enableCMT in 1.1.0": _set("containerEdits.intelRdt.enableCMT", True),
}


def _broken(table: dict[str, Edit]) -> list[Any]:
    return [pytest.param(edit, id=name) for name, edit in table.items()]


def test_the_good_spec_passes_both(ours: SchemaChecker, upstream: SchemaChecker | None) -> None:
    accepted(good(), ours, upstream)


@pytest.mark.parametrize("edit", _broken(BOTH_REFUSE))
def test_what_upstream_refuses_ours_refuses(
    edit: Edit, ours: SchemaChecker, upstream: SchemaChecker | None
) -> None:
    doc = good()
    edit(doc)
    assert ours.problems(doc) != []
    if upstream is None:
        pytest.skip(f"upstream CDI schema not present at {UPSTREAM_DIR}")
    assert upstream.problems(doc) != []


@pytest.mark.parametrize("edit", _broken(ONLY_OURS_REFUSE))
def test_ours_is_stricter(edit: Edit, ours: SchemaChecker, upstream: SchemaChecker | None) -> None:
    doc = good()
    edit(doc)
    assert ours.problems(doc) != []
    if upstream is None:
        pytest.skip(f"upstream CDI schema not present at {UPSTREAM_DIR}")
    assert upstream.problems(doc) == []


def test_unknown_keys_are_found_at_the_key(ours: SchemaChecker) -> None:
    doc = good()
    doc["devices"][0]["containerEdits"]["deviceNodes"][0]["mode"] = 1
    doc["extra"] = True
    assert ours.problems(doc) == [
        ("devices[0].containerEdits.deviceNodes[0].mode", "unknown key 'mode'"),
        ("extra", "unknown key 'extra'"),
    ]
    # the strict layer says so first: the schema layer does not repeat it
    assert validate_spec_dict(doc, "t", schema=ours) == [
        "devices[0].containerEdits.deviceNodes[0].mode: unknown key (known keys: path, "
        "hostPath, type, major, minor, fileMode, permissions, uid, gid)",
        "extra: unknown key (known keys: cdiVersion, kind, annotations, devices, containerEdits)",
    ]


def test_check_files_uses_the_shipped_schema_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUCTK_CDI_SCHEMA_DIR", raising=False)
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(good()))
    report = check_files([spec])
    assert report.ok and report.notes == () and report.schema == SHIPPED_SCHEMA


# --- the installed product ------------------------------------------------------------------


@pytest.fixture
def installed(installed_bin: Path) -> Path:
    """The `gpuctk` launcher of the packaged, non-editable venv (tests/conftest.py)."""
    return installed_bin / "gpuctk"


def validate(launcher: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCTK_", "PYTHON"))}
    return subprocess.run(
        [str(launcher), "cdi", "validate", *args],
        capture_output=True, text=True, timeout=120, check=False, cwd=cwd, env=env,
    )  # fmt: skip


def test_installed_validate_runs_the_shipped_schema(installed: Path, tmp_path: Path) -> None:
    spec = tmp_path / "good.json"
    spec.write_text(json.dumps(good()))
    p = validate(installed, tmp_path, str(spec), "--format", "json")
    assert p.returncode == 0, p.stderr
    assert "skipped" not in p.stderr and p.stderr == ""
    body = json.loads(p.stdout)
    assert body["valid"] is True and body["notes"] == []
    assert body["schema"].endswith("/site-packages/gpuctk/cdi/specs/cdi-schema.json")
    assert str(REPO) + "/cdi/" not in body["schema"]  # the installed copy, not the checkout's


def test_installed_validate_refuses_an_unknown_key(installed: Path, tmp_path: Path) -> None:
    doc = good()
    doc["devices"][0]["containerEdits"]["deviceNodes"][0]["mode"] = 438
    spec = tmp_path / "bad.json"
    spec.write_text(json.dumps(doc))
    p = validate(installed, tmp_path, str(spec))
    assert p.returncode == 7, p.stdout + p.stderr
    assert "deviceNodes[0].mode: unknown key" in p.stdout
    assert "skipped" not in p.stderr


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A folder another user may enter (pytest's tmp_path is root's own)."""
    folder = Path(tempfile.mkdtemp(prefix="gpuctk-spec-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


@pytest.mark.parametrize("kind", ["missing", "directory", "unreadable", "closed directory"])
def test_installed_validate_unreadable_input_exits_4(
    installed: Path, open_folder: Path, kind: str
) -> None:
    argv = [str(installed), "cdi", "validate"]
    if kind == "missing":
        path, words = Path("/nonexistent.yaml"), "/nonexistent.yaml: does not exist"
    elif kind == "directory":
        path, words = open_folder / "nvidia.yaml", "nvidia.yaml: not a regular file"
        path.mkdir()  # a spec-named entry of the folder given is itself a folder
        path = path.parent
    elif kind == "unreadable":
        path, words = open_folder / "secret.yaml", "secret.yaml: cannot open: Permission denied"
        path.write_text("cdiVersion: 0.5.0\n")
        path.chmod(0)
    else:
        path, words = open_folder / "closed", "closed: cannot read the directory: Permission"
        path.mkdir(mode=0)
    if kind in ("unreadable", "closed directory") and os.geteuid() == 0:
        # root reads every file: ask as nobody
        if shutil.which("setpriv") is None:
            pytest.skip("running as root and setpriv (util-linux) is missing")
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCTK_", "PYTHON"))}
    p = subprocess.run(
        [*argv, str(path)], capture_output=True, text=True, timeout=120, check=False, env=env,
        cwd=open_folder,
    )  # fmt: skip
    assert p.returncode == 4, p.stdout + p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuctk: error: ") and words in lines[0], lines
    assert p.stdout == ""
