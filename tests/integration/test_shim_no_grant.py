"""No GPU without a grant where an orchestrator grants GPUs: the real shim, then real runc.

A Kubernetes container is one whose config.json carries the CRI runtime's own annotations
(containerd's `io.kubernetes.cri.container-type` and `io.kubernetes.cri.sandbox-id`, as
containerd 1.6, 1.7 and 2.x set them: tests/integration/test_cri_shim_gpu.py sees them on a real
CRI container). There, under the default `accept-envvar-unprivileged = "auto"`, an image's
NVIDIA_VISIBLE_DEVICES / NVIDIA_IMEX_CHANNELS is no grant for an unprivileged container: it
gets no GPU, no control node, no IMEX channel, and the shim logs one line saying why and what
to set. A privileged container, an explicit `accept-envvar-unprivileged = true`, a plain host
(no CRI annotations) and the orchestrator's own grant (a `cdi.k8s.io/` annotation) keep their
GPUs. IMEX channels come only beside a granted GPU: `NVIDIA_VISIBLE_DEVICES=none` takes none
anywhere.

Each bundle is edited by `gpuctk-runtime create` (fixtures.gpucheck.shim_edit, /bin/true as the
low-level runtime) and then run by real runc, whose container reports the nodes it sees
(fixtures.gpucheck.SCRIPT and check_nodes: ENXIO on each GPU node, allowed and driverless).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fixtures.devroot import make_node_roots
from fixtures.gpucheck import (
    BIN,
    SCRIPT,
    Node,
    check_nodes,
    generate,
    need_runtime,
    runc_run,
    shim_edit,
)
from fixtures.images import make_bundle

from gpuctk.cdi.node.profile import load_profile

pytestmark = pytest.mark.integration

CRI = {  # what containerd's CRI plugin sets on every container (besides names and the image)
    "io.kubernetes.cri.container-type": "container",
    "io.kubernetes.cri.sandbox-id": "0f" * 32,
    "io.kubernetes.cri.sandbox-namespace": "default",
}
CHANNELS = "/dev/nvidia-caps-imex-channels"
IMEX_SCRIPT = SCRIPT.replace("true\n", f'for f in {CHANNELS}/*; do [ -c "$f" ] && echo "NODE $f"; '
                             "done; true\n")  # fmt: skip
ADMIN = "CAP_SYS_ADMIN"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, driver_root: Path) -> Node:
    need_runtime("runc")
    base = tmp_path_factory.mktemp("no-grant")
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


def create(
    node: Node,
    rootfs: Path,
    tmp_path: Path,
    env: list[str],
    annotations: dict[str, str] | None = None,
    privileged: bool = False,
    conf: str = "",
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], str]:
    """A bundle asking with `env` (and `annotations`), edited by the shim, run by runc: (what
    the container printed, config.json as the shim left it, the shim's log)."""
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["/bin/true"], env=["PATH=/bin", *env])
    doc = json.loads((bundle / "config.json").read_text())
    doc.setdefault("annotations", {}).update(annotations or {})
    caps = doc["process"]["capabilities"]
    for kind in caps:
        caps[kind] = [c for c in caps[kind] if c != ADMIN] + ([ADMIN] if privileged else [])
    (bundle / "config.json").write_text(json.dumps(doc))
    log = tmp_path / "gpuctk.log"
    config = shim_edit(bundle, node.spec_dir, tmp_path / "state", f'log-file = "{log}"\n{conf}')
    done = runc_run(bundle, json.loads(json.dumps(config)), IMEX_SCRIPT, f"gpuctk-ng-{os.getpid()}")
    return done, config, log.read_text() if log.exists() else ""


def gpu_nodes(config: dict[str, Any]) -> set[str]:
    return {d["path"] for d in config["linux"].get("devices") or []
            if d["path"].startswith("/dev/nvidia")}  # fmt: skip


Fresh = Callable[[str], Path]


def test_kubernetes_unprivileged_env_gets_nothing(
    node: Node, fresh_rootfs: Fresh, tmp_path: Path
) -> None:
    """(a) the image's NVIDIA_VISIBLE_DEVICES=all in an unprivileged CRI container."""
    done, config, log = create(
        node, fresh_rootfs("debian"), tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"], CRI
    )
    check_nodes(done, set())
    assert gpu_nodes(config) == set() and not config.get("hooks")
    lines = [line for line in log.splitlines() if "ignoring NVIDIA_VISIBLE_DEVICES=all" in line]
    assert len(lines) == 1, log
    assert "unprivileged Kubernetes container" in lines[0]
    assert "--device-list-strategy=cdi-annotations" in lines[0]
    assert "accept-envvar-unprivileged = true" in lines[0]


def test_kubernetes_privileged_env_gets_the_gpus(
    node: Node, fresh_rootfs: Fresh, tmp_path: Path
) -> None:
    """(b) the same with CAP_SYS_ADMIN in the bounding set (a privileged pod)."""
    env = ["NVIDIA_VISIBLE_DEVICES=all"]
    done, _, _ = create(node, fresh_rootfs("debian"), tmp_path, env, CRI, privileged=True)
    check_nodes(done, node.nodes("all"))


def test_plain_host_env_gets_the_gpus(node: Node, fresh_rootfs: Fresh, tmp_path: Path) -> None:
    """(c) no CRI annotations (podman, Docker, ctr): the env request stands, as before."""
    done, _, log = create(node, fresh_rootfs("debian"), tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"])
    check_nodes(done, node.nodes("all"))
    assert "ignoring" not in log


def test_explicit_opt_in_gets_the_gpus(node: Node, fresh_rootfs: Fresh, tmp_path: Path) -> None:
    """(d) accept-envvar-unprivileged = true, written: the operator's choice (the device
    plugin's `envvar` strategy), honoured in a Kubernetes container."""
    done, _, _ = create(
        node, fresh_rootfs("debian"), tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"], CRI,
        conf="accept-envvar-unprivileged = true\n",
    )  # fmt: skip
    check_nodes(done, node.nodes("all"))


def test_explicit_false_refuses_everywhere(node: Node, fresh_rootfs: Fresh, tmp_path: Path) -> None:
    done, _, log = create(
        node, fresh_rootfs("debian"), tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"],
        conf="accept-envvar-unprivileged = false\n",
    )  # fmt: skip
    check_nodes(done, set())
    assert "(accept-envvar-unprivileged = false)" in log


def test_kubernetes_annotation_grant_gets_its_gpu(
    node: Node, fresh_rootfs: Fresh, tmp_path: Path
) -> None:
    """(e) the orchestrator's grant (the device plugin's cdi-annotations strategy): that GPU,
    whatever the image's env says."""
    grant = {**CRI, "cdi.k8s.io/nvidia-device-plugin_uuid": "nvidia.com/gpu=1"}
    done, _, _ = create(
        node, fresh_rootfs("debian"), tmp_path,
        ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_IMEX_CHANNELS=all"], grant,
    )  # fmt: skip
    check_nodes(done, node.nodes("1"))


@pytest.mark.parametrize("kubernetes", [True, False], ids=["kubernetes", "plain"])
def test_no_channel_without_a_gpu(
    node: Node, fresh_rootfs: Fresh, tmp_path: Path, kubernetes: bool
) -> None:
    """(f) NVIDIA_VISIBLE_DEVICES=none with NVIDIA_IMEX_CHANNELS=all: no IMEX channel
    anywhere; in a Kubernetes container nothing at all (no control node either); on a plain
    host `none` keeps its meaning (the driver files and control nodes, no GPU)."""
    env = ["NVIDIA_VISIBLE_DEVICES=none", "NVIDIA_IMEX_CHANNELS=all"]
    done, config, _ = create(
        node, fresh_rootfs("debian"), tmp_path, env, CRI if kubernetes else None
    )
    assert not {p for p in gpu_nodes(config) if p.startswith(CHANNELS)}
    check_nodes(done, set() if kubernetes else node.nodes())


def test_channels_beside_a_granted_gpu(node: Node, fresh_rootfs: Fresh, tmp_path: Path) -> None:
    env = ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_IMEX_CHANNELS=all"]
    done, _, _ = create(node, fresh_rootfs("debian"), tmp_path, env)
    check_nodes(done, node.nodes("0") | {f"{CHANNELS}/channel0", f"{CHANNELS}/channel1"})
