"""Filesystem helpers shared by every part: bounded reads and atomic writes on the host."""

from __future__ import annotations

import errno
import os

from gpuctk.errors import OutputError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def stat_identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """(dev, ino, size, mtime_ns, ctime_ns): what the caches take a file's identity to be
    (a rename gives a new inode, a write or chmod a new mtime/ctime, which no user can set
    back for ctime)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def read_limited(fd: int, limit: int) -> bytes:
    """Read from `fd` to its end, but never more than `limit` + 1 bytes.

    A result longer than `limit` means the file is too large; the caller says so in its own
    words. OSError propagates.
    """
    chunks = []
    total = 0
    while total <= limit:
        chunk = os.read(fd, limit + 1 - total)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def private_folder(path: str, *, create: bool = False) -> bool:
    """Whether `path` is a folder (not a symlink) owned by this uid that nobody else can write;
    with `create`, a missing one is made first, mode 0700."""
    if create:
        try:  # noqa: SIM105 - contextlib would cost the create path an import
            os.mkdir(path, 0o700)
        except OSError:
            pass
    try:
        st = os.lstat(path)
    except OSError:
        return False
    is_dir = (st.st_mode & 0o170000) == 0o040000
    return is_dir and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def atomic_write(path: str, data: bytes, mode: int = 0o644, durable: bool = True) -> None:
    """Write `data` to `path` atomically: temp file in the same folder, fsync, rename.

    Readers see either the old file or the new one, never a partial file. On any failure the
    existing file is left untouched and OutputError says what went wrong. `durable=False` skips
    the two fsyncs, for files nobody needs after a crash (a bundle's config.json about to be
    read by runc, a container's ld cache): each fsync is a disk flush on the create path.
    """
    directory = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(directory):
        raise OutputError(
            f"cannot write {path}: folder {directory} does not exist (create it first)"
        )
    if os.path.isdir(path):
        raise OutputError(f"cannot write {path}: it is a directory")
    base = os.path.basename(path)
    # Not tempfile.mkstemp: importing tempfile costs the container-start path ~8 ms.
    tmp = os.path.join(directory, f".{base}.{os.urandom(6).hex()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror} (check permissions)") from exc
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except OSError as exc:
        try:  # noqa: SIM105 - contextlib would cost the create path an import
            os.unlink(tmp)
        except OSError:
            pass
        reason = exc.strerror or str(exc)
        if exc.errno == errno.ENOSPC:
            reason = "no space left on device"
        raise OutputError(f"cannot write {path}: {reason}") from exc
    if not durable:
        return
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def load_private_marshal(folder: str, path: str, limit: int, fmt: str) -> dict[str, Any] | None:
    """The `marshal` document at `path` (in `folder`) when only this uid can have written it:
    the folder private (private_folder), the file a regular one owned by this uid and not
    group/world-writable (checked on the descriptor), at most `limit` bytes, a dict whose
    "format" is `fmt`. None for anything else: marshal is not meant for hostile input, and
    these files are caches (gpuctk.cdi.speccache, gpuctk.hook.plans)."""
    if not private_folder(folder):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (st.st_mode & 0o170000) != 0o100000 or st.st_uid != os.geteuid():
            return None
        if st.st_mode & 0o022 or st.st_size > limit:
            return None
        data = read_limited(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)
    import marshal

    try:
        doc = marshal.loads(data)
    except (EOFError, ValueError, TypeError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        return None
    return doc


def save_private_marshal(folder: str, path: str, doc: dict[str, Any], limit: int) -> bool:
    """Write `doc` (with its "format") to `path` as `marshal`, mode 0600, atomically and
    without fsync, creating `folder` (0700) if missing; False when the folder is not this
    uid's alone, the document is larger than `limit` or not marshallable, or the write fails."""
    import marshal

    try:
        data = marshal.dumps(doc)
    except ValueError:  # an unmarshallable value: never from JSON or safe YAML
        return False
    if len(data) > limit or not private_folder(folder, create=True):
        return False
    try:
        atomic_write(path, data, mode=0o600, durable=False)
    except OutputError:
        return False
    return True
