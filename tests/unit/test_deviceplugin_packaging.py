"""packaging/kubernetes/device-plugin: the plugin's DaemonSet, strictly valid against the
Kubernetes models (test_manifests' checker), in the node agent's namespace and image, running
flags `gpuctk device-plugin` has, with the kubelet's folder and the node's root mounted."""

from __future__ import annotations

import pytest
import yaml
from fixtures.containerd import gpuctk
from test_manifests import K8S, documents, load

pytest.importorskip("kubernetes")


def test_the_plugin_daemonset(capsys: pytest.CaptureFixture[str]) -> None:
    (doc,) = documents("device-plugin/daemonset.yaml")
    ds = load(doc)
    agent = load(documents("daemonset.yaml")[1])
    assert ds.metadata.namespace == agent.metadata.namespace
    (container,) = ds.spec.template.spec.containers
    (agent_container,) = agent.spec.template.spec.containers
    assert container.image == agent_container.image
    assert ds.spec.template.spec.node_selector == agent.spec.template.spec.node_selector
    assert container.args[0] == "device-plugin"
    code, out, _ = gpuctk(capsys, "device-plugin", "--help")
    assert code == 0
    for flag in (a for a in container.args if a.startswith("--")):
        assert flag in out, flag
    mounts = {m.mount_path: m for m in container.volume_mounts}
    assert "/var/lib/kubelet/device-plugins" in mounts and mounts["/host"].read_only
    kustomization = yaml.safe_load((K8S / "device-plugin" / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["daemonset.yaml"]
    assert '"/src[device-plugin]"' in (K8S / "Containerfile").read_text()  # grpcio in the image
