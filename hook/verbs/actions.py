"""One hook invocation, start to end: find the container root, then do the work inside it.

`run_request` is the whole createContainer mode (and each nvidia-ctk-style verb, which is a
subset of it): symlinks, modes, then the loader: `/etc/ld.so.conf.d/00-gpuctk.conf`, an
`/etc/ld.so.conf` when the image lacks one, and the ld cache. createContainer merges the cache
in-process as gpuctk-runtime does (gpuctk.hook.verbs.ldmerge: the image's cache plus the mounted
driver libraries, an image's newer CUDA compat folder first: gpuctk.hook.verbs.cudacompat); where it
cannot (no cache in the image, a library whose SONAME link is missing), for `update-ldcache`,
and when an ldconfig is named (--ldconfig-path, GPUCTK_LDCONFIG), the host's ldconfig rebuilds
it, confined to the root (gpuctk.hook.verbs.ldconfig: slower, and more so with every library the
image holds), with that compat folder first on its command line. musl images get
`/etc/ld-musl-<arch>.path` instead. A root mounted read-only (crun mounts it so before the
hooks) is made writable for the duration.
"""

from __future__ import annotations

import os
import posixpath

from gpuctk import rootfs
from gpuctk.cdi.node import facts
from gpuctk.cdi.node.facts import HOOK_ACTIONS
from gpuctk.errors import UsageError
from gpuctk.hook import oci_state
from gpuctk.hook.verbs import cudacompat, inroot, ldmerge, mounts, nodeprotect
from gpuctk.log import hook as hooklog

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: typing's import is costly at every start
if TYPE_CHECKING:
    from typing import Any, BinaryIO


KNOWN_ACTIONS = frozenset(HOOK_ACTIONS)  # --disable-hook names; the verbs that protect:
PROTECTING_VERBS = frozenset(("createContainer", nodeprotect.NAME))


class Request:
    """What one hook invocation was asked to do (raw option values, checked by run_request).
    A plain class: dataclasses would import inspect at every container start."""

    __slots__ = (
        "container_spec",
        "disabled",
        "folders",
        "ld_cache",
        "ldconfig",
        "links",
        "links_for",
        "mode",
        "parts",
        "paths",
        "run_ldconfig",
        "verb",
    )

    def __init__(
        self,
        verb: str,
        *,
        links: list[str] | None = None,
        links_for: list[str] | None = None,
        folders: list[str] | None = None,
        mode: str | None = None,
        paths: list[str] | None = None,
        ldconfig: str | None = None,
        container_spec: str | None = None,
        run_ldconfig: bool = False,
        disabled: list[str] | None = None,
        ld_cache: str | None = None,
        parts: dict[tuple[str, str], tuple[str, str, str]] | None = None,
    ) -> None:
        self.verb = verb
        self.links = list(links or [])
        self.links_for = list(links_for or [])
        self.folders = list(folders or [])
        self.mode = mode
        self.paths = list(paths or [])
        self.ldconfig = ldconfig
        self.container_spec = container_spec
        self.run_ldconfig = run_ldconfig
        self.disabled = frozenset(disabled or ())
        self.ld_cache = ld_cache  # a folder spec's stage cache (--ld-cache), a host file
        # (NAME, VALUE) -> (CAPABILITY, TARGET, LINK) of each link value that splits, as
        # gpuctk-cdi-hook reads it (gpuctk.hook.verbs.hook_main.parse)
        self.parts = dict(parts or {})


def locate(container_spec: str | None, stdin: BinaryIO | None = None) -> tuple[dict[str, Any], str]:
    """(config.json, host path of the container root): from --container-spec, or the OCI
    state's bundle."""
    if container_spec:
        spec = os.path.abspath(container_spec)
        config = oci_state.read_config(spec)
        return config, oci_state.rootfs_path(config, posixpath.dirname(spec), spec)
    state = oci_state.read_state(stdin)
    config = oci_state.read_config(posixpath.join(state.bundle, "config.json"))
    return config, oci_state.rootfs_path(config, state.bundle)


def bind_files(config: dict[str, Any]) -> dict[str, str]:
    """{container path: host path} of config.json's bind mounts (the last one on a path wins,
    as it is the one on top)."""
    out: dict[str, str] = {}
    for m in config.get("mounts") or []:
        if not isinstance(m, dict):
            continue
        dest, src, opts = m.get("destination"), m.get("source"), m.get("options") or []
        bind = m.get("type") == "bind" or (
            isinstance(opts, list) and ("bind" in opts or "rbind" in opts)
        )
        if (
            bind
            and isinstance(dest, str)
            and isinstance(src, str)
            and dest.startswith("/")
            and src.startswith("/")
        ):
            out[posixpath.normpath(dest)] = src
    return out


def merge_cache(
    root_fd: int,
    present: list[str],
    binds: dict[str, str],
    links: dict[str, str],
    compat: cudacompat.Compat | None = None,
) -> str | None:
    """Write the root's ld cache as gpuctk-runtime does (gpuctk.hook.verbs.ldmerge: the image's
    cache plus the driver libraries mounted in `present`, under their SONAMEs, from the host
    files' ELF headers), without running ldconfig. None, with nothing written, when only
    ldconfig would do: the image has no cache this reader knows, or a mounted library's
    SONAME is nowhere in the folder (ldconfig would make that link), a folder lies in a
    mounted folder (whose files ldconfig would find), or no mounted library is in `present`
    (the folders hold only files of the root: ldconfig indexes what is there). `compat`'s
    entries go before the driver's (gpuctk.hook.verbs.cudacompat)."""
    wanted = set(present)
    for folder in present:
        for up in _self_and_parents(folder):
            if up in binds:
                hooklog.log("debug", f"{folder} is in the mounted {up}: ldconfig", to_stderr=False)
                return None
    files = [(dest, host) for dest, host in binds.items() if posixpath.dirname(dest) in wanted]
    for link in links:
        end = ldmerge.chain_end(links, link)
        if posixpath.dirname(link) in wanted and end in binds and link not in binds:
            files.append((link, binds[end]))
    try:
        old = ldmerge.read_image_cache(root_fd)
    except ValueError as exc:
        hooklog.warning(f"{exc}: not merged; the host's ldconfig rebuilds the ld cache")
        return None
    if old is None:
        hooklog.log("debug", f"no {ldmerge.LD_CACHE} in the image: ldconfig", to_stderr=False)
        return None
    known: dict[str, Any] = {}
    entries = ldmerge.library_entries(files, present, known)
    if not entries:
        hooklog.log("debug", "no mounted driver library in the folders: ldconfig", to_stderr=False)
        return None
    for dest, host in files:
        facts = known.get(host)
        soname = facts[2] if facts is not None and facts[1] is not None else None
        if soname and soname != posixpath.basename(dest):
            path = posixpath.join(posixpath.dirname(dest), soname)
            if rootfs.stat_in_root(root_fd, path, follow=False) is None:
                hooklog.log(
                    "debug", f"{path} (the SONAME of {dest}) is missing: ldconfig", to_stderr=False
                )
                return None
    try:
        ldmerge.write_cache(root_fd, old, cudacompat.ahead(compat, entries))
    except ValueError as exc:
        hooklog.warning(f"{ldmerge.LD_CACHE} not merged ({exc}): the host's ldconfig rebuilds it")
        return None
    done = f"ld cache: the image's entries and {len(entries)} driver libraries"
    if compat is not None:
        done += f", {compat.folder} first"
    return done + " (no ldconfig)"


def merge_stage_cache(root_fd: int, part: str, compat: cudacompat.Compat | None) -> str | None:
    """Write the root's ld cache as gpuctk-cdi-hook does for a folder spec (hook/ldcache.c):
    the image's cache plus the entries of the stage's own cache `part` (--ld-cache, made with
    the stage from the host files' ELF headers), `compat`'s entries first. None, with nothing
    written, when the image has no cache this reader knows or `part` cannot be used: ldconfig
    then rebuilds it."""
    try:
        old = ldmerge.read_image_cache(root_fd)
        if old is None:
            hooklog.log("debug", f"no {ldmerge.LD_CACHE} in the image: ldconfig", to_stderr=False)
            return None
        ldmerge.write_cache(root_fd, old, cudacompat.ahead(compat, []), part)
    except (OSError, ValueError) as exc:
        hooklog.warning(f"the stage's cache not merged ({exc}): the host's ldconfig rebuilds it")
        return None
    done = "ld cache: the image's and the stage's libraries"
    return done + (f", {compat.folder} first" if compat is not None else "") + " (no ldconfig)"


def find_compat(
    root_fd: int, binds: dict[str, str], disabled: frozenset[str] = frozenset()
) -> cudacompat.Compat | None:
    """The image's CUDA compat folder when it is to come first: the driver's version from the
    mounted libcuda.so.<version>, else from the hook's GPUCTK_DRIVER_VERSION. None when the
    hook's args say `--disable-hook enable-cuda-compat`."""
    if "enable-cuda-compat" in disabled:
        return None
    host = cudacompat.host_version([*binds, *binds.values()])
    if host is None:
        host = cudacompat.parse_version(os.environ.get("GPUCTK_DRIVER_VERSION", ""))
    return cudacompat.find(root_fd, host)


def _self_and_parents(folder: str) -> list[str]:
    """`folder` and each folder above it, up to (not including) "/"."""
    out = []
    while folder not in ("/", ""):
        out.append(folder)
        folder = posixpath.dirname(folder)
    return out


def update_loader(
    root_fd: int,
    root_path: str,
    folders: list[str],
    ldconfig_path: str | None,
    always: bool,
    merge: tuple[dict[str, str], dict[str, str]] | None = None,
    disabled: frozenset[str] = frozenset(),
    stage_cache: str | None = None,
) -> str:
    """Make the folders part of the loader's search path; returns what was done, in words.
    With none of the folders in the root, the cache is rebuilt only when `always`. With
    `merge` (config.json's bind mounts, the links), and no ldconfig asked for by name, the
    cache is merged in-process (merge_cache; with a folder spec's `stage_cache`, its entries:
    merge_stage_cache) where it can be; else the host's ldconfig runs."""
    present = inroot.existing_folders(root_fd, folders)
    if not present and not always:
        return "none of the folders is in the container: loader left alone"
    arches = inroot.musl_arches(root_fd)
    for arch in arches:
        if present and inroot.update_musl_path(root_fd, arch, present):
            hooklog.log("debug", f"listed {present} in /etc/ld-musl-{arch}.path", to_stderr=False)
    if not inroot.has_glibc(root_fd):
        return "musl loader path" if arches else "no libc loader found: nothing to configure"
    if present:
        inroot.write_ld_conf(root_fd, present)
    compat = find_compat(root_fd, merge[0] if merge is not None else {}, disabled)
    cudacompat.write_conf(root_fd, compat)
    if stage_cache is not None and ldconfig_path is None and not always and present:
        done = merge_stage_cache(root_fd, stage_cache, compat)
        if done is not None:
            return done
    if merge is not None and ldconfig_path is None and not always and present:
        done = merge_cache(root_fd, present, *merge, compat=compat)
        if done is not None:
            return done
    from gpuctk.hook.verbs import ldconfig, ldrebuild

    exe_fd, exe = ldconfig.open_host_ldconfig(ldconfig_path)
    try:
        first = [compat.folder] if compat is not None else []  # ldconfig: the first folder wins
        args = ["-f", inroot.LD_SO_CONF, *first, *present]
        if "create-symlinks" in disabled:
            args.insert(0, "-X")  # ldconfig makes no SONAME links either
        output = ldrebuild.rebuild_cache(root_fd, root_path, exe_fd, args)
    finally:
        os.close(exe_fd)
    for line in output.splitlines():
        if line.startswith(ldconfig.WARNING):
            hooklog.warning(line.removeprefix(ldconfig.WARNING))
        else:
            hooklog.log("debug", f"{exe}: {line}", to_stderr=False)
    return f"ld cache rebuilt by {exe}"


def run_request(req: Request, stdin: BinaryIO | None = None) -> None:
    """Check the request, then carry it out inside the container root. An action named by
    `--disable-hook` (gpuctk.cdi.generate.HOOK_ACTIONS) is left out; createContainer ends
    with disable-device-node-modification (gpuctk.hook.verbs.nodeprotect) unless that is
    disabled."""
    off = req.disabled
    for name in sorted(off - KNOWN_ACTIONS):
        hooklog.warning(f"{req.verb}: --disable-hook {name!r} ignored (written by a newer gpuctk?)")
    link, link_for = facts.LINK_OPT[2:], facts.LINK_FOR_OPT[2:]
    links = [] if facts.LINKS_ACTION in off else [
        inroot.parse_link(s, req.parts.get((link, s))) for s in req.links
    ]  # fmt: skip
    links_for = [] if facts.LINKS_ACTION in off else [
        inroot.parse_link_for(s, req.parts.get((link_for, s))) for s in req.links_for
    ]  # fmt: skip
    folders = [inroot.check_folder(folder) for folder in req.folders]
    mode = inroot.parse_mode(req.mode) if req.mode is not None else None
    if req.paths and mode is None:
        raise UsageError(f"{req.verb}: --path needs --mode")
    config, root_path = locate(req.container_spec, stdin)
    if links_for:  # those whose capability the container asks for (NVIDIA_DRIVER_CAPABILITIES)
        asked = inroot.container_capabilities(config)
        links += [(target, link) for cap, target, link in links_for if cap in asked]
    root_fd = rootfs.open_root(root_path)
    try:
        with mounts.writable_root(root_fd, root_path) as remounted:
            if remounted:
                hooklog.log("debug", f"{root_path} made writable for the hook", to_stderr=False)
            changed = inroot.create_symlinks(root_fd, links) if links else 0
            if mode is not None:
                inroot.chmod_paths(root_fd, mode, req.paths)
            done = ""
            if req.run_ldconfig and "update-ldcache" not in off:
                always = req.verb == "update-ldcache"
                merge = (bind_files(config), {link: target for target, link in links})
                done = update_loader(root_fd, root_path, folders, req.ldconfig, always, merge, off,
                                     req.ld_cache)  # fmt: skip
        guard = ""
        if req.verb in PROTECTING_VERBS and nodeprotect.NAME not in off:
            guard = "; " + nodeprotect.protect(root_fd)
        what = f"{changed} links; {done or 'no loader update'}{guard}"
        hooklog.info(f"{req.verb} {root_path}: {what}")
    finally:
        os.close(root_fd)
