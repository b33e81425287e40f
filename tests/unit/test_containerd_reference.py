"""The reference files under containerd-config/reference/ are what the commands write.

Each case runs the command against a fake root (<tmp>/etc/...: the default paths under a
temporary folder), reads the file it wrote and maps the temporary prefix away, so the reference
shows exactly what lands in /etc on a fresh node. Regenerate with
GPUCTK_UPDATE_REFERENCE=1 pytest tests/unit/test_containerd_reference.py
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures.containerd import gpuctk

REFERENCE = Path(__file__).resolve().parents[2] / "containerd-config" / "reference"

CTD = "etc/containerd"


def _containerd(*extra: str) -> Callable[[Path], list[str]]:
    def argv(root: Path) -> list[str]:
        (root / CTD / "conf.d").mkdir(parents=True)
        return [
            "runtime",
            "configure",
            "--config-source",
            "file",
            "--config",
            str(root / CTD / "config.toml"),
            "--drop-in",
            str(root / CTD / "conf.d" / "99-gpuctk.toml"),
            *extra,
        ]

    return argv


def _containerd_v3(root: Path) -> list[str]:
    argv = _containerd()(root)
    (root / CTD / "config.toml").write_text("version = 3\n")
    return argv


def _crio(root: Path) -> list[str]:
    (root / "etc/crio/crio.conf.d").mkdir(parents=True)
    return [
        "runtime",
        "configure",
        "--runtime",
        "crio",
        "--config-source",
        "file",
        "--config",
        str(root / "etc/crio/crio.conf"),
        "--drop-in",
        str(root / "etc/crio/crio.conf.d/99-gpuctk.conf"),
    ]


def _docker(root: Path) -> list[str]:
    (root / "etc/docker").mkdir(parents=True)
    config = str(root / "etc/docker/daemon.json")
    return ["runtime", "configure", "--runtime", "docker", "--config", config]


def _podman(root: Path) -> list[str]:
    hooks = str(root / "etc/containers/oci/hooks.d/99-gpuctk.json")
    return ["runtime", "configure", "--runtime", "podman", "--drop-in", hooks, "--create"]


def _runtimeclass(*extra: str) -> Callable[[Path], list[str]]:
    def argv(root: Path) -> list[str]:
        return ["runtime", "runtimeclass", *extra, "--output", str(root / "runtimeclass.yaml")]

    return argv


CASES: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "containerd-v2-dropin.toml": (_containerd(), f"{CTD}/conf.d/99-gpuctk.toml"),
    "containerd-v2-config.toml": (_containerd(), f"{CTD}/config.toml"),
    "containerd-v2-hook-dropin.toml": (
        _containerd("--mode", "hook"),
        f"{CTD}/conf.d/99-gpuctk.toml",
    ),
    "containerd-hook-base-spec.json": (
        _containerd("--mode", "hook"),
        f"{CTD}/conf.d/99-gpuctk.base-spec.json",
    ),
    "containerd-v3-dropin.toml": (_containerd_v3, f"{CTD}/conf.d/99-gpuctk.toml"),
    "crio-dropin.conf": (_crio, "etc/crio/crio.conf.d/99-gpuctk.conf"),
    "docker-daemon.json": (_docker, "etc/docker/daemon.json"),
    "podman-hooks.json": (_podman, "etc/containers/oci/hooks.d/99-gpuctk.json"),
    "runtimeclass.yaml": (_runtimeclass(), "runtimeclass.yaml"),
    "runtimeclass-gpu-nodes.yaml": (_runtimeclass("--gpu-node-selector"), "runtimeclass.yaml"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_file_is_what_the_command_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    make_argv, written = CASES[name]
    code, _, err = gpuctk(capsys, *make_argv(tmp_path))
    assert code == 0, err
    text = (tmp_path / written).read_text().replace(str(tmp_path), "")
    reference = REFERENCE / name
    if os.environ.get("GPUCTK_UPDATE_REFERENCE") == "1":
        reference.write_text(text)
    assert reference.read_text() == text, f"{reference} is stale: see this module's docstring"


def test_every_reference_file_is_checked() -> None:
    files = {p.name for p in REFERENCE.iterdir()} - {"README.md"}
    assert files == set(CASES)
