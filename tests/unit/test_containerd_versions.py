"""containerd config versions 2, 3 and 4: the drop-in is written at the main config's version.

containerd exits at start on a file newer than the version it reads, and `containerd config
dump` prints the newest version the binary knows whatever the files say, so the only safe
version for the drop-in is the main config's own. A fake containerd (a shell script that
answers `--version` and `config dump` as containerd 2.x does) stands in for 2.x, which cannot
run here; tests/integration/test_containerd_dump_versions.py checks version 2 with the real 1.6.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
from fixtures.containerd import SHIM, SYSTEMD_SANDBOX, VERSION_3, gpuctk, snapshot

V2 = "io.containerd.grpc.v1.cri"
V3 = "io.containerd.cri.v1.runtime"
RUNC_V2 = "io.containerd.runc.v2"

# containerd 2.3 layout (config version 4): server settings are plugins, CRI as in version 3.
VERSION_4 = """\
# containerd 2.3
version = 4
root = "/var/lib/containerd"

[plugins.'io.containerd.server.v1.grpc']
  address = "/run/containerd/containerd.sock"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "registry.example.com/pause:3.10"

[plugins.'io.containerd.cri.v1.runtime']
  enable_unprivileged_ports = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = true
"""
ROOTS = {2: SYSTEMD_SANDBOX, 3: VERSION_3, 4: VERSION_4}
PLUGIN = {2: V2, 3: V3, 4: V3}

# What containerd 2.x's `config dump` prints for any of the roots: migrated to its newest
# version, the CRI runtime table under io.containerd.cri.v1.runtime.
DUMP = """\
version = {version}
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "runc"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    sandboxer = "podsandbox"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      SystemdCgroup = true
"""


def fake_containerd(tmp_path: Path, release: str, dump_version: int) -> Path:
    """A containerd that reports `release` and dumps at `dump_version`."""
    path = tmp_path / "bin" / "containerd"
    path.parent.mkdir(exist_ok=True)
    path.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then\n'
        f"  echo 'containerd github.com/containerd/containerd/v2 v{release} 0123abcd'\n"
        "  exit 0\n"
        "fi\n"
        "cat <<'EOF'\n" + DUMP.format(version=dump_version) + "EOF\n"
    )
    path.chmod(0o755)
    return path


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


def drop_in(root: Path) -> dict[str, Any]:
    return tomllib.loads((root / "conf.d" / "99-gpuctk.toml").read_text())


def handler(data: dict[str, Any], plugin: str, name: str = "nvidia") -> dict[str, Any]:
    result: dict[str, Any] = data["plugins"][plugin]["containerd"]["runtimes"][name]
    return result


@pytest.mark.parametrize("mode", ["shim", "hook"])
@pytest.mark.parametrize("version", [2, 3, 4])
def test_file_source_writes_the_main_config_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], version: int, mode: str
) -> None:
    (tmp_path / "config.toml").write_text(ROOTS[version])
    code, _, err = gpuctk(capsys, *configure(tmp_path, "file", "--mode", mode))
    assert code == 0, err
    data = drop_in(tmp_path)
    assert data["version"] == version
    assert set(data["plugins"]) == {PLUGIN[version]}
    nvidia = handler(data, PLUGIN[version])
    assert nvidia["runtime_type"] == RUNC_V2
    assert nvidia["options"]["SystemdCgroup"] is True  # copied from runc
    if mode == "shim":
        assert nvidia["options"]["BinaryName"] == SHIM
    else:
        assert nvidia["base_runtime_spec"].endswith("99-gpuctk.base-spec.json")
    if version >= 3:  # deep merge: only the handler
        assert set(data["plugins"][PLUGIN[version]]["containerd"]["runtimes"]) == {"nvidia"}
    main = tomllib.loads((tmp_path / "config.toml").read_text())
    assert main["version"] == version  # the main config keeps its own version


@pytest.mark.parametrize("version", [2, 3, 4])
def test_dump_version_never_becomes_the_drop_in_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], version: int
) -> None:
    """containerd 2.3 dumps every config as version 4; a v4 drop-in over a v2 root would stop
    every containerd that reads only the root's version."""
    (tmp_path / "config.toml").write_text(ROOTS[version])
    binary = fake_containerd(tmp_path, "2.3.0", 4)
    argv = configure(tmp_path, "command", "--executable-path", str(binary))
    code, _, err = gpuctk(capsys, *argv)
    assert code == 0, err
    data = drop_in(tmp_path)
    assert data["version"] == version
    assert set(data["plugins"]) == {PLUGIN[version]}
    nvidia = handler(data, PLUGIN[version])
    assert nvidia["runtime_type"] == RUNC_V2
    assert nvidia["options"] == {"SystemdCgroup": True, "BinaryName": SHIM}  # from the dump
    assert set(data["plugins"][PLUGIN[version]]["containerd"]["runtimes"]) == {"nvidia"}
    code, out, _ = gpuctk(capsys, *argv)
    assert code == 0 and "nothing to change" in out


def test_main_without_version_on_containerd_2_gets_version_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.toml").write_text('root = "/var/lib/containerd"\n')
    binary = fake_containerd(tmp_path, "2.3.1", 4)
    code, _, err = gpuctk(capsys, *configure(tmp_path, "command", "--executable-path", str(binary)))
    assert code == 0, err
    assert drop_in(tmp_path)["version"] == 3  # read by every containerd 2.x
    assert tomllib.loads((tmp_path / "config.toml").read_text())["version"] == 3


@pytest.mark.parametrize(
    ("release", "dump_version", "reads"), [("2.2.1", 3, 3), ("2.0.0", 3, 3), ("1.7.27", 2, 2)]
)
def test_version_4_main_with_an_older_containerd_is_refused(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    release: str,
    dump_version: int,
    reads: int,
) -> None:
    (tmp_path / "config.toml").write_text(VERSION_4)
    binary = fake_containerd(tmp_path, release, dump_version)
    before = snapshot(tmp_path)
    code, _, err = gpuctk(capsys, *configure(tmp_path, "command", "--executable-path", str(binary)))
    assert code == 7, err
    assert "config version 4 (containerd 2.3+)" in err and f"reads version {reads}" in err
    assert "conflicting versions" in err and err.count("\n") == 1
    assert snapshot(tmp_path) == before


def test_stale_newer_drop_in_is_rewritten_at_the_main_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """gpuctk's own drop-in from a version 4 main, after the main went back to version 2."""
    main = tmp_path / "config.toml"
    main.write_text("version = 4\n")
    assert gpuctk(capsys, *configure(tmp_path, "file"))[0] == 0
    assert drop_in(tmp_path)["version"] == 4
    main.write_text(main.read_text().replace("version = 4", "version = 2"))
    code, _, err = gpuctk(capsys, *configure(tmp_path, "file"))
    assert code == 0, err
    data = drop_in(tmp_path)
    assert data["version"] == 2 and set(data["plugins"]) == {V2}
    assert handler(data, V2)["runtime_type"] == RUNC_V2
    assert handler(data, V2, "runc")["runtime_type"] == RUNC_V2  # containerd 1.x: runc kept


@pytest.mark.parametrize(("main_version", "other_version"), [(2, 3), (2, 4), (3, 4)])
def test_imported_file_newer_than_the_main_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], main_version: int, other_version: int
) -> None:
    (tmp_path / "config.toml").write_text(
        f"version = {main_version}\nimports = ['site.d/*.toml']\n"
    )
    (tmp_path / "site.d").mkdir()
    other = tmp_path / "site.d" / "10-site.toml"
    other.write_text(f"version = {other_version}\n")
    before = snapshot(tmp_path)
    code, _, err = gpuctk(capsys, *configure(tmp_path, "file"))
    assert code == 7 and err.count("\n") == 1, err
    assert f"{other} is config version {other_version}" in err
    assert f"rewrite {other} as version {main_version}" in err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("version", [3, 4])
def test_runtime_type_set_when_the_copied_handler_has_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], version: int
) -> None:
    """Without runtime_type every sandbox of the handler fails: the copy always gets one."""
    text = ROOTS[version].replace('      runtime_type = "io.containerd.runc.v2"\n', "", 1)
    assert "runtime_type" not in text
    (tmp_path / "config.toml").write_text(text)
    code, _, err = gpuctk(capsys, *configure(tmp_path, "file"))
    assert code == 0, err
    nvidia = handler(drop_in(tmp_path), V3)
    assert nvidia["runtime_type"] == RUNC_V2
    assert nvidia["options"]["SystemdCgroup"] is True  # still the runc copy
