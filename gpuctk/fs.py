"""Filesystem helpers shared by every part: bounded reads and the trusted-path walk
(open_trusted_dir, trusted_file, open_private_dir) for the files root acts on. Atomic writes
are gpuctk.writes."""

from __future__ import annotations

import errno
import os
import stat  # already loaded by os: free

from gpuctk.errors import GpuctkError, TrustError

TYPE_CHECKING = False
if TYPE_CHECKING:
    pass


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
READ_EXTRA = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


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
    return _PATH_FLAGS if flags & os.O_PATH else flags | READ_EXTRA


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
