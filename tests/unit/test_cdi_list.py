"""`gpuctk cdi list` and `gpuctk cdi validate` (gpuctk.cdi.cli_inspect), driven by CliRunner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result
from fixtures.containerd import gpuctk

from gpuctk.cdi.cli_inspect import list_cmd, scan_spec_dirs, validate_cmd
from gpuctk.errors import GpuctkError, InputError, ValidationError


def spec(
    *device_names: str, kind: str = "nvidia.com/gpu", version: str = "0.5.0"
) -> dict[str, Any]:
    return {
        "cdiVersion": version,
        "kind": kind,
        "devices": [
            {"name": n, "containerEdits": {"deviceNodes": [{"path": f"/dev/x{i}"}]}}
            for i, n in enumerate(device_names)
        ],
    }


def put(directory: Path, name: str, doc: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def run(command: click.Command, *args: str) -> Result:
    return CliRunner().invoke(command, list(args))


def exit_code(result: Result) -> int:
    """The exit code gpuctk.cli.main would give: GpuctkError carries it."""
    if isinstance(result.exception, GpuctkError):
        return result.exception.exit_code
    return result.exit_code


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "etc-cdi", tmp_path / "run-cdi"


def test_list_prints_qualified_names_in_natural_order(dirs: tuple[Path, Path]) -> None:
    etc, run_dir = dirs
    put(etc, "nvidia.yaml", spec("10", "2", "all", "0:1"))
    put(run_dir, "other.json", spec("a", kind="vendor.com/net"))
    result = run(list_cmd, "--spec-dir", str(etc), "--spec-dir", str(run_dir))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "nvidia.com/gpu=0:1",
        "nvidia.com/gpu=2",
        "nvidia.com/gpu=10",
        "nvidia.com/gpu=all",
        "vendor.com/net=a",
    ]
    assert result.stderr == ""


def test_later_dir_wins_and_same_dir_conflicts_are_dropped(dirs: tuple[Path, Path]) -> None:
    etc, run_dir = dirs
    put(etc, "a.json", spec("0", "1"))
    put(run_dir, "b.json", spec("0"))
    listing = scan_spec_dirs([str(etc), str(run_dir)])
    assert {(d.name, Path(d.spec).name) for d in listing.devices} == {
        ("nvidia.com/gpu=0", "b.json"),
        ("nvidia.com/gpu=1", "a.json"),
    }
    assert listing.problems == {}
    put(run_dir, "c.json", spec("0", "2"))  # same priority as b.json: a conflict
    listing = scan_spec_dirs([str(etc), str(run_dir)])
    assert [d.name for d in listing.devices] == ["nvidia.com/gpu=1", "nvidia.com/gpu=2"]
    assert set(listing.problems) == {str(run_dir / "b.json"), str(run_dir / "c.json")}
    assert "conflicting device nvidia.com/gpu=0" in listing.problems[str(run_dir / "c.json")][0]


def test_invalid_files_are_skipped_with_a_warning(dirs: tuple[Path, Path]) -> None:
    etc, _ = dirs
    put(etc, "good.json", spec("0"))
    bad = put(etc, "bad.yaml", "cdiVersion: 0.5.0\nkind: a/b\nkind: a/c\n")
    put(etc, "ignored.yml", "not even: [yaml")  # the engines read only .json and .yaml
    put(etc, "notes.txt", "hello")
    (etc / "sub.json").mkdir()
    result = run(list_cmd, "--spec-dir", str(etc))
    assert result.exit_code == 0
    assert result.stdout == "nvidia.com/gpu=0\n"
    assert f"gpuctk: warning: {bad}: duplicate key 'kind'" in result.stderr
    strict = run(list_cmd, "--spec-dir", str(etc), "--strict")
    assert exit_code(strict) == 7 and strict.stdout == "nvidia.com/gpu=0\n"


def test_list_fails_only_when_nothing_valid_was_read(dirs: tuple[Path, Path]) -> None:
    etc, run_dir = dirs
    put(etc, "bad.json", spec("0", version="0.3.0"))
    result = run(list_cmd, "--spec-dir", str(etc))
    assert exit_code(result) == 7
    assert "needs at least 0.5.0" in result.stderr
    empty = run(list_cmd, "--spec-dir", str(run_dir))  # missing dir: nothing to list, not an error
    assert empty.exit_code == 0 and empty.stdout == ""
    assert "no CDI spec files" in empty.stderr


def test_list_json(dirs: tuple[Path, Path]) -> None:
    etc, run_dir = dirs
    put(run_dir, "nv.json", spec("0"))
    bad = put(etc, "bad.json", "{")
    result = run(list_cmd, "--spec-dir", str(etc), "--spec-dir", str(run_dir), "--format", "json")
    assert result.exit_code == 0
    body = json.loads(result.stdout)
    assert body["devices"] == [
        {"name": "nvidia.com/gpu=0", "spec": str(run_dir / "nv.json"), "specDir": str(run_dir)}
    ]
    assert list(body["problems"]) == [str(bad)]


def test_validate_ok_and_problems(tmp_path: Path) -> None:
    good = put(tmp_path, "good.json", spec("0"))
    doc = spec("0", "1")
    doc["devices"][1]["containerEdits"]["deviceNodes"][0]["path"] = "dev/x"
    doc["devices"][1]["containerEdits"]["env"] = ["NOEQUALS"]
    bad = put(tmp_path, "bad.json", doc)
    ok = run(validate_cmd, str(good), "--no-schema")
    assert ok.exit_code == 0 and ok.stdout == f"{good}: valid\n"
    result = run(validate_cmd, str(good), str(bad), "--no-schema")
    assert exit_code(result) == 7
    assert isinstance(result.exception, ValidationError)
    assert result.stdout.splitlines() == [
        f"{good}: devices[0].name: nvidia.com/gpu=0 is also defined in {bad}",
        f"{bad}: devices[1].containerEdits.env[0]: 'NOEQUALS' is not KEY=VALUE",
        f"{bad}: devices[1].containerEdits.deviceNodes[0].path: must be absolute, not 'dev/x'",
        f"{bad}: devices[0].name: nvidia.com/gpu=0 is also defined in {good}",
    ]
    assert result.exception.message == "4 problem(s) in 2 of 2 file(s)"
    assert len(result.exception.problems) == 4


def test_validate_json_and_directories(tmp_path: Path) -> None:
    put(tmp_path / "d", "a.yaml", "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")
    put(tmp_path / "d", "b.json", spec("1"))
    result = run(validate_cmd, str(tmp_path / "d"), "--format", "json", "--no-schema")
    assert exit_code(result) == 7
    body = json.loads(result.stdout)
    assert body["valid"] is False
    assert [(Path(f["path"]).name, f["valid"]) for f in body["files"]] == [
        ("a.yaml", False),
        ("b.json", True),
    ]
    assert body["files"][0]["problems"] == ["devices: a spec needs at least one device"]
    empty = run(validate_cmd, str(tmp_path / "d" / "nothing-here"))
    assert exit_code(empty) == 4  # a missing file is unreadable input (EXIT_INPUT)
    (tmp_path / "e").mkdir()
    none = run(validate_cmd, str(tmp_path / "e"))
    assert isinstance(none.exception, InputError) and exit_code(none) == 4


def test_validate_schema_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = put(tmp_path, "good.json", spec("0"))
    bad_dir = run(validate_cmd, str(good), "--schema-dir", str(tmp_path))
    assert exit_code(bad_dir) == 2  # UsageError: no schema.json there
    monkeypatch.delenv("GPUCTK_CDI_SCHEMA_DIR", raising=False)
    monkeypatch.setattr("gpuctk.cdi.specs.validate.SHIPPED_SCHEMA", tmp_path / "none.json")
    skipped = run(validate_cmd, str(good))
    assert skipped.exit_code == 0
    assert "gpuctk: note: CDI JSON schema not found" in skipped.stderr


def test_help_texts_teach() -> None:
    for command, needles in (
        (list_cmd, ["--spec-dir", "later directory has priority", "Exit status"]),
        (validate_cmd, ["--schema-dir", "0.5.0 for numeric device", "Exit status", "Examples"]),
    ):
        result = run(command, "--help")
        assert result.exit_code == 0
        for needle in needles:
            assert needle in result.stdout


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_list_without_specs_says_what_to_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    """Empty or missing spec folders: one stderr line naming the generate command, stdout as is."""
    empty, missing = tmp_path / "etc-cdi", tmp_path / "run-cdi"
    empty.mkdir()
    argv = ["cdi", "list", "--spec-dir", str(empty), "--spec-dir", str(missing), "--format", fmt]
    code, out, err = gpuctk(capsys, *argv)
    assert code == 0
    assert err == (
        f"gpuctk: no CDI spec files in {empty}, {missing}: "
        f"run gpuctk cdi generate --output {missing}/nvidia.yaml\n"
    )
    if fmt == "json":
        assert json.loads(out)["devices"] == []
    else:
        assert out == ""
