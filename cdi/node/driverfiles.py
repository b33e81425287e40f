"""Driver files under a driver root: libraries, binaries, firmware, configs, IPC sockets.

Paths have two forms. A container path is where a file sits in the driver's own filesystem and
where it is mounted in the container ("/usr/lib/x86_64-linux-gnu/libcuda.so.535.309.01"); the
host path is the same file seen from the node, the driver root prefixed
("/run/nvidia/driver/usr/lib/..."). Every symlink is followed INSIDE the driver root
(gpuctk.cdi.node.driverroot): an absolute target is taken relative to the root and ".." stops
at it, as if chrooted (a containerised driver's /usr/lib/libcuda.so.1 -> /etc/alternatives/...
must not escape to the node's /etc). Host paths always name the final real file, so a bind
mount never follows a symlink on the node.

Every host path recorded, and every symlink followed on the way to one, must be one that root
alone can have made (gpuctk.cdi.specs.hostpaths.source_problem, the gpuctk.fs trusted-path rules): a
symlink is followed only out of a folder nobody else can write, and a file, folder or socket
whose owner is another account, that others can write, or that sits below a folder others can
write or rename, is left out with one warning naming it and the fix. runc follows links in a
mount source: a user's /tmp/nvidia-mps swapped for a link to / would otherwise give every GPU
container the host's / read-write.

Cost: one stat per candidate folder, one scandir per library folder, a few preads per library
(ELF headers only, memoised), one trusted walk per folder holding a recorded file. No tree
walks.

Device nodes live in gpuctk.cdi.node.devnodes and are re-exported here.
"""

from __future__ import annotations

import os
import posixpath
import stat

from gpuctk import log
from gpuctk.cdi.node import capabilities as caps
from gpuctk.cdi.node.devnodes import NodeInfo, control_nodes, gpu_nodes, mig_nodes, parse_mig_minors
from gpuctk.cdi.node.driverpaths import (
    BINARIES,
    BINARY_DIRS,
    CONFIGS,
    DEV_LINKS,
    EXTRA_SONAMES,
    FIRMWARE_DIRS,
    FIRMWARE_PATH,
    LIBRARY_DIRS,
    LOADER_LINKS,
    PATH_DIRS,
    PREFIXES,
    SOCKETS,
    config_container_path,
    is_driver_library_name,
)
from gpuctk.cdi.node.driverroot import DriverRoot
from gpuctk.cdi.node.elf import elf_info
from gpuctk.cdi.node.ldcache import cached_name, read_ld_cache
from gpuctk.errors import InputError
from gpuctk.records import record

__all__ = [
    "DriverFile",
    "DriverFiles",
    "NodeInfo",
    "control_nodes",
    "discover_driver_files",
    "gpu_nodes",
    "mig_nodes",
    "parse_mig_minors",
]


MPS_PIPE_DIR = "/tmp/nvidia-mps"  # nvidia-cuda-mps-control's default CUDA_MPS_PIPE_DIRECTORY
MPS_FIX = (
    "; fix: remove it, and start nvidia-cuda-mps-control as root, which makes it root's "
    "(better: with CUDA_MPS_PIPE_DIRECTORY in a folder only root can write)"
)


@record
class DriverFile:
    """One file (or IPC path) to mount into containers."""

    host_path: str  # absolute, driver root prefix included, the real file (no symlink)
    container_path: str  # where it is mounted in the container
    kind: str  # "library" | "binary" | "firmware" | "config" | "socket"
    capability: str  # gpuctk.cdi.node.capabilities: utility, compute, graphics, ...
    soname: str | None = None  # DT_SONAME, libraries only
    arch: str | None = (
        None  # ELF machine ("x86_64", "i386", ...: gpuctk.cdi.node.elf), libraries only
    )
    # a library's development link (libX.so), by name: where the driver root holds it beside
    # the library, or always for a library without SONAME; the container gets it too, as
    # from the reference toolkit (_dev_links)
    links: tuple[str, ...] = ()


@record
class DriverFiles:
    """Everything discovered under a driver root, in a stable order."""

    libraries: tuple[DriverFile, ...] = ()
    binaries: tuple[DriverFile, ...] = ()
    firmware: tuple[DriverFile, ...] = ()
    configs: tuple[DriverFile, ...] = ()
    sockets: tuple[DriverFile, ...] = ()
    symlinks: tuple[tuple[str, str], ...] = ()  # (target, link), container terms
    ld_folders: tuple[str, ...] = ()  # container folders holding libraries


def _check_root(root: str) -> str:
    absolute = os.path.abspath(root)
    try:
        st = os.stat(absolute)
    except OSError as exc:
        raise InputError(f"driver root {root}: {exc.strerror or exc}") from exc
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(f"driver root {root} is not a directory")
    try:
        with os.scandir(absolute) as it:
            next(it, None)
    except OSError as exc:
        raise InputError(f"driver root {root} cannot be read: {exc.strerror or exc}") from exc
    return absolute


def _check_version(version: str) -> None:
    if not version or "/" in version or "\0" in version or len(version) > 64:
        raise InputError(f"unusable driver version {version!r}")


def _libraries(r: DriverRoot, version: str) -> dict[str, DriverFile]:
    """Driver libraries by real container path: ld.so.cache first, then the library folders."""
    candidates: list[str] = []
    cache = r.resolve("/etc/ld.so.cache")
    if cache is not None:
        try:
            entries = read_ld_cache(r.host(cache))
        except (OSError, ValueError) as exc:
            log.warning(f"ignoring the driver root's ld.so.cache: {exc}")
            entries = ()
        candidates += [e.value for e in entries if is_driver_library_name(e.key)]
    suffix = f".so.{version}"
    seen_dirs: set[str] = set()
    for folder in LIBRARY_DIRS:
        real_dir = r.resolve(folder)
        if real_dir is None or real_dir in seen_dirs:
            continue
        seen_dirs.add(real_dir)
        try:
            with os.scandir(r.host(real_dir)) as it:
                names = [e.name for e in it if e.name.endswith(suffix) or e.name in EXTRA_SONAMES]
        except OSError:
            continue
        candidates += [f"{real_dir.rstrip('/')}/{n}" for n in sorted(names)]
    found: dict[str, DriverFile] = {}
    for path in candidates:
        hit = r.stat(path)
        if hit is None or hit[0] in found or not stat.S_ISREG(hit[1].st_mode):
            continue
        real = hit[0]
        name = posixpath.basename(real)
        if not name.endswith(suffix) and posixpath.basename(path) not in EXTRA_SONAMES:
            continue
        if not r.trusted(real):
            continue
        info = elf_info(r.host(real))
        if info is None:
            continue
        capability = caps.capability_of(name, elf32=info.elf_class == 32)
        found[real] = DriverFile(
            r.host(real), real, "library", capability, info.soname, info.arch,
            _dev_links(r, real, info.soname),
        )  # fmt: skip
    return found


def dev_link_name(name: str, soname: str | None) -> str | None:
    """The development link's name of the library file `name` with SONAME `soname`:
    libX.so for libX.so.<version> with SONAME libX.so.N, or with none (ldcache.cached_name);
    None for a library of another stem."""
    link = name.partition(".so.")[0] + ".so"
    return link if link != name and cached_name(link, soname, name) else None


def _dev_links(r: DriverRoot, real: str, soname: str | None) -> tuple[str, ...]:
    """The development link of the library `real` (dev_link_name), by name: where its folder
    holds one that leads to it, or always for a library without SONAME, which is loaded by
    that name alone (the driver dlopens libnvidia-vulkan-producer.so for Vulkan on Wayland,
    and NVIDIA's spec links it); () where there is none. What ldconfig caches and the linker
    finds, and a loader's dlopen("libX.so") too: NVML's Rust binding opens libnvidia-ml.so."""
    folder, name = posixpath.split(real)
    link = dev_link_name(name, soname)
    if link is None:
        return ()
    hit = r.stat(f"{folder}/{link}") if soname else None
    return (link,) if not soname or (hit is not None and hit[0] == real) else ()


def _links(libraries: list[DriverFile]) -> list[tuple[str, str]]:
    links: dict[str, str] = {}  # link -> target
    for lib in libraries:
        folder, name = posixpath.split(lib.container_path)
        if lib.soname and lib.soname != name and "/" not in lib.soname:
            links.setdefault(f"{folder}/{lib.soname}", name)
            for target, link in DEV_LINKS.get(lib.soname, ()):
                links.setdefault(f"{folder}/{link}", target.format(soname=lib.soname, name=name))
            for link in lib.links:
                links.setdefault(f"{folder}/{link}", lib.soname)
        elif not lib.soname:  # a library found by its development link alone
            for link in lib.links:
                links.setdefault(f"{folder}/{link}", name)
        loader = LOADER_LINKS.get(lib.soname or "")
        if loader:
            libdir = folder.removesuffix("/nvidia/current").removesuffix("/vdpau")
            link = f"{libdir}/{loader}"
            if link != lib.container_path:
                target = posixpath.relpath(f"{folder}/{lib.soname}", posixpath.dirname(link))
                links.setdefault(link, target)
    return [(target, link) for link, target in links.items()]


def _first_found(r: DriverRoot, paths: tuple[str, ...], want: int) -> tuple[str, str] | None:
    """(container path as listed, real path) of the first of `paths` of file type `want` that
    may be recorded (DriverRoot.trusted)."""
    for path in paths:
        hit = r.stat(path)
        if hit is not None and stat.S_IFMT(hit[1].st_mode) == want and r.trusted(hit[0]):
            return path, hit[0]
    return None


def _beside(folders: tuple[str, ...] | dict[str, None]) -> tuple[str, ...]:
    """The driver prefixes the library folders name: /opt/drv for /opt/drv/lib64 (a driver
    somewhere else that the root's ld cache names), whose bin/ and firmware/ are searched after
    the usual places."""
    return tuple(dict.fromkeys(
        posixpath.dirname(d) for d in folders
        if posixpath.basename(d) in ("lib64", "lib")
        and posixpath.dirname(d) not in ("", "/", "/usr", "/usr/local")
    ))  # fmt: skip


def _binaries(r: DriverRoot, prefixes: tuple[str, ...] = ()) -> list[DriverFile]:
    """Each driver program: the first ELF file of its name in BINARY_DIRS, then in the bin/ of
    `prefixes` (_beside: the libraries' own prefix). A file that is not
    ELF (a wrapper script at /usr/bin/nvidia-smi that execs the prefix's binary: in a container
    that path is not there) gives way to a later folder's ELF, mounted at the wrapper's path;
    with no ELF anywhere the program is left out, with one warning."""
    out = []
    for name in BINARIES:
        wrappers: list[str] = []  # container paths of the non-ELF files of this name
        found: tuple[str, str] | None = None  # (listed, real)
        for folder in dict.fromkeys((*BINARY_DIRS, *(f"{p}/bin" for p in prefixes))):
            listed = f"{folder}/{name}"
            hit = r.stat(listed)
            if hit is None or not stat.S_ISREG(hit[1].st_mode) or not r.trusted(hit[0]):
                continue
            if elf_info(r.host(hit[0])) is None:
                wrappers.append(listed)
                continue
            found = listed, hit[0]
            break
        if found is None:
            if wrappers:
                r.left_out.setdefault(
                    r.host(wrappers[0]),
                    f"not an ELF program (a wrapper script?), and no ELF {name} is in the "
                    f"usual folders nor in a driver prefix's bin/ ({', '.join(PREFIXES)}); "
                    "fix: pass the root that holds the driver's programs as --driver-root",
                )
            continue
        listed, real = found
        container = listed if posixpath.dirname(listed) in PATH_DIRS else f"/usr/bin/{name}"
        if wrappers:
            container = wrappers[0] if posixpath.dirname(wrappers[0]) in PATH_DIRS else container
            log.debug(f"{name}: took the driver's ELF {r.host(real)} for {container}, not the "
                      f"wrapper {r.host(wrappers[0])}")  # fmt: skip
        out.append(DriverFile(r.host(real), container, "binary", caps.capability_of(name)))
    return out


def _firmware(r: DriverRoot, version: str, prefixes: tuple[str, ...] = ()) -> list[DriverFile]:
    """The GSP firmware (gsp*.bin) of `version`: /lib/firmware/nvidia/<version>, and a
    prefix's firmware/nvidia/<version> (FIRMWARE_DIRS, then `prefixes`) mounted there. The
    first file of a container path wins."""
    out: dict[str, DriverFile] = {}  # container path -> file
    seen: set[str] = set()  # real paths
    beside = tuple((f"{p}/firmware/nvidia/{{version}}", FIRMWARE_PATH) for p in prefixes)
    for template, target in dict.fromkeys((*FIRMWARE_DIRS, *beside)):
        folder, into = template.format(version=version), target.format(version=version)
        real_dir = r.resolve(folder)
        if real_dir is None:
            continue
        try:
            with os.scandir(r.host(real_dir)) as it:
                names = sorted(e.name for e in it if e.name.startswith("gsp") and
                               e.name.endswith(".bin"))  # fmt: skip
        except OSError:
            continue
        for name in names:
            hit = r.stat(f"{real_dir}/{name}")
            container = f"{into}/{name}"
            if hit is None or not stat.S_ISREG(hit[1].st_mode) or hit[0] in seen:
                continue
            if container in out:
                continue
            if r.trusted(hit[0]):
                seen.add(hit[0])
                out[container] = DriverFile(r.host(hit[0]), container, "firmware", caps.UTILITY)
    return list(out.values())


def _listed(r: DriverRoot, table: tuple[tuple[tuple[str, ...], str, int], ...], kind: str,
            version: str) -> list[DriverFile]:  # fmt: skip
    out: dict[str, DriverFile] = {}
    for paths, capability, want in table:
        hit = _first_found(r, tuple(p.format(version=version) for p in paths), want)
        if hit is not None and hit[1] not in out:
            at = config_container_path(hit[0]) if kind == "config" else hit[0]
            out[hit[1]] = DriverFile(r.host(hit[1]), at, kind, capability)
    return list(out.values())


def select_capabilities(files: DriverFiles, selected: frozenset[str]) -> DriverFiles:
    """`files` cut down to the driver capabilities in `selected` (gpuctk.cdi.node.capabilities):
    libraries, binaries, configs and sockets of other capabilities go, with the SONAME links
    and ld folders that only they needed. Firmware always stays: the kernel driver may load
    it from the container's root on a GPU's first open, whatever the container asked for."""
    if selected >= frozenset(caps.ALL):
        return files
    libraries = [f for f in files.libraries if f.capability in selected]
    return DriverFiles(
        libraries=tuple(libraries),
        binaries=tuple(f for f in files.binaries if f.capability in selected),
        firmware=files.firmware,
        configs=tuple(f for f in files.configs if f.capability in selected),
        sockets=tuple(f for f in files.sockets if f.capability in selected),
        symlinks=tuple(_links(libraries)),
        ld_folders=tuple(dict.fromkeys(posixpath.dirname(f.container_path) for f in libraries)),
    )


def discover_driver_files(driver_root: str, driver_version: str) -> DriverFiles:
    """Every driver file of version `driver_version` under `driver_root`.

    Missing items are simply absent. InputError if the root is missing, not a directory or
    unreadable, or if the version is unusable.
    """
    root = _check_root(os.fspath(driver_root))
    _check_version(driver_version)
    r = DriverRoot(root)
    try:
        libraries = sorted(
            _libraries(r, driver_version).values(),
            key=lambda f: (f.capability == caps.COMPAT32, f.container_path),
        )
        folders = dict.fromkeys(posixpath.dirname(f.container_path) for f in libraries)
        files = DriverFiles(
            libraries=tuple(libraries),
            binaries=tuple(_binaries(r, _beside(folders))),
            firmware=tuple(_firmware(r, driver_version, _beside(folders))),
            configs=tuple(_listed(r, CONFIGS, "config", driver_version)),
            sockets=tuple(_listed(r, SOCKETS, "socket", driver_version)),
            symlinks=tuple(_links(libraries)),
            ld_folders=tuple(folders),
        )
    finally:
        r.close()
    _warn_left_out(r.left_out, r.host(MPS_PIPE_DIR))
    return files


def _warn_left_out(left_out: dict[str, str], mps: str) -> None:
    """One warning line per reason: the paths left out for it, and the fix."""
    by_reason: dict[str, list[str]] = {}
    for host, why in left_out.items():
        if host == mps:
            why = why.partition("; fix: ")[0] + MPS_FIX
        by_reason.setdefault(why, []).append(host)
    for why, hosts in by_reason.items():
        shown = ", ".join(hosts[:3]) + (f" and {len(hosts) - 3} more" if len(hosts) > 3 else "")
        log.warning(f"left out {shown}: {why}")
