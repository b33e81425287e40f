"""gpuctk.hook.requests.imex: NVIDIA_IMEX_CHANNELS and `imex/` mounts, read with the GPU request."""

from __future__ import annotations

from typing import Any

import pytest

from gpuctk.errors import EXIT_REQUEST, RequestError
from gpuctk.hook.requests.devices import MOUNTS_ROOT, requested
from gpuctk.hook.requests.imex import MAX_CHANNEL, from_env

CH = "nvidia.com/imex-channel"


def config(*env: str, **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"process": {"env": ["PATH=/bin", *env]}}
    doc.update(extra)
    return doc


def mount(name: str) -> dict[str, Any]:
    return {"source": "/dev/null", "destination": f"{MOUNTS_ROOT}/{name}", "type": "bind"}


@pytest.mark.parametrize(
    ("value", "names"),
    [
        (None, []),
        ("", []),
        (" , ", []),
        ("none", []),
        ("void", []),
        ("0,none", []),
        ("0", [f"{CH}=0"]),
        ("1, 0,1", [f"{CH}=1", f"{CH}=0"]),
        ("channel2047", [f"{CH}=2047"]),
        ("007", [f"{CH}=7"]),
        (str(MAX_CHANNEL), [f"{CH}={MAX_CHANNEL}"]),
        ("all", [f"{CH}=all"]),
        ("0,all", [f"{CH}=all"]),
    ],
)
def test_env_values(value: str | None, names: list[str]) -> None:
    assert from_env(value) == names


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("x", "'x' is no IMEX channel"),
        ("-1", "'-1' is no IMEX channel"),
        ("0x1", "is no IMEX channel"),
        ("channel", "is no IMEX channel"),
        ("../0", "is no IMEX channel"),
        ("nvidia.com/imex-channel=0", "is no IMEX channel"),
        ("\u0661", "is no IMEX channel"),  # an Arabic-Indic digit: isdigit() alone takes it
        (str(MAX_CHANNEL + 1), "out of range 0..1048575"),
        ("1" * 40, "is no IMEX channel"),
        (",".join(str(i) for i in range(1025)), "at most 1024"),
        ("all,garbage", "'garbage' is no IMEX channel"),  # a word never hides a typo
        ("none,x", "'x' is no IMEX channel"),
    ],
)
def test_bad_values_are_one_line_request_errors(value: str, message: str) -> None:
    with pytest.raises(RequestError) as err:
        requested(config("NVIDIA_VISIBLE_DEVICES=0", f"NVIDIA_IMEX_CHANNELS={value}"))
    assert message in err.value.message
    assert "\n" not in err.value.message and err.value.exit_code == EXIT_REQUEST
    assert err.value.message.startswith("NVIDIA_IMEX_CHANNELS: ")


def test_channels_join_the_gpu_request() -> None:
    req = requested(config("NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_IMEX_CHANNELS=0,1"))
    assert req.devices == ("nvidia.com/gpu=0", f"{CH}=0", f"{CH}=1")
    assert req.source == "NVIDIA_VISIBLE_DEVICES" and not req.driver_only


def test_last_env_entry_wins() -> None:
    doc = config("NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_IMEX_CHANNELS=0", "NVIDIA_IMEX_CHANNELS=3")
    assert requested(doc).devices == ("nvidia.com/gpu=0", f"{CH}=3")


def test_driver_only_takes_no_channel() -> None:
    """IMEX channels come only beside a granted GPU: `none` (the driver files) takes none,
    from the env or from mounts, privileged or not."""
    req = requested(config("NVIDIA_VISIBLE_DEVICES=none", "NVIDIA_IMEX_CHANNELS=2"))
    assert req.driver_only and req.devices == ()
    doc = config("NVIDIA_VISIBLE_DEVICES=none", "NVIDIA_IMEX_CHANNELS=all",
                 mounts=[mount("imex/5")])  # fmt: skip
    doc["process"]["capabilities"] = {"bounding": ["CAP_SYS_ADMIN"]}
    req = requested(doc, accept_volume_mounts=True)
    assert req.driver_only and req.devices == ()


@pytest.mark.parametrize("visible", [None, "", "void"])
def test_no_gpu_no_channels(visible: str | None) -> None:
    env = [] if visible is None else [f"NVIDIA_VISIBLE_DEVICES={visible}"]
    req = requested(config(*env, "NVIDIA_IMEX_CHANNELS=0"))
    assert not req and req.devices == ()


def test_legacy_images_get_no_channels_by_default() -> None:
    req = requested(config("NVIDIA_VISIBLE_DEVICES=0", "CUDA_VERSION=12.2"))
    assert req.devices == ("nvidia.com/gpu=0",)


def test_annotation_requests_take_no_channels_from_the_image() -> None:
    doc = config("NVIDIA_IMEX_CHANNELS=all", annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=1"})
    assert requested(doc).devices == ("nvidia.com/gpu=1",)


def test_unprivileged_policy_applies_to_the_channels() -> None:
    doc = config("NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_IMEX_CHANNELS=0")
    doc["mounts"] = [mount("1")]
    req = requested(doc, accept_volume_mounts=True, accept_envvar_unprivileged=False)
    assert req.devices == ("nvidia.com/gpu=1",)
    assert any("NVIDIA_IMEX_CHANNELS=0" in n for n in req.notes)
    doc["process"]["capabilities"] = {"bounding": ["CAP_SYS_ADMIN"]}
    req = requested(doc, accept_volume_mounts=True, accept_envvar_unprivileged=False)
    assert req.devices == ("nvidia.com/gpu=1", f"{CH}=0")


def test_imex_mounts_come_first_when_accepted() -> None:
    doc = config("NVIDIA_IMEX_CHANNELS=0", mounts=[mount("0"), mount("imex/5"), mount("imex/6")])
    req = requested(doc, accept_volume_mounts=True)
    assert req.devices == ("nvidia.com/gpu=0", f"{CH}=5", f"{CH}=6")
    assert req.source == "mounts"
    doc = config("NVIDIA_VISIBLE_DEVICES=1", mounts=[mount("imex/5")])
    assert requested(doc, accept_volume_mounts=True).devices == ("nvidia.com/gpu=1", f"{CH}=5")
    assert requested(doc).devices == ("nvidia.com/gpu=1",)  # mounts not accepted


def test_bad_imex_mount_is_a_request_error() -> None:
    doc = config(mounts=[mount("0"), mount("imex/x")])
    with pytest.raises(RequestError, match="'imex/x': 'x' is no IMEX channel"):
        requested(doc, accept_volume_mounts=True)
    doc = config(mounts=[mount("0"), mount("imex/../../../etc")])
    with pytest.raises(RequestError, match=r"'\.\.' in a device request mount"):
        requested(doc, accept_volume_mounts=True)


CRI = {"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-id": "x"}


def test_kubernetes_unprivileged_takes_no_channel_from_the_env() -> None:
    """In an unprivileged Kubernetes container (auto) the env asks for nothing, channels
    included; beside a mounts grant, the image's channels are ignored with one note."""
    doc = config("NVIDIA_VISIBLE_DEVICES=none", "NVIDIA_IMEX_CHANNELS=all", annotations=CRI)
    req = requested(doc)
    assert not req and req.devices == () and len(req.notes) == 1
    doc = config("NVIDIA_IMEX_CHANNELS=all", annotations=CRI, mounts=[mount("0")])
    req = requested(doc, accept_volume_mounts=True)
    assert req.devices == ("nvidia.com/gpu=0",)
    assert [n for n in req.notes if n.startswith("ignoring NVIDIA_IMEX_CHANNELS=all in ")]
