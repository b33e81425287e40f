"""`gpuctk migrate`: NVIDIA's config.toml (tests/data/nvidia-ctk-config.toml, in the layout
`nvidia-ctk config default` prints, with an operator's changes) carried over to gpuctk's by the
one table of gpuctk.install.nvctk_config; the result read by the runtime's loader, and a create
through gpuctk-runtime that shows the carried settings at work.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest
from test_config_cmd import MINE, gpuctk, snapshot
from test_shim import Env, base_config, device_paths

from gpuctk.errors import ValidationError
from gpuctk.hook import config
from gpuctk.install import config_edit, nvctk_config

ROOT = Path(__file__).resolve().parents[2]
NVIDIA = ROOT / "tests" / "data" / "nvidia-ctk-config.toml"


def migrate(
    capsys: pytest.CaptureFixture[str], source: Path, target: Path, *extra: str
) -> tuple[int, str, str]:
    return gpuctk(capsys, "migrate", "--from", str(source), "--config-file", str(target), *extra)


def test_migrate_writes_what_the_runtime_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "etc" / "gpuctk" / "config.toml"
    code, out, err = migrate(capsys, NVIDIA, target)
    assert code == 0, err
    assert err == f"gpuctk: wrote 8 setting(s) to {target}\n"
    settings = config.load({"GPUCTK_CONFIG": str(target)})  # trusted, checked: as the shim
    assert settings.runtimes == ("crun", "runc")
    assert settings.spec_dirs == ("/etc/cdi", "/var/run/cdi", "/var/lib/cdi")
    assert settings.annotation_prefixes == ("cdi.k8s.io/", "nvidia.cdi.k8s.io/")
    assert settings.default_kind == "nvidia.com/gpu"
    assert settings.accept_envvar_unprivileged is False and settings.accept_volume_mounts is True
    assert settings.log_file == "/var/log/nvidia-container-runtime.log"
    assert settings.log_level == "warning"  # logrus' "warn"
    text = target.read_text()
    assert text.startswith(config_edit.template().split("\n", 1)[0])  # the shipped comments
    assert "#disable-device-node-modification = true" in text  # not carried: still commented
    assert target.stat().st_mode & 0o777 == 0o644
    # the table: every setting of the file, once, in its order
    lines = out.splitlines()
    assert lines[0].split() == ["nvidia-ctk", "setting", "value", "gpuctk"]
    keys = [k for k, _ in nvctk_config.leaves(tomllib.loads(NVIDIA.read_text()))]
    assert [line.split()[0] for line in lines[1:]] == keys
    row = dict((line.split()[0], line) for line in lines[1:])
    assert row["nvidia-container-runtime.log-level"].endswith('log-level = "warning"')
    assert "pass --driver-root to gpuctk cdi generate" in row["nvidia-container-cli.root"]
    assert "always applies the CDI specs" in row["nvidia-container-runtime.mode"]
    assert (
        '"ldconfig" (NVIDIA\'s default)'
        in row["nvidia-container-runtime.modes.legacy.cuda-compat-mode"]
    )
    assert "no equivalent" in row["features.ignore-imex-channel-requests"]
    # run again: the file already says all that
    before = snapshot(target.parent)
    code, _, err = migrate(capsys, NVIDIA, target)
    assert code == 0 and "unchanged" in err
    assert snapshot(target.parent) == before


def test_an_existing_file_keeps_its_other_keys_and_comments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "nvidia.toml"
    source.write_text('[nvidia-container-runtime]\nlog-level = "trace"\n')
    target = tmp_path / "config.toml"
    target.write_text(MINE)
    code, _, err = migrate(capsys, source, target)
    assert code == 0, err
    assert target.read_text() == MINE.replace('#log-level = "info"', 'log-level = "debug"')


def test_dry_run_and_json_write_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "config.toml"
    code, out, err = migrate(capsys, NVIDIA, target, "--dry-run")
    assert code == 0, err
    assert f"# --- would write {target} ---" in out and 'log-level = "warning"' in out
    code, out, err = migrate(capsys, NVIDIA, target, "--dry-run", "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["written"], doc["from"], doc["config_file"]) == (False, str(NVIDIA), str(target))
    by_key = {r["nvidia"]: r for r in doc["settings"]}
    assert by_key["nvidia-container-runtime.debug"]["gpuctk"] == "log-file"
    assert by_key["disable-require"]["gpuctk"] is None
    assert by_key["disable-require"]["nvidia_default"] is True
    assert config.parse(doc["config"], "x").log_level == "warning"
    assert not target.exists()


def test_the_source_comes_from_nvidia_s_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NVIDIA_CTK_CONFIG", str(NVIDIA))
    code, out, err = gpuctk(
        capsys, "migrate", "--config-file", str(tmp_path / "c.toml"), "--dry-run"
    )
    assert code == 0 and "nvidia-container-cli.root" in out, err


def test_dev_null_debug_is_no_log_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "nvidia.toml"
    source.write_text('[nvidia-container-runtime]\ndebug = "/dev/null"\n')
    target = tmp_path / "config.toml"
    code, out, err = migrate(capsys, source, target)
    assert code == 0, err
    assert config.load({"GPUCTK_CONFIG": str(target)}).log_file == ""
    assert "/dev/null\" (NVIDIA's default)" in out


@pytest.mark.parametrize("value", ["true", "false"])
def test_carrying_the_unprivileged_env_switch_on_is_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """NVIDIA's default (true) carried over lets a Kubernetes pod granted no GPU take them all
    by env; gpuctk carries it as written, and says so, with the command to undo it."""
    source = tmp_path / "nvidia.toml"
    source.write_text(f"accept-nvidia-visible-devices-envvar-when-unprivileged = {value}\n")
    target = tmp_path / "config.toml"
    code, _, err = migrate(capsys, source, target)
    assert code == 0, err
    warned = "gpuctk config -i --set accept-envvar-unprivileged=auto" in err
    assert warned == (value == "true"), err
    assert config.load({"GPUCTK_CONFIG": str(target)}).accept_envvar_unprivileged is (
        value == "true"
    )


@pytest.mark.parametrize(
    ("text", "code", "needle"),
    [
        (None, 4, "no such file"),
        ("[nvidia-container-runtime\n", 7, "invalid TOML"),
        ("# nothing\n", 7, "no nvidia-ctk settings in it"),
        (MINE, 7, "no nvidia-ctk settings in it"),  # gpuctk's own file
        (
            '[nvidia-container-runtime]\nlog-level = "loud"\n',
            7,
            "nvidia-container-runtime.log-level = \"loud\": 'loud' is not one of",
        ),
        (
            '[nvidia-container-runtime.modes.cdi]\nspec-dirs = ["cdi"]\n',
            7,
            "spec-dirs = [\"cdi\"]: 'cdi' must be an absolute path (as gpuctk's spec-dirs)",
        ),
    ],
)
def test_a_bad_source_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | None, code: int, needle: str
) -> None:
    source = tmp_path / "src" / "nvidia.toml"
    source.parent.mkdir()
    if text is not None:
        source.write_text(text)
    target = tmp_path / "etc" / "config.toml"
    target.parent.mkdir()
    target.write_text(MINE)
    before = snapshot(target.parent)
    got, out, err = migrate(capsys, source, target)
    assert (got, out) == (code, "")
    assert err.startswith(f"gpuctk: error: {source}: ") and needle in err, err
    assert len(err.splitlines()) == 1
    assert snapshot(target.parent) == before


def test_every_row_names_a_gpuctk_key_or_why_not() -> None:
    for row in nvctk_config.ROWS:
        if row.gpuctk is None:
            assert row.note.startswith("no equivalent"), row
        else:
            assert row.gpuctk in config.DEFAULTS, row
    assert nvctk_config.row_of("features.something-new").nvidia == "features.*"
    assert nvctk_config.row_of("nvidia-container-cli.user").nvidia == "nvidia-container-cli.*"
    assert nvctk_config.row_of("unheard-of").nvidia == "*"


def test_the_docs_show_the_table() -> None:
    """docs/commands.md's table under `gpuctk migrate` is the module's, line for line."""
    text = (ROOT / "docs" / "commands.md").read_text()
    table = "\n".join(nvctk_config.doc_table())
    assert f"\n{table}\n\n" in text, "docs/commands.md: paste nvctk_config.doc_table()"


def test_a_create_runs_with_the_carried_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """gpuctk-runtime create, under the file migrate wrote: the runtime NVIDIA's file named
    ran, devices came from its spec folder, volume mounts were honoured and an unprivileged
    env request refused (gpuctk's defaults do the opposite of both), its extra annotation
    prefix was read, and the debug file is the log."""
    env = Env(tmp_path)
    log = tmp_path / "nvidia-runtime.log"
    source = tmp_path / "nvidia.toml"
    source.write_text(
        "accept-nvidia-visible-devices-as-volume-mounts = true\n"
        "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n"
        "[nvidia-container-runtime]\n"
        f'debug = "{log}"\n'
        'log-level = "debug"\n'
        f'runtimes = ["{env.runtime}"]\n'
        "[nvidia-container-runtime.modes.cdi]\n"
        f'spec-dirs = ["{env.cdi}"]\n'
        'annotation-prefixes = ["example.com/gpus."]\n'
    )
    (tmp_path / "config.toml").unlink()  # the shim's file: what migrate writes
    code, _, err = migrate(capsys, source, tmp_path / "config.toml")
    assert code == 0, err

    def create(config_json: dict[str, Any]) -> list[str]:
        (env.record / "seen.json").unlink(missing_ok=True)
        env.write_config(config_json)
        done = env.create()
        assert done.returncode == 0, done.stderr
        assert (env.argv() or [""])[0] == str(env.runtime)  # the runtime carried over
        return device_paths(env.seen())

    mount = {"destination": "/var/run/nvidia-container-devices/0", "source": "/dev/null",
             "type": "bind", "options": ["bind", "ro"]}  # fmt: skip
    doc = base_config([])
    doc["mounts"].append(mount)
    assert create(doc) == ["/dev/nvidiactl", "/dev/nvidia0"]
    assert create(base_config(["NVIDIA_VISIBLE_DEVICES=1"])) == []  # unprivileged: refused
    doc = base_config([], annotations={"example.com/gpus.x": "nvidia.com/gpu=1"})
    assert create(doc) == ["/dev/nvidiactl", "/dev/nvidia1"]
    assert log.stat().st_size > 0 and "ctr1" in log.read_text()
    assert os.path.getsize(env.tmp / "config.toml") > 0


def test_the_runtime_names_migrate_for_nvidia_s_keys(tmp_path: Path) -> None:
    """NVIDIA's file named as gpuctk's (GPUCTK_CONFIG) fails, as any bad file, with a line that
    says what to run: the shim and gpuctk doctor show it."""
    with pytest.raises(ValidationError) as exc:
        config.parse(NVIDIA.read_text(), str(NVIDIA))
    assert any(
        p.startswith("nvidia-container-runtime: nvidia-ctk's setting, not gpuctk's")
        and p.endswith("(carry its file over: gpuctk migrate)")
        for p in exc.value.problems
    ), exc.value.problems
    assert "accept-nvidia-visible-devices-as-volume-mounts: nvidia-ctk's" in exc.value.message
