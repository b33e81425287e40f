"""`--library-mode mounts`: driver libraries reachable by SONAME without any hook process.

In `hook` mode (the default) the spec mounts each driver library at its own path and one
gpuctk-hook entry makes the SONAME links and refreshes the image's ld cache. An engine that
applies CDI itself (podman, containerd 1.7+, CRI-O) then starts a Python process per container.

In `mounts` mode the spec bind-mounts every library that has a SONAME at that SONAME in the
folders where the image's own dynamic loader looks when its ld cache has no entry (glibc's
compiled-in system directories, measured with `ld.so --help`):

    Debian/Ubuntu  /lib/<triplet>, /usr/lib/<triplet>, /lib, /usr/lib
    Fedora/RHEL    /lib64, /usr/lib64 (64-bit); /lib, /usr/lib (32-bit)

So a 64-bit library goes to /usr/lib/<triplet>/SONAME and /usr/lib64/SONAME, a 32-bit one to
/usr/lib/<triplet>/SONAME and /usr/lib/SONAME (the 32-bit folder on RHEL; Debian searches it
too). /usr is named rather than /lib: with a merged /usr they are one folder, and without it
the loader searches both. A folder the image lacks is created by the runtime (an empty
/usr/lib64 on a Debian image is harmless). The other names hook mode links (libcuda.so,
libGLX_indirect.so.0, gbm/ and vdpau/ backends: gpuctk.cdi.node.driverpaths) are mounted the same
way: every name by which hook mode makes a library loadable stays loadable, only through the
loader's fallback instead of the ld cache.

`--loader-folders triplet` (or `lib64`) keeps one family's folders only: on a node whose images
are all Debian/Ubuntu-based (the CUDA images are), half the library mounts, each paid at
every container start; an image of the other family then finds no driver library.

These mounts replace the library's own mount (the versioned file at its driver path): nothing
loads a driver library by that name (DT_NEEDED and dlopen name SONAMEs; a library whose SONAME
is its versioned file name gets that name in the loader folders), and each mount costs the
engine time at every container start (docs/benchmarks.md, podman): the 24 versioned mounts
of the Debian 535 driver would be paid at every start. A library without a usable SONAME
keeps its own mount.

Pure: driver files in, Mount records out.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

from gpuctk.cdi.node import capabilities as caps
from gpuctk.cdi.node.driverfiles import DriverFile
from gpuctk.cdi.node.driverpaths import DEV_LINKS, LOADER_LINKS
from gpuctk.cdi.specs.spec import Mount

# ELF machine (gpuctk.cdi.node.elf.ElfInfo.arch) -> Debian multiarch triplet.
TRIPLETS = {
    "x86_64": "x86_64-linux-gnu",
    "aarch64": "aarch64-linux-gnu",
    "ppc64": "powerpc64le-linux-gnu",  # NVIDIA ships little-endian POWER only
    "i386": "i386-linux-gnu",
    "arm": "arm-linux-gnueabihf",
}


# --loader-folders: the loader families a mounts spec serves (the default: both)
FAMILIES = ("triplet", "lib64")


def loader_dirs(
    arch: str | None, elf32: bool, families: tuple[str, ...] = FAMILIES
) -> tuple[str, ...]:
    """The container folders whose SONAME files the `families`' loaders find for a library:
    "triplet" /usr/lib/<triplet> (Debian, Ubuntu), "lib64" /usr/lib64, or /usr/lib for a
    32-bit library (Fedora, RHEL, UBI, SUSE)."""
    triplet = TRIPLETS.get(arch or "")
    own = (f"/usr/lib/{triplet}",) if triplet and "triplet" in families else ()
    return (*own, *(("/usr/lib" if elf32 else "/usr/lib64",) if "lib64" in families else ()))


# glibc 2.33+ searches `<system folder>/glibc-hwcaps/<level>/` before the folder itself when the
# ld cache has no entry, for each level the CPU supports (`ld.so --help` lists them). x86-64-v2
# (SSE4.2, POPCNT: every x86-64 server since ~2009) is the lowest level above the baseline, so
# distributions leave it empty (RHEL 9's baseline is v2 itself).
HWCAPS_LEVELS = {"x86_64": "x86-64-v2"}


def hwcaps_dirs(arch: str | None, families: tuple[str, ...] = FAMILIES) -> tuple[str, ...]:
    """The glibc-hwcaps folders of the 64-bit loader folders of `families` on `arch`, where a
    glibc 2.33+ loader finds a library without an ld cache entry: folder mode's extra mounts of
    the staged lib64/ (gpuctk.cdi.stage). Empty for an architecture without a level here."""
    level = HWCAPS_LEVELS.get(arch or "")
    if level is None:
        return ()
    return tuple(f"{d}/glibc-hwcaps/{level}" for d in loader_dirs(arch, False, families))


def names_of(lib: DriverFile) -> tuple[str, ...]:
    """The names (relative to a loader folder) by which `lib` is found: its SONAME, then the
    extra names hook mode links (development links, GLVND entry point, gbm/vdpau backends);
    a library without SONAME, its development link alone."""
    soname = lib.soname
    if not soname:  # found by its development link alone, if it has one
        return tuple(lib.links)
    if "/" in soname or soname in (".", ".."):
        return ()
    names = [soname]
    names += [link for _target, link in DEV_LINKS.get(soname, ())]
    names += lib.links
    loader = LOADER_LINKS.get(soname)
    if loader:
        names.append(loader)
    return tuple(dict.fromkeys(names))


def library_mounts(
    libraries: Iterable[DriverFile], options: tuple[str, ...], families: tuple[str, ...] = FAMILIES
) -> list[Mount]:
    """The mounts that make `libraries` loadable without a hook, in discovery order.

    One read-only bind mount per (loader folder of `families`, name) of every library with a
    SONAME; the first library to claim a container path keeps it (discovery lists 64-bit
    libraries first, then by path). A library without a usable SONAME, or with no loader
    folder in `families` (an architecture without a triplet, "triplet" alone), is mounted at
    its own path.
    """
    out: dict[str, Mount] = {}
    for lib in libraries:
        names = names_of(lib)
        if not names:
            out.setdefault(lib.container_path, Mount(lib.host_path, lib.container_path, options))
            continue
        folders = loader_dirs(lib.arch, lib.capability == caps.COMPAT32, families)
        if not folders:
            out.setdefault(lib.container_path, Mount(lib.host_path, lib.container_path, options))
        for folder in folders:
            for name in names:
                path = posixpath.join(folder, name)
                out.setdefault(path, Mount(lib.host_path, path, options))
    return list(out.values())
