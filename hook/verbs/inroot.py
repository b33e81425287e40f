"""What gpuctk-hook does inside a container root: library symlinks, loader configuration, modes.

Every path is a container path resolved inside the root through gpuctk.rootfs; nothing here
joins the rootfs path with a container path.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat

from gpuctk import rootfs
from gpuctk.cdi.node import facts
from gpuctk.errors import UsageError
from gpuctk.log import hook as hooklog

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

LD_CONF_DIR = "/etc/ld.so.conf.d"
LD_CONF_FILE = LD_CONF_DIR + "/00-gpuctk.conf"  # "00-": driver folders come first
LD_SO_CONF = "/etc/ld.so.conf"
LD_SO_CONF_TEXT = b"include /etc/ld.so.conf.d/*.conf\n"
MUSL_DEFAULT_PATH = ("/lib", "/usr/local/lib", "/usr/lib")  # musl's search path with no file
_WORD = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_LOADER_TAIL = _WORD | {".", "-"}
_LIB_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/lib32")


def parse_link(
    spec: str, parts: tuple[str, str, str] | None, opt: str = facts.LINK_OPT
) -> tuple[str, str]:
    """A `TARGET::LINK` value `spec`, as gpuctk-cdi-hook split it (`parts`: CAPABILITY, TARGET,
    LINK; None where it does not split: gpuctk.hook.compiled.read_args) -> (target, link);
    LINK must be an absolute container path."""
    _cap, target, link = parts or ("", "", "")
    if not target or not link:
        raise UsageError(f"{opt} {spec!r}: expected TARGET::LINK")
    for text in (target, link):
        if "\0" in text or "\n" in text:
            raise UsageError(f"{opt} {spec!r}: NUL or newline in a path")
    if not link.startswith("/"):
        raise UsageError(f"{opt} {spec!r}: LINK must be an absolute container path")
    return target, posixpath.normpath(link)


def parse_link_for(spec: str, parts: tuple[str, str, str] | None) -> tuple[str, str, str]:
    """A `CAPABILITY:TARGET::LINK` value `spec`, as gpuctk-cdi-hook split it (parse_link) ->
    (capability, target, link). An unknown capability (a spec of a newer gpuctk) is warned
    about: no container asks for it, so the link is never made."""
    from gpuctk.cdi.node import capabilities as caps

    if not parts:
        raise UsageError(f"{facts.LINK_FOR_OPT} {spec!r}: expected CAPABILITY:TARGET::LINK")
    cap = parts[0]
    if cap not in caps.ALL:
        hooklog.warning(f"--link-for {spec!r}: unknown capability {cap!r} (link left out)")
    return (cap, *parse_link(spec, parts, facts.LINK_FOR_OPT))


def container_capabilities(config: object) -> frozenset[str]:
    """What the container's NVIDIA_DRIVER_CAPABILITIES asks for, as gpuctk-cdi-hook reads it
    (gpuctk.hook.compiled.capabilities)."""
    from gpuctk.hook import compiled

    return compiled.capabilities(config)[0]


def check_folder(folder: str) -> str:
    """An absolute container folder that ld.so.conf and musl's path file can carry."""
    if not folder.startswith("/") or any(c in folder for c in "\0\n\r\t ,:"):
        raise UsageError(
            f"--folder {folder!r}: expected an absolute path without spaces, ':' or ','"
        )
    return posixpath.normpath(folder)


def create_symlinks(
    root_fd: int, links: list[tuple[str, str]], present: Callable[[str], bool] | None = None
) -> int:
    """Create each LINK -> TARGET whose target exists inside the root (or, before the runtime
    has mounted it there, for which `present(target)` says it will); returns how many changed.
    An existing symlink is replaced; an existing file or folder is never touched; a link in a
    folder on another mount (a bind mount or volume) or a read-only one is skipped, with a
    warning: the driver's own folder mounted whole already has its links."""
    from gpuctk.hook import compiled

    asked = []
    for target, link in links:
        resolved = (
            target if target.startswith("/") else posixpath.join(posixpath.dirname(link), target)
        )
        if present is not None and not present(resolved):
            continue
        if present is None and rootfs.stat_in_root(root_fd, resolved) is None:
            hooklog.log(
                "debug", f"skip {link} -> {target}: target not in the container", to_stderr=False
            )
            continue
        asked.append((target, link))
    changed = 0
    for (target, link), done in zip(asked, compiled.links_in_root(root_fd, asked), strict=True):
        if isinstance(done, rootfs.InRootError):
            if done.errno not in (errno.EXDEV, errno.EROFS):
                raise done
            hooklog.warning(f"left {link} alone: {done.message}")
        elif done == "made":
            changed += 1
            hooklog.log("debug", f"linked {link} -> {target}", to_stderr=False)
        elif done == "left":
            hooklog.warning(f"left {link} alone: it exists and is not a symlink")
    return changed


def musl_arch(name: str) -> str | None:
    """ "x86_64" for "ld-musl-x86_64.so.1" (the arch in ASCII letters, digits, "_"), else None.
    (String tests, not `re`: this module is on the container-create path.)"""
    if name.startswith("ld-musl-") and name.endswith(".so.1"):
        arch = name[len("ld-musl-") : -len(".so.1")]
        if arch and all(c in _WORD for c in arch):
            return arch
    return None


def is_glibc_loader(name: str) -> bool:
    """Whether `name` is a glibc dynamic loader's: ld-linux*.so.N, ld64.so.N or ld.so.N."""
    stem, sep, version = name.rpartition(".so.")
    if not sep or not (version.isascii() and version.isdigit()):
        return False
    if stem in ("ld64", "ld"):
        return True
    return stem.startswith("ld-linux") and all(c in _LOADER_TAIL for c in stem[8:])


def musl_arches(root_fd: int) -> list[str]:
    """Architectures of the musl loaders in /lib (ld-musl-<arch>.so.1)."""
    names = rootfs.listdir_in_root(root_fd, "/lib")
    return sorted({arch for arch in map(musl_arch, names) if arch})


# musl's arch names for the loaders a machine of each kind can run (`uname -m` -> names)
_RUNNABLE_MUSL = {"x86_64": ("x86_64", "i386"), "aarch64": ("aarch64", "armhf", "arm")}


def has_runnable_musl(root_fd: int) -> bool:
    """Whether /lib holds a musl loader this machine can run (ld-musl-<arch>.so.1 for its own
    arch or its 32-bit one): a few stats, where musl_arches lists the whole folder (a merged-/usr
    image's /usr/lib is large). A loader for another machine cannot start here."""
    machine = os.uname().machine
    arches = _RUNNABLE_MUSL.get(machine, (machine,))
    return any(rootfs.stat_in_root(root_fd, f"/lib/ld-musl-{a}.so.1") for a in arches)


def has_glibc(root_fd: int) -> bool:
    """Whether the image looks glibc-based: an ld cache, ld.so.conf or a glibc loader."""
    if any(rootfs.stat_in_root(root_fd, p) for p in ("/etc/ld.so.cache", LD_SO_CONF)):
        return True
    return any(
        is_glibc_loader(name) for d in _LIB_DIRS for name in rootfs.listdir_in_root(root_fd, d)
    )


def existing_folders(root_fd: int, folders: list[str]) -> list[str]:
    """The folders that are directories inside the root, in order, without duplicates."""
    out: list[str] = []
    for folder in folders:
        st = rootfs.stat_in_root(root_fd, folder)
        if st is not None and stat.S_ISDIR(st.st_mode) and folder not in out:
            out.append(folder)
        elif st is None:
            hooklog.log("debug", f"skip folder {folder}: not in the container", to_stderr=False)
    return out


def write_ld_conf(root_fd: int, folders: list[str]) -> None:
    """List the folders in /etc/ld.so.conf.d/00-gpuctk.conf; create /etc/ld.so.conf with its
    include line when the image has none (its own is never edited: the hook also names the
    folders on ldconfig's command line, so an ld.so.conf without the include still works)."""
    text = "# written by gpuctk-hook: NVIDIA driver library folders\n" + "".join(
        f"{folder}\n" for folder in folders
    )
    rootfs.write_file_in_root(root_fd, LD_CONF_FILE, text.encode(), 0o644, parents=True)
    if rootfs.stat_in_root(root_fd, LD_SO_CONF, follow=False) is None:
        rootfs.write_file_in_root(root_fd, LD_SO_CONF, LD_SO_CONF_TEXT, 0o644)
        hooklog.log("debug", f"created {LD_SO_CONF}", to_stderr=False)


def update_musl_path(root_fd: int, arch: str, folders: list[str]) -> bool:
    """Put the folders first in /etc/ld-musl-<arch>.path (musl has no ld cache). A new file
    starts from musl's built-in path, which the file replaces. True when written. An image's
    file that leads to another mount (its /proc, a volume) is not read: replaced like none."""
    path = f"/etc/ld-musl-{arch}.path"
    try:
        data = rootfs.read_file_in_root(root_fd, path, 1 << 16)
    except rootfs.InRootError as exc:
        if exc.errno != errno.EXDEV:
            raise
        hooklog.warning(f"{path} in the image leads to another mount: not read, replaced")
        data = None
    if data is None:
        current = list(MUSL_DEFAULT_PATH)
    else:
        text = data.decode("utf-8", "replace").replace(":", "\n")
        current = [p for p in text.split("\n") if p.strip()]
    missing = [f for f in folders if f not in current]
    if not missing:
        return False
    text = "".join(f"{p}\n" for p in missing + current)
    rootfs.write_file_in_root(root_fd, path, text.encode(), 0o644, parents=True)
    return True


def parse_mode(text: str) -> int:
    """An octal mode such as 755 or 0o755 (permission bits and sticky/setgid only)."""
    try:
        mode = int(text.removeprefix("0o"), 8)
    except ValueError:
        raise UsageError(f"--mode {text!r}: expected an octal mode such as 755") from None
    if mode & ~0o3777 or mode & 0o4000:
        raise UsageError(f"--mode {text!r}: only permission, setgid and sticky bits are allowed")
    return mode


def chmod_paths(root_fd: int, mode: int, paths: list[str]) -> None:
    """chmod each container path (never through a symlink at the end); a missing one is
    skipped, as nvidia-ctk does."""
    for path in paths:
        if rootfs.stat_in_root(root_fd, path, follow=False) is None:
            hooklog.log("debug", f"skip chmod {path}: not in the container", to_stderr=False)
            continue
        rootfs.chmod_in_root(root_fd, path, mode)
