"""`--hook-config PATH`: the hook entry gpuctk writes names the gpuctk config the hook reads.

A hook gets no environment but its entry's, so the only way to point `gpuctk-hook prestart` at a
config other than /etc/gpuctk/config.toml (and so at spec dirs other than /etc/cdi and
/var/run/cdi) is GPUCTK_CONFIG in the entry's env: the containerd base spec and the podman
hooks.d file both carry it, and nothing else changes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.containerd import gpuctk, snapshot

PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def containerd(root: Path, *extra: str) -> list[str]:
    return [
        "runtime", "configure", "--config-source", "file",
        "--config", str(root / "config.toml"), "--drop-in", str(root / "conf.d" / "99-gpuctk.toml"),
        *extra,
    ]  # fmt: skip


def test_base_spec_hook_names_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = containerd(tmp_path, "--mode", "hook", "--hook-config", "/etc/gpuctk/hook.toml")
    code, _, err = gpuctk(capsys, *argv)
    assert code == 0, err
    spec = json.loads((tmp_path / "conf.d" / "99-gpuctk.base-spec.json").read_text())
    (hook,) = spec["hooks"]["prestart"]
    assert hook["env"] == [PATH_ENV, "GPUCTK_CONFIG=/etc/gpuctk/hook.toml"]
    assert hook["args"] == ["gpuctk-hook", "prestart"]


def test_without_it_the_env_is_path_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = gpuctk(capsys, *containerd(tmp_path, "--mode", "hook"))
    assert code == 0, err
    spec = json.loads((tmp_path / "conf.d" / "99-gpuctk.base-spec.json").read_text())
    assert spec["hooks"]["prestart"][0]["env"] == [PATH_ENV]


def test_podman_hooks_file_names_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hooks = tmp_path / "hooks.d" / "99-gpuctk.json"
    argv = ["runtime", "configure", "--runtime", "podman", "--drop-in", str(hooks)]
    code, _, err = gpuctk(capsys, *argv, "--hook-config", "/srv/gpuctk.toml")
    assert code == 0, err
    assert json.loads(hooks.read_text())["hook"]["env"] == [
        PATH_ENV,
        "GPUCTK_CONFIG=/srv/gpuctk.toml",
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--hook-config", "/etc/gpuctk/hook.toml"), "--hook-config is for --mode hook"),
        (("--mode", "hook", "--hook-config", "hook.toml"), "must be an absolute path"),
    ],
)
def test_bad_use_is_a_usage_error_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: tuple[str, ...], message: str
) -> None:
    (tmp_path / "config.toml").write_text("version = 2\n")
    before = snapshot(tmp_path)
    code, _, err = gpuctk(capsys, *containerd(tmp_path, *extra))
    assert code == 2 and message in err, err
    assert snapshot(tmp_path) == before
