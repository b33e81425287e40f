"""Machine + driver files -> CDI Spec. Pure: every input is a record, the output is a Spec.

One device per GPU (per MIG device for a GPU with MIG enabled), under each naming strategy,
an `all` device, and the common edits: control nodes, driver file mounts, the env marker and ONE
createContainer hook entry that runs gpuctk-hook for the in-root work. With library_mode
"mounts" there is no hook entry: the libraries are mounted at their SONAMEs in the image
loader's own folders instead (gpuctk.cdi.libmounts); with "folder", neither: the folder where
the CLI staged the libraries and binaries (gpuctk.cdi.stage) is mounted at /usr/local/nvidia,
and its lib64/ in the loader folders' glibc-hwcaps/x86-64-v2 (gpuctk.cdi.libmounts.hwcaps_dirs).
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable

from gpuctk.cdi.libmounts import FAMILIES, hwcaps_dirs, library_mounts
from gpuctk.cdi.node import capabilities as caps
from gpuctk.cdi.node import facts
from gpuctk.cdi.node.devnodes import NodeInfo
from gpuctk.cdi.node.driverfiles import DriverFile, DriverFiles
from gpuctk.cdi.node.machine import Gpu, Machine, MigDevice
from gpuctk.cdi.specs.spec import ContainerEdits, Device, DeviceNode, Hook, Mount, Spec
from gpuctk.cdi.stage import CACHE as STAGE_CACHE
from gpuctk.cdi.stage import FILES as STAGE_FILES
from gpuctk.cdi.stage import MOUNT as STAGE_PATH
from gpuctk.cdi.stage import linked_files
from gpuctk.errors import NoDevicesError, UsageError
from gpuctk.records import record, replace

NAME_STRATEGIES = ("index", "uuid", "type-index")
DEFAULT_STRATEGIES = ("index", "uuid")
# --library-mode; "mounts": gpuctk.cdi.libmounts, "folder": gpuctk.cdi.stage
LIBRARY_MODES = ("hook", "mounts", "folder")
READ_ONLY = ("ro", "nosuid", "nodev", "rbind", "rprivate")
# IPC sockets and the MPS pipe folder: read-only as nvidia-ctk mounts them (connect() needs no
# write access to the mount), so a container cannot replace the host daemon's socket.
SOCKET = ("ro", "nosuid", "nodev", "noexec", "rbind", "rprivate")
HOOK_ENV_PATH = facts.HOOK_ENV_PATH
LIBCUDA_DIR_ENV = facts.LIBCUDA_DIR_ENV
LIBCUDA = "libcuda.so.1"
HOOK_ACTIONS = facts.HOOK_ACTIONS  # --disable-hook names


@record
class Options:
    kind: str = "nvidia.com/gpu"
    name_strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    all_device: bool = True
    device_ids: tuple[str, ...] = ()  # limit generation to these (any strategy's name)
    hook_path: str = facts.PACKAGED_HOOK
    front_path: str = ""  # folder mode's entry: gpuctk-cdi-hook beside hook_path, if installed
    library_mode: str = "hook"  # "hook" | "mounts" (gpuctk.cdi.libmounts) | "folder"
    stage_path: str = ""  # folder mode: the host folder gpuctk.cdi.stage built
    loader_folders: tuple[str, ...] = FAMILIES  # mounts and folder modes (gpuctk.cdi.libmounts)
    additional_gids: bool = False  # --additional-gids: group_gids on each device (CDI 0.7.0)
    disabled_hooks: tuple[str, ...] = ()  # --disable-hook: HOOK_ACTIONS names, or "all"
    ldconfig_path: str = ""  # the host ldconfig the hook runs, not its own cache merge


@record
class NodeLookup:
    """Where device nodes come from: callables so tests and discovery share one shape."""

    control: Callable[[], tuple[NodeInfo, ...]]
    gpu: Callable[[Gpu], tuple[NodeInfo, ...]]
    mig: Callable[[Gpu, MigDevice], tuple[NodeInfo, ...]]


def gpu_names(gpu: Gpu, strategies: Iterable[str]) -> list[str]:
    names = {"index": str(gpu.index), "uuid": gpu.uuid, "type-index": f"gpu{gpu.index}"}
    return [names[s] for s in strategies]


def mig_names(mig: MigDevice, strategies: Iterable[str]) -> list[str]:
    names = {"index": mig.name, "uuid": mig.uuid, "type-index": f"mig{mig.name}"}
    return [names[s] for s in strategies]


def _device_node(n: NodeInfo, owners: bool = False) -> DeviceNode:
    """The spec's node; with `owners` (--additional-gids) a group-only node keeps its host
    owner and group, where runc would give it the container's user."""
    owned = owners and bool(group_gids((n,)))
    return DeviceNode(
        path=n.path,
        host_path=n.host_path if n.host_path != n.path else None,
        type=n.type,
        major=n.major,
        minor=n.minor,
        file_mode=n.file_mode,
        uid=n.uid if owned else None,
        gid=n.gid if owned else None,
    )


def group_gids(nodes: Iterable[NodeInfo]) -> tuple[int, ...]:
    """The groups a non-root process must hold to open `nodes`: those of nodes that their group
    may read and write and others may not (/dev/dri/renderD* under `render`, mode 0660)."""
    return tuple(
        sorted(
            {
                n.gid
                for n in nodes
                if n.gid != 0 and n.file_mode & 0o060 == 0o060 and n.file_mode & 0o006 != 0o006
            }
        )
    )


def _mount(f: DriverFile) -> Mount:
    return Mount(f.host_path, f.container_path, SOCKET if f.kind == "socket" else READ_ONLY)


def device_units(
    machine: Machine, opts: Options, nodes: NodeLookup
) -> list[tuple[list[str], tuple[NodeInfo, ...]]]:
    """(names, nodes) for every exposed unit: whole GPUs, or the MIG devices of MIG GPUs.

    `--device-id` selects units by any of their names; naming a MIG-enabled GPU (index or
    UUID) selects all of its MIG devices.
    """
    candidates: list[tuple[list[str], set[str], Gpu, MigDevice | None]] = []
    for gpu in machine.gpus:
        if gpu.mig_enabled:
            for mig in gpu.mig_devices:
                names = mig_names(mig, opts.name_strategies)
                keys = set(mig_names(mig, NAME_STRATEGIES)) | {str(gpu.index), gpu.uuid}
                candidates.append((names, keys, gpu, mig))
        else:
            names = gpu_names(gpu, opts.name_strategies)
            candidates.append((names, set(gpu_names(gpu, NAME_STRATEGIES)), gpu, None))
    wanted = set(opts.device_ids)
    unknown = sorted(wanted - set().union(*(keys for _, keys, _, _ in candidates)))
    if unknown:
        raise UsageError(
            f"--device-id names no device on this machine: {', '.join(unknown)} "
            "(use an index such as 0, a MIG index such as 0:1, or a GPU-/MIG- UUID)"
        )
    return [
        (names, nodes.gpu(gpu) if mig is None else nodes.mig(gpu, mig))
        for names, keys, gpu, mig in candidates
        if not wanted or keys & wanted
    ]


def common_edits(
    machine: Machine, files: DriverFiles, opts: Options, nodes: NodeLookup
) -> ContainerEdits:
    mounts: dict[str, Mount] = {}
    hooks: tuple[Hook, ...] = ()
    others: tuple[tuple[DriverFile, ...], ...] = (
        files.binaries,
        files.firmware,
        files.configs,
        files.sockets,
    )
    if opts.library_mode == "mounts":  # SONAME mounts instead of the hook (gpuctk.cdi.libmounts)
        lib_mounts = library_mounts(files.libraries, READ_ONLY, opts.loader_folders)
        mounts = {m.container_path: m for m in lib_mounts}
    elif opts.library_mode == "folder":  # one staged folder for libraries and binaries
        mounts = {STAGE_PATH: Mount(opts.stage_path, STAGE_PATH, READ_ONLY)}
        arch = next((f.arch for f in files.libraries if f.capability != caps.COMPAT32), None)
        for folder in hwcaps_dirs(arch, opts.loader_folders) if arch else ():
            mounts[folder] = Mount(f"{opts.stage_path}/lib64", folder, READ_ONLY)
        others = others[1:]
        hooks = () if "all" in opts.disabled_hooks else (_stage_hook(machine, files, opts),)
        if hooks and facts.LINKS_ACTION not in opts.disabled_hooks:  # the rest: _stage_hook's links
            linked = {f.container_path for f in linked_files(files)}
            others = tuple(tuple(f for f in g if f.container_path not in linked) for g in others)
    else:
        hooks = () if "all" in opts.disabled_hooks else (_hook(machine, files, opts),)
        others = (files.libraries, *others)
    for group in others:
        for f in group:
            mounts.setdefault(f.container_path, _mount(f))
    control = nodes.control()
    cuda = libcuda_dir(files, opts, mounts)
    return ContainerEdits(
        env=(*([f"{LIBCUDA_DIR_ENV}={cuda}"] if cuda else []), "NVIDIA_VISIBLE_DEVICES=void"),
        device_nodes=tuple(_device_node(n, opts.additional_gids) for n in control),
        mounts=tuple(sorted(mounts.values(), key=lambda m: m.container_path)),
        hooks=hooks,
        additional_gids=group_gids(control) if opts.additional_gids else (),
    )


def libcuda_dir(files: DriverFiles, opts: Options, mounts: dict[str, Mount]) -> str:
    """The folder the container finds the driver's 64-bit libcuda.so.1 in (nvidia-ctk's
    NVIDIA_CTK_LIBCUDA_DIR, which scripts put first on LD_LIBRARY_PATH to prefer the host's
    driver over an image's CUDA compat libcuda): the stage's lib64 in folder mode, the folder
    of its first SONAME mount in mounts mode, the library's own folder with the hook (which
    makes the SONAME link beside it); "" where the spec gives no libcuda."""
    cuda = [f for f in files.libraries if f.capability != caps.COMPAT32 and f.soname == LIBCUDA]
    if not cuda:
        return ""
    if opts.library_mode == "folder":
        return f"{STAGE_PATH}/lib64"
    if opts.library_mode == "mounts":  # a SONAME mount of that very file (not a 32-bit one)
        host = cuda[0].host_path
        named = (p for p, m in mounts.items() if posixpath.basename(p) == LIBCUDA and
                 m.host_path == host)  # fmt: skip
        return posixpath.dirname(next(named, cuda[0].container_path))
    return posixpath.dirname(cuda[0].container_path)


def _hook(machine: Machine, files: DriverFiles, opts: Options) -> Hook:
    """The createContainer entry: SONAME links, ld cache folders, and the machine facts; each
    disabled action named (`--disable-hook NAME`: the hook and gpuctk-runtime leave it out),
    with the --link or --folder args of a disabled create-symlinks or update-ldcache left out."""
    args = [facts.HOOK_NAME, facts.HOOK_VERB]
    off = opts.disabled_hooks
    for target, link in files.symlinks if facts.LINKS_ACTION not in off else ():
        args += [facts.LINK_OPT, facts.link_value(target, link)]
    for folder in files.ld_folders if facts.LDCACHE_ACTION not in off else ():
        args += [facts.FOLDER_OPT, folder]
    args += _ldconfig_args(opts)
    for name in (n for n in HOOK_ACTIONS if n in off):
        args += [facts.DISABLE_OPT, name]
    facts_env = facts.encode(
        facts.Facts(
            driver_version=machine.driver_version,
            cuda_version=machine.cuda_driver_version,
            gpus=tuple(
                facts.GpuFacts(
                    g.index,
                    g.uuid,
                    g.compute_capability_str,
                    g.architecture,
                    tuple(m.uuid for m in g.mig_devices),
                )
                for g in machine.gpus
            ),
        )
    )
    return Hook(facts.HOOK_VERB, opts.hook_path, tuple(args), (HOOK_ENV_PATH, *facts_env))


def _ldconfig_args(opts: Options) -> list[str]:
    """`--ldconfig-path P`: gpuctk-hook runs that host ldconfig (nvidia-ctk's flag)."""
    if not opts.ldconfig_path or facts.LDCACHE_ACTION in opts.disabled_hooks:
        return []
    return ["--ldconfig-path", opts.ldconfig_path]


def _stage_hook(machine: Machine, files: DriverFiles, opts: Options) -> Hook:
    """Folder mode's createContainer entry: a link to each firmware and config file in the
    stage's files/ folder (gpuctk.cdi.stage; a config file's only for a container whose
    NVIDIA_DRIVER_CAPABILITIES asks for its capability), a link to each staged binary at its
    usual path (/usr/bin/nvidia-smi -> /usr/local/nvidia/bin/nvidia-smi: found by name on any
    image's PATH; for the binary's capability), the stage's library folders and its own ld
    cache (merged into the image's: `ldconfig -p` lists the driver, as Triton needs), and the
    device node guard. gpuctk-cdi-hook does all of it in C for the common image and hands the
    others to gpuctk-hook (hook/cdihook.c). Named gpuctk-hook itself where no front was
    built."""
    folders = ["lib64", *(["lib"] if any(f.capability == caps.COMPAT32 for f in
               files.libraries) else [])]  # fmt: skip
    args = [facts.HOOK_NAME, facts.HOOK_VERB]
    linked = linked_files(files) if facts.LINKS_ACTION not in opts.disabled_hooks else ()
    for f in sorted(linked, key=lambda f: f.container_path):  # a config: its capability's
        path = posixpath.normpath(f.container_path)
        target = f"{STAGE_PATH}/{STAGE_FILES}{path}"
        args += (
            [facts.LINK_OPT, facts.link_value(target, path)]
            if f.kind == "firmware"
            else [facts.LINK_FOR_OPT, facts.link_value(target, path, f.capability)]
        )
    for f in files.binaries if facts.LINKS_ACTION not in opts.disabled_hooks else ():
        path = posixpath.normpath(f.container_path)
        if not path.startswith(f"{STAGE_PATH}/"):
            target = f"{STAGE_PATH}/bin/{posixpath.basename(path)}"
            args += [facts.LINK_FOR_OPT, facts.link_value(target, path, f.capability)]
    if facts.LDCACHE_ACTION not in opts.disabled_hooks:
        for sub in folders:
            args += [facts.FOLDER_OPT, f"{STAGE_PATH}/{sub}"]
        args += [facts.LD_CACHE_OPT, f"{opts.stage_path}/{STAGE_CACHE}", *_ldconfig_args(opts)]
    for name in (n for n in HOOK_ACTIONS if n in opts.disabled_hooks):
        args += [facts.DISABLE_OPT, name]
    hook = _hook(machine, files, opts)
    if opts.front_path:
        args[0] = posixpath.basename(opts.front_path)
    return Hook(facts.HOOK_VERB, opts.front_path or opts.hook_path, tuple(args), hook.env)


def without_drm(nodes: NodeLookup) -> NodeLookup:
    """`nodes` less the GPUs' /dev/dri card and render nodes (a spec without the graphics and
    display capabilities: nothing else opens them)."""

    def cut(found: tuple[NodeInfo, ...]) -> tuple[NodeInfo, ...]:
        return tuple(n for n in found if not n.path.startswith(caps.DRM_NODES))

    return NodeLookup(
        control=nodes.control,
        gpu=lambda gpu: cut(nodes.gpu(gpu)),
        mig=lambda gpu, mig: cut(nodes.mig(gpu, mig)),
    )


def check_options(opts: Options) -> None:
    """UsageError for options that do not go together (before any work is done)."""
    if opts.library_mode not in LIBRARY_MODES:
        raise UsageError(f"unknown library mode {opts.library_mode!r} (hook, mounts or folder)")
    bad = [f for f in opts.loader_folders if f not in FAMILIES]
    if bad or not opts.loader_folders:
        raise UsageError(
            f"--loader-folders: {', '.join(bad) or 'nothing'} given; expected triplet, lib64 "
            "or both (triplet: /usr/lib/<triplet> for Debian/Ubuntu images; lib64: /usr/lib64 "
            "for Fedora/RHEL/UBI/SUSE images)"
        )
    unknown = [n for n in opts.disabled_hooks if n not in (*HOOK_ACTIONS, "all")]
    if unknown:
        raise UsageError(
            f"--disable-hook: unknown name {unknown[0]!r} (known: {', '.join(HOOK_ACTIONS)}, all)"
        )
    if opts.library_mode == "mounts" and set(opts.disabled_hooks) - {"all"}:
        raise UsageError(
            "--disable-hook NAME goes with --library-mode hook or folder (mounts mode writes no "
            "hook; gpuctk-runtime's config key disable-device-node-modification turns its "
            "guard off)"
        )
    if opts.library_mode == "mounts" and opts.ldconfig_path:
        raise UsageError("--ldconfig-path goes with --library-mode hook or folder (mounts "
                         "mode runs no hook, so no ldconfig)")  # fmt: skip
    if opts.library_mode == "hook" and set(opts.loader_folders) != set(FAMILIES):
        raise UsageError(
            "--loader-folders applies to --library-mode mounts and folder only (hook mode adds "
            "the driver folders to each image's ld cache instead)"
        )


def build_spec(machine: Machine, files: DriverFiles, opts: Options, nodes: NodeLookup) -> Spec:
    """The whole spec, with cdiVersion set to the minimum its content needs."""
    from gpuctk.cdi.specs.version import minimum_version

    check_options(opts)
    if (opts.library_mode == "folder") != bool(opts.stage_path):
        raise UsageError("a stage folder goes with --library-mode folder, and only with it")
    units = device_units(machine, opts, nodes)
    if not units:
        raise NoDevicesError(
            "no NVIDIA GPU found: NVML reports "
            f"{len(machine.gpus)} GPU(s) and none is exposable "
            "(a MIG-enabled GPU without MIG devices exposes nothing); no spec written"
        )
    devices: list[Device] = []
    all_nodes: dict[str, NodeInfo] = {}

    def gids(found: Iterable[NodeInfo]) -> tuple[int, ...]:
        return group_gids(found) if opts.additional_gids else ()

    for names, unit_nodes in units:
        edits = ContainerEdits(
            device_nodes=tuple(_device_node(n, opts.additional_gids) for n in unit_nodes),
            additional_gids=gids(unit_nodes),
        )
        devices.extend(Device(name, edits) for name in names)
        for n in unit_nodes:
            all_nodes.setdefault(n.path, n)
    if opts.all_device:
        every = [all_nodes[p] for p in sorted(all_nodes, key=_node_key)]
        all_edits = ContainerEdits(
            device_nodes=tuple(_device_node(n, opts.additional_gids) for n in every),
            additional_gids=gids(every),
        )
        devices.append(Device("all", all_edits))
    common = common_edits(machine, files, opts, nodes)
    spec = Spec(kind=opts.kind, devices=tuple(devices), edits=common)
    return replace(spec, version=minimum_version(spec.to_dict()))


def _node_key(path: str) -> tuple[str, int, str]:
    """Sort /dev/nvidia2 before /dev/nvidia10."""
    head = path.rstrip("0123456789")
    tail = path[len(head) :]
    return (head, int(tail) if tail else -1, path)
