"""`gpuctk cdi ...`: generate, list and validate CDI specs."""

from __future__ import annotations

from typing import Any

import click

from gpuctk.cdi import cliopts
from gpuctk.cdi.discover import Roots
from gpuctk.cdi.generate import LIBRARY_MODES, NAME_STRATEGIES
from gpuctk.cdi.nicspec import nic_options


class _InspectCommands(click.Group):
    """`list`, `validate` and `transform` load their module only when invoked (generate never
    pays)."""

    _lazy = {"list": "list_cmd", "validate": "validate_cmd", "transform": "transform"}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._lazy))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == "transform":
            from gpuctk.cdi.transform import transform

            return transform
        if cmd_name in self._lazy:
            from gpuctk.cdi import cli_inspect

            command = getattr(cli_inspect, self._lazy[cmd_name])
            assert isinstance(command, click.Command)
            return command
        return super().get_command(ctx, cmd_name)


@click.group("cdi", cls=_InspectCommands)
def cdi() -> None:
    """Generate, list and validate CDI specs for NVIDIA GPUs.

    \b
    A CDI spec tells a container engine (podman, containerd, CRI-O) which device nodes,
    driver files and hooks give a container a GPU. Write one per node:
      gpuctk cdi generate --output /var/run/cdi/nvidia.yaml
    then ask for GPUs by name:
      podman run --device nvidia.com/gpu=0 ...
    """


@cdi.command("generate")
@click.option(
    "--mode",
    type=click.Choice(["nvml", "management", "imex"]),
    default="nvml",
    show_default=True,
    help="nvml: a device per GPU and MIG device. management: one `all` device with every "
    "NVIDIA device node and the utility driver files (NVML, nvidia-smi), for monitoring pods; "
    "kind management.nvidia.com/gpu. imex: a device per IMEX channel node; kind "
    "nvidia.com/imex-channel, no NVML needed.",
)
@click.option(
    "--output",
    "-o",
    metavar="PATH",
    help="Write the spec here (atomically, mode 0644). Default: standard output. "
    "Engines read /etc/cdi and /var/run/cdi.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["yaml", "json"]),
    help="Output format. Default: from the --output extension (.json), else yaml.",
)
@click.option("--vendor", default="nvidia.com", show_default=True, help="Vendor part of the kind.")
@click.option(
    "--class", "device_class", default="gpu", show_default=True, help="Class part of the kind."
)
@click.option(
    "--device-name-strategy",
    "strategies",
    multiple=True,
    type=click.Choice(NAME_STRATEGIES),
    help="How devices are named; repeat for several. index: 0, 0:1 (MIG); uuid: GPU-..., "
    "MIG-...; type-index: gpu0, mig0:1. Default: index and uuid.",
)
@click.option("--no-all-device", is_flag=True, help="Do not add the `all` device.")
@click.option(
    "--device-id",
    "device_ids",
    multiple=True,
    metavar="ID",
    help="Only these devices (index, MIG index 0:1, or UUID); repeatable. Default: all.",
)
@click.option(
    "--hook-path",
    default="/usr/bin/gpuctk-hook",
    show_default=True,
    help="Path of gpuctk-hook on the host, written into the spec's hook entry.",
)
@click.option(
    "--library-mode",
    type=click.Choice(LIBRARY_MODES),
    default="hook",
    show_default=True,
    help="hook: mount each driver library at its own path; gpuctk-hook makes the SONAME links and "
    "the ld cache at container create. mounts: no hook entry; each library is mounted "
    "read-only at its SONAME (instead of its own path) in /usr/lib/<triplet> and /usr/lib64 "
    "(/usr/lib for 32-bit), where the image's glibc loader looks when its ld cache has no "
    "entry (Debian, Ubuntu, Fedora, RHEL, UBI), which saves the hook process in engines that "
    "apply CDI themselves (podman, containerd 1.7+, CRI-O); gpuctk-runtime does the hook's "
    "work without a process in either mode. Keep hook for: images whose own ld.so.cache names"
    " a driver library (CUDA compat libraries in ld.so.conf: the cache wins over the mounts);"
    " tools that read `ldconfig -p` (it lists no driver library in this mode: Triton needs "
    "TRITON_LIBCUDA_PATH=/usr/lib64); dlopen by names other than the SONAME, libcuda.so, "
    "libnvidia-opticalflow.so, libGLX_indirect.so.0; NVIDIA_REQUIRE_* checks by "
    "gpuctk-runtime or the prestart and precreate hooks (the machine facts ride in the hook "
    "entry). musl images cannot load the driver in either mode. folder: no hook and three "
    "mounts: the libraries (with their SONAME links) and binaries are staged once per driver "
    "in --staging-dir; that folder is mounted at /usr/local/nvidia (lib64/, lib/, bin/), the "
    "layout every nvidia/cuda and NGC image searches through its LD_LIBRARY_PATH and PATH, "
    "and its lib64/ at /usr/lib/<triplet>/glibc-hwcaps/x86-64-v2 and "
    "/usr/lib64/glibc-hwcaps/x86-64-v2, where glibc 2.33+ looks without a cache entry. In "
    "engines that apply CDI themselves a non-CUDA image with an older glibc (Ubuntu 20.04, "
    "Debian 11, UBI 8) finds no driver library; gpuctk-runtime adds the folder to every "
    "image's ld cache.",
)
@click.option(
    "--staging-dir",
    default="/var/lib/gpuctk/driver",
    show_default=True,
    metavar="DIR",
    help="With --library-mode folder: where the driver is staged, one folder per driver "
    "version and file set (files hard-linked from the driver where the filesystem allows, "
    "else copied; reused while the driver is unchanged). Must be owned by root and writable "
    "by nobody else.",
)
@click.option(
    "--prune-stages",
    is_flag=True,
    help="With --library-mode folder: after writing the spec, remove the older stages in "
    "--staging-dir that no CDI spec in /etc/cdi, /var/run/cdi, the --output folder or a "
    "--keep-spec-dir names (each pins a driver's files on disk). Containers running on one "
    "keep their mount.",
)
@click.option(
    "--keep-spec-dir",
    multiple=True,
    metavar="DIR",
    type=click.Path(file_okay=False, path_type=str),
    help="With --prune-stages: another folder of CDI specs whose stages stay (repeatable): "
    "every folder an engine or gpuctk-runtime (its config's spec-dirs) reads specs from, "
    "beyond /etc/cdi and /var/run/cdi.",
)
@click.option(
    "--loader-folders",
    default="triplet,lib64",
    show_default=True,
    metavar="LIST",
    help="With --library-mode mounts (or folder: its glibc-hwcaps mounts): the loader "
    "folders the libraries are mounted in, "
    "comma-separated. triplet: /usr/lib/<triplet> (Debian, Ubuntu, and the CUDA images "
    "built on them); lib64: /usr/lib64, /usr/lib for 32-bit (Fedora, RHEL, UBI, SUSE). One "
    "family alone halves the library mounts (each one paid at every container start in "
    "podman); an image of the other family then finds no driver library.",
)
@click.option(
    "--driver-capabilities",
    default="all",
    show_default=True,
    metavar="LIST",
    help="Driver capabilities whose files the spec mounts: all, or a comma-separated list of "
    "utility, compute, video, graphics, display, ngx, compat32 (firmware is always mounted). "
    "Engines that apply CDI themselves (podman, containerd 1.7+, CRI-O) mount every file of "
    "the spec into every GPU container and cannot honour NVIDIA_DRIVER_CAPABILITIES; on a "
    "compute-only node, utility,compute cuts the spec from ~45 to ~20 files, and each "
    "container start by every mount left out. gpuctk-runtime still applies each "
    "container's NVIDIA_DRIVER_CAPABILITIES within what the spec has. Without graphics and "
    "display the GPUs' /dev/dri nodes are left out too, as the NVIDIA runtime's legacy mode "
    "does (each device node costs podman time at every start: docs/benchmarks.md).",
)
@cliopts.driver_root(
    "Root of the driver files and the NVML library (e.g. /run/nvidia/driver for a "
    "containerised driver). Host paths in the spec keep this prefix; container paths drop it."
)
@cliopts.dev_root("Root under which /dev/nvidia* nodes are found.")
@click.option(
    "--proc-root", default="/proc", show_default=True, help="Where /proc is (MIG minors)."
)
@cliopts.sys_root("Where /sys is (DRM nodes).")
@cliopts.nvml_library
@cliopts.simulate(
    "Use an embedded machine profile instead of NVML (no GPU needed): "
    "h100-8, h100-8-mig7, a100-mig, l4, or a profile .yaml path."
)
@nic_options
def generate(
    output: str | None,
    fmt: str | None,
    vendor: str,
    device_class: str,
    strategies: tuple[str, ...],
    no_all_device: bool,
    device_ids: tuple[str, ...],
    hook_path: str,
    library_mode: str,
    staging_dir: str,
    prune_stages: bool,
    keep_spec_dir: tuple[str, ...],
    loader_folders: str,
    driver_capabilities: str,
    driver_root: str,
    dev_root: str,
    proc_root: str,
    sys_root: str,
    nvml_library: str | None,
    simulate: str | None,
    mode: str,
    **nic: Any,
) -> None:
    """Write a CDI spec for every GPU and MIG device on this node.

    \b
    Reads the GPUs through NVML and the driver files under --driver-root, and writes one
    device per GPU (per MIG device where MIG is enabled) under each naming strategy, an
    `all` device, and the common edits: control nodes, driver libraries, binaries,
    firmware, IPC sockets, graphics configs and one gpuctk-hook entry (none with
    --library-mode mounts or folder). The cdiVersion is the lowest that the content
    needs, so older engines accept it.

    \b
    Examples:
      gpuctk cdi generate --output /var/run/cdi/nvidia.yaml
      gpuctk cdi generate --driver-root /run/nvidia/driver --format json
      gpuctk cdi generate --simulate a100-mig        # no GPU needed
      gpuctk cdi generate --library-mode mounts -o /var/run/cdi/nvidia.yaml   # no hook
      gpuctk cdi generate --library-mode folder -o /var/run/cdi/nvidia.yaml   # 3 mounts
      gpuctk cdi generate --driver-capabilities utility,compute   # compute-only node
      gpuctk cdi generate --mode management -o /var/run/cdi/management.yaml
    """
    from gpuctk.cdi.generate_cmd import GenerateArgs, run

    run(
        GenerateArgs(
            output, fmt, vendor, device_class, strategies, no_all_device, device_ids,
            hook_path, library_mode, staging_dir, prune_stages, keep_spec_dir,
            loader_folders, driver_capabilities,
            Roots(driver_root, dev_root, proc_root, sys_root), nvml_library, simulate, nic,
            mode,
        )
    )  # fmt: skip
