"""What the real containerd 1.6 sees after `gpuctk runtime configure`: `config dump` checks.

For each real-world starting config, and for both ways of reading the current configuration
(`--config-source command`: containerd's own dump; `file`: gpuctk's re-implementation of the
import rules), `containerd --config <main> config dump` after configure shows the new handler
with the shim path, AND everything else exactly as before: the runc handler with its options,
the sandbox image, registry settings, other plugins.
"""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures.containerd import (
    CRI,
    SHIM,
    SYSTEMD_SANDBOX,
    VERSION_3,
    WITH_IMPORTS_DROP_IN,
    WITH_IMPORTS_MAIN,
    default_config,
    dump,
    gpuctk,
    have_containerd,
    runtimes,
    snapshot,
    without_handler,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not have_containerd(), reason="containerd is not installed"),
]


def _none(root: Path) -> None:
    pass


def _default(root: Path) -> None:
    (root / "config.toml").write_text(default_config())


def _systemd(root: Path) -> None:
    (root / "config.toml").write_text(SYSTEMD_SANDBOX)


def _imports(root: Path) -> None:
    other = root / "other.d"
    other.mkdir()
    (other / "10-cri.toml").write_text(WITH_IMPORTS_DROP_IN)
    (root / "config.toml").write_text(WITH_IMPORTS_MAIN.format(other=other))


STARTS: dict[str, Callable[[Path], None]] = {
    "none": _none,
    "default": _default,
    "systemd-sandbox": _systemd,
    "existing-imports": _imports,
}


def configure(root: Path, source: str, *extra: str) -> list[str]:
    return [
        "runtime",
        "configure",
        "--config-source",
        source,
        "--config",
        str(root / "config.toml"),
        "--drop-in",
        str(root / "conf.d" / "99-gpuctk.toml"),
        *extra,
    ]


def dump_of(root: Path) -> dict[str, object]:
    main = root / "config.toml"
    if main.exists():
        return dump(main)
    empty = root / "empty.toml"  # containerd without a config file runs on its defaults
    empty.write_text("version = 2\n")
    try:
        return dump(empty)
    finally:
        empty.unlink()


@pytest.mark.parametrize("source", ["command", "file"])
@pytest.mark.parametrize("start", list(STARTS))
@pytest.mark.parametrize("default", [False, True])
def test_dump_shows_handler_and_keeps_everything_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], start: str, source: str, default: bool
) -> None:
    STARTS[start](tmp_path)
    before = dump_of(tmp_path)
    flags = ("--set-as-default",) if default else ()
    code, _, err = gpuctk(capsys, *configure(tmp_path, source, *flags))
    assert code == 0, err
    after = dump(tmp_path / "config.toml")

    handler = runtimes(after)["nvidia"]
    assert handler["runtime_type"] == "io.containerd.runc.v2"
    assert handler["options"]["BinaryName"] == SHIM
    assert "cdi.k8s.io/*" in handler["container_annotations"]
    runc = runtimes(before)["runc"]
    assert runtimes(after)["runc"] == runc  # the original handler, options and all
    copied = {k: v for k, v in handler["options"].items() if k != "BinaryName"}
    assert copied == {k: v for k, v in runc["options"].items() if k != "BinaryName"}
    if start in ("systemd-sandbox", "existing-imports"):
        assert handler["options"]["SystemdCgroup"] is True

    expected = copy.deepcopy(without_handler(before))
    if default:
        assert after["plugins"][CRI]["containerd"]["default_runtime_name"] == "nvidia"
        expected["plugins"][CRI]["containerd"]["default_runtime_name"] = "nvidia"
    assert without_handler(after) == expected  # every other setting, every plugin


@pytest.mark.parametrize("start", list(STARTS))
def test_command_and_file_sources_agree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], start: str
) -> None:
    """gpuctk's re-reading of the files gives containerd the same view as its own dump."""
    STARTS[start](tmp_path)
    assert gpuctk(capsys, *configure(tmp_path, "command"))[0] == 0
    by_command = dump(tmp_path / "config.toml")
    assert gpuctk(capsys, *configure(tmp_path, "file"))[0] == 0
    assert dump(tmp_path / "config.toml") == by_command


@pytest.mark.parametrize("source", ["command", "file"])
@pytest.mark.parametrize("start", list(STARTS))
def test_second_run_changes_nothing_and_unconfigure_restores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], start: str, source: str
) -> None:
    STARTS[start](tmp_path)
    pristine = snapshot(tmp_path)
    before = dump_of(tmp_path)
    assert gpuctk(capsys, *configure(tmp_path, source, "--set-as-default"))[0] == 0
    first = snapshot(tmp_path)
    code, out, _ = gpuctk(capsys, *configure(tmp_path, source, "--set-as-default"))
    assert code == 0 and "nothing to change" in out
    assert snapshot(tmp_path) == first
    unconfigure = [
        "runtime",
        "unconfigure",
        "--config",
        str(tmp_path / "config.toml"),
        "--drop-in",
        str(tmp_path / "conf.d" / "99-gpuctk.toml"),
    ]
    assert gpuctk(capsys, *unconfigure)[0] == 0
    assert snapshot(tmp_path) == pristine
    assert dump_of(tmp_path) == before


def test_hook_mode_base_spec_is_containerd_default_spec_plus_hook(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _systemd(tmp_path)
    assert gpuctk(capsys, *configure(tmp_path, "command", "--mode", "hook"))[0] == 0
    handler = runtimes(dump(tmp_path / "config.toml"))["nvidia"]
    spec_path = Path(handler["base_runtime_spec"])
    assert spec_path == tmp_path / "conf.d" / "99-gpuctk.base-spec.json"
    assert handler["options"].get("BinaryName", "") == ""  # runc itself, no shim
    assert handler["options"]["SystemdCgroup"] is True
    spec = json.loads(spec_path.read_text())
    hooks = spec.pop("hooks")
    assert hooks == {
        "prestart": [
            {
                "path": "/usr/bin/gpuctk-hook",
                "args": ["gpuctk-hook", "prestart"],
                "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            }
        ]
    }
    default = json.loads(
        subprocess.run(["ctr", "oci", "spec"], capture_output=True, text=True, check=True).stdout
    )
    default["linux"].pop("cgroupsPath")  # per container: CRI sets it
    assert spec == default


def test_version_3_main_with_containerd_1_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.toml").write_text(VERSION_3)
    before = snapshot(tmp_path)
    code, _, err = gpuctk(capsys, *configure(tmp_path, "command"))
    assert code == 7 and "conflicting versions" in err and "reads version 2" in err
    assert snapshot(tmp_path) == before
    code, _, err = gpuctk(capsys, *configure(tmp_path, "auto"))
    assert code == 7 and snapshot(tmp_path) == before


def test_missing_containerd_with_command_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = gpuctk(
        capsys, *configure(tmp_path, "command", "--executable-path", str(tmp_path / "nope"))
    )
    assert code == 4 and "not an executable file" in err
    assert snapshot(tmp_path) == {}
