"""Where driver files live: the candidate paths that driver-file discovery checks.

Plain data, in container terms (no driver root). Layouts covered: NVIDIA's .run installer and
CUDA repo packages (files in /usr/lib/x86_64-linux-gnu or /usr/lib64), Debian's packages (files
in /usr/lib/<triplet>/nvidia/current and /usr/lib/nvidia/current, linked into place by
update-alternatives), containerised drivers (the same layouts under /run/nvidia/driver), and
drivers kept whole under one prefix (PREFIXES: GKE and COS nodes, images built for them), with
bin/, lib64/ (VDPAU's in lib64/vdpau/) and firmware/nvidia/<version>/ below it, where
/usr/bin/nvidia-smi may be a shell wrapper that execs the prefix's binary; such a prefix may
also be the driver root itself.
"""

from __future__ import annotations

import stat

from gpuctk.cdi.node.capabilities import COMPUTE, DISPLAY, GRAPHICS, UTILITY

_TRIPLETS = ("x86_64-linux-gnu", "aarch64-linux-gnu", "powerpc64le-linux-gnu")

# Folders that hold a whole driver: <prefix>/bin, <prefix>/lib64 and
# <prefix>/firmware/nvidia/<version> (GKE's and COS's installers, and images made for them).
PREFIXES = ("/usr/local/nvidia", "/home/kubernetes/bin/nvidia")

# Folders scanned for libraries whose file name ends with .so.<driver version>, in order.
# 32-bit libraries are recognised by their ELF class, wherever they are found.
LIBRARY_DIRS: tuple[str, ...] = (
    *(d for t in _TRIPLETS for d in (f"/usr/lib/{t}", f"/usr/lib/{t}/nvidia/current",
                                     f"/lib/{t}", f"/usr/lib/{t}/vdpau")),
    "/usr/lib64", "/lib64", "/usr/lib64/vdpau", "/lib64/vdpau", "/usr/lib", "/lib",
    "/usr/local/lib",
    "/usr/lib/i386-linux-gnu", "/usr/lib/i386-linux-gnu/nvidia/current", "/lib/i386-linux-gnu",
    "/usr/lib/i386-linux-gnu/vdpau", "/usr/lib32", "/lib32", "/usr/lib/vdpau",
    *(f"{p}/{d}" for p in PREFIXES for d in ("lib64", "lib64/vdpau", "lib")),
)  # fmt: skip

# Libraries that do not carry the driver version in their name but belong to the driver's
# graphics stack (named by the EGL external platform configs below). Looked up by SONAME.
EXTRA_SONAMES = frozenset(
    {"libnvidia-egl-gbm.so.1", "libnvidia-egl-wayland.so.1", "libnvidia-egl-xcb.so.1",
     "libnvidia-egl-xlib.so.1"}
)  # fmt: skip

# Extra links next to a library, by SONAME: (target, link name). As the reference toolkit:
# the development link for libcuda (and opticalflow), and GLVND's indirect GLX entry point.
DEV_LINKS: dict[str, tuple[tuple[str, str], ...]] = {
    "libcuda.so.1": (("{soname}", "libcuda.so"),),
    "libnvidia-opticalflow.so.1": (("{soname}", "libnvidia-opticalflow.so"),),
    "libGLX_nvidia.so.0": (("{soname}", "libGLX_indirect.so.0"),),
}

# Loader links in the multiarch library folder, by SONAME: the path (relative to that folder)
# where another loader looks for the library (libgbm's backends, libvdpau's drivers).
LOADER_LINKS = {
    "libnvidia-allocator.so.1": "gbm/nvidia-drm_gbm.so",
    "libvdpau_nvidia.so.1": "vdpau/libvdpau_nvidia.so.1",
}

BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-imex",
    "nvidia-imex-ctl",
)
# A binary found in one of these is mounted where it was found; elsewhere, at /usr/bin/<name>.
# Only the driver's ELF programs count: a shell wrapper standing at /usr/bin/nvidia-smi (it
# execs the prefix's binary, a path a container does not have) gives way to the ELF found in a
# later folder, mounted at the wrapper's path.
PATH_DIRS = frozenset(
    {"/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin", "/usr/local/sbin"}
)
BINARY_DIRS = (
    "/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin", "/usr/local/sbin",
    "/usr/lib/nvidia/current", "/usr/lib/nvidia", *(f"{p}/bin" for p in PREFIXES),
)  # fmt: skip

# Where the GSP firmware is mounted in a container: where the kernel and NVIDIA's spec put it.
FIRMWARE_PATH = "/lib/firmware/nvidia/{version}"
# (folder in the driver root, folder in the container), the first of a name wins. A prefix may
# itself be the driver root (the GPU Operator on COS: --driver-root /home/kubernetes/bin/nvidia).
FIRMWARE_DIRS: tuple[tuple[str, str], ...] = (
    (FIRMWARE_PATH, FIRMWARE_PATH),
    ("/usr/lib/firmware/nvidia/{version}", "/usr/lib/firmware/nvidia/{version}"),
    *((f"{p}/firmware/nvidia/{{version}}", FIRMWARE_PATH) for p in PREFIXES),
    ("/firmware/nvidia/{version}", FIRMWARE_PATH),
)

_REG = stat.S_IFREG
# (alternative locations, the first found wins; capability; file type). A Vulkan file is
# mounted under /etc/vulkan wherever the host has it (config_container_path).
CONFIGS: tuple[tuple[tuple[str, ...], str, int], ...] = (
    (("/etc/vulkan/icd.d/nvidia_icd.json", "/usr/share/vulkan/icd.d/nvidia_icd.json",
      "/etc/vulkan/icd.d/nvidia_icd.x86_64.json", "/usr/share/vulkan/icd.d/nvidia_icd.x86_64.json",
      # GKE's: under the driver's own folder (a prefix, or the driver root itself)
      *(f"{p}/vulkan/icd.d/nvidia_icd.json" for p in (*PREFIXES, ""))),
     GRAPHICS, _REG),
    (("/etc/vulkan/implicit_layer.d/nvidia_layers.json",
      "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json"), GRAPHICS, _REG),
    (("/etc/vulkan/icd.d/nvidia_layers.json", "/usr/share/vulkan/icd.d/nvidia_layers.json"),
     GRAPHICS, _REG),
    (("/usr/share/nvidia/nvoptix.bin",), GRAPHICS, _REG),  # OptiX's shader cache seed
    (("/etc/glvnd/egl_vendor.d/10_nvidia.json", "/usr/share/glvnd/egl_vendor.d/10_nvidia.json"),
     GRAPHICS, _REG),
    *(((f"/etc/egl/egl_external_platform.d/{n}", f"/usr/share/egl/egl_external_platform.d/{n}"),
       GRAPHICS, _REG)
      for n in ("10_nvidia_wayland.json", "15_nvidia_gbm.json", "20_nvidia_xcb.json",
                "20_nvidia_xlib.json")),
    (("/usr/share/nvidia/nvidia-application-profiles-{version}-rc",), GRAPHICS, _REG),
    (("/usr/share/nvidia/nvidia-application-profiles-{version}-key-documentation",),
     GRAPHICS, _REG),
    (("/etc/OpenCL/vendors/nvidia.icd",), COMPUTE, _REG),
    (("/usr/lib/xorg/modules/drivers/nvidia_drv.so",
      "/usr/lib64/xorg/modules/drivers/nvidia_drv.so"), DISPLAY, _REG),
    (("/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{version}",
      "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so",
      "/usr/lib64/xorg/modules/extensions/libglxserver_nvidia.so.{version}"), DISPLAY, _REG),
    (("/usr/share/X11/xorg.conf.d/10-nvidia.conf",
      "/usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf"), DISPLAY, _REG),
)  # fmt: skip

VULKAN_CONTAINER = "/etc/vulkan/"


def config_container_path(found: str) -> str:
    """Where a container gets the config file found at `found` (as listed in CONFIGS): a
    Vulkan ICD or layer file (a `vulkan/` folder's) under /etc/vulkan, where NVIDIA's spec
    puts it (images name VK_ICD_FILENAMES=/etc/vulkan/icd.d/nvidia_icd.json; a loader reads
    /etc/vulkan and /usr/share/vulkan), any other at its own path."""
    _, sep, rest = found.rpartition("/vulkan/")
    return VULKAN_CONTAINER + rest if sep else found


SOCKETS: tuple[tuple[tuple[str, ...], str, int], ...] = (
    (("/run/nvidia-persistenced/socket", "/var/run/nvidia-persistenced/socket"),
     UTILITY, stat.S_IFSOCK),
    (("/run/nvidia-fabricmanager/socket", "/var/run/nvidia-fabricmanager/socket"),
     UTILITY, stat.S_IFSOCK),
    (("/tmp/nvidia-mps",), COMPUTE, stat.S_IFDIR),
)  # fmt: skip

_DRIVER_STEMS = ("libcuda", "libnvcuvid", "libnvoptix")


def is_driver_library_name(name: str) -> bool:
    """Whether a library name (an ld.so.cache key) may belong to the NVIDIA driver."""
    return "nvidia" in name.lower() or name.startswith(_DRIVER_STEMS)
