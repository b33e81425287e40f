"""packaging/hooks.d/gpuctk-hook.json: the podman / CRI-O hooks.d file for the prestart mode.

It must be exactly what `gpuctk runtime configure --runtime podman` writes for /usr/bin (one
source of truth), in hooks schema 1.0.0, with an explicit env (runc <= 1.2 gives a hook with an
empty env the container's environment) and `when: always` (hooks.d cannot match env vars: the
hook exits 0 at once when the container asks for nothing).
"""

from __future__ import annotations

import json
from pathlib import Path

from gpuctk.containerd import podman

REPO = Path(__file__).resolve().parents[2]


def test_hooks_file_is_what_configure_writes() -> None:
    doc = json.loads((REPO / "packaging/hooks.d/gpuctk-hook.json").read_text())
    assert doc == podman.hooks_json("/usr/bin/gpuctk-hook")
    assert doc == json.loads((REPO / "containerd-config/reference/podman-hooks.json").read_text())


def test_hooks_file_contract() -> None:
    doc = json.loads((REPO / "packaging/hooks.d/gpuctk-hook.json").read_text())
    assert doc["version"] == "1.0.0"
    assert doc["hook"]["args"] == ["gpuctk-hook", "prestart"]
    assert doc["hook"]["path"].startswith("/")
    env = doc["hook"]["env"]
    assert env and all("=" in e for e in env) and env[0].startswith("PATH=/")
    assert doc["when"] == {"always": True} and doc["stages"] == ["prestart"]
