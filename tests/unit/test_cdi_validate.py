"""Spec loading and validation in layers (gpuctk.cdi.specs.specfile, .validate, .schema, .names)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuctk.cdi.specs import names
from gpuctk.cdi.specs.schema import SHIPPED_SCHEMA, find_schema_dir, load_checker
from gpuctk.cdi.specs.specfile import load_spec_file
from gpuctk.cdi.specs.validate import (
    check_files,
    check_spec_dict,
    validate_files,
    validate_spec_dict,
)
from gpuctk.errors import InputError, UsageError, ValidationError

SCHEMA_DIR = Path(__file__).resolve().parents[2].parent / "shared/vendor-data/cdi-schema"
needs_schema = pytest.mark.skipif(
    not (SCHEMA_DIR / "schema.json").is_file(), reason="vendored CDI schema not present"
)

GOOD: dict[str, Any] = {
    "cdiVersion": "0.5.0",
    "kind": "nvidia.com/gpu",
    "devices": [
        {
            "name": "0",
            "containerEdits": {
                "deviceNodes": [
                    {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "fileMode": 438}
                ]
            },
        },
        {"name": "GPU-1234", "containerEdits": {"env": ["NVIDIA_GPU=1"]}},
    ],
    "containerEdits": {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": "/drv/dev/nvidiactl"}],
        "mounts": [
            {
                "hostPath": "/drv/usr/lib/libcuda.so.1",
                "containerPath": "/usr/lib/libcuda.so.1",
                "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"],
            }
        ],
        "hooks": [
            {
                "hookName": "createContainer",
                "path": "/usr/bin/gpuctk-hook",
                "args": ["gpuctk-hook", "create"],
                "env": ["PATH=/usr/bin"],
                "timeout": 10,
            }
        ],
    },
}


def good() -> dict[str, Any]:
    return copy.deepcopy(GOOD)


def write(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc) if path.suffix == ".json" else str(doc))
    return path


def test_good_spec_is_valid() -> None:
    assert validate_spec_dict(good(), "good") == []
    check_spec_dict(good(), "good")


@needs_schema
@pytest.mark.parametrize("name", ["minimal.json", "spec-example.json"])
def test_vendored_good_testdata(name: str) -> None:
    path = SCHEMA_DIR / "testdata/good" / name
    assert validate_files([path], SCHEMA_DIR) == {str(path): []}


@needs_schema
def test_vendored_bad_testdata() -> None:
    empty = SCHEMA_DIR / "testdata/bad/empty.json"
    explicit = SCHEMA_DIR / "testdata/bad/explicit-empty.json"
    found = validate_files([empty, explicit], SCHEMA_DIR)
    assert found[str(empty)] == ["empty file"]
    assert sorted(found[str(explicit)]) == [
        "cdiVersion: missing (required)",
        "devices: missing (required)",
        "kind: missing (required)",
    ]


def _set(doc: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node: Any = doc
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


DEV0 = "devices.0.containerEdits"
NODE0 = f"{DEV0}.deviceNodes.0"
HOOK0 = "containerEdits.hooks.0"
MOUNT0 = "containerEdits.mounts.0"


@pytest.mark.parametrize(
    ("dotted", "value", "needle"),
    [
        ("extra", 1, "extra: unknown key"),
        ("CdiVersion", "0.5.0", "did you mean 'cdiVersion'"),
        (f"{NODE0}.Major", 1, "deviceNodes[0].Major: unknown key"),
        ("cdiVersion", 0.5, "cdiVersion: must be a string, not a number"),
        ("cdiVersion", "0.4.0", "needs at least 0.5.0"),
        ("cdiVersion", "2.0.0", "unknown version"),
        ("kind", "nvidia.com", "invalid kind 'nvidia.com'"),
        ("kind", "nvidia.com/gp u", "invalid class 'gp u'"),
        ("kind", "-nvidia.com/gpu", "invalid vendor '-nvidia.com'"),
        ("devices.1.name", "GPU-1234-", "must end with a letter or digit"),
        ("devices.1.name", "0", "'0' is already defined by devices[0]"),
        ("devices.1.containerEdits", {}, "devices[1].containerEdits: a device's edits must not be"),
        ("devices.1.containerEdits", None, "must be a mapping, not null"),
        ("devices", [], "devices: a spec needs at least one device"),
        ("containerEdits.env.0", "NOVALUE", "'NOVALUE' is not KEY=VALUE"),
        ("containerEdits.env.0", "=x", "'=x' is not KEY=VALUE"),
        ("containerEdits.env.0", 5, "env[0]: must be a string, not a number"),
        (
            f"{NODE0}.path",
            "dev/nvidia0",
            "deviceNodes[0].path: must be absolute, not 'dev/nvidia0'",
        ),
        (f"{NODE0}.path", "", "deviceNodes[0].path: must not be empty"),
        (f"{NODE0}.path", "/dev/a\x00b", "contains a NUL byte"),
        (f"{NODE0}.hostPath", "rel/x", "deviceNodes[0].hostPath: must be absolute"),
        (f"{NODE0}.type", "x", "'x' is not a device type"),
        ("containerEdits.deviceNodes.0.type", "u", "type u needs a major number"),
        (f"{NODE0}.major", -1, "major: must not be negative"),
        (f"{NODE0}.major", "195", "major: must be an integer, not a string"),
        (f"{NODE0}.major", True, "major: must be an integer, not a boolean"),
        (f"{NODE0}.major", 2**63, "out of range for int64"),
        (f"{NODE0}.uid", -1, "uid: -1 is out of range for uint32"),
        (f"{NODE0}.fileMode", 0o10000, "is not a permission mode"),
        (f"{NODE0}.permissions", "rwx", "must combine r, w and m"),
        (f"{NODE0}.type", "p", "a fifo (type p) has no major/minor"),
        ("containerEdits.deviceNodes.0.minor", 3, "minor: ignored without a major number"),
        (f"{HOOK0}.hookName", "precreate", "'precreate' is not one of"),
        (f"{HOOK0}.path", "gpuctk-hook", "hooks[0].path: must be absolute"),
        (f"{HOOK0}.env", ["LD_PRELOAD"], "hooks[0].env[0]: 'LD_PRELOAD' is not KEY=VALUE"),
        (f"{HOOK0}.timeout", 0, "timeout: must be greater than zero"),
        (f"{MOUNT0}.containerPath", "usr/lib", "mounts[0].containerPath: must be absolute"),
        (f"{MOUNT0}.hostPath", "", "mounts[0].hostPath: must not be empty"),
        (f"{MOUNT0}.hostPath", "lib", "mounts[0].hostPath: must be absolute"),
        (f"{MOUNT0}.options", "ro", "options: must be a list, not a string"),
        ("annotations", {"Bad_Prefix/x": "1"}, "invalid annotation key"),
        ("annotations", {"a": 1}, "annotations['a']: must be a string, not a number"),
        ("containerEdits.intelRdt", {"closID": ".."}, "closID: '..' is not a valid file name"),
        ("containerEdits.netDevices", [{"hostInterfaceName": "eth0"}], "name: missing"),
        (
            "containerEdits.netDevices",
            [{"hostInterfaceName": "a/b", "name": "eth0"}],
            "not a Linux interface name",
        ),
    ],
)
@pytest.mark.parametrize("layer", ["no schema", "shipped schema"])
def test_each_rule_gives_exactly_one_problem(
    dotted: str, value: Any, needle: str, layer: str
) -> None:
    doc = good()
    if dotted.startswith(("annotations", "containerEdits.intelRdt", "containerEdits.netDev")):
        doc["cdiVersion"] = "1.1.0"  # content that needs a newer version is not the point here
    _set(doc, dotted, value)
    # The shipped schema refuses it too, at the place another layer names: said once.
    checker = load_checker() if layer == "shipped schema" else None
    if checker is not None and not needle.startswith(("needs at least", "'0' is already")):
        assert checker.problems(doc), "the shipped schema accepts it"  # (cdiVersion minimums
        # and duplicate names are beyond a JSON schema)
    problems = validate_spec_dict(doc, "t", schema=checker)
    assert len(problems) == 1, problems
    assert needle in problems[0], problems


def test_tmpfs_mount_may_have_a_non_path_source() -> None:
    doc = good()
    doc["cdiVersion"] = "0.5.0"
    doc["containerEdits"]["mounts"] = [
        {"hostPath": "tmpfs", "containerPath": "/tmp", "type": "tmpfs"}
    ]
    assert validate_spec_dict(doc, "t") == []


def test_conflicting_edits_are_reported() -> None:
    doc = good()
    doc["devices"][1]["containerEdits"] = {
        "env": ["NVIDIA_VISIBLE_DEVICES=all"],
        "mounts": [{"hostPath": "/other", "containerPath": "/usr/lib/libcuda.so.1"}],
        "deviceNodes": [{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}],
    }
    problems = validate_spec_dict(doc, "t")
    assert len(problems) == 3, problems
    assert all("conflicting edits" in p for p in problems)
    assert (
        "devices[1].containerEdits.env[0]: conflicting edits: env 'NVIDIA_VISIBLE_DEVICES'"
        in (problems[2])
    )
    # The same entry repeated identically is harmless.
    doc["devices"][1]["containerEdits"] = {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}
    assert validate_spec_dict(doc, "t") == []


def test_many_problems_in_one_file_are_reported_together(tmp_path: Path) -> None:
    doc = {
        "cdiVersion": "0.3.0",
        "kind": "nvidia.com/gpu",
        "unknown": True,
        "devices": [
            {
                "name": "0",
                "containerEdits": {
                    "env": ["FOO"],
                    "deviceNodes": [{"path": "dev/nvidia0", "type": "z"}],
                    "hooks": [{"hookName": "bad", "path": "/x"}],
                },
            },
            {"name": "0", "containerEdits": {"env": ["A=1"]}},
        ],
    }
    path = write(tmp_path / "many.json", doc)
    problems = validate_files([path])[str(path)]
    text = "\n".join(problems)
    for needle in (
        "unknown: unknown key",
        "needs at least 0.5.0",
        "'0' is already defined",
        "'FOO' is not KEY=VALUE",
        "deviceNodes[0].path: must be absolute",
        "'z' is not a device type",
        "'bad' is not one of",
    ):
        assert needle in text
    assert len(problems) == 7, problems
    with pytest.raises(ValidationError) as info:
        check_spec_dict(doc, "many.json")
    assert info.value.exit_code == 7 and len(info.value.problems) == 7


def test_cross_file_duplicate_device(tmp_path: Path) -> None:
    a = write(tmp_path / "a.json", good())
    other = good()
    other["devices"] = [other["devices"][1], {"name": "1", "containerEdits": {"env": ["X=1"]}}]
    b = write(tmp_path / "b.json", other)
    found = validate_files([a, b])
    assert found[str(a)] == [f"devices[1].name: nvidia.com/gpu=GPU-1234 is also defined in {b}"]
    assert found[str(b)] == [f"devices[0].name: nvidia.com/gpu=GPU-1234 is also defined in {a}"]
    # Same kind, distinct names: fine. The same file twice is not a conflict with itself.
    other["devices"] = [{"name": "1", "containerEdits": {"env": ["X=1"]}}]
    write(b, other)
    assert validate_files([a, b, a]) == {str(a): [], str(b): []}


@needs_schema
def test_schema_layer_runs_and_does_not_repeat_the_strict_layer() -> None:
    checker = load_checker(SCHEMA_DIR)
    bad = good()
    bad["devices"][0]["containerEdits"]["deviceNodes"][0]["uid"] = -1
    del bad["kind"]
    assert checker.problems(bad) == [
        ("devices[0].containerEdits.deviceNodes[0].uid", "-1 is less than the minimum of 0"),
        ("kind", "'kind' is a required property"),
    ]
    problems = validate_spec_dict(bad, "t", schema=checker)
    assert len(problems) == 2 and not any("CDI schema" in p for p in problems), problems
    annotated = good()
    annotated.update(cdiVersion="0.6.0", annotations={"a.b/c": 1})
    assert validate_spec_dict(annotated, "t", schema=checker) == [
        "annotations['a.b/c']: must be a string, not a number (quote it in YAML)"
    ]


def test_schema_dir_search(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUCTK_CDI_SCHEMA_DIR", raising=False)
    assert find_schema_dir() is None  # the shipped schema
    assert load_checker().path == SHIPPED_SCHEMA
    with pytest.raises(UsageError):
        find_schema_dir(tmp_path)
    monkeypatch.setenv("GPUCTK_CDI_SCHEMA_DIR", str(tmp_path))
    with pytest.raises(UsageError, match="GPUCTK_CDI_SCHEMA_DIR"):
        find_schema_dir()
    (tmp_path / "schema.json").write_text('{"type": "object", "required": ["kind"]}')
    assert find_schema_dir() == tmp_path
    spec = write(tmp_path / "s.json", {k: v for k, v in good().items() if k != "kind"})
    report = check_files([spec])
    assert report.schema == tmp_path / "schema.json" and report.notes == ()
    assert report.problems[str(spec)] == ["kind: missing (required)"]


def test_the_shipped_schema_is_the_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("GPUCTK_CDI_SCHEMA_DIR", raising=False)
    spec = write(tmp_path / "s.json", good())
    report = check_files([spec])
    assert report.ok and report.schema == SHIPPED_SCHEMA and report.notes == ()
    assert check_files([spec], use_schema=False).schema is None


def test_an_install_without_the_schema_file_notes_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("GPUCTK_CDI_SCHEMA_DIR", raising=False)
    monkeypatch.setattr("gpuctk.cdi.specs.validate.SHIPPED_SCHEMA", tmp_path / "none.json")
    spec = write(tmp_path / "s.json", good())
    report = check_files([spec])
    assert report.ok and report.schema is None
    assert "schema layer skipped" in report.notes[0]
    assert check_files([spec], use_schema=False).notes == ()


def test_unreadable_files_are_set_apart(tmp_path: Path) -> None:
    spec = write(tmp_path / "s.json", good())
    missing, folder = tmp_path / "missing.yaml", tmp_path / "d.yaml"
    folder.mkdir()
    report = check_files([spec, missing, folder, missing])
    assert report.unreadable == (str(missing), str(folder))
    assert report.problems == {
        str(spec): [],
        str(missing): ["does not exist"],
        str(folder): ["not a regular file"],
    }


# --- decoding: hostile and malformed files -------------------------------------------------


@pytest.mark.parametrize(
    ("name", "content", "needle"),
    [
        ("d.yaml", b"cdiVersion: 0.5.0\nkind: a/b\nkind: c/d\n", "duplicate key 'kind' (line 3"),
        ("d.yml", b"a: {x: 1, x: 2}\n", "duplicate key 'x'"),
        ("d.json", b'{"kind": "a/b", "kind": "c/d"}', "duplicate key 'kind'"),
        ("a.yaml", b"x: &a [1]\ny: *a\n", "aliases are not allowed"),
        ("m.yaml", b"x: {<<: {a: 1}}\n", "merge keys"),
        ("k.yaml", b"1: x\n", "key '1' is not a string"),
        ("u.yaml", b"kind: \xff\n", "not UTF-8"),
        ("b.json", b"\xef\xbb\xbf{}", "byte-order mark"),
        ("n.json", b'{"a": NaN}', "NaN is not valid JSON"),
        ("s.json", b'{"a": ', "invalid JSON"),
        ("s.yaml", b"a: [", "invalid YAML"),
        ("l.yaml", b"- a\n", "top level must be a mapping, not a list"),
        ("e.yaml", b"  \n", "empty file"),
        ("t.yaml", b"a: !!python/object/apply:os.system [true]\n", "invalid YAML"),
        ("deep.json", b'{"a":' * 40 + b"1" + b"}" * 40, "nested deeper than 32"),
        ("deeper.json", b'{"a":' * 100000 + b"1" + b"}" * 100000, "nested too deeply"),
        ("deep.yaml", b"a: " + b"[" * 5000 + b"]" * 5000, "invalid YAML"),
    ],
)
def test_hostile_documents_are_refused(
    tmp_path: Path, name: str, content: bytes, needle: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValidationError) as info:
        load_spec_file(path)
    assert str(path) in info.value.message
    assert needle in info.value.message
    assert validate_files([path])[str(path)] == info.value.problems


def test_file_level_refusals(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"a: " + b"x" * 2000)
    with pytest.raises(InputError, match="too large"):
        load_spec_file(big, max_bytes=1000)
    with pytest.raises(InputError, match="no such file"):
        load_spec_file(tmp_path / "missing.yaml")
    with pytest.raises(InputError, match="not a regular file"):
        load_spec_file(tmp_path)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # nobody writes to it: a blocking open would hang
    with pytest.raises(InputError, match="not a regular file"):
        load_spec_file(fifo)
    link = tmp_path / "link.yaml"
    link.symlink_to(big)
    assert load_spec_file(link, max_bytes=4000) == {"a": "x" * 2000}
    with pytest.raises(InputError, match="symbolic link"):
        load_spec_file(link, follow_symlinks=False)
    with pytest.raises(InputError, match="refused: not ours"):
        load_spec_file(big, check_stat=lambda st: "not ours")
    assert load_spec_file(big, check_stat=lambda st: None) == {"a": "x" * 2000}


def test_yaml_and_json_load_the_same(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(good()))
    assert load_spec_file(path) == good()
    assert validate_files([path]) == {str(path): []}


def test_hot_path_modules_import_nothing_heavy() -> None:
    code = (
        "import sys; import gpuctk.cdi.specs.specfile, gpuctk.cdi.specs.names, "
        "gpuctk.cdi.specs.version, gpuctk.cdi.specs.validate; "
        "print(sorted(m for m in ('jsonschema', 'click', 'referencing') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- names --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("qualified", "parts"),
    [
        ("nvidia.com/gpu=0", ("nvidia.com", "gpu", "0")),
        ("nvidia.com/gpu=0:1", ("nvidia.com", "gpu", "0:1")),
        ("nvidia.com/gpu=GPU-4cf8db2d-06c0", ("nvidia.com", "gpu", "GPU-4cf8db2d-06c0")),
        ("vendor.com/a.b_c-d=x", ("vendor.com", "a.b_c-d", "x")),
        ("a/b=c", ("a", "b", "c")),
    ],
)
def test_parse_qualified_name(qualified: str, parts: tuple[str, str, str]) -> None:
    assert names.is_qualified_name(qualified)
    assert names.parse_qualified_name(qualified) == parts
    assert names.qualified_name(*parts) == qualified


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "gpu=0",
        "/dev/nvidia0",
        "nvidia.com/gpu",
        "nvidia.com/gpu=",
        "nvidia.com/=0",
        "1nvidia.com/gpu=0",
        "nvidia.com/gpu-=0",
        "nvidia.com/gpu=-0",
        "nvidia.com/gpu=0/../x",
        "nvidia.com/g/pu=0",
        "nvidia.com/gpu=a b",
        "v/c=name=with=eq",
    ],
)
def test_bad_qualified_names(bad: str) -> None:
    assert not names.is_qualified_name(bad)
    with pytest.raises(ValueError):
        names.parse_qualified_name(bad)


def test_name_rules() -> None:
    assert names.device_name_problem("0") is None
    assert names.device_name_problem("a") is None
    assert names.device_name_problem("_a") is not None
    assert names.vendor_name_problem("a") is None
    assert names.vendor_name_problem("0a") is not None
    assert names.class_name_problem("gpu.mig") is None
    assert names.kind_problem("nvidia.com/gpu") is None
    assert names.parse_device("gpu=0") == ("", "", "gpu=0")


def test_a_later_folder_overrides_an_earlier_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs' `gpuctk cdi validate /etc/cdi /var/run/cdi` on a node whose spec is in both: CDI's
    later spec folder wins, a legal setup, so one note names the winner and the exit is 0;
    two files of ONE folder defining a device stay a problem (requests for it fail)."""
    from fixtures.containerd import gpuctk

    etc, run_dir = tmp_path / "etc-cdi", tmp_path / "run-cdi"
    etc.mkdir()
    run_dir.mkdir()
    code, _, _ = gpuctk(capsys, "cdi", "generate", "--simulate", "h100-8",
                        "--library-mode", "hook", "--output", str(etc / "nvidia.yaml"))  # fmt: skip
    assert code == 0
    (run_dir / "nvidia.yaml").write_bytes((etc / "nvidia.yaml").read_bytes())
    code, out, err = gpuctk(capsys, "cdi", "validate", str(etc), str(run_dir))
    assert code == 0, out + err
    assert out.splitlines() == [f"{etc}/nvidia.yaml: valid", f"{run_dir}/nvidia.yaml: valid"]
    notes = err.splitlines()
    assert len(notes) == 1 and notes[0].startswith(
        f"gpuctk: note: {run_dir}/nvidia.yaml overrides {etc}/nvidia.yaml for 17 device(s) "
        "(nvidia.com/gpu=0, "
    ), notes
    report = check_files([run_dir / "nvidia.yaml", etc / "nvidia.yaml"])  # order is priority
    assert report.ok and len(report.notes) == 1
    assert report.notes[0].startswith(f"{etc}/nvidia.yaml overrides {run_dir}/nvidia.yaml")

    (run_dir / "again.yaml").write_bytes((etc / "nvidia.yaml").read_bytes())
    code, out, err = gpuctk(capsys, "cdi", "validate", str(etc), str(run_dir))
    assert code == 7
    assert f"{run_dir}/nvidia.yaml: devices[0].name: nvidia.com/gpu=0 is also defined in " \
        f"{run_dir}/again.yaml" in out.splitlines()  # fmt: skip
    assert not [line for line in out.splitlines() if line.startswith(f"{etc}/") and
                not line.endswith(": valid")]  # fmt: skip
    code, out, _ = gpuctk(capsys, "cdi", "validate", "--help")  # --help says the same
    text = " ".join(out.split())
    assert code == 0 and "devices defined in two files of one folder" in text
    assert "A device in files of two folders is CDI's override, not a problem" in text
