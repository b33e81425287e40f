"""The bundle's OCI config, read and written back through one descriptor of the bundle.

The bundle's owner may move or relink its folders while the shim works: the bundle is opened
once, config.json is read from and replaced in that same folder (never by path again), a
symlink is followed only to a name in the folder, duplicate and case-folded keys are refused
(runc would read another request), and the owner is set on the temp file before the rename.
"""

from __future__ import annotations

import os

from gpuctk.errors import InputError, ValidationError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

MAX_CONFIG = 32 * 1024 * 1024
MAX_CONFIG_LINKS = 40


def open_bundle(bundle: str, config_name: str) -> tuple[int, int, str]:
    """(bundle fd, fd of the folder that holds the config, the config's name in it): the
    bundle opened once (O_PATH), so that config.json is read from and written back to the
    same folder and root.path is found from it, whatever its path names meanwhile; crun's
    --config name may be absolute or have folders (resolved from the bundle fd, as crun does
    from the bundle). The caller closes both (once if they are the same). InputError."""
    flags = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
    try:
        bundle_fd = os.open(bundle, flags)
    except OSError as exc:
        raise InputError(f"cannot open the bundle {bundle}: {exc.strerror or exc}") from None
    folder, _, name = config_name.rpartition("/")
    if not name or name in (".", ".."):
        os.close(bundle_fd)
        raise InputError(f"the config name {config_name!r} does not name a file")
    if not folder and not config_name.startswith("/"):
        return bundle_fd, bundle_fd, name
    try:
        dir_fd = os.open(folder or "/", flags, dir_fd=bundle_fd)
    except OSError as exc:
        os.close(bundle_fd)
        where = os.path.join(bundle, folder or "/")
        raise InputError(f"cannot open {where}: {exc.strerror or exc}") from None
    return bundle_fd, dir_fd, name


def _open_config(dir_fd: int, name: str, where: str) -> tuple[int, str | None]:
    """The config file `name` in `dir_fd`, opened non-blocking, and the name in that same
    folder to write it back to: a symlink to a plain name is followed within the folder (never
    out of it); one that leads anywhere else is opened as runc would (following it) for
    reading only (None: not to be edited)."""
    import errno  # builtin; gpuctk.fs has it loaded on this path anyway

    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
    for _ in range(MAX_CONFIG_LINKS):
        try:
            return os.open(name, flags | os.O_NOFOLLOW, dir_fd=dir_fd), name
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
        target = os.readlink(name, dir_fd=dir_fd)
        if "/" in target or target in ("", ".", ".."):
            return os.open(name, flags, dir_fd=dir_fd), None
        name = target
    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), where)


def read_config(
    dir_fd: int, name: str, where: str
) -> tuple[dict[str, Any], os.stat_result, str | None, bytes]:
    """The OCI config `name` in the folder `dir_fd` (`where`: its path, for messages) as a
    dict, its stat, the name in that folder to write it back to (_open_config; None when it
    is a symlink out of the folder), and the text it was read from.
    InputError/ValidationError."""
    from gpuctk.fs import read_limited

    try:
        fd, write_name = _open_config(dir_fd, name, where)
    except OSError as exc:
        raise InputError(f"cannot open {where}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if (st.st_mode & 0o170000) != 0o100000:
            raise InputError(f"{where} is not a regular file")
        if st.st_size > MAX_CONFIG:
            raise InputError(f"{where} is larger than {MAX_CONFIG} bytes")
        data = read_limited(fd, MAX_CONFIG)
        if len(data) > MAX_CONFIG:
            raise InputError(f"{where} is larger than {MAX_CONFIG} bytes")
    except OSError as exc:
        raise InputError(f"cannot read {where}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    try:
        from gpuctk.jsonfast import loads, unique_pairs

        # runc merges a duplicate object into the first, key by key; the shim would read the
        # last alone: refuse duplicates, as the hook does, so both read one request
        doc = loads(data.decode("utf-8"), pairs_hook=unique_pairs)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValidationError(f"malformed OCI config {where}: {exc}") from None
    if not isinstance(doc, dict):
        raise ValidationError(f"malformed OCI config {where}: not a JSON object")
    from gpuctk.hook.ocikeys import check_keys

    check_keys(doc, where)  # runc's decoder folds case: a "Process" would be its process
    return doc, st, write_name, data


def write_config(
    dir_fd: int, name: str, where: str, doc: Mapping[str, Any], st: os.stat_result
) -> None:
    """Replace `name` in the folder `dir_fd` (where the config `where` was read) atomically
    with `doc`, keeping its mode and owner: written through that descriptor, never the
    folder's path again (its owner could have pointed the path elsewhere by now); the owner
    is set on the temp file's descriptor before the rename (never a chown by name afterwards:
    the bundle's owner could have swapped a link in by then)."""
    from gpuctk.jsonfast import dumps
    from gpuctk.writes import atomic_write

    try:
        data = dumps(doc)
    except (ValueError, TypeError) as exc:
        raise ValidationError(f"cannot encode the edited OCI config: {exc}") from None
    uid = st.st_uid if st.st_uid != os.geteuid() else -1
    gid = st.st_gid if st.st_gid != os.getegid() else -1
    # not durable: runc reads it next; a writer that may not chown (rootless) keeps it
    path = os.path.join(os.path.dirname(where), name)  # atomic_write: its last component
    atomic_write(
        path, data, mode=st.st_mode & 0o7777, durable=False, uid=uid, gid=gid, dir_fd=dir_fd
    )
