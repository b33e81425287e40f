"""gpuctk.cdi.node.capabilities: each driver file's capability, after libnvidia-container's
lists."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuctk.cdi.node import capabilities as caps
from gpuctk.cdi.node.capabilities import capability_of

V = "535.309.01"

EXPECTED = {
    "utility": [f"libnvidia-ml.so.{V}", "libnvidia-ml.so.1", f"libnvidia-cfg.so.{V}",
                f"libnvidia-nscq.so.{V}", "nvidia-smi", "nvidia-debugdump",
                "nvidia-persistenced"],
    "compute": [f"libcuda.so.{V}", "libcuda.so", f"libcudadebugger.so.{V}",
                f"libnvidia-opencl.so.{V}", f"libnvidia-ptxjitcompiler.so.{V}",
                f"libnvidia-fatbinaryloader.so.{V}", f"libnvidia-allocator.so.{V}",
                f"libnvidia-compiler.so.{V}", f"libnvidia-nvvm.so.{V}", "libnvidia-nvvm.so.4",
                f"libnvidia-gpucomp.so.{V}", f"libnvidia-pkcs11.so.{V}",
                f"libnvidia-pkcs11-openssl3.so.{V}", "nvidia-cuda-mps-control",
                "nvidia-cuda-mps-server", "nvidia-imex", "nvidia-imex-ctl"],
    "video": [f"libnvcuvid.so.{V}", f"libnvidia-encode.so.{V}", f"libnvidia-opticalflow.so.{V}",
              f"libvdpau_nvidia.so.{V}"],
    "graphics": [f"libEGL_nvidia.so.{V}", f"libGLESv2_nvidia.so.{V}",
                 f"libGLESv1_CM_nvidia.so.{V}", f"libGLX_nvidia.so.{V}",
                 f"libnvidia-eglcore.so.{V}", f"libnvidia-glcore.so.{V}", f"libnvidia-tls.so.{V}",
                 f"libnvidia-glsi.so.{V}", f"libnvidia-glvkspirv.so.{V}",
                 f"libnvidia-rtcore.so.{V}", f"libnvoptix.so.{V}", f"libnvidia-fbc.so.{V}",
                 f"libnvidia-ifr.so.{V}", f"libnvidia-cbl.so.{V}", "libnvidia-egl-gbm.so.1.1.0",
                 "libnvidia-egl-wayland.so.1.1.10", f"libnvidia-vulkan-producer.so.{V}"],
    "display": ["nvidia_drv.so", f"libglxserver_nvidia.so.{V}"],
    "ngx": [f"libnvidia-ngx.so.{V}"],
}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "expected"), [(n, cap) for cap, names in EXPECTED.items() for n in names]
)
def test_capability_of(name: str, expected: str) -> None:
    assert capability_of(name) == expected


def test_every_capability_is_reachable() -> None:
    assert set(EXPECTED) | {caps.COMPAT32} == set(caps.ALL)


def test_compat32_wins_over_the_name() -> None:
    assert capability_of(f"libcuda.so.{V}", elf32=True) == "compat32"
    assert capability_of(f"libGLX_nvidia.so.{V}", elf32=True) == "compat32"


def test_prefixes_do_not_leak() -> None:
    # libnvidia-pkcs11 is compute; libnvidia-ml must not be matched by libnvidia-m* others.
    assert capability_of("libnvidia-mlx.so.1") == caps.UTILITY  # unknown -> default
    assert capability_of("libcudart.so.12") == caps.UTILITY  # not libcuda
    assert capability_of("nvidia-smi-extra") == caps.UTILITY


@pytest.mark.parametrize(
    ("value", "expected", "unknown"),
    [(None, {"utility", "compute"}, 0), ("", {"utility", "compute"}, 0),
     (" \t", {"utility", "compute"}, 0), ("all", set(caps.ALL), 0),
     ("compute,video", {"compute", "video"}, 0),
     (" graphics , display ", {"graphics", "display"}, 0),
     ("utility,bogus", {"utility"}, 1), ("compute,all", set(caps.ALL), 0),
     ("x,,Utility, ngx\u00e9", set(), 3), ("compute,\u0000", {"compute"}, 1)],
)  # fmt: skip
def test_the_container_capabilities_as_the_c_reads_them(
    value: str | None, expected: set[str], unknown: int
) -> None:
    """gpuctk-cdi-hook's container_caps (the reading's one home), asked by the Python."""
    from gpuctk.hook import compiled

    env = ["PATH=/bin", "NVIDIA_DRIVER_CAPABILITIES=video"]  # the last entry wins
    env += [] if value is None else [f"NVIDIA_DRIVER_CAPABILITIES={value}"]
    config = {"process": {"env": env if value is not None else env[:1]}}
    assert compiled.capabilities(config) == (expected, unknown)


def test_an_env_of_any_length_is_read() -> None:
    """A process starts with far more env entries than the C's lists of members hold: the
    variable is read from an env list of any length the config holds."""
    from gpuctk.hook import compiled

    env = [f"V{i}=x" for i in range(70_000)] + ["NVIDIA_DRIVER_CAPABILITIES=video"]
    assert compiled.capabilities({"process": {"env": env}}) == ({"video"}, 0)
    env.append("NVIDIA_DRIVER_CAPABILITIES=")
    assert compiled.capabilities({"process": {"env": env}}) == ({"utility", "compute"}, 0)


def test_a_config_whose_capabilities_cannot_be_read_is_an_error() -> None:
    from gpuctk.errors import GpuctkError
    from gpuctk.hook import compiled

    for config in (
        {"process": {"env": ["A=1", 7]}},
        {"process": None},
        {"process": {"env": "NVIDIA_DRIVER_CAPABILITIES=all"}},
    ):
        with pytest.raises(GpuctkError, match="NVIDIA_DRIVER_CAPABILITIES cannot be read"):
            compiled.capabilities(config)
    with pytest.raises(GpuctkError, match="cannot be passed on"):
        compiled.capabilities({"process": {"env": [float("inf")]}})
    # the keys are checked where the config is read (gpuctk.hook.ocikeys), not here
    assert compiled.capabilities({"pr\u00f3cess": {}, "process": {"Env": 1}})[0] == {
        "utility", "compute"}  # fmt: skip


def test_import_is_light(tmp_path: Path) -> None:
    code = (
        "import sys; before = set(sys.modules); import gpuctk.cdi.node.capabilities; "
        "print(' '.join(sorted(set(sys.modules) - before)))"
    )
    # run away from a checkout's root, whose gpuctk/ (the source) `-c` would import instead
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=tmp_path)  # fmt: skip
    assert set(out.stdout.split()) <= {
        "__future__",  # what `from __future__ import annotations` loads, where site did not
        "gpuctk",
        "gpuctk.cdi",
        "gpuctk.cdi.node",
        "gpuctk.cdi.node.capabilities",
    }
