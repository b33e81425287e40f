"""Filesystem helpers shared by every part: bounded reads, atomic writes and the trusted-path
walk (open_trusted_dir, trusted_file) for the files root acts on."""

from __future__ import annotations

import errno
import os
import stat  # already loaded by os: free

from gpuctk.errors import GpuctkError, OutputError, TrustError

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


# --- trusted paths: files the create path may act on as root ---------------------------------
#
# A file outside the container root that root acts on (a config, a runtime it execs, a CDI spec
# or hook, its own state) is only as trustworthy as the accounts that can write it or swap it:
# its owner, and whoever can write any folder on the way to it (rename a folder aside, put
# another in its place). So such a file is reached by a walk from / through descriptors
# (openat, O_NOFOLLOW), each step checked on the descriptor it opened (fstat: no race between
# the check and the use):
#
# - every folder is owned by root (or by this process's euid: a rootless engine) and not
#   group/world-writable; a sticky one that others can write (/tmp) is crossed only to an
#   entry owned by root/euid, which nobody else can then rename or unlink;
# - the file itself is a regular file with the same owner rule, not group/world-writable;
#   a folder asked for as the end of the walk is not writable by others at all (sticky or
#   not: anyone could add a file to it);
# - a symlink is followed only from a folder that passed (so only root can have made it, or
#   it is root's own in a sticky folder), its target walked the same way, 40 links at most;
# - a name missing from a trusted folder is FileNotFoundError (nobody else can create it
#   there later); missing from a folder others can write, it is a TrustError.
#
# Cost: two syscalls (openat, fstat) per path component, one more per symlink.

MAX_LINKS = 40
_WRITABLE = 0o022
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_EXTRA = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


def _writable_words(mode: int) -> str:
    if mode & _WRITABLE == _WRITABLE:
        return "group- and world-writable"
    return "group-writable" if mode & 0o020 else "world-writable"


def _problem(st: os.stat_result, comp: str, target: str, shared: str, end: bool) -> str:
    """The refusal of the component `comp` with this stat, in words (only on a refusal: the
    walk itself compares numbers). `shared`: the folder others can write that holds it;
    `end`: it is where the walk ends (a folder there may not be writable at all)."""
    fmt = stat.S_IFMT(st.st_mode)
    noun = "folder" if fmt == stat.S_IFDIR else ("symlink" if fmt == stat.S_IFLNK else "file")
    label = f"the {noun}" if comp == target else f"{noun} {comp}"
    euid = os.geteuid()
    if st.st_uid not in (0, euid):
        allowed = "root" if euid == 0 else f"root or uid {euid}"
        where = f", in {shared}, which others can write" if shared else ""
        return f"{label} is owned by uid {st.st_uid}, not {allowed}{where}; fix: chown root {comp}"
    if st.st_mode & _WRITABLE and (end or fmt != stat.S_IFDIR or not st.st_mode & stat.S_ISVTX):
        mode, words = stat.S_IMODE(st.st_mode), _writable_words(st.st_mode)
        return f"{label} is {words} (mode {mode:04o}); fix: chmod go-w {comp}"
    return f"{label} is not a regular file; fix: name a regular file"


def _parts(path: str) -> list[str]:
    """The components of `path` as a stack (the first one last), without "" and "."."""
    return [p for p in reversed(path.split("/")) if p and p != "."]


def _join(parts: list[str]) -> str:
    return "/" + "/".join(parts)


def _walk(
    path: str,
    at: int | None,
    where: str,
    *,
    want_dir: bool,
    flags: int,
    create: bool = False,
    follow_last: bool = True,
) -> tuple[int, os.stat_result]:
    """The descriptor and stat of `path` (relative to the trusted folder `at`, whose path is
    `where`, or from /) after the walk described above; the caller closes it. `flags`: how the
    end is opened (O_PATH, or O_RDONLY with O_NOFOLLOW|O_NONBLOCK|O_NOCTTY added for a file);
    `create`: a missing last folder is made, mode 0700; `follow_last=False`: a symlink as the
    last component is refused. TrustError, or OSError (FileNotFoundError: missing)."""
    if at is None and not path.startswith("/"):  # not abspath: "a/../b" is not "b" if a is a link
        path = f"{os.getcwd()}/{path}"
    start_at_root = at is None or path.startswith("/")
    todo = _parts(path)
    base = [] if start_at_root else [p for p in where.split("/") if p]
    target = _join([*base, *reversed(todo)])  # the path as written, for the messages
    euid = os.geteuid()
    links = 0
    if start_at_root:
        cur, owned, shown = os.open("/", _PATH_FLAGS | os.O_DIRECTORY), True, []
    else:
        cur, owned, shown = at if at is not None else -1, False, base
    try:
        cur_st = os.fstat(cur)
        if start_at_root and _bad_folder(cur_st, euid):
            raise TrustError(_problem(cur_st, "/", target, "", False))
        while todo:
            name = todo.pop()
            if name == "..":  # back to a folder this walk (or the caller's) already passed
                fd = os.open("..", _PATH_FLAGS | os.O_DIRECTORY, dir_fd=cur)
                if owned:
                    os.close(cur)
                cur, owned, shown = fd, True, shown[:-1]
                cur_st = os.fstat(cur)
                continue
            last = not todo
            shared = cur_st.st_mode & _WRITABLE
            try:
                fd = os.open(name, flags if last and not want_dir else _PATH_FLAGS, dir_fd=cur)
            except FileNotFoundError:
                making = create and last and want_dir
                if shared and not making:
                    comp, mode = _join([*shown, name]), stat.S_IMODE(cur_st.st_mode)
                    noun = "folder" if want_dir or not last else "file"
                    label = f"the {noun}" if comp == target else f"{noun} {comp}"
                    raise TrustError(
                        f"{label} does not exist, and {_join(shown)} lets others create it "
                        f"(mode {mode:04o}); fix: create it as root first"
                    ) from None
                if making:
                    try:  # noqa: SIM105 - contextlib would cost the create path an import
                        os.mkdir(name, 0o700, dir_fd=cur)
                    except FileExistsError:
                        pass
                    todo.append(name)  # and open it as any other: it may not be ours
                    create = False
                    continue
                raise
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                fd = os.open(name, _PATH_FLAGS, dir_fd=cur)  # a symlink: judged below
            try:
                st = os.fstat(fd)
                fmt = st.st_mode & 0o170000
                if fmt == stat.S_IFDIR:
                    bad = _bad_folder(st, euid)
                elif fmt == stat.S_IFLNK:
                    bad = bool(shared) and st.st_uid != 0 and st.st_uid != euid
                    if not bad and last and not follow_last:
                        comp = _join([*shown, name])
                        label = "the symlink" if comp == target else f"symlink {comp}"
                        raise TrustError(f"{label} is a symlink; fix: name the path it leads to")
                elif not last or want_dir:
                    comp = _join([*shown, name])
                    raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), comp)
                else:
                    bad = (st.st_uid != 0 and st.st_uid != euid) or bool(
                        st.st_mode & _WRITABLE or fmt != stat.S_IFREG
                    )
                if bad:
                    where_shared = _join(shown) if shared else ""
                    raise TrustError(
                        _problem(st, _join([*shown, name]), target, where_shared, last)
                    )
                if fmt == stat.S_IFLNK:
                    links += 1
                    if links > MAX_LINKS:
                        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), target)
                    dest = os.readlink("", dir_fd=fd)
            except BaseException:
                os.close(fd)
                raise
            if fmt == stat.S_IFLNK:
                os.close(fd)
                todo.extend(_parts(dest))
                if dest.startswith("/"):
                    fd = os.open("/", _PATH_FLAGS | os.O_DIRECTORY)
                    if owned:
                        os.close(cur)
                    cur, owned, shown = fd, True, []
                    cur_st = os.fstat(cur)
                    if _bad_folder(cur_st, euid):
                        raise TrustError(_problem(cur_st, "/", target, "", False))
                continue
            if fmt != stat.S_IFDIR:
                return fd, st
            if owned:
                os.close(cur)
            cur, owned, cur_st, shown = fd, True, st, [*shown, name]
        # the walk ended on a folder
        if not want_dir:
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), target)
        if cur_st.st_mode & _WRITABLE:
            raise TrustError(_problem(cur_st, _join(shown), target, "", True))
        if flags & os.O_PATH and owned:
            owned = False
            return cur, cur_st
        return os.open(".", flags | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=cur), cur_st
    finally:
        if owned:
            os.close(cur)


def _bad_folder(st: os.stat_result, euid: int) -> bool:
    """A folder on the way that must not be crossed: a foreign owner, or others may write it
    without the sticky bit (with it, each entry crossed must be root's or the euid's)."""
    mode = st.st_mode
    foreign = st.st_uid != 0 and st.st_uid != euid
    return foreign or bool(mode & _WRITABLE and not mode & stat.S_ISVTX)


def _file_flags(flags: int) -> int:
    return _PATH_FLAGS if flags & os.O_PATH else flags | _READ_EXTRA


def open_trusted_dir(path: str, *, flags: int = os.O_PATH, create: bool = False) -> int:
    """A descriptor of the folder `path` (opened with `flags`: O_PATH, or O_RDONLY to list
    it) that only root (or this euid) can have written, nor any folder above it (see above);
    with `create`, a missing last component is made first, mode 0700. The caller closes it.
    TrustError naming the component at fault and the fix; OSError (FileNotFoundError when
    missing)."""
    return _walk(path, None, "/", want_dir=True, flags=flags, create=create)[0]


def trusted_file(
    dir_fd: int, name: str, *, folder: str, flags: int = os.O_RDONLY
) -> tuple[int, os.stat_result]:
    """The regular file `name` in the folder `dir_fd` (from open_trusted_dir; its path is
    `folder`, for messages and symlinks), opened with `flags` (O_RDONLY, or O_PATH to look
    only), and its stat: owned by root (or this euid), not group/world-writable; a symlink is
    followed as in open_trusted_dir. The caller closes it. TrustError; OSError."""
    return _walk(name, dir_fd, folder, want_dir=False, flags=_file_flags(flags))


def open_trusted_file(path: str, *, flags: int = os.O_RDONLY) -> tuple[int, os.stat_result]:
    """trusted_file for a path: every folder from / to it checked as in open_trusted_dir (a
    sticky one others can write is crossed to a file owned by root or this euid)."""
    return _walk(path, None, "/", want_dir=False, flags=_file_flags(flags))


def append_trusted(path: str, data: bytes, mode: int = 0o644) -> str | None:
    """Append `data` to the log file `path` in one write, opened (created `mode` if missing)
    without following a link and without blocking, in a folder that root alone can write
    (open_trusted_dir), and only if it is a regular file that root (or this euid) alone can
    write: a user who could write that folder could otherwise point the name at any file, or
    a FIFO, that root then appends to. None when written, else why not (one line)."""
    folder, _, name = path.rpartition("/")
    if not path.startswith("/") or not name:
        return "must be an absolute path to a file"
    try:
        dfd = open_trusted_dir(folder or "/")
    except GpuctkError as exc:
        return f"refused: {exc.message}"
    except OSError as exc:
        return f"cannot open its folder: {exc.strerror or exc}"
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags | os.O_NOCTTY, mode, dir_fd=dfd)
    except OSError as exc:
        return f"cannot open: {exc.strerror or exc} (a symlink is not followed)"
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        if st.st_uid not in (0, os.geteuid()) or st.st_mode & _WRITABLE:
            return "refused: it is not root's alone (fix: chown root, chmod go-w)"
        os.write(fd, data)
    except OSError as exc:
        return f"cannot write: {exc.strerror or exc}"
    finally:
        os.close(fd)
    return None


def open_private_dir(path: str, *, create: bool = False) -> int:
    """An O_PATH descriptor of the folder `path` when only this uid can write it: owned by
    this euid, not group/world-writable, not a symlink, every folder above it trusted
    (open_trusted_dir); with `create`, a missing one is made first, mode 0700. TrustError;
    OSError."""
    fd, st = _walk(
        path, None, "/", want_dir=True, flags=os.O_PATH, create=create, follow_last=False
    )
    if st.st_uid != os.geteuid():
        os.close(fd)
        raise TrustError(
            f"the folder is owned by uid {st.st_uid}, not uid {os.geteuid()}; "
            f"fix: chown {os.geteuid()} {path}"
        )
    return fd


def private_folder(path: str, *, create: bool = False) -> bool:
    """Whether `path` is a folder only this uid can write (open_private_dir)."""
    try:
        fd = open_private_dir(path, create=create)
    except (GpuctkError, OSError):
        return False
    os.close(fd)
    return True


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
    # Not tempfile.mkstemp: importing tempfile costs the container-start path ~8 ms.
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


def load_private_marshal(folder: str, path: str, limit: int, fmt: str) -> dict[str, Any] | None:
    """The `marshal` document at `path` (in `folder`) when only this uid can have written it:
    the folder private (open_private_dir: its ancestors too), the file, opened through it, a
    regular one owned by this uid and not group/world-writable (checked on the descriptor), at
    most `limit` bytes, a dict whose "format" is `fmt`. None for anything else: marshal is not
    meant for hostile input, and these files are caches (gpuctk.cdi.speccache,
    gpuctk.hook.plans)."""
    try:
        dir_fd = open_private_dir(folder)
    except (GpuctkError, OSError):
        return None
    try:
        fd = os.open(os.path.basename(path), os.O_RDONLY | _READ_EXTRA, dir_fd=dir_fd)
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
    uid's alone (open_private_dir), the document is larger than `limit` or not marshallable,
    or the write fails."""
    import marshal

    try:
        data = marshal.dumps(doc)
    except ValueError:  # an unmarshallable value: never from JSON or safe YAML
        return False
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
