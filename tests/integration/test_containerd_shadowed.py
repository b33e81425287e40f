"""containerd 1.x: what the main config says after configure, as real containerd 1.6 reads it.

An imported file replaces the whole CRI table under 1.x, so gpuctk's drop-in carries a copy of
the table the main config sets. It copies only the keys the files set (never `config dump`'s
defaults): a key the admin adds to the main config later takes effect at once. A key the main
config already set is pinned by the copy: `gpuctk doctor` (engine.containerd.shadowed) fails
naming it, and configure again makes containerd follow the main config.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fixtures.containerd import CRI, SYSTEMD_SANDBOX, dump, gpuctk, have_containerd

from gpuctk.doctor.shadowed import check_shadowed

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not have_containerd(), reason="containerd is not installed"),
]

FIX = "gpuctk runtime configure --runtime containerd && systemctl restart containerd"


def configure(capsys: pytest.CaptureFixture[str], root: Path, source: str) -> None:
    argv = [
        "runtime", "configure", "--config-source", source,
        "--config", str(root / "config.toml"), "--drop-in", str(root / "conf.d/99-gpuctk.toml"),
    ]  # fmt: skip
    assert gpuctk(capsys, *argv)[0] == 0


def cri(root: Path) -> dict[str, object]:
    table: dict[str, object] = dump(root / "config.toml")["plugins"][CRI]
    return table


@pytest.mark.parametrize("source", ["command", "file"])
def test_edited_key_is_named_by_doctor_and_configure_again_follows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], source: str
) -> None:
    main = tmp_path / "config.toml"
    main.write_text(SYSTEMD_SANDBOX)
    configure(capsys, tmp_path, source)
    binary = shutil.which("containerd")
    assert check_shadowed(str(main), binary, "nvidia", FIX).status == "ok"

    main.write_text(main.read_text().replace("registry.example.com/pause:3.9", "mirror/pause:3.10"))
    assert cri(tmp_path)["sandbox_image"] == "registry.example.com/pause:3.9"  # the copy wins
    result = check_shadowed(str(main), binary, "nvidia", FIX)
    assert result.status == "failed" and result.fix == FIX
    assert result.evidence == (
        f"{main}: sandbox_image = 'mirror/pause:3.10' has no effect: containerd 1.x reads the "
        f"whole CRI table from {tmp_path / 'conf.d/99-gpuctk.toml'}, which has "
        "'registry.example.com/pause:3.9'",
    )

    configure(capsys, tmp_path, source)
    assert cri(tmp_path)["sandbox_image"] == "mirror/pause:3.10"
    assert check_shadowed(str(main), binary, "nvidia", FIX).status == "ok"


@pytest.mark.parametrize("source", ["command", "file"])
def test_key_added_later_is_named_and_defaults_are_not_pinned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], source: str
) -> None:
    """A key the main config did not set is not in the copy (containerd's default applies, and
    a newer containerd's default too); once the admin sets it, doctor names it."""
    main = tmp_path / "config.toml"
    main.write_text(SYSTEMD_SANDBOX)
    configure(capsys, tmp_path, source)
    drop_in = tmp_path / "conf.d/99-gpuctk.toml"
    assert "max_concurrent_downloads" not in drop_in.read_text()
    assert cri(tmp_path)["max_concurrent_downloads"] == 3  # containerd's default
    main.write_text(
        main.read_text().replace(
            "  max_container_log_line_size = 65536\n",
            "  max_container_log_line_size = 65536\n  max_concurrent_downloads = 7\n",
        )
    )
    assert cri(tmp_path)["max_concurrent_downloads"] == 3  # replaced with the whole table
    result = check_shadowed(str(main), shutil.which("containerd"), "nvidia", FIX)
    assert result.status == "failed"
    assert result.evidence == (
        f"{main}: max_concurrent_downloads = 7 has no effect: containerd 1.x reads the whole "
        f"CRI table from {drop_in}, which has nothing",
    )
    configure(capsys, tmp_path, source)
    assert cri(tmp_path)["max_concurrent_downloads"] == 7


def test_set_as_default_and_handler_are_not_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main = tmp_path / "config.toml"
    main.write_text(SYSTEMD_SANDBOX)
    argv = [
        "runtime", "configure", "--set-as-default", "--cdi-enabled", "--config", str(main),
        "--drop-in", str(tmp_path / "conf.d/99-gpuctk.toml"),
    ]  # fmt: skip
    assert gpuctk(capsys, *argv)[0] == 0
    assert cri(tmp_path)["containerd"]["default_runtime_name"] == "nvidia"  # type: ignore[index]
    assert check_shadowed(str(main), shutil.which("containerd"), "nvidia", FIX).status == "ok"
