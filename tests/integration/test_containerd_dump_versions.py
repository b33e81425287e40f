"""The real containerd (1.6 here) and config versions: why the drop-in keeps the main's version.

containerd 1.6/1.7 read config version 2 only. A drop-in at version 3 or 4 over a version 2
main either stops containerd (1.6.32+, 1.7.17+: "unsupported config version") or, in older
1.6 releases, is read as version 2 with its CRI table ignored: either way its handler is gone.
gpuctk's drop-in over a version 2 main is version 2, and `config dump` shows its handler with
runtime_type. Versions 3 and 4 need containerd 2.x (tests/unit/test_containerd_versions.py).
"""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest
from fixtures.containerd import SYSTEMD_SANDBOX, VERSION_3, dump, gpuctk, have_containerd, runtimes

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not have_containerd(), reason="containerd is not installed"),
]

RUNC_V2 = "io.containerd.runc.v2"


def configure(root: Path, source: str) -> list[str]:
    return [
        "runtime",
        "configure",
        "--config-source",
        source,
        "--config",
        str(root / "config.toml"),
        "--drop-in",
        str(root / "conf.d" / "99-gpuctk.toml"),
    ]


@pytest.mark.parametrize("source", ["command", "file"])
@pytest.mark.parametrize("start", ["version = 2\n", SYSTEMD_SANDBOX])
def test_version_2_main_gets_a_version_2_drop_in_with_runtime_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], source: str, start: str
) -> None:
    (tmp_path / "config.toml").write_text(start)
    code, _, err = gpuctk(capsys, *configure(tmp_path, source))
    assert code == 0, err
    written = tomllib.loads((tmp_path / "conf.d" / "99-gpuctk.toml").read_text())
    assert written["version"] == 2
    nvidia = runtimes(dump(tmp_path / "config.toml"))["nvidia"]
    assert nvidia["runtime_type"] == RUNC_V2


@pytest.mark.parametrize("version", [3, 4])
def test_newer_drop_in_over_version_2_loses_its_handler(tmp_path: Path, version: int) -> None:
    """What gpuctk prevents: containerd 1.x exits, or reads the drop-in's CRI table as nothing."""
    other = tmp_path / "conf.d" / "99-newer.toml"
    other.parent.mkdir()
    other.write_text(
        VERSION_3.replace("version = 3", f"version = {version}").replace(
            "runtimes.runc", "runtimes.newer"
        )
    )
    main = tmp_path / "config.toml"
    main.write_text(f'version = 2\nimports = ["{other}"]\n')
    proc = subprocess.run(
        ["containerd", "--config", str(main), "config", "dump"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if proc.returncode != 0:
        assert f"unsupported config version `{version}`" in proc.stderr
        return
    assert "newer" not in runtimes(tomllib.loads(proc.stdout))


def test_version_4_main_with_containerd_1_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.toml").write_text(VERSION_3.replace("version = 3", "version = 4"))
    code, _, err = gpuctk(capsys, *configure(tmp_path, "command"))
    assert code == 7 and "config version 4 (containerd 2.3+)" in err, err
    assert "reads version 2" in err and not (tmp_path / "conf.d").exists()
