"""NVIDIA driver capabilities, and which capability each driver file belongs to.

Kept tiny and import-free: the runtime shim imports it on the container-start path to honour
NVIDIA_DRIVER_CAPABILITIES.

The library and binary lists follow libnvidia-container (src/nvc_info.c: utility_libs,
compute_libs, video_libs, graphics_libs, graphics_libs_glvnd, ngx_libs, utility_bins,
compute_bins). Where that code has no list, the choice made here:

- display: the X server modules (nvidia_drv.so, libglxserver_nvidia.so); libnvidia-container
  leaves them out ("display libraries are not needed"), the Go toolkit mounts them for
  graphics/display.
- graphics: the EGL platform libraries (libnvidia-egl-gbm, -egl-wayland, nvidia-drm_gbm.so),
  libnvidia-vulkan-producer, libnvidia-api (NVAPI), OptiX.
- compute: nvidia-imex, nvidia-imex-ctl (multi-node NVLink memory export for CUDA).
- any 32-bit library: compat32 (`capability_of(name, elf32=True)`).
- a name none of the lists knows: utility (part of the default set, so an unknown library that
  carries the driver version is still injected rather than silently dropped).
"""

from __future__ import annotations

UTILITY = "utility"
COMPUTE = "compute"
VIDEO = "video"
GRAPHICS = "graphics"
DISPLAY = "display"
NGX = "ngx"
COMPAT32 = "compat32"

ALL = (UTILITY, COMPUTE, VIDEO, GRAPHICS, DISPLAY, NGX, COMPAT32)
DEFAULT = (UTILITY, COMPUTE)  # NVIDIA_DRIVER_CAPABILITIES unset
EVERY = "all"  # the word that asks for every capability
BLANKS = " \t\n\r\x0b\x0c"  # what gpuctk-cdi-hook trims a word of the variable of: ASCII space
# The GPUs' DRM card and render nodes go with these only (as in libnvidia-container's legacy
# mode): a spec or container without either gets no node under DRM_NODES.
DRM_USERS = frozenset((GRAPHICS, DISPLAY))
DRM_NODES = "/dev/dri/"

# Prefixes of library file names (matched up to ".so"), per capability.
_LIBRARIES = {
    UTILITY: ("libnvidia-ml", "libnvidia-cfg", "libnvidia-nscq"),
    COMPUTE: (
        "libcuda", "libcudadebugger", "libnvidia-opencl", "libnvidia-gpucomp",
        "libnvidia-ptxjitcompiler", "libnvidia-fatbinaryloader", "libnvidia-allocator",
        "libnvidia-compiler", "libnvidia-pkcs11", "libnvidia-pkcs11-openssl3", "libnvidia-nvvm",
        "libnvidia-tileiras",
    ),
    VIDEO: ("libvdpau_nvidia", "libnvidia-encode", "libnvidia-opticalflow", "libnvcuvid"),
    GRAPHICS: (
        "libnvidia-eglcore", "libnvidia-glcore", "libnvidia-tls", "libnvidia-glsi",
        "libnvidia-fbc", "libnvidia-ifr", "libnvidia-rtcore", "libnvoptix", "libGLX_nvidia",
        "libEGL_nvidia", "libGLESv2_nvidia", "libGLESv1_CM_nvidia", "libnvidia-glvkspirv",
        "libnvidia-cbl", "libnvidia-egl-gbm", "libnvidia-egl-wayland", "libnvidia-egl-xcb",
        "libnvidia-egl-xlib", "libnvidia-vulkan-producer", "libnvidia-api", "nvidia-drm_gbm",
        "libGLX_indirect",
    ),
    DISPLAY: ("nvidia_drv", "libglxserver_nvidia"),
    NGX: ("libnvidia-ngx",),
}  # fmt: skip

_BINARIES = {
    "nvidia-smi": UTILITY,
    "nvidia-debugdump": UTILITY,
    "nvidia-persistenced": UTILITY,
    "nv-fabricmanager": UTILITY,
    "nvidia-cuda-mps-control": COMPUTE,
    "nvidia-cuda-mps-server": COMPUTE,
    "nvidia-imex": COMPUTE,
    "nvidia-imex-ctl": COMPUTE,
}

_BY_STEM = {stem: cap for cap, stems in _LIBRARIES.items() for stem in stems}


def capability_of(basename: str, *, elf32: bool = False) -> str:
    """The driver capability of a library or binary, from its file name.

    `basename` is a file name ("libcuda.so.535.309.01", "nvidia-smi"); `elf32` marks a 32-bit
    library, which belongs to compat32 whatever its name.
    """
    if elf32:
        return COMPAT32
    binary = _BINARIES.get(basename)
    if binary is not None:
        return binary
    stem = basename.split(".so", 1)[0]
    return _BY_STEM.get(stem, UTILITY)


def list_problem(value: str) -> str | None:
    """Why `value` is not an operator's capability list (parse_strict), or None."""
    try:
        parse_strict(value)
    except ValueError as exc:
        return str(exc)
    return None


def parse_strict(value: str) -> frozenset[str]:
    """An operator's capability list ("utility,compute", "all"): ValueError naming any word
    that is not a capability (unlike the container's variable, where unknown words are
    ignored as the reference runtime does)."""
    words = [w.strip() for w in value.split(",") if w.strip()]
    if not words:
        raise ValueError("no capability given")
    unknown = sorted({w for w in words if w not in ALL and w != EVERY})
    if unknown:
        raise ValueError(
            f"unknown capabilities {', '.join(unknown)} (known: {EVERY}, {', '.join(ALL)})"
        )
    return frozenset(ALL) if EVERY in words else frozenset(words)
