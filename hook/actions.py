"""One hook invocation, start to end: find the container root, then do the work inside it.

`run_request` is the whole createContainer mode (and each nvidia-ctk-style verb, which is a
subset of it): symlinks, modes, then the loader: `/etc/ld.so.conf.d/00-gpuctk.conf`, an
`/etc/ld.so.conf` when the image lacks one, and the ld cache rebuilt by the host's ldconfig
confined to the root (gpuctk.hook.ldconfig); musl images get `/etc/ld-musl-<arch>.path` instead.
A root mounted read-only (crun mounts it so before the hooks) is made writable for the duration.
"""

from __future__ import annotations

import os
import posixpath

from gpuctk import rootfs
from gpuctk.errors import UsageError
from gpuctk.hook import hooklog, inroot, ldconfig, mounts, oci_state

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~3 ms per start
if TYPE_CHECKING:
    from typing import BinaryIO


class Request:
    """What one hook invocation was asked to do (raw option values, checked by run_request).
    A plain class: dataclasses would import inspect, ~8 ms at every container start."""

    __slots__ = (
        "container_spec",
        "folders",
        "ldconfig",
        "links",
        "mode",
        "paths",
        "run_ldconfig",
        "verb",
    )

    def __init__(
        self,
        verb: str,
        *,
        links: list[str] | None = None,
        folders: list[str] | None = None,
        mode: str | None = None,
        paths: list[str] | None = None,
        ldconfig: str | None = None,
        container_spec: str | None = None,
        run_ldconfig: bool = False,
    ) -> None:
        self.verb = verb
        self.links = list(links or [])
        self.folders = list(folders or [])
        self.mode = mode
        self.paths = list(paths or [])
        self.ldconfig = ldconfig
        self.container_spec = container_spec
        self.run_ldconfig = run_ldconfig


def locate_root(container_spec: str | None, stdin: BinaryIO | None = None) -> str:
    """Host path of the container root: from --container-spec, or the OCI state's bundle."""
    if container_spec:
        spec = os.path.abspath(container_spec)
        config = oci_state.read_config(spec)
        return oci_state.rootfs_path(config, posixpath.dirname(spec), spec)
    state = oci_state.read_state(stdin)
    config = oci_state.read_config(posixpath.join(state.bundle, "config.json"))
    return oci_state.rootfs_path(config, state.bundle)


def update_loader(
    root_fd: int, root_path: str, folders: list[str], ldconfig_path: str | None, always: bool
) -> str:
    """Make the folders part of the loader's search path; returns what was done, in words.
    With none of the folders in the root, the cache is rebuilt only when `always`."""
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
    exe_fd, exe = ldconfig.open_host_ldconfig(ldconfig_path)
    try:
        args = ["-C", "/etc/ld.so.cache", "-f", inroot.LD_SO_CONF, *present]
        output = ldconfig.run_confined(root_fd, root_path, exe_fd, args)
    finally:
        os.close(exe_fd)
    for line in output.splitlines():
        if line.startswith(ldconfig.WARNING):
            hooklog.warning(line.removeprefix(ldconfig.WARNING))
        else:
            hooklog.log("debug", f"{exe}: {line}", to_stderr=False)
    return f"ld cache rebuilt by {exe}"


def run_request(req: Request, stdin: BinaryIO | None = None) -> None:
    """Check the request, then carry it out inside the container root."""
    links = [inroot.parse_link(spec) for spec in req.links]
    folders = [inroot.check_folder(folder) for folder in req.folders]
    mode = inroot.parse_mode(req.mode) if req.mode is not None else None
    if req.paths and mode is None:
        raise UsageError(f"{req.verb}: --path needs --mode")
    root_path = locate_root(req.container_spec, stdin)
    root_fd = rootfs.open_root(root_path)
    try:
        with mounts.writable_root(root_fd, root_path) as remounted:
            if remounted:
                hooklog.log("debug", f"{root_path} made writable for the hook", to_stderr=False)
            changed = inroot.create_symlinks(root_fd, links) if links else 0
            if mode is not None:
                inroot.chmod_paths(root_fd, mode, req.paths)
            done = ""
            if req.run_ldconfig:
                always = req.verb == "update-ldcache"
                done = update_loader(root_fd, root_path, folders, req.ldconfig, always)
        hooklog.info(f"{req.verb} {root_path}: {changed} links; {done or 'no loader update'}")
    finally:
        os.close(root_fd)
