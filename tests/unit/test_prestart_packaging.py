"""packaging/hooks.d/gpuctk-hook.json: the podman / CRI-O hooks.d file for the prestart mode.

It must be exactly what `gpuctk runtime configure --runtime podman` writes for /usr/bin (one
source of truth), in hooks schema 1.0.0, with an explicit env (runc <= 1.2 gives a hook with an
empty env the container's environment) and a `when` that matches only containers with a CDI
annotation (`cdi.k8s.io/...`), never `always` (hooks.d cannot match env vars, and an image's
NVIDIA_VISIBLE_DEVICES alone must not run the hook). The deb does not install it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

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
    assert doc["when"] == {"annotations": {r"^cdi\.k8s\.io/": ".*"}}
    assert doc["stages"] == ["prestart"]


@pytest.mark.parametrize(
    ("annotations", "runs"),
    [
        ({}, False),
        ({"io.podman.annotations.label": "x"}, False),
        ({"nvidia.com/gpu": "0"}, False),
        ({"xcdi.k8s.io/gpu": "nvidia.com/gpu=0"}, False),
        ({"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}, True),
        ({"cdi.k8s.io/nvidia-device-plugin_abc": "nvidia.com/gpu=GPU-1"}, True),
    ],
)
def test_when_matches_only_cdi_annotations(annotations: dict[str, str], runs: bool) -> None:
    """containers/common pkg/hooks/1.0.0 When.Match for annotations: every (key, value) regex
    pair of `when` must match some annotation (Go's regexp: a search, unanchored)."""
    when = json.loads((REPO / "packaging/hooks.d/gpuctk-hook.json").read_text())["when"]
    assert set(when) == {"annotations"}
    matched = all(
        any(re.search(k, key) and re.search(v, value) for key, value in annotations.items())
        for k, v in when["annotations"].items()
    )
    assert matched is runs
