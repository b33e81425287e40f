"""gpuctk.hook.requests.drivercaps: NVIDIA_DRIVER_CAPABILITIES filters driver files and hook
links."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpuctk.hook.requests import drivercaps
from gpuctk.hook.requests.drivercaps import file_capabilities, filter_edits

LIB = "/usr/lib/x86_64-linux-gnu"


def m(path: str, *options: str) -> dict[str, Any]:
    return {"hostPath": "/drv" + path, "containerPath": path, "options": list(options) or ["ro"]}


def parse(value: str | None) -> tuple[frozenset[str], list[str]]:
    """drivercaps.parse for a config whose env sets the variable to `value` (None: unset)."""
    env = [] if value is None else [f"{drivercaps.ENV}={value}"]
    return drivercaps.parse({"process": {"env": ["PATH=/bin", *env]}}, value)


def test_parse() -> None:
    assert parse(None) == (frozenset({"utility", "compute"}), [])
    assert parse("") == (frozenset({"utility", "compute"}), [])
    assert parse("all")[0] >= {"graphics", "video", "display", "ngx", "compat32"}
    caps, notes = parse("video, compute,bogus")
    assert caps == {"video", "compute"}
    assert notes == [
        "NVIDIA_DRIVER_CAPABILITIES='video, compute,bogus': ignoring a word that names no "
        "capability (known: utility, compute, video, graphics, display, ngx, compat32, all)"
    ]
    assert "2 words" in parse("x,y")[1][0]


@pytest.mark.parametrize(
    ("path", "options", "needed"),
    [
        (f"{LIB}/libcuda.so.535.309.01", (), ("compute",)),
        (f"{LIB}/libnvidia-ml.so.535.309.01", (), ("utility",)),
        (f"{LIB}/libnvidia-encode.so.535.309.01", (), ("video",)),
        (f"{LIB}/libGLX_nvidia.so.535.309.01", (), ("graphics",)),
        ("/usr/lib/i386-linux-gnu/libcuda.so.535.309.01", (), ("compute", "compat32")),
        ("/usr/bin/nvidia-smi", (), ("utility",)),
        ("/usr/bin/nvidia-cuda-mps-control", (), ("compute",)),
        ("/usr/share/vulkan/icd.d/nvidia_icd.json", (), ("graphics",)),
        ("/usr/share/glvnd/egl_vendor.d/10_nvidia.json", (), ("graphics",)),
        ("/etc/OpenCL/vendors/nvidia.icd", (), ("compute",)),
        ("/usr/share/nvidia/nvidia-application-profiles-535.309.01-rc", (), ("graphics",)),
        ("/usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf", (), ("display",)),
        ("/usr/lib/xorg/modules/drivers/nvidia_drv.so", (), ("display",)),
        ("/run/nvidia-persistenced/socket", ("noexec",), ()),
        ("/lib/firmware/nvidia/535.309.01/gsp_ga10x.bin", (), ()),
        ("/etc/something/unknown", (), ()),
    ],
)
def test_file_capabilities(path: str, options: tuple[str, ...], needed: tuple[str, ...]) -> None:
    assert file_capabilities(m(path, *options), lib64=False) == needed


def test_rhel_layout_32bit_libraries() -> None:
    assert file_capabilities(m("/usr/lib/libcuda.so.1"), lib64=True) == ("compute", "compat32")
    assert file_capabilities(m("/usr/lib/libcuda.so.1"), lib64=False) == ("compute",)


def edits() -> dict[str, Any]:
    return {
        "env": [f"NVIDIA_CTK_LIBCUDA_DIR={LIB}", "NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [{"path": "/dev/nvidiactl"}],
        "mounts": [
            m(f"{LIB}/libcuda.so.535.309.01"),
            m(f"{LIB}/libnvidia-ml.so.535.309.01"),
            m(f"{LIB}/libnvidia-encode.so.535.309.01"),
            m("/usr/lib/i386-linux-gnu/libnvidia-ml.so.535.309.01"),
            m("/usr/bin/nvidia-smi"),
            m("/run/nvidia-persistenced/socket", "noexec"),
        ],
        "hooks": [
            {
                "hookName": "createContainer",
                "path": "/usr/bin/gpuctk-hook",
                "args": [
                    "gpuctk-hook",
                    "createContainer",
                    "--link",
                    f"libcuda.so.535.309.01::{LIB}/libcuda.so.1",
                    f"--link=libcuda.so.1::{LIB}/libcuda.so",
                    "--link",
                    f"{LIB}/libnvidia-ml.so.535.309.01::{LIB}/libnvidia-ml.so.1",
                    "--link",
                    f"../libnvidia-encode.so.535.309.01::{LIB}/x/enc.so",
                    "--folder",
                    LIB,
                ],
                "env": ["GPUCTK_DRIVER_VERSION=535.309.01"],
            },
            {"hookName": "poststop", "path": "/other"},
        ],
    }


def test_default_caps_drop_video_and_32bit_and_their_links() -> None:
    original = edits()
    before = copy.deepcopy(original)
    out = filter_edits(original, parse(None)[0])
    assert original == before  # input untouched
    assert [x["containerPath"] for x in out["mounts"]] == [
        f"{LIB}/libcuda.so.535.309.01",
        f"{LIB}/libnvidia-ml.so.535.309.01",
        "/usr/bin/nvidia-smi",
        "/run/nvidia-persistenced/socket",
    ]
    args = out["hooks"][0]["args"]
    assert not any("encode" in a for a in args)
    assert f"libcuda.so.535.309.01::{LIB}/libcuda.so.1" in args
    assert out["hooks"][1] == {"hookName": "poststop", "path": "/other"}
    assert out["deviceNodes"] == before["deviceNodes"] and out["env"] == before["env"]


def test_utility_drops_the_whole_libcuda_link_chain() -> None:
    out = filter_edits(edits(), frozenset({"utility"}))
    assert out["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]  # no folder named for a libcuda gone
    args = out["hooks"][0]["args"]
    assert args == [
        "gpuctk-hook",
        "createContainer",
        "--link",
        f"{LIB}/libnvidia-ml.so.535.309.01::{LIB}/libnvidia-ml.so.1",
        "--folder",
        LIB,
    ]


def test_all_keeps_everything() -> None:
    original = edits()
    out = filter_edits(original, parse("all")[0])
    assert out == original


def test_a_folder_specs_links_to_its_staged_files_follow_their_own_path() -> None:
    """A folder spec mounts no config file: its hook links each from the stage's files/, a
    --link-for naming the capability, which the shim's filter takes as a mount's."""
    files = "/usr/local/nvidia/files"
    paths = {
        "/usr/share/vulkan/icd.d/nvidia_icd.json": "graphics",
        "/usr/lib/xorg/modules/drivers/nvidia_drv.so": "display",
        "/etc/OpenCL/vendors/nvidia.icd": "compute",
        "/lib/firmware/nvidia/535.309.01/gsp_ga10x.bin": "",
    }
    args = ["gpuctk-cdi-hook", "createContainer"]
    for path, cap in paths.items():  # a config file's link names its capability
        link = f"{files}{path}::{path}"
        args += ["--link-for", f"{cap}:{link}"] if cap else ["--link", link]
    args += ["--folder", "/usr/local/nvidia/lib64"]
    hook = {"hookName": "createContainer", "path": "/usr/bin/gpuctk-cdi-hook", "args": args}
    edits = {"mounts": [m("/usr/local/nvidia")], "hooks": [hook]}
    before = copy.deepcopy(edits)

    def links(selected: set[str]) -> list[str]:
        out = filter_edits(edits, frozenset(selected))
        got = out["hooks"][0]["args"]
        assert got[-2:] == ["--folder", "/usr/local/nvidia/lib64"]
        assert out["mounts"] == edits["mounts"]
        return [a.partition("::")[2] for a in got if "::" in a]

    always = [p for p, c in paths.items() if not c]
    assert links({"utility", "compute"}) == ["/etc/OpenCL/vendors/nvidia.icd", *always]
    assert links({"utility"}) == always
    assert links({"graphics"}) == ["/usr/share/vulkan/icd.d/nvidia_icd.json", *always]
    assert links({"utility", "compute", "graphics", "video", "display", "ngx", "compat32"}) == list(
        paths
    )
    assert edits == before
    unchanged = filter_edits(edits, frozenset({"utility", "compute", "graphics", "display"}))
    assert unchanged["hooks"] is edits["hooks"]
