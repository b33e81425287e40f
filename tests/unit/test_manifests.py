"""packaging/kubernetes: every manifest checked against the Kubernetes object schemas.

The schemas are the `kubernetes` Python client's models (generated from the API's OpenAPI
spec). Each document is deserialized through ApiClient (the constructors enforce required
fields), and walked strictly against the models' attribute maps: an unknown or misspelt key
anywhere is an error (kubectl would reject it with --validate=strict; the client alone would
drop it silently). Then what matters for this DaemonSet: GPU nodes only, the host root
mounted, privileged, the install entrypoint equal to the Containerfile's, and the RuntimeClass
file byte-for-byte what `gpuctk runtime runtimeclass --gpu-node-selector` prints.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures.containerd import gpuctk

kubernetes = pytest.importorskip("kubernetes")
client = kubernetes.client

K8S = Path(__file__).resolve().parents[2] / "packaging" / "kubernetes"
MODELS = {
    ("v1", "Namespace"): "V1Namespace",
    ("apps/v1", "DaemonSet"): "V1DaemonSet",
    ("node.k8s.io/v1", "RuntimeClass"): "V1RuntimeClass",
}
_LIST = re.compile(r"^(?:list|List)\[(.+)\]$")  # client <= 31 spells list[...], newer List[...]
_DICT = re.compile(r"^(?:dict\(([^,]+), (.+)\)|Dict\[([^,]+), (.+)\])$")
_PRIMITIVE = {"str": str, "int": int, "bool": bool, "float": (int, float)}


def strict_problems(value: Any, type_name: str, where: str = "") -> list[str]:
    """Every key or value in `value` that the model `type_name` does not allow."""
    if m := _LIST.match(type_name):
        if not isinstance(value, list):
            return [f"{where}: expected a list"]
        return [p for i, v in enumerate(value) for p in strict_problems(v, m[1], f"{where}[{i}]")]
    if m := _DICT.match(type_name):
        if not isinstance(value, dict):
            return [f"{where}: expected a map"]
        inner = m[2] or m[4]
        return [p for k, v in value.items() for p in strict_problems(v, inner, f"{where}.{k}")]
    if type_name in _PRIMITIVE:
        ok = isinstance(value, _PRIMITIVE[type_name]) and not (
            type_name != "bool" and isinstance(value, bool)
        )
        return [] if ok else [f"{where}: expected {type_name}, got {value!r}"]
    if type_name == "object":
        return []
    model = getattr(client, type_name)
    if not isinstance(value, dict):
        return [f"{where}: expected a {type_name} map"]
    by_key = {key: attr for attr, key in model.attribute_map.items()}
    problems = []
    for key, item in value.items():
        if key not in by_key:
            problems.append(f"{where}.{key}: unknown field of {type_name}")
            continue
        problems += strict_problems(item, model.openapi_types[by_key[key]], f"{where}.{key}")
    return problems


class _Response:
    def __init__(self, doc: dict[str, Any]) -> None:
        self.data = json.dumps(doc)


def deserialize(doc: dict[str, Any], model: str) -> Any:
    """ApiClient.deserialize across client versions (a response object, or text + type)."""
    api = client.ApiClient()
    if "content_type" in inspect.signature(api.deserialize).parameters:
        return api.deserialize(json.dumps(doc), model, "application/json")
    return api.deserialize(_Response(doc), model)


def load(doc: dict[str, Any]) -> Any:
    """The model object for a manifest document (ValueError when a required field is missing)."""
    model = MODELS[(doc["apiVersion"], doc["kind"])]
    problems = strict_problems(doc, model, doc["kind"])
    assert not problems, "\n".join(problems)
    return deserialize(doc, model)


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


@pytest.mark.parametrize("name", ["daemonset.yaml", "runtimeclass.yaml"])
def test_every_document_is_a_valid_object(name: str) -> None:
    docs = documents(name)
    assert docs
    for doc in docs:
        obj = load(doc)
        assert obj.metadata.name


def test_the_checker_sees_mistakes() -> None:
    ds = documents("daemonset.yaml")[1]
    ds["spec"]["template"]["spec"]["nodeSelectr"] = {"a": "b"}  # typo
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"] = "yes"
    problems = strict_problems(ds, "V1DaemonSet", "DaemonSet")
    assert any("nodeSelectr: unknown field of V1PodSpec" in p for p in problems)
    assert any("privileged: expected bool" in p for p in problems)
    ds = documents("daemonset.yaml")[1]
    del ds["spec"]["selector"]  # required by the API: the client's model refuses it
    with pytest.raises(ValueError, match="selector"):
        deserialize(ds, "V1DaemonSet")


def test_daemonset_shape() -> None:
    namespace, ds = (load(d) for d in documents("daemonset.yaml"))
    assert ds.metadata.namespace == namespace.metadata.name
    assert ds.spec.selector.match_labels.items() <= ds.spec.template.metadata.labels.items()
    pod = ds.spec.template.spec
    assert pod.node_selector == {"nvidia.com/gpu.present": "true"}
    assert pod.host_pid is True  # nsenter into PID 1 for --restart
    assert pod.automount_service_account_token is False  # no API access, hence no RBAC
    (container,) = pod.containers
    assert container.security_context.privileged is True
    args = container.args
    assert args[:3] == ["install", "--host-root", "/host"]
    assert "--uninstall-on-exit" in args  # SIGTERM (DaemonSet deleted) undoes the install
    (mount,) = container.volume_mounts
    (volume,) = pod.volumes
    assert (mount.name, mount.mount_path) == (volume.name, "/host")
    assert (volume.host_path.path, volume.host_path.type) == ("/", "Directory")
    assert pod.termination_grace_period_seconds >= 60


def test_entrypoint_matches_the_image() -> None:
    text = (K8S / "Containerfile").read_text()
    cmd = json.loads(re.search(r"(?m)^CMD (\[.*\])$", text)[1])  # type: ignore[index]
    entry = json.loads(re.search(r"(?m)^ENTRYPOINT (\[.*\])$", text)[1])  # type: ignore[index]
    (container,) = load(documents("daemonset.yaml")[1]).spec.template.spec.containers
    assert container.command == entry and container.args == cmd
    repo = K8S.parents[1]
    for line in re.findall(r"(?m)^COPY (?!--from)(.+) /src/?$", text):
        for source in line.split():
            assert (repo / source).exists(), source


def test_install_accepts_the_daemonset_flags(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = gpuctk(capsys, "install", "--help")
    assert code == 0
    (container,) = load(documents("daemonset.yaml")[1]).spec.template.spec.containers
    for flag in (a for a in container.args if a.startswith("--")):
        assert flag in out, flag


def test_runtimeclass_file_is_what_the_cli_prints(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = gpuctk(capsys, "runtime", "runtimeclass", "--gpu-node-selector")
    assert code == 0
    assert (K8S / "runtimeclass.yaml").read_text() == out
    rc = load(documents("runtimeclass.yaml")[0])
    assert rc.handler == "nvidia"  # the handler `gpuctk install` registers (--runtime-name)
    assert rc.scheduling.node_selector == {"nvidia.com/gpu.present": "true"}


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    manifests = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == manifests


def test_the_agent_runs_nothing_resident_on_the_node(capsys: pytest.CaptureFixture[str]) -> None:
    """The agent installs and waits: the image's command, the DaemonSet's args and `gpuctk
    install` offer no resident create process (a GPU create is the sh front and one Python)."""
    (container,) = load(documents("daemonset.yaml")[1]).spec.template.spec.containers
    assert container.args == ["install", "--host-root", "/host", "--restart",
                              "--uninstall-on-exit"]  # fmt: skip
    for name in ("daemonset.yaml", "Containerfile", "kustomization.yaml", "runtimeclass.yaml"):
        assert "create-server" not in (K8S / name).read_text(), name
    code, out, _ = gpuctk(capsys, "install", "--help")
    assert code == 0 and "create-server" not in out
    code, out, _ = gpuctk(capsys, "--help")
    assert code == 0 and "create-server" not in out
