"""gpuctk.hook.requests.devices: what a container asks for, from annotations, mounts and env."""

from __future__ import annotations

from typing import Any

import pytest

from gpuctk.errors import RequestError
from gpuctk.hook.requests.devices import (
    MAX_DEVICES,
    MAX_NAME_LEN,
    env_map,
    from_visible_devices,
    is_kubernetes,
    requested,
)

KIND = "nvidia.com/gpu"


def config(env: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"process": {"env": env if env is not None else ["PATH=/bin"]}}
    doc.update(extra)
    return doc


@pytest.mark.parametrize(
    ("value", "names", "driver_only"),
    [
        (None, [], False),
        ("", [], False),
        ("void", [], False),
        (" , ", [], False),
        ("0,void", [], False),
        ("none", [], True),
        ("0,none", [], True),
        ("all", ["nvidia.com/gpu=all"], False),
        ("0,all", ["nvidia.com/gpu=all"], False),
        ("0", ["nvidia.com/gpu=0"], False),
        ("1, 3,1", ["nvidia.com/gpu=1", "nvidia.com/gpu=3"], False),
        ("0:1", ["nvidia.com/gpu=0:1"], False),
        ("GPU-8d0f1a2b-aaaa", ["nvidia.com/gpu=GPU-8d0f1a2b-aaaa"], False),
        ("MIG-1234-5678", ["nvidia.com/gpu=MIG-1234-5678"], False),
        ("nvidia.com/gpu=1,0", ["nvidia.com/gpu=1", "nvidia.com/gpu=0"], False),
    ],
)
def test_visible_devices_values(value: str | None, names: list[str], driver_only: bool) -> None:
    assert from_visible_devices(value, KIND) == (names, driver_only)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("../../etc", "unqualified device"),
        ("a/b", "unqualified device 'a/b'"),
        ("nvidia.com/gpu=", "unqualified"),
        ("0\x001", "NUL"),
        ("-x", "must start with a letter or digit"),
        ("x" * (MAX_NAME_LEN + 1), "characters long"),
        (",".join(str(i) for i in range(MAX_DEVICES + 1)), "at most 1024"),
    ],
)
def test_visible_devices_bad_input(value: str, message: str) -> None:
    with pytest.raises(RequestError, match=message):
        from_visible_devices(value, KIND)


@pytest.mark.parametrize(
    "value", ["example.com/hostdisk=sda", "0,nvidia.com/nic=mlx5_0", "nvidia.com/gpux=0"]
)
def test_visible_devices_select_the_default_kind_only(value: str) -> None:
    with pytest.raises(RequestError, match=r"selects nvidia\.com/gpu devices only") as got:
        from_visible_devices(value, KIND)
    assert "annotation" in got.value.message and "device-list-kinds" in got.value.message
    with pytest.raises(RequestError, match=r"selects nvidia\.com/gpu devices only"):
        requested(config([f"NVIDIA_VISIBLE_DEVICES={value}"]))


def test_device_list_kinds_widen_the_device_list() -> None:
    kinds = ("example.com/hostdisk", "nvidia.com/nic")
    names, _ = from_visible_devices("0,example.com/hostdisk=sda,nvidia.com/nic=mlx5_0", KIND, kinds)
    assert names == ["nvidia.com/gpu=0", "example.com/hostdisk=sda", "nvidia.com/nic=mlx5_0"]
    doc = config(["NVIDIA_VISIBLE_DEVICES=nvidia.com/nic=mlx5_0"])
    assert requested(doc, device_list_kinds=kinds).devices == ("nvidia.com/nic=mlx5_0",)
    with pytest.raises(RequestError, match=r"of kind nvidia\.com/nic"):
        requested(doc, device_list_kinds=("example.com/hostdisk",))


def test_last_env_entry_wins_and_unset_means_nothing() -> None:
    req = requested(config(["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=1"]))
    assert req.devices == ("nvidia.com/gpu=1",) and req.source == "NVIDIA_VISIBLE_DEVICES"
    assert not requested(config())
    assert not requested({})
    assert not requested({"process": None})


def test_none_is_driver_only() -> None:
    req = requested(config(["NVIDIA_VISIBLE_DEVICES=none"]), kind="example.com/gpu")
    assert req and req.driver_only and req.devices == () and req.kind == "example.com/gpu"


def test_annotations_come_first_and_must_be_qualified() -> None:
    doc = config(
        ["NVIDIA_VISIBLE_DEVICES=all"],
        annotations={
            "cdi.k8s.io/b": "nvidia.com/gpu=1,nvidia.com/gpu=0",
            "cdi.k8s.io/a": "nvidia.com/gpu=0",
            "other.io/x": "junk",
        },
    )
    req = requested(doc)
    assert req.source == "annotations"
    assert req.devices == ("nvidia.com/gpu=0", "nvidia.com/gpu=1")
    with pytest.raises(RequestError, match=r"annotation 'cdi.k8s.io/x': invalid device name '0'"):
        requested(config(annotations={"cdi.k8s.io/x": "0"}))
    req = requested(doc, annotation_prefixes=("nope/",))
    assert req.source == "NVIDIA_VISIBLE_DEVICES"


def test_volume_mounts_only_when_accepted() -> None:
    mounts = [
        {"source": "/dev/null", "destination": "/var/run/nvidia-container-devices/1"},
        {"source": "/dev/null", "destination": "/var/run/nvidia-container-devices/cdi/x.com/y/z"},
        {"source": "/dev/null", "destination": "/var/run/nvidia-container-devicesX/9"},
        {"source": "/tmp/f", "destination": "/var/run/nvidia-container-devices/8"},
        {"source": "/dev/null", "destination": "/other/7"},
    ]
    doc = config(["NVIDIA_VISIBLE_DEVICES=0"], mounts=mounts)
    assert requested(doc).devices == ("nvidia.com/gpu=0",)
    with pytest.raises(RequestError, match=r"x\.com/y=z' is of kind x\.com/y"):
        requested(doc, accept_volume_mounts=True)  # the device list: the default kind only
    req = requested(doc, accept_volume_mounts=True, device_list_kinds=["x.com/y"])
    assert req.source == "mounts" and req.devices == ("nvidia.com/gpu=1", "x.com/y=z")
    mounts[1]["destination"] = "/var/run/nvidia-container-devices/cdi/nvidia.com/gpu/2"
    req = requested(doc, accept_volume_mounts=True)
    assert req.devices == ("nvidia.com/gpu=1", "nvidia.com/gpu=2")
    bad = config(
        mounts=[{"source": "/dev/null", "destination": "/var/run/nvidia-container-devices/cdi/a/b"}]
    )
    with pytest.raises(RequestError, match="expected"):
        requested(bad, accept_volume_mounts=True)


def test_unprivileged_policy() -> None:
    doc = config(["NVIDIA_VISIBLE_DEVICES=0"])
    req = requested(doc, accept_envvar_unprivileged=False)
    assert not req and "unprivileged" in req.notes[0]
    doc["process"]["capabilities"] = {"bounding": ["CAP_CHOWN", "CAP_SYS_ADMIN"]}
    assert requested(doc, accept_envvar_unprivileged=False).devices == ("nvidia.com/gpu=0",)
    # annotations are not subject to the env var policy, nor to the device list's kind rule
    doc = config(annotations={"cdi.k8s.io/x": "nvidia.com/gpu=0,example.com/hostdisk=sda"})
    assert requested(doc, accept_envvar_unprivileged=False)
    assert requested(doc).devices == ("nvidia.com/gpu=0", "example.com/hostdisk=sda")


CRI = {"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-id": "x"}
CRIO = {"io.kubernetes.cri-o.ContainerType": "container", "io.container.manager": "cri-o"}
PODMAN_POD = {"io.kubernetes.cri-o.ContainerType": "container", "io.container.manager": "libpod"}


@pytest.mark.parametrize(
    ("annotations", "kubernetes"),
    [
        (None, False),
        ({}, False),
        ({"io.kubernetes.cri.container-type": "container"}, True),  # containerd's CRI
        ({"io.kubernetes.cri.sandbox-id": "x"}, True),
        (CRI, True),
        (CRIO, True),
        ({"io.kubernetes.cri-o.ContainerType": "container"}, True),  # a CRI-O before manager
        (PODMAN_POD, False),  # podman marks its own pods' containers with CRI-O's key
        ({**PODMAN_POD, **CRI}, True),  # a forged marker only makes the rule stricter
        ({"io.kubernetes.cri.image-name": "x", "io.container.manager": "libpod"}, False),
    ],
)
def test_kubernetes_markers(annotations: dict[str, str] | None, kubernetes: bool) -> None:
    doc = config(annotations=annotations) if annotations is not None else config()
    assert is_kubernetes(doc) is kubernetes


@pytest.mark.parametrize("value", ["all", "0", "none", "GPU-x,nonsense/=", "nvidia.com/nic=0"])
def test_auto_ignores_the_env_in_an_unprivileged_kubernetes_container(value: str) -> None:
    """auto (the default): the env is no grant in a Kubernetes container, and an ignored
    value is not parsed (a malformed one fails nothing); one note says why and what to set."""
    doc = config([f"NVIDIA_VISIBLE_DEVICES={value}"], annotations=CRI)
    for setting in (None, False):
        req = requested(doc, accept_envvar_unprivileged=setting)
        assert not req and req.devices == () and not req.driver_only and len(req.notes) == 1
        assert req.notes[0].startswith(f"ignoring NVIDIA_VISIBLE_DEVICES={value} in ")
        assert "cdi-annotations" in req.notes[0] and "\n" not in req.notes[0]
        assert "accept-envvar-unprivileged = true" in req.notes[0]
    assert "Kubernetes" in requested(doc).notes[0]


def test_auto_keeps_the_env_elsewhere_and_for_privileged() -> None:
    for marks in ({}, PODMAN_POD):
        doc = config(["NVIDIA_VISIBLE_DEVICES=all"], annotations=marks)
        req = requested(doc)
        assert req.devices == ("nvidia.com/gpu=all",) and not req.notes
    doc = config(["NVIDIA_VISIBLE_DEVICES=all"], annotations=CRI)
    assert requested(doc, accept_envvar_unprivileged=True).devices == ("nvidia.com/gpu=all",)
    doc["process"]["capabilities"] = {"bounding": ["CAP_SYS_ADMIN"]}
    assert requested(doc).devices == ("nvidia.com/gpu=all",)


@pytest.mark.parametrize("value", [None, "", "void", " , "])
def test_no_note_when_the_env_asks_nothing(value: str | None) -> None:
    env = [] if value is None else [f"NVIDIA_VISIBLE_DEVICES={value}"]
    req = requested(config(env, annotations=CRI))
    assert not req and req.notes == ()


def test_kubernetes_grants_are_honoured() -> None:
    """The orchestrator's grants (CDI annotations, accepted device mounts) stand under auto."""
    doc = config(["NVIDIA_VISIBLE_DEVICES=all"],
                 annotations={**CRI, "cdi.k8s.io/gpu": "nvidia.com/gpu=1"})  # fmt: skip
    assert requested(doc).devices == ("nvidia.com/gpu=1",)
    doc = config(["NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices"], annotations=CRI,
                 mounts=[{"source": "/dev/null",
                          "destination": "/var/run/nvidia-container-devices/2"}])  # fmt: skip
    req = requested(doc, accept_volume_mounts=True)
    assert req.devices == ("nvidia.com/gpu=2",) and req.source == "mounts"


def test_env_map() -> None:
    assert env_map(["A=1", "B", "A=2=3", 5]) == {"A": "2=3"}
    assert env_map(None) == {}
