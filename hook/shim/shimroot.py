"""The shim does the hook's in-root work itself, so that no hook process runs at container start.

A `--library-mode mounts` spec carries ONE `gpuctk-hook createContainer --link TARGET::LINK...
--folder DIR...` entry: make the SONAME links, list the driver folders for the loader, refresh
the ld cache. A hook process costs a Python start plus an ldconfig run (docs/benchmarks.md).
The engine mounts the container root before `create`, so the shim does the same before runc:

- each LINK whose TARGET is a driver file the spec mounts becomes one more bind mount of that
  host file at LINK (what a loader sees through a symlink, without writing into the image);
- `/etc/ld.so.conf.d/00-gpuctk.conf` lists the folders (an image's later ldconfig keeps them);
- `/etc/ld.so.cache` is the image's own entries plus the driver's libraries under the names
  ldconfig caches (gpuctk.hook.verbs.ldmerge, from the host files' ELF headers), in ldconfig's
  order and format, so `ldconfig -p` and the loader find libcuda.so.1 without any ldconfig;
  an image's CUDA compat folder newer than the driver comes first (gpuctk.hook.verbs.cudacompat).

The default folder spec mounts the driver staged on the host at /usr/local/nvidia
(gpuctk.cdi.stage) with one entry (`gpuctk-cdi-hook createContainer --folder
/usr/local/nvidia/lib64 ... --ld-cache FILE`, or gpuctk-hook where no compiled hook was built;
none with --disable-hook all). That entry stays: runc runs it, and it serves the image (the
stage's own ld cache merged into the image's, the links to the stage's binaries, firmware and
config files, the device node guard) as it does on the compiled create and in every engine that
applies the spec itself, so that one program serves each image whichever path created it.

Writes go through gpuctk.rootfs (resolved inside the root, never following the image's
symlinks out of it). Anything this cannot do exactly as the hook would (an option other than
--link/--folder, a link target that is an image file, a musl image, an image without an ld
cache, a read-only or foreign-mount root) leaves the edits untouched: the hook then runs as
before. Set `GPUCTK_SHIM_INROOT=0` in the shim's environment to always use the hook.

The hook's last action, keeping the container from making device nodes, needs the container's
mount namespace: gpuctk.hook.verbs.nodeguard decides how it is done once the edits are known. The
hook's `--disable-hook NAME` args are honoured here as by the hook.
"""

from __future__ import annotations

import os
import posixpath

from gpuctk import rootfs
from gpuctk.cdi.node import facts
from gpuctk.errors import GpuctkError, UsageError
from gpuctk.hook.shim.rootcache import Fallback, merge_cache, open_glibc_root
from gpuctk.hook.verbs import cudacompat, inroot, ldmerge, nodeguard

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: typing's import is costly at every start
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpuctk.cdi.specs.shape import EditsDoc, MountDoc


def _our_hook(hook: Any) -> bool:
    args = hook.get("args") if isinstance(hook, dict) else None
    return (
        isinstance(args, list)
        and len(args) >= 2
        and hook.get("hookName") == facts.HOOK_VERB
        and isinstance(hook.get("path"), str)
        and posixpath.basename(hook["path"]) == facts.HOOK_NAME
        and args[1] == facts.HOOK_VERB
        and all(isinstance(a, str) for a in args)
        and not _stage_hook(hook)
    )


def _stage_hook(hook: Any) -> bool:
    """A folder spec's entry (gpuctk.cdi.generate._stage_hook): gpuctk-cdi-hook or gpuctk-hook
    `createContainer` with only the stage's --folder, --ld-cache, --link and --link-for args,
    --disable-hook names and an --ldconfig-path."""
    args = hook.get("args") if isinstance(hook, dict) else None
    if not (
        isinstance(args, list)
        and len(args) >= 2
        and all(isinstance(a, str) for a in args)
        and hook.get("hookName") == facts.HOOK_VERB
        and isinstance(hook.get("path"), str)
        and posixpath.basename(hook["path"]) in facts.HOOK_PROGRAMS
        and args[1] == facts.HOOK_VERB
    ):
        return False
    from gpuctk.hook import compiled

    try:
        read = compiled.read_args(facts.HOOK_VERB, args[2:])
    except UsageError:  # the hook refuses them too
        return False
    return all(_stage_arg(kind, f"--{name}", value, target, link)
               for kind, _start, _stop, name, value, _cap, target, link in read)  # fmt: skip


def _stage_arg(kind: str, opt: str, value: str, target: str, link: str) -> bool:
    """One argument of a folder spec's entry (as gpuctk.hook.compiled.read_args reads it): a
    stage folder, the stage's cache, an action's name, an --ldconfig-path, or a link of a
    staged file at its own container path or of a staged binary at its usual path
    (/usr/local/nvidia/bin/NAME at /usr/bin/NAME)."""
    if kind == "l":
        plain = link[:1] == "/" != link[1:2] and posixpath.normpath(link) == link
        staged = target in (STAGE_FILES + link, f"{STAGE_PATH}/bin/{posixpath.basename(link)}")
        return plain and staged  # no NUL: the C was given it as an argument
    return (
        (opt == facts.FOLDER_OPT and value in STAGE_LIBS)
        or (opt == facts.LD_CACHE_OPT and value[:1] == "/" and value.endswith(STAGE_CACHE))
        or (opt == facts.DISABLE_OPT and value in facts.HOOK_ACTIONS)
        or (opt == "--ldconfig-path" and bool(value))  # nvidia-ctk's option (gpuctk.cdi.nvctk)
    )


def gpuctk_hooks(edits: EditsDoc) -> list[Any]:
    """The spec's gpuctk hook entries in `edits`: a gpuctk-hook entry the shim may serve, or a
    folder spec's entry, which runc runs and which guards the device nodes itself."""
    return [h for h in edits.get("hooks") or [] if _our_hook(h) or _stage_hook(h)]


def take_over(
    config: dict[str, Any],
    bundle: str,
    edits: EditsDoc,
    debug: Callable[[str], None],
    prep: dict[str, Any],
    *,
    bundle_fd: int | None = None,
    protect: str = "hook",
    warn: Callable[[str], None] | None = None,
) -> EditsDoc:
    """`edits` with the gpuctk hook replaced by mounts, after doing its in-root work in the
    container root; `edits` unchanged when the hook must run (see the module docstring).
    `prep` is prepare(edits), made now or remembered with the plan (gpuctk.hook.shim.plans).
    `bundle_fd`: the bundle as the shim opened it; a relative root.path is found from it,
    never from the `bundle` path again (its owner may have pointed it elsewhere since).
    `protect`, `warn`: the device node guard's mode and what says it cannot be done
    (gpuctk.hook.verbs.nodeguard.guard)."""
    hooks = edits.get("hooks") or []
    ours = [h for h in hooks if _our_hook(h)]
    if len(ours) != 1 or os.environ.get("GPUCTK_SHIM_INROOT", "1") == "0":
        return nodeguard.guard(edits, gpuctk_hooks(edits), protect, debug, warn=warn)
    try:
        if prep.get("fallback") is not None:
            raise Fallback(prep["fallback"])
        mounts = _work(config, bundle, edits, prep, bundle_fd)
    except (Fallback, rootfs.InRootError, OSError, ValueError) as exc:
        debug(f"in-root work left to gpuctk-hook: {exc}")
        return nodeguard.guard(edits, ours, protect, debug, warn=warn)
    done = edits.copy()
    done["mounts"] = [*(edits.get("mounts") or []), *mounts]
    done["hooks"] = [h for h in hooks if h is not ours[0]]
    return nodeguard.guard(done, ours, protect, debug, taken=True, warn=warn)


def prepare(edits: EditsDoc) -> dict[str, Any]:
    """What the in-root work needs from `edits` alone, for any container: the hook's links
    (link -> target) and folders, and the ELF facts (file identity, cache flags, SONAME) of
    every mounted file a cache entry may name. {"fallback": why} when the hook must run; {}
    when there is no hook of ours. Plain data (gpuctk.hook.shim.plans keeps it)."""
    ours = [h for h in edits.get("hooks") or [] if _our_hook(h)]
    if len(ours) != 1:
        return {}
    from gpuctk.hook.verbs import hook_main as words

    try:
        values, parts, ignored = words.parse(facts.HOOK_VERB, ours[0]["args"][2:])
    except Exception as exc:
        return {"fallback": f"hook arguments: {exc}"}
    if ignored or any(
        values[k] for k in values if k not in (words.LINK, words.FOLDER, words.DISABLE)
    ):
        return {"fallback": "the hook has options beyond --link, --folder and --disable-hook"}
    off = values[words.DISABLE]
    unknown = [name for name in off if name not in facts.HOOK_ACTIONS]
    if unknown:
        return {"fallback": f"--disable-hook {unknown[0]!r} is not known here"}
    try:
        links_ = [] if facts.LINKS_ACTION in off else values[words.LINK]
        links = dict(reversed([
            inroot.parse_link(s, parts.get((words.LINK, s)))[::-1] for s in links_
        ]))  # fmt: skip
        folders = [inroot.check_folder(f) for f in values[words.FOLDER]]
        if facts.LDCACHE_ACTION in off:
            folders = []
    except (rootfs.InRootError, ValueError, GpuctkError) as exc:  # a value the hook refuses
        return {"fallback": str(exc)}
    by_dest = _by_dest(edits)
    wanted = set(folders)
    hosts = {
        m["hostPath"]
        for dest, m in by_dest.items()
        if posixpath.dirname(dest) in wanted and isinstance(m.get("hostPath"), str)
    }
    for link in links:  # a link mount takes its target's host file
        target = ldmerge.chain_end(links, link)
        if posixpath.dirname(link) in wanted and target in by_dest:
            host = by_dest[target].get("hostPath")
            if isinstance(host, str):
                hosts.add(host)
    elf = {h: ldmerge.elf_facts(h) for h in sorted(hosts)}
    compat = "enable-cuda-compat" not in off
    return {"links": links, "folders": folders, "elf": elf, "compat": compat}


STAGE_PATH = "/usr/local/nvidia"  # gpuctk.cdi.generate.STAGE_PATH
STAGE_FILES = STAGE_PATH + "/files"  # gpuctk.cdi.stage.FILES
STAGE_CACHE = "/ld.so.cache"  # the stage's own cache (gpuctk.cdi.stage.CACHE), on the host
STAGE_FOLDERS = ("lib64", "lib")
STAGE_LIBS = tuple(f"{STAGE_PATH}/{sub}" for sub in STAGE_FOLDERS)


def _by_dest(edits: EditsDoc) -> dict[str, MountDoc]:
    return {
        posixpath.normpath(m["containerPath"]): m
        for m in edits.get("mounts") or []
        if isinstance(m, dict) and isinstance(m.get("containerPath"), str)
    }


def _work(
    config: dict[str, Any], bundle: str, edits: EditsDoc, prep: dict[str, Any],
    bundle_fd: int | None = None,
) -> list[MountDoc]:  # fmt: skip
    links, folders = prep["links"], prep["folders"]
    by_dest = _by_dest(edits)
    root_fd = open_glibc_root(config, bundle, bundle_fd)
    try:
        new_mounts = _link_mounts(root_fd, links, by_dest)
        if folders:
            files = [
                (m["containerPath"], m["hostPath"])
                for m in [*by_dest.values(), *new_mounts]
                if isinstance(m.get("hostPath"), str)
            ]
            entries = ldmerge.library_entries(files, folders, dict(prep.get("elf") or {}))
            version = cudacompat.host_version(p for f in files for p in f)
            merge_cache(root_fd, entries, folders, version, prep.get("compat", True))
    finally:
        os.close(root_fd)
    return new_mounts


def _link_mounts(
    root_fd: int, links: dict[str, str], by_dest: dict[str, MountDoc]
) -> list[MountDoc]:
    """One bind mount per link whose target (through other links) is a mounted driver file."""
    out: list[MountDoc] = []
    for link, target in links.items():
        path = ldmerge.chain_end(links, link)
        mount = by_dest.get(path)
        if mount is None:
            if rootfs.stat_in_root(root_fd, path) is not None:
                raise Fallback(f"link {link} -> {target} targets a file of the image")
            continue  # as the hook: a target not in the container (a capability left out)
        if link in by_dest:
            continue
        out.append({**mount, "containerPath": link})
    return out
