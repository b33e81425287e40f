"""bench/nvidiaspec.py and the NVIDIA side of bench/podman.py, without building or running
anything: the by-path links nvidia-ctk reads, and the paired ratios against NVIDIA's spec."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest
from fixtures.devroot import make_node_roots
from fixtures.layout import REPO

from gpuctk.cdi.node.profile import load_profile


def bench(name: str) -> ModuleType:
    if str(REPO / "bench") not in sys.path:
        sys.path.insert(0, str(REPO / "bench"))
    return importlib.import_module(name)


def test_by_path_links_name_each_gpu_drm_node(tmp_path: Path) -> None:
    roots = make_node_roots(tmp_path, load_profile("l4"))
    bench("nvidiaspec").add_by_path_links(roots.dev_root, roots.sys_root)
    by_path = roots.dev_root / "dev" / "dri" / "by-path"
    links = {p.name: str(p.readlink()) for p in by_path.iterdir()}
    assert links["pci-0000:01:00.0-card"] == "../card1"
    assert links["pci-0000:01:00.0-render"] == "../renderD129"
    assert all((by_path / name).resolve().exists() for name in links)
    bench("nvidiaspec").add_by_path_links(roots.dev_root, roots.sys_root)  # idempotent


def test_against_nvidia_pairs_each_round() -> None:
    podman = bench("podman")
    ms = 1e-3
    times = {
        "no device": [100 * ms, 200 * ms, 150 * ms],
        "hook spec": [110 * ms, 220 * ms, 160 * ms],  # adds 10, 20, 10
        "nvidia": [140 * ms, 240 * ms, 190 * ms],  # adds 40, 40, 40
        "nvidia, no hooks": [120 * ms, 220 * ms, 170 * ms],
    }
    found = podman.against_nvidia(times, show=False)
    assert set(found) == {"hook spec"}
    assert found["hook spec"]["median_ratio"] == pytest.approx(0.25)
    assert found["hook spec"]["ratio_of_medians"] == pytest.approx(0.25)
    assert found["hook spec"]["minus_nvidia_ms"] == pytest.approx(-30)
