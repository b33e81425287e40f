"""The OCI state a hook gets on stdin, and the bundle's config.json: bounded, strict reads.

Where a createContainer hook runs (checked on runc 1.1.5 and crun 1.8.1): in the container's
mount namespace, after the rootfs and its mounts (the bind-mounted driver files) are in place and
before pivot_root, so the rootfs path from config.json reaches the container's view of the root.
It also runs in the container's pid namespace while /proc is still the host's: runc reports
`pid: 1` (its own view) and crun `pid: 0`, so the state's pid names no usable process here and
createContainer never uses it. (A prestart / createRuntime mode, which runs in the runtime's
namespaces with the real init pid, must enter /proc/<pid>/ns/mnt after checking that pid.)
"""

from __future__ import annotations

import os
import posixpath
import stat
import sys

from gpuctk import jsonfast
from gpuctk.errors import InputError
from gpuctk.fs import read_limited
from gpuctk.hook.ocikeys import check_keys

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: typing's import is costly at every start
if TYPE_CHECKING:
    from typing import Any, BinaryIO

MAX_STATE = 1 << 20  # bytes; a real state is a few hundred
MAX_CONFIG = 16 << 20  # bytes; a config.json with many CDI edits is well under 1 MiB
BUNDLE_FIELD = "bundle"  # the state's bundle folder (gpuctk-cdi-hook reads it too)
ROOT_FIELD = "root"  # the config's root object, its path the container root


class State:
    """The fields of the OCI state a hook uses (a plain class: no dataclasses import)."""

    __slots__ = ("bundle", "id", "pid", "status")

    def __init__(self, *, id: str, bundle: str, pid: int, status: str) -> None:
        self.id, self.bundle, self.pid, self.status = id, bundle, pid, status

    def __repr__(self) -> str:
        return (
            f"State(id={self.id!r}, bundle={self.bundle!r}, pid={self.pid}, status={self.status!r})"
        )


def parse_json(data: bytes, what: str) -> Any:
    """Decode strict JSON (UTF-8, no duplicate keys, bounded nesting) or raise InputError."""
    try:
        text = data.decode("utf-8")
        return jsonfast.loads(text, pairs_hook=jsonfast.unique_pairs)  # NaN/Infinity refused
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} is not UTF-8 (byte {exc.start})") from exc
    except jsonfast.NestingError as exc:
        raise InputError(f"{what} is nested too deeply") from exc
    except ValueError as exc:
        raise InputError(f"{what} is not valid JSON: {exc}") from exc


def read_bounded(stream: BinaryIO, limit: int, what: str) -> bytes:
    """Read all of `stream`, refusing more than `limit` bytes."""
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"{what} is larger than {limit} bytes")
    return data


def _check_path(path: object, what: str) -> str:
    if not isinstance(path, str) or not path:
        raise InputError(f"{what} must be a non-empty string")
    if "\0" in path:
        raise InputError(f"{what} contains a NUL byte")
    return path


def parse_state(data: bytes) -> State:
    """Check and decode the OCI state JSON."""
    doc = parse_json(data, "OCI state on stdin")
    if not isinstance(doc, dict):
        raise InputError("OCI state on stdin is not a JSON object")
    bundle = _check_path(doc.get(BUNDLE_FIELD), "OCI state field 'bundle'")
    if not bundle.startswith("/") or ".." in bundle.split("/"):
        raise InputError(
            f"OCI state field 'bundle' must be an absolute path without '..': {bundle}"
        )
    ident, status, pid = doc.get("id", ""), doc.get("status", ""), doc.get("pid", 0)
    if not isinstance(ident, str) or not isinstance(status, str):
        raise InputError("OCI state fields 'id' and 'status' must be strings")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid < 0:
        raise InputError("OCI state field 'pid' must be a non-negative integer")
    return State(id=ident, bundle=posixpath.normpath(bundle), pid=pid, status=status)


def read_state(stream: BinaryIO | None = None) -> State:
    """Read the OCI state from `stream` (default: stdin)."""
    return parse_state(read_bounded(stream or sys.stdin.buffer, MAX_STATE, "OCI state on stdin"))


def read_config(path: str) -> dict[str, Any]:
    """Read a bundle's config.json (a regular file, not a symlink, at most MAX_CONFIG bytes)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(f"cannot read {path}: not a regular file")
        data = read_limited(fd, MAX_CONFIG)
        if len(data) > MAX_CONFIG:
            raise InputError(f"{path} is larger than {MAX_CONFIG} bytes")
    finally:
        os.close(fd)
    doc = parse_json(data, path)
    if not isinstance(doc, dict):
        raise InputError(f"{path} is not a JSON object")
    check_keys(doc, path)  # runc's decoder folds case: a "Root" would be its root
    return doc


def rootfs_path(config: dict[str, Any], bundle: str, where: str = "config.json") -> str:
    """The host path of the container root: root.path, relative to the bundle when relative."""
    root = config.get(ROOT_FIELD)
    if not isinstance(root, dict):
        raise InputError(f"{where} has no 'root' object")
    path = _check_path(root.get("path"), f"{where} field root.path")
    return posixpath.normpath(posixpath.join(bundle, path))
