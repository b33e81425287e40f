"""NVIDIA_IMEX_CHANNELS through the real shim and runc (hook/requests/imex.py,
hook/requests/devices.py).

One spec dir holds the h100-8 spec and the `--mode imex` spec, both generated over the fixture
dev root (channel0 and channel1, major from the fixture /proc/devices). The shim's `create`
edits config.json; real runc then runs the container, which reports the channel nodes it sees.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures.devroot import IMEX_MAJOR, make_node_roots
from fixtures.gpucheck import BIN, Node, generate, need_runtime, runc_run, seen, shim_edit
from fixtures.images import make_bundle

from gpuctk.cdi.node.profile import load_profile

pytestmark = pytest.mark.integration

CHANNELS = "/dev/nvidia-caps-imex-channels"
SCRIPT = f'for f in {CHANNELS}/*; do [ -c "$f" ] && echo "NODE $f"; done; true'


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, driver_root: Path) -> Node:
    need_runtime("runc")
    base = tmp_path_factory.mktemp("imex")
    roots = make_node_roots(base / "node", load_profile("h100-8"))
    node = generate(base, driver_root, "h100-8", base / "cdi" / "nvidia.json", roots=roots)
    done = subprocess.run(
        [str(BIN / "gpuctk"), "cdi", "generate", "--mode", "imex",
         "--dev-root", str(roots.dev_root), "--proc-root", str(roots.proc_root),
         "--output", str(node.spec_dir / "imex.json")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return node


def container_channels(
    node: Node, rootfs: Path, tmp_path: Path, *env: str
) -> tuple[set[str], list[dict[str, object]]]:
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["/bin/true"], env=["PATH=/bin", *env])
    config = shim_edit(bundle, node.spec_dir, tmp_path / "state")
    nodes = [n for n in config["linux"].get("devices", []) if n["path"].startswith(CHANNELS + "/")]
    done = runc_run(bundle, config, SCRIPT, f"gpuctk-imex-{os.getpid()}")
    assert done.returncode == 0, done.stderr
    return seen(done.stdout, "NODE"), nodes


def test_channel_0_is_in_the_container_when_asked_for(
    node: Node, fresh_rootfs: Callable[[str], Path], tmp_path: Path
) -> None:
    seen_nodes, nodes = container_channels(
        node, fresh_rootfs("debian"), tmp_path, "NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_IMEX_CHANNELS=0"
    )
    assert seen_nodes == {f"{CHANNELS}/channel0"}
    assert [(n["major"], n["minor"]) for n in nodes] == [(IMEX_MAJOR, 0)]


def test_all_channels(node: Node, fresh_rootfs: Callable[[str], Path], tmp_path: Path) -> None:
    seen_nodes, _ = container_channels(
        node,
        fresh_rootfs("debian"),
        tmp_path,
        "NVIDIA_VISIBLE_DEVICES=0",
        "NVIDIA_IMEX_CHANNELS=all",
    )
    assert seen_nodes == {f"{CHANNELS}/channel0", f"{CHANNELS}/channel1"}


@pytest.mark.parametrize("imex", [None, "none"], ids=["unset", "none"])
def test_no_channel_without_the_variable(
    node: Node, fresh_rootfs: Callable[[str], Path], tmp_path: Path, imex: str | None
) -> None:
    env = ["NVIDIA_VISIBLE_DEVICES=0"] + ([f"NVIDIA_IMEX_CHANNELS={imex}"] if imex else [])
    seen_nodes, nodes = container_channels(node, fresh_rootfs("debian"), tmp_path, *env)
    assert seen_nodes == set() and nodes == []


@pytest.mark.parametrize(
    ("value", "message"),
    [("zero", "'zero' is no IMEX channel"), ("7", "unknown CDI device nvidia.com/imex-channel=7")],
)
def test_bad_channel_fails_the_create_and_leaves_config_json(
    node: Node, fresh_rootfs: Callable[[str], Path], tmp_path: Path, value: str, message: str
) -> None:
    env = ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0", f"NVIDIA_IMEX_CHANNELS={value}"]
    bundle = make_bundle(tmp_path / "bundle", fresh_rootfs("debian"), ["/bin/true"], env=env)
    before = (bundle / "config.json").read_bytes()
    toml = tmp_path / "gpuctk.toml"
    toml.write_text(f'runtimes = ["/bin/true"]\nspec-dirs = ["{node.spec_dir}"]\n')
    done = subprocess.run(
        [str(BIN / "gpuctk-runtime"), "create", "--bundle", str(bundle), "gpuctk-imex-bad"],
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "GPUCTK_CONFIG": str(toml),
             "GPUCTK_STATE_DIR": str(tmp_path / "state")},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert (bundle / "config.json").read_bytes() == before
