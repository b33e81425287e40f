"""The container root as gpuctk-runtime's shim opens it for its in-root work, and the ld cache
it writes there (gpuctk.hook.shim.shimroot: for a mounts spec's hook entry and for the folder
spec's stage). Writes go through gpuctk.rootfs, resolved inside the root."""

from __future__ import annotations

import os
import posixpath

from gpuctk import rootfs
from gpuctk.hook.verbs import cudacompat, inroot, ldmerge

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: typing's import is costly at every start
if TYPE_CHECKING:
    from typing import Any

    from gpuctk.cdi.node.ldcache import LdCacheEntry


class Fallback(Exception):
    """This container needs the hook after all (the message says why, for the debug log)."""


def open_glibc_root(config: dict[str, Any], bundle: str, bundle_fd: int | None = None) -> int:
    """The container root, opened (the caller closes it); Fallback for a musl image. A
    relative root.path is opened from `bundle_fd` when given."""
    root_fd = open_root(config, bundle, bundle_fd)
    try:
        if inroot.has_runnable_musl(root_fd):
            raise Fallback("a musl loader in the image")
    except BaseException:
        os.close(root_fd)
        raise
    return root_fd


def open_root(config: dict[str, Any], bundle: str, bundle_fd: int | None = None) -> int:
    from gpuctk.hook import oci_state

    path = oci_state.rootfs_path(config, bundle)
    rel = config["root"]["path"]  # checked by rootfs_path
    if bundle_fd is None or rel.startswith("/"):
        root_fd = rootfs.open_root(path)
    else:
        flags = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
        try:
            root_fd = os.open(posixpath.normpath(rel), flags, dir_fd=bundle_fd)
        except OSError as exc:
            err = exc.errno or 5
            raise rootfs.InRootError(
                f"cannot open container root {path}: {os.strerror(err)}", err
            ) from exc
    return root_fd


def merge_cache(
    root_fd: int, entries: list[LdCacheEntry], folders: list[str],
    version: tuple[int, ...] | None, with_compat: bool = True,
) -> None:  # fmt: skip
    """List `folders` in ld.so.conf.d and write the image's ld cache plus `entries` (the
    driver's libraries), with an image's CUDA compat folder newer than the driver's `version`
    first (gpuctk.hook.verbs.cudacompat). Fallback when the image has no cache; ValueError
    when it is too large (ldmerge.MAX_CACHE) or malformed."""
    cache = ldmerge.read_image_cache(root_fd)
    if cache is None:
        raise Fallback(f"the image has no {ldmerge.LD_CACHE}")
    compat = None
    if with_compat:  # not with --disable-hook enable-cuda-compat
        compat = cudacompat.find(root_fd, version)
    inroot.write_ld_conf(root_fd, folders)
    cudacompat.write_conf(root_fd, compat)
    ldmerge.write_cache(root_fd, cache, cudacompat.ahead(compat, entries))
