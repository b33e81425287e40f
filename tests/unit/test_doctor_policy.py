"""`gpuctk doctor`'s policy checks on whole fake nodes (fixtures.doctornode), through the real CLI.

runtime.envvar-unprivileged: off passes; on warns, with the fix for the device plugin's
device-list strategy (read off a fake plugin process under the proc root, or both options when
no plugin is seen). cdi.version-readers: engines faked as scripts on the node's PATH that print
a version; a spec every engine reads passes, a spec one of them rejects fails and names it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures.doctornode import DoctorNode, build_node

NodeFactory = Callable[[], DoctorNode]
ENVVAR = "runtime.envvar-unprivileged"
READERS = "cdi.version-readers"


@pytest.fixture
def make_node(
    tmp_path: Path, driver_root: Path, fake_nvml_env: Callable[..., dict[str, str]]
) -> Iterator[NodeFactory]:
    if os.geteuid() != 0:
        pytest.skip("device nodes need mknod (root)")
    nodes: list[DoctorNode] = []

    def make() -> DoctorNode:
        node = build_node(tmp_path / f"n{len(nodes)}", driver_root, "l4", fake_nvml_env)
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.close()


def text(check: dict[str, Any]) -> str:
    return "\n".join(check["evidence"])


def envvar_on(node: DoctorNode) -> None:
    config = node.runtime_config.read_text().replace(
        "accept-envvar-unprivileged = false", "accept-envvar-unprivileged = true"
    )
    node.runtime_config.write_text(config)


def fake_plugin(node: DoctorNode, environ: str, *argv: str) -> None:
    proc = node.roots.proc_root / "4242"
    proc.mkdir()
    (proc / "cmdline").write_bytes("\0".join(["/usr/bin/nvidia-device-plugin", *argv]).encode())
    (proc / "environ").write_bytes(environ.encode())
    # what the kernel says of the real plugin: root runs it from a root-owned executable
    (proc / "status").write_bytes(b"Name:\tnvidia-device-plugin\nUid:\t0\t0\t0\t0\n")
    (proc / "exe").symlink_to(os.path.realpath("/bin/sh"))


REMOVE = "remove the key (auto: env requests of Kubernetes containers are refused)"


def envvar_auto(node: DoctorNode) -> None:
    config = node.runtime_config.read_text().replace("accept-envvar-unprivileged = false\n", "")
    node.runtime_config.write_text(config)


def test_envvar_unprivileged_off_passes(make_node: NodeFactory) -> None:
    node = make_node()
    _, report, _ = node.doctor()
    check = node.check(report, ENVVAR)
    assert check["status"] == "ok", check
    assert check["evidence"][0] == f"{node.runtime_config}: accept-envvar-unprivileged = false"


def test_envvar_unprivileged_on_without_a_plugin_seen_gives_both_options(
    make_node: NodeFactory,
) -> None:
    node = make_node()
    envvar_on(node)
    code, report, _ = node.doctor()
    check = node.check(report, ENVVAR)
    assert code == 1 and check["status"] == "warning", check
    assert "NVIDIA_VISIBLE_DEVICES=all gets every GPU of the node" in text(check)
    assert f"no nvidia-device-plugin process under {node.roots.proc_root}" in check["evidence"]
    assert check["fix"].startswith("set DEVICE_LIST_STRATEGY=cdi-annotations on the NVIDIA")
    assert "volume-mounts with accept-volume-mounts = true" in check["fix"]
    assert check["fix"].endswith(f"then {REMOVE}")


def test_envvar_unprivileged_on_with_a_volume_mounts_plugin(make_node: NodeFactory) -> None:
    node = make_node()
    envvar_on(node)
    fake_plugin(node, "PATH=/bin\0DEVICE_LIST_STRATEGY=volume-mounts\0")
    _, report, _ = node.doctor()
    check = node.check(report, ENVVAR)
    assert check["status"] == "warning", check
    assert (
        "device plugin (pid 4242): device-list strategy volume-mounts (DEVICE_LIST_STRATEGY)"
        in check["evidence"]
    )
    assert (
        check["fix"] == f"set accept-volume-mounts = true in {node.runtime_config}, then {REMOVE}"
    )


def test_envvar_unprivileged_on_with_a_cdi_annotations_plugin_flag(make_node: NodeFactory) -> None:
    node = make_node()
    envvar_on(node)
    # the command line wins over the environment, as in the plugin
    fake_plugin(node, "DEVICE_LIST_STRATEGY=envvar\0", "--device-list-strategy=cdi-annotations")
    _, report, _ = node.doctor()
    check = node.check(report, ENVVAR)
    assert check["status"] == "warning"
    assert "(--device-list-strategy)" in text(check)
    assert check["fix"] == REMOVE


def test_envvar_unprivileged_auto_with_an_envvar_plugin_fails(make_node: NodeFactory) -> None:
    """auto (the default) refuses env requests of unprivileged Kubernetes containers: a plugin
    that hands GPUs out by env leaves its pods without GPUs, and the doctor says how to fix
    it without turning env requests back on for every pod."""
    node = make_node()
    envvar_auto(node)
    fake_plugin(node, "PATH=/bin\0")  # no strategy set: the plugin's default, envvar
    code, report, _ = node.doctor()
    check = node.check(report, ENVVAR)
    assert code == 2 and check["status"] == "failed", check
    assert f"{node.runtime_config}: accept-envvar-unprivileged = auto" in text(check)
    assert "its pods get none" in text(check)
    assert check["fix"].startswith("set DEVICE_LIST_STRATEGY=cdi-annotations on the NVIDIA")


def test_envvar_unprivileged_auto_with_a_volume_mounts_plugin_needs_the_mounts_read(
    make_node: NodeFactory,
) -> None:
    node = make_node()
    envvar_auto(node)
    fake_plugin(node, "PATH=/bin\0DEVICE_LIST_STRATEGY=volume-mounts\0")
    _, report, _ = node.doctor()
    check = node.check(report, ENVVAR)
    assert check["status"] == "failed", check
    assert check["fix"] == f"set accept-volume-mounts = true in {node.runtime_config}"
    fake = node.runtime_config.read_text() + "accept-volume-mounts = true\n"
    node.runtime_config.write_text(fake)
    _, report, _ = node.doctor()
    assert node.check(report, ENVVAR)["status"] == "ok"


def test_version_readers_pass_when_every_engine_reads_the_spec(make_node: NodeFactory) -> None:
    node = make_node()
    node.fake_binary("podman", "podman version 4.3.1")  # Debian 12's: reads up to 0.5.0
    _, report, _ = node.doctor()
    check = node.check(report, READERS)
    assert check["status"] == "ok", check
    assert "1 spec file(s), cdiVersion 0.5.0" in check["evidence"]
    assert "podman 4.3.1 reads cdiVersion up to 0.5.0" in check["evidence"]


def test_containerd_without_cdi_is_left_out(make_node: NodeFactory) -> None:
    node = make_node()
    node.fake_binary("containerd", "containerd github.com/containerd/containerd 1.6.20~ds1")
    _, report, _ = node.doctor()
    check = node.check(report, READERS)
    assert check["status"] == "ok", check
    assert (
        "containerd 1.6.20 (containerd github.com/containerd/containerd 1.6.20~ds1): "
        "older than the table's first entry: no CDI support: it reads no spec" in check["evidence"]
    )


def _rewrite_spec(node: DoctorNode, change: Callable[[dict[str, Any]], None]) -> None:
    doc = yaml.safe_load(node.spec.read_text())
    change(doc)
    node.spec.write_text(yaml.safe_dump(doc))


def test_version_readers_fail_when_content_needs_more_than_podman_reads(
    make_node: NodeFactory,
) -> None:
    node = make_node()
    node.fake_binary("podman", "podman version 4.3.1")

    def annotate(doc: dict[str, Any]) -> None:
        doc["annotations"] = {"example.com/owner": "ops"}
        doc["cdiVersion"] = "0.6.0"

    _rewrite_spec(node, annotate)
    code, report, _ = node.doctor()
    check = node.check(report, READERS)
    assert code == 2 and check["status"] == "failed", check
    assert check["evidence"][0] == (
        f"{node.spec}: cdiVersion 0.6.0: podman 4.3.1 reads up to 0.5.0 and rejects this spec, "
        "so none of its devices reach that engine's containers"
    )
    assert check["fix"] == (
        "its content needs cdiVersion 0.6.0 (annotations, or a dot in the class name): "
        f"regenerate {node.spec} without that, or upgrade to podman 4.7.0"
    )


def test_version_readers_fail_when_the_spec_says_more_than_it_needs(
    make_node: NodeFactory,
) -> None:
    node = make_node()
    node.fake_binary("podman", "podman version 4.3.1")
    _rewrite_spec(node, lambda doc: doc.update(cdiVersion="0.7.0"))
    _, report, _ = node.doctor()
    check = node.check(report, READERS)
    assert check["status"] == "failed", check
    assert "podman 4.3.1 reads up to 0.5.0 and rejects this spec" in check["evidence"][0]
    assert check["fix"].startswith("gpuctk cdi generate ")
    assert check["fix"].endswith(f"--output {node.spec}   # it needs only cdiVersion 0.5.0")
