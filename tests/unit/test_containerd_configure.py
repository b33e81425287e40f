"""`gpuctk runtime configure/unconfigure --runtime containerd` with --config-source file.

These run without containerd: the version-2 results are checked against the real
`containerd config dump` in tests/integration/test_containerd_dump.py; the version-3 result
(containerd 2.x cannot run here) is checked by containerd 2.x's documented deep-merge rules.
"""

from __future__ import annotations

import json
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

import pytest
from fixtures.containerd import SHIM, SYSTEMD_SANDBOX, VERSION_3, gpuctk, ro_mount, snapshot

from gpuctk.containerd import plan as planmod
from gpuctk.errors import OutputError
from gpuctk.writes import atomic_write

V3 = "io.containerd.cri.v1.runtime"
V2 = "io.containerd.grpc.v1.cri"


def args(root: Path, *extra: str) -> list[str]:
    return [
        "runtime",
        "configure",
        "--config-source",
        "file",
        "--config",
        str(root / "config.toml"),
        "--drop-in",
        str(root / "conf.d" / "99-gpuctk.toml"),
        *extra,
    ]


def unargs(root: Path) -> list[str]:
    return [
        "runtime",
        "unconfigure",
        "--config",
        str(root / "config.toml"),
        "--drop-in",
        str(root / "conf.d" / "99-gpuctk.toml"),
    ]


def merge_v3(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """containerd 2.x (PR #9982, its TestMergingPlugins* cases): tables merge, values replace."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_v3(out[key], value)
        else:
            out[key] = value
    return out


def leaves(table: dict[str, Any], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for key, value in table.items():
        path = f"{prefix}.{key}" if prefix else key
        out |= leaves(value, path) if isinstance(value, dict) and value else {path}
    return out


@pytest.mark.parametrize("flags", [(), ("--set-as-default", "--cdi-enabled")])
def test_version_3_by_deep_merge_rules(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: tuple[str, ...]
) -> None:
    main = tmp_path / "config.toml"
    main.write_text(VERSION_3)
    code, _, err = gpuctk(capsys, *args(tmp_path, *flags))
    assert code == 0, err
    original = tomllib.loads(VERSION_3)
    now = tomllib.loads(main.read_text())
    drop_in_path = str(tmp_path / "conf.d" / "99-gpuctk.toml")
    assert now.pop("imports") == [drop_in_path]
    assert now == original
    assert main.read_text().startswith("# containerd 2.x\nversion = 3\nimports = [")

    drop_in = tomllib.loads(Path(drop_in_path).read_text())
    assert drop_in["version"] == 3
    allowed = {f"plugins.{V3}.containerd.runtimes.nvidia"}
    if flags:
        allowed |= {
            f"plugins.{V3}.containerd.default_runtime_name",
            f"plugins.{V3}.enable_cdi",
            f"plugins.{V3}.cdi_spec_dirs",
        }
    written = {p for p in leaves(drop_in) if p != "version"}
    assert all(any(p == a or p.startswith(a + ".") for a in allowed) for p in written), written

    merged = merge_v3(original, drop_in)
    cri = merged["plugins"][V3]
    nvidia = cri["containerd"]["runtimes"]["nvidia"]
    runc = original["plugins"][V3]["containerd"]["runtimes"]["runc"]
    assert cri["containerd"]["runtimes"]["runc"] == runc  # untouched
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert nvidia["options"] == {"SystemdCgroup": True, "BinaryName": SHIM}
    assert nvidia["pod_annotations"] == ["io.example/trace"]  # copied from runc
    assert nvidia["container_annotations"] == ["cdi.k8s.io/*"]
    assert (
        merged["plugins"]["io.containerd.cri.v1.images"]
        == original["plugins"]["io.containerd.cri.v1.images"]
    )
    assert cri["enable_unprivileged_ports"] is True
    if flags:
        assert cri["containerd"]["default_runtime_name"] == "nvidia"
        assert cri["enable_cdi"] is True
        assert cri["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    else:
        assert cri["containerd"]["default_runtime_name"] == "runc"


@pytest.mark.parametrize("start", [None, SYSTEMD_SANDBOX, VERSION_3])
@pytest.mark.parametrize("mode", ["shim", "hook"])
def test_idempotent_and_unconfigure_restores_everything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], start: str | None, mode: str
) -> None:
    if start is not None:
        (tmp_path / "config.toml").write_text(start)
    before = snapshot(tmp_path)
    assert gpuctk(capsys, *args(tmp_path, "--mode", mode, "--set-as-default"))[0] == 0
    first = snapshot(tmp_path)
    code, out, _ = gpuctk(capsys, *args(tmp_path, "--mode", mode, "--set-as-default"))
    assert code == 0 and "nothing to change" in out
    assert snapshot(tmp_path) == first  # byte for byte
    if start is not None:
        assert first["config.toml.gpuctk-backup"] == start.encode()
    code, out, err = gpuctk(capsys, *unargs(tmp_path))
    assert code == 0, err
    assert snapshot(tmp_path) == before
    assert gpuctk(capsys, *unargs(tmp_path))[1].startswith("nothing to change")


def test_hook_mode_writes_base_spec_beside_drop_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gpuctk(capsys, *args(tmp_path, "--mode", "hook", "--hook-path", "/opt/g/hook"))[0] == 0
    spec_path = tmp_path / "conf.d" / "99-gpuctk.base-spec.json"
    drop_in = tomllib.loads((tmp_path / "conf.d" / "99-gpuctk.toml").read_text())
    nvidia = drop_in["plugins"][V2]["containerd"]["runtimes"]["nvidia"]
    assert nvidia["base_runtime_spec"] == str(spec_path)
    assert nvidia["options"].get("BinaryName", "") == ""  # runc itself runs; no shim
    spec = json.loads(spec_path.read_text())
    hook = spec["hooks"]["prestart"][0]
    assert hook["path"] == "/opt/g/hook" and hook["args"] == ["gpuctk-hook", "prestart"]
    assert hook["env"] and all(e.startswith("PATH=/") for e in hook["env"])
    assert spec["root"] == {"path": "rootfs"} and spec["linux"]["namespaces"]


def test_dry_run_writes_nothing_and_prints_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.toml").write_text(SYSTEMD_SANDBOX)
    before = snapshot(tmp_path)
    code, out, _ = gpuctk(capsys, *args(tmp_path, "--dry-run"))
    assert code == 0 and snapshot(tmp_path) == before
    assert f"# --- would write {tmp_path}/conf.d/99-gpuctk.toml (containerd drop-in) ---" in out
    assert 'BinaryName = "/usr/bin/gpuctk-runtime"' in out
    assert f"# --- would write {tmp_path}/config.toml (containerd main config) ---" in out


def test_rerun_picks_up_main_config_edits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main = tmp_path / "config.toml"
    main.write_text(SYSTEMD_SANDBOX)
    assert gpuctk(capsys, *args(tmp_path))[0] == 0
    main.write_text(main.read_text().replace("pause:3.9", "pause:3.10"))
    assert gpuctk(capsys, *args(tmp_path))[0] == 0
    drop_in = tomllib.loads((tmp_path / "conf.d" / "99-gpuctk.toml").read_text())
    assert drop_in["plugins"][V2]["sandbox_image"] == "registry.example.com/pause:3.10"


# --- bad input: a clear error, the right exit code, nothing changed on disk ---------------------


def check_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, match: str
) -> None:
    before = snapshot(tmp_path)
    got, out, err = gpuctk(capsys, *argv)
    assert got == code, (out, err)
    lines = 2 if code == 2 else 1  # a usage error: the --help hint follows
    assert match in err and err.startswith("gpuctk: error: ") and err.count("\n") == lines, err
    if code == 2:
        assert err.endswith("\nTry 'gpuctk runtime configure --help'.\n"), err
    assert snapshot(tmp_path) == before


def test_unparsable_main_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.toml").write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri"\n')
    check_refused(tmp_path, capsys, args(tmp_path), 7, "config.toml: not valid TOML")
    check_refused(tmp_path, capsys, unargs(tmp_path), 7, "config.toml: not valid TOML")


def test_drop_in_folder_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.toml").write_text(SYSTEMD_SANDBOX)
    (tmp_path / "conf.d").write_text("not a folder\n")
    check_refused(tmp_path, capsys, args(tmp_path), 5, "conf.d is not a directory")


def test_unwritable_location(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.toml").write_text(SYSTEMD_SANDBOX)
    if os.geteuid() == 0:
        with ro_mount(tmp_path / "conf.d"):
            check_refused(tmp_path, capsys, args(tmp_path), 5, "is not writable")
    else:
        (tmp_path / "conf.d").mkdir(mode=0o555)
        check_refused(tmp_path, capsys, args(tmp_path), 5, "is not writable")


def test_unwritable_main_config_folder_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The drop-in folder is writable but the main config's is not: no drop-in is left over."""
    etc = tmp_path / "etc"
    etc.mkdir()
    if os.geteuid() != 0:
        etc.chmod(stat.S_IRUSR | stat.S_IXUSR)
        check_refused(tmp_path, capsys, args(etc), 5, "is not writable")
        return
    with ro_mount(etc):
        argv = args(tmp_path)
        argv[argv.index("--config") + 1] = str(etc / "config.toml")
        check_refused(tmp_path, capsys, argv, 5, "is not writable")


@pytest.mark.parametrize(
    ("main", "other", "match"),
    [
        ("version = 2\nimports = ['other.toml']\n", "version = 3\n", "conflicting versions"),
        (VERSION_3.replace("version = 3", "version = 2"), None, "conflicting versions"),
        ("version = 1\n[plugins.cri]\n  x = 1\n", None, "version 1 is not supported"),
        ('[plugins."io.containerd.grpc.v1.cri"]\n  x = 1\n', None, "no `version`"),
        ("version = 9\n", None, "unsupported config version 9"),
    ],
)
def test_conflicting_versions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], main: str, other: str | None, match: str
) -> None:
    (tmp_path / "config.toml").write_text(main)
    if other is not None:
        (tmp_path / "other.toml").write_text(other)
    check_refused(tmp_path, capsys, args(tmp_path), 7, match)


def test_foreign_drop_in_is_neither_overwritten_nor_removed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "99-gpuctk.toml").write_text("version = 2\n# someone else's\n")
    check_refused(tmp_path, capsys, args(tmp_path), 5, "not written by gpuctk")
    check_refused(tmp_path, capsys, unargs(tmp_path), 5, "not written by gpuctk")


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (("--runtime-name", "Bad_Name"), "DNS label"),
        (("--runtime-name", "runc"), "names an existing runtime"),
        (("--runtime-path", "gpuctk-runtime"), "must be an absolute path"),
        (("--cdi-spec-dir", "cdi"), "must be an absolute path"),
    ],
)
def test_bad_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: tuple[str, ...], match: str
) -> None:
    check_refused(tmp_path, capsys, args(tmp_path, *extra), 2, match)


def test_failed_write_rolls_back_earlier_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "a" / "first", tmp_path / "second"
    second.write_bytes(b"old")
    real = atomic_write

    def failing(path: str, data: bytes, mode: int = 0o644) -> None:
        if path == str(second):
            raise OutputError(f"cannot write {path}: injected")
        real(path, data, mode)

    monkeypatch.setattr(planmod, "atomic_write", failing)
    before = snapshot(tmp_path)
    changes = [
        planmod.FileChange(str(first), b"new", "first"),
        planmod.FileChange(str(second), b"new", "second"),
    ]
    with pytest.raises(OutputError, match="injected"):
        planmod.apply(changes)
    assert snapshot(tmp_path) == before  # first removed again, its new folder too


def test_restart_runs_systemctl_only_when_something_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    root = tmp_path / "etc"
    code, out, _ = gpuctk(capsys, *args(root, "--restart", "--create"))
    assert code == 0 and "restarted containerd" in out
    assert gpuctk(capsys, *args(root, "--restart"))[0] == 0
    assert calls.read_text() == "restart containerd\n"
    code, out, _ = gpuctk(capsys, *args(root))
    assert "nothing to change" in out


def test_symlinked_private_main_config_keeps_its_link_and_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 0600 config (registry credentials) linked from elsewhere: no leak, no broken link."""
    real = tmp_path / "site" / "containerd.toml"
    real.parent.mkdir()
    real.write_text(SYSTEMD_SANDBOX)
    real.chmod(0o600)
    (tmp_path / "config.toml").symlink_to(real)
    assert gpuctk(capsys, *args(tmp_path))[0] == 0
    assert (tmp_path / "config.toml").is_symlink() and "imports = [" in real.read_text()
    for path in (
        real,
        tmp_path / "conf.d" / "99-gpuctk.toml",
        tmp_path / "config.toml.gpuctk-backup",
    ):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert gpuctk(capsys, *unargs(tmp_path))[0] == 0
    assert (tmp_path / "config.toml").is_symlink() and real.read_text() == SYSTEMD_SANDBOX
    assert stat.S_IMODE(real.stat().st_mode) == 0o600
    assert not (tmp_path / "config.toml.gpuctk-backup").exists()


def test_config_in_a_missing_folder_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo in --config names a file containerd never reads: refuse unless --create."""
    typo = tmp_path / "typo" / "dir"
    argv = args(tmp_path)
    argv[argv.index("--config") + 1] = str(typo / "config.toml")
    code, out, err = gpuctk(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("gpuctk: error: ") and err.count("\n") == 2  # + the --help hint
    assert str(typo) in err and "--create" in err
    assert not (tmp_path / "typo").exists() and not (tmp_path / "conf.d").exists()
    code, out, err = gpuctk(capsys, *argv, "--create")
    assert code == 0, err
    assert (typo / "config.toml").is_file()


def test_drop_in_folder_is_created_only_under_an_existing_parent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """conf.d under an existing containerd folder is normal; a missing parent is a typo."""
    argv = args(tmp_path)
    argv[argv.index("--drop-in") + 1] = str(tmp_path / "containred" / "conf.d" / "99-gpuctk.toml")
    code, _, err = gpuctk(capsys, *argv)
    assert code == 2 and str(tmp_path / "containred") in err and "--create" in err
    assert not (tmp_path / "containred").exists()
    code, _, err = gpuctk(capsys, *args(tmp_path))
    assert code == 0, err
    assert (tmp_path / "conf.d" / "99-gpuctk.toml").is_file()
