"""`gpuctk config`: --set edits gpuctk's config.toml keeping comments, checks it as the runtime
does (a bad key or value changes nothing), refuses NVIDIA's file; `config default` is the one
text of the defaults (the deb ships it commented out); `config show` reads as the runtime reads.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from test_install_deb_files import _build

from gpuctk.cli import main
from gpuctk.hook import config
from gpuctk.install import config_edit

DATA = Path(__file__).resolve().parents[1] / "data"
NVIDIA = DATA / "nvidia-ctk-config.toml"
MINE = """\
# my node's settings
runtimes = ["runc"]  # only runc here

# where the specs are
spec-dirs = ["/etc/cdi"]
#log-level = "info"
"""


def gpuctk(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `gpuctk ARGS`, in this interpreter."""
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def snapshot(folder: Path) -> dict[str, Any]:
    """Every file in `folder`: its bytes, inode and mtime (a rewrite changes the inode)."""
    return {
        p.name: (p.read_bytes(), p.stat().st_ino, p.stat().st_mtime_ns)
        for p in sorted(folder.iterdir())
    }


def test_set_in_place_keeps_comments_and_owner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(MINE)
    os.chown(path, 1234, 5678)
    path.chmod(0o600)
    code, out, err = gpuctk(
        capsys, "config", "-c", str(path), "-i",
        "--set", "runtimes=crun,/usr/sbin/runc",
        "--set", "log-level=debug",  # commented out: set where that line is
        "--set", "accept-volume-mounts",  # a true/false key alone is true
        "--set", "spec-dirs=/etc/cdi",  # the value it has: written all the same
        "--set", "log-file=",  # the default: written explicitly
    )  # fmt: skip
    assert (code, out) == (0, ""), err
    assert path.read_text() == (
        "# my node's settings\n"
        'runtimes = ["crun", "/usr/sbin/runc"]  # only runc here\n'
        "\n"
        "# where the specs are\n"
        'spec-dirs = ["/etc/cdi"]\n'
        'log-level = "debug"\n'
        "accept-volume-mounts = true\n"
        'log-file = ""\n'
    )
    st = path.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (1234, 5678, 0o644)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]  # no temp file left
    settings = config.parse(path.read_text(), str(path))  # (load refuses uid 1234's file)
    assert settings.runtimes == ("crun", "/usr/sbin/runc") and settings.log_level == "debug"
    assert settings.accept_volume_mounts is True


def test_set_to_stdout_or_output_leaves_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(MINE)
    before = snapshot(tmp_path)
    code, out, err = gpuctk(capsys, "config", "-c", str(path), "--set", "log-level=error")
    assert code == 0, err
    assert out == MINE.replace('#log-level = "info"', 'log-level = "error"')
    assert snapshot(tmp_path) == before
    new = tmp_path / "made" / "here.toml"  # a missing folder is made, as nvidia-ctk does
    code, out, err = gpuctk(
        capsys, "config", "-c", str(path), "-o", str(new),
        "--set-list-separator", ":", "--set", "annotation-prefixes=a/:b/",
    )  # fmt: skip
    assert (code, out) == (0, ""), err
    assert 'annotation-prefixes = ["a/", "b/"]' in new.read_text()
    assert (new.stat().st_mode & 0o777, new.parent.stat().st_mode & 0o777) == (0o644, 0o755)


def test_a_missing_file_is_the_shipped_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.toml"
    code, out, err = gpuctk(
        capsys, "config", "-c", str(path), "--set", "accept-envvar-unprivileged=false"
    )
    assert code == 0, err
    shipped = config_edit.template()
    assert out == shipped.replace(
        '#accept-envvar-unprivileged = "auto"', "accept-envvar-unprivileged = false"
    )
    assert not path.exists()
    assert config.parse(out, "x").accept_envvar_unprivileged is False


@pytest.mark.parametrize(
    ("sets", "needle"),
    [
        (["bogus=1"], "--set bogus: unknown key (known: runtimes, spec-dirs, default-kind,"),
        (["log-levl=debug"], "did you mean log-level?"),
        (["log-level=loud"], "--set log-level: 'loud' is not one of debug, info, warning, error"),
        (["accept-volume-mounts=maybe"], "accept-volume-mounts must be true or false"),
        (["spec-dirs=relative"], "spec-dirs: 'relative' must be an absolute path"),
        (["default-kind"], "expected default-kind=VALUE"),
        (["runtimes="], "runtimes: name at least one runtime"),
        (["log-level=debug", "default-kind=no kind"], "default-kind"),  # one bad: none written
    ],
)
def test_a_bad_key_or_value_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sets: list[str], needle: str
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(MINE)
    before = snapshot(tmp_path)
    argv = ["config", "-c", str(path), "-i"] + [a for s in sets for a in ("--set", s)]
    code, out, err = gpuctk(capsys, *argv)
    assert code == 2 and out == ""
    first = err.splitlines()[0]
    assert first.startswith("gpuctk: error: ") and needle in first, err
    assert snapshot(tmp_path) == before


def test_a_bad_file_is_named_and_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.toml"
    path.write_text(MINE + 'log-levl = "debug"\n')
    before = snapshot(tmp_path)
    code, _, err = gpuctk(capsys, "config", "-c", str(path), "-i", "--set", "log-level=error")
    assert code == 7
    assert err == f"gpuctk: error: {path}: log-levl: unknown key (did you mean log-level?)\n"
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "args",
    [
        ["config", "-c", str(NVIDIA), "--set", "log-level=debug"],
        ["config", "-c", str(NVIDIA), "-i", "--set", "log-level=debug"],
        ["config", "-c", str(NVIDIA)],
        ["config", "-c", str(NVIDIA), "show"],
        ["config", "default", "-o", str(NVIDIA)],  # never written over
    ],
)
def test_nvidia_s_file_is_refused_with_the_migrate_command(
    capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    before = NVIDIA.read_bytes(), NVIDIA.stat().st_ino
    code, out, err = gpuctk(capsys, *args)
    assert (code, out) == (4, "")
    assert err == (
        f"gpuctk: error: {NVIDIA} is nvidia-ctk's config; carry it over with: "
        f"gpuctk migrate --from {NVIDIA}\n"
    )
    assert (NVIDIA.read_bytes(), NVIDIA.stat().st_ino) == before


def test_default_is_the_defaults_and_the_shipped_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = gpuctk(capsys, "config", "default")
    assert code == 0, err
    assert config.parse_table(out, "default") == config.DEFAULTS  # every key, at its default
    assert config.check(config.DEFAULTS) == []
    keys = re.findall(r"(?m)^([a-z-]+) = ", out)
    assert keys == list(config.DEFAULTS)  # each once, in DEFAULTS' order
    commented = re.sub(r"(?m)^(?=[a-z-]+ = )", "#", out)
    assert _build().static_files("amd64")["/etc/gpuctk/config.toml"] == commented
    lines = out.splitlines()
    for i, line in enumerate(lines):  # each key says what it does, on the line above
        if re.match(r"[a-z-]+ = ", line):
            assert lines[i - 1].startswith("# "), line


def test_show_reads_as_the_runtime_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(MINE)
    monkeypatch.setenv("GPUCTK_CONFIG", str(path))
    code, out, err = gpuctk(capsys, "config", "show", "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["file"] == str(path) and doc["exists"] is True
    assert doc["set_in_file"] == ["runtimes", "spec-dirs"]
    assert doc["settings"] == {**config.DEFAULTS, "runtimes": ["runc"], "spec-dirs": ["/etc/cdi"]}
    code, out, err = gpuctk(capsys, "config", "show")
    assert code == 0, err
    assert out.splitlines()[0] == f"# {path}"
    assert re.search(r'(?m)^runtimes = \["runc"\] +# from the file$', out), out
    assert re.search(r'(?m)^log-level = "info" +# default$', out), out
    path.chmod(0o666)  # anyone may write it: the runtime refuses it, and so does show
    code, out, err = gpuctk(capsys, "config", "show")
    assert code == 4 and out == ""
    assert err.startswith(f"gpuctk: error: {path}: refused: ") and len(err.splitlines()) == 1
    other = tmp_path / "other.toml"  # --config-file of `gpuctk config`, as GPUCTK_CONFIG
    other.write_text('log-level = "error"\n')
    code, out, err = gpuctk(capsys, "config", "-c", str(other), "show", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["settings"]["log-level"] == "error"


def test_show_without_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUCTK_CONFIG", raising=False)
    monkeypatch.setattr(config, "DEFAULT_PATH", str(tmp_path / "none.toml"))
    code, out, err = gpuctk(capsys, "config", "show", "--format", "json")
    assert code == 0, err
    assert json.loads(out) == {
        "file": str(tmp_path / "none.toml"),
        "exists": False,
        "settings": config.DEFAULTS,
        "set_in_file": [],
    }


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["config", "-i", "-o", "x", "--set", "log-level=info"], "--in-place and --output"),
        (["config", "--set", "log-level=info", "show"], "--set: options of `gpuctk config`"),
        (["config", "--set-list-separator", "", "--set", "runtimes=a"], "must not be empty"),
    ],
)
def test_flag_misuse_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    code, out, err = gpuctk(capsys, *args)
    assert code == 2 and out == "" and needle in err.splitlines()[0], err


def test_nvidia_ctk_s_names_of_default() -> None:
    from click.testing import CliRunner

    from gpuctk.cli import cli

    runner = CliRunner()
    want = runner.invoke(cli, ["config", "default"])
    assert want.exit_code == 0 and want.output
    for name in ("create-default", "generate-default"):
        done = runner.invoke(cli, ["config", name])
        assert (done.exit_code, done.output) == (0, want.output), name
