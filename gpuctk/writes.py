"""Atomic writes, and the private caches written with them.

atomic_write never shows a partial file and sets ownership on the temporary file before the
rename; in shared folders (the state folder) it locks the temporary file while writing it, so
that sweep_dead_temps can remove what a killed writer left without guessing by pid. The
`marshal` caches (gpuctk.cdi.specs.speccache, gpuctk.hook.shim.plans) are read only from folders and
files
this uid alone can have written (gpuctk.fs.open_private_dir).
"""

from __future__ import annotations

import errno
import os

from gpuctk.errors import GpuctkError, OutputError
from gpuctk.fs import READ_EXTRA, open_private_dir, read_limited

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def lock_temp(fd: int) -> None:
    """Hold an exclusive lock on a temp file's descriptor while it is written: the kernel
    drops it when the writer dies, so sweep_dead_temps can tell a killed writer's leftover
    from a live writer's file (no pid numbers)."""
    import fcntl

    try:  # noqa: SIM105 - contextlib would cost the create path an import
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass


def sweep_dead_temps(dir_fd: int, prefix: str, suffix: str = "") -> None:
    """Unlink the files named `prefix`...`suffix` in the folder `dir_fd` that no live writer
    holds locked (lock_temp): what a writer killed between creating its temp file and renaming
    it left. At most 64 are looked at; errors are ignored (a sweep is housekeeping)."""
    import fcntl

    try:
        lfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return
    try:
        names = [n for n in os.listdir(lfd) if n.startswith(prefix) and n.endswith(suffix)]
    except OSError:
        names = []
    finally:
        os.close(lfd)
    for name in names[:64]:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dir_fd)  # fmt: skip
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(name, dir_fd=dir_fd)
        except OSError:
            pass  # locked: its writer is alive
        finally:
            os.close(fd)


def atomic_write(
    path: str,
    data: bytes,
    mode: int = 0o644,
    durable: bool = True,
    *,
    uid: int = -1,
    gid: int = -1,
    dir_fd: int | None = None,
    sweep: bool = False,
) -> None:
    """Write `data` to `path` atomically: temp file in the same folder, fsync, rename.

    Readers see either the old file or the new one, never a partial file. On any failure the
    existing file is left untouched and OutputError says what went wrong. `durable=False` skips
    the two fsyncs, for files nobody needs after a crash (a bundle's config.json about to be
    read by runc, a container's ld cache): each fsync is a disk flush on the create path.

    `uid`/`gid` (-1: this process's) are set on the temp file's descriptor before the rename:
    the name never shows the file with another owner, and nothing is chowned by name (a
    symlink swapped in at `path` after the rename is never followed). Where this process may
    not give files away (EPERM: not root), the file stays its writer's. `dir_fd`: the folder,
    already opened and checked (open_trusted_dir, open_private_dir); `path`'s last component
    is then the name in it, and `path` is used in messages only. `sweep` (with `dir_fd`): the
    temp file is locked while written, and after the rename the temp files of writers killed
    before their rename are removed (sweep_dead_temps): for shared folders such as the state
    folder, where nothing else would ever remove them.
    """
    base = os.path.basename(path)
    if dir_fd is None:
        directory = os.path.dirname(os.path.abspath(path)) or "."
        if not os.path.isdir(directory):
            raise OutputError(
                f"cannot write {path}: folder {directory} does not exist (create it first)"
            )
        if os.path.isdir(path):
            raise OutputError(f"cannot write {path}: it is a directory")
        dest = path
    else:
        directory, dest = "", base
    # Not tempfile.mkstemp: importing tempfile would cost the container-start path dearly.
    tmp = f".{base}.{os.urandom(6).hex()}.tmp"
    tmp = os.path.join(directory, tmp) if directory else tmp
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        hint = " (check permissions)" if exc.errno in (errno.EACCES, errno.EPERM) else ""
        reason = "no space left on device" if exc.errno == errno.ENOSPC else exc.strerror
        raise OutputError(f"cannot write {path}: {reason}{hint}") from exc
    if sweep and dir_fd is not None:
        lock_temp(fd)
    try:
        try:
            if uid != -1 or gid != -1:
                try:  # noqa: SIM105 - contextlib would cost the create path an import
                    os.fchown(fd, uid, gid)  # before fchmod: a chown may clear setuid bits
                except PermissionError:
                    pass
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if durable:
                os.fsync(fd)
            os.rename(tmp, dest, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # still locked (sweep)
        finally:
            os.close(fd)
    except OSError as exc:
        try:  # noqa: SIM105 - contextlib would cost the create path an import
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        reason = exc.strerror or str(exc)
        if exc.errno == errno.ENOSPC:
            reason = "no space left on device"
        raise OutputError(f"cannot write {path}: {reason}") from exc
    if sweep and dir_fd is not None:
        sweep_dead_temps(dir_fd, f".{base}.", ".tmp")
    if not durable:
        return
    try:
        if dir_fd is None:
            dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        else:
            dfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=dir_fd)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def read_private(folder: str, path: str, limit: int) -> bytes | None:
    """The bytes of `path` (in `folder`) when only this uid can have written it: the folder
    private (open_private_dir: its ancestors too), the file, opened through it without
    following a link or blocking, a regular one owned by this uid and not group/world-writable
    (checked on the descriptor), at most `limit` bytes. None for anything else."""
    try:
        dir_fd = open_private_dir(folder)
    except (GpuctkError, OSError):
        return None
    try:
        fd = os.open(os.path.basename(path), os.O_RDONLY | READ_EXTRA, dir_fd=dir_fd)
    except OSError:
        return None
    finally:
        os.close(dir_fd)
    try:
        st = os.fstat(fd)
        if (st.st_mode & 0o170000) != 0o100000 or st.st_uid != os.geteuid():
            return None
        if st.st_mode & 0o022 or st.st_size > limit:
            return None
        return read_limited(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def load_private_marshal(folder: str, path: str, limit: int, fmt: str) -> dict[str, Any] | None:
    """The `marshal` document at `path` (in `folder`), read by read_private, when it is a dict
    whose "format" is `fmt`. None for anything else: marshal is not meant for hostile input,
    and these files are caches (gpuctk.cdi.specs.speccache, gpuctk.hook.shim.plans)."""
    data = read_private(folder, path, limit)
    if data is None:
        return None
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
    uid's alone (open_private_dir), the document is larger than `limit` or not marshallable,
    or the write fails."""
    import marshal

    try:
        data = marshal.dumps(doc)
    except ValueError:  # an unmarshallable value: never from JSON or safe YAML
        return False
    return write_private(folder, path, data, limit)


def write_private(folder: str, path: str, data: bytes, limit: int) -> bool:
    """Write `data` to `path` in `folder`, mode 0600, atomically and without fsync, creating
    `folder` (0700) if missing; False when the folder is not this uid's alone
    (open_private_dir), `data` is larger than `limit`, or the write fails."""
    if len(data) > limit:
        return False
    try:
        dir_fd = open_private_dir(folder, create=True)
    except (GpuctkError, OSError):
        return False
    try:
        atomic_write(path, data, mode=0o600, durable=False, dir_fd=dir_fd, sweep=True)
    except OutputError:
        return False
    finally:
        os.close(dir_fd)
    return True
