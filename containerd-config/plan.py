"""A plan is the list of host files a command will write or remove; applying it is all-or-nothing.

Every command first computes its whole plan from what is on disk (no writes), so that a bad input
is reported before anything changes. `apply` then checks that every target can be written, writes
each file atomically (gpuctk.writes.atomic_write), and if a later step still fails it puts back what
the earlier steps changed, so that an error leaves the disk as it was.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuctk.errors import OutputError
from gpuctk.writes import atomic_write


@dataclass(frozen=True)
class FileChange:
    """Write `data` to `path` (or remove the file when `data` is None).

    `mode` None keeps the mode of the file being replaced (0644 for a new file): a config that
    holds registry credentials stays as private as the operator made it.
    """

    path: str
    data: bytes | None
    what: str
    mode: int | None = None


@dataclass(frozen=True)
class Plan:
    """The changes a command makes, and lines to tell the user (warnings, next steps)."""

    changes: tuple[FileChange, ...]
    notes: tuple[str, ...] = field(default=())

    def effective(self) -> tuple[FileChange, ...]:
        """Only the changes that differ from what is on disk now."""
        return tuple(c for c in self.changes if _current(c.path) != c.data)


def _current(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except IsADirectoryError:
        return b""  # never equal to a planned content: the write will report it
    except OSError as exc:
        raise OutputError(f"cannot read {path}: {exc.strerror}") from None


def missing_dirs(path: str) -> list[str]:
    """Folders to create (outermost first) so that `path` can be written."""
    missing: list[str] = []
    directory = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(directory):
        missing.append(directory)
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    if not os.path.isdir(directory):
        raise OutputError(f"cannot write {path}: {directory} is not a directory")
    return list(reversed(missing))


def check(changes: Sequence[FileChange]) -> None:
    """Fail before any write when a target cannot be written: clear message, exit 5."""
    for change in changes:
        if change.data is not None and os.path.isdir(change.path):
            raise OutputError(f"cannot write {change.path}: it is a directory")
        missing = missing_dirs(change.path)
        target = missing[0] if missing else os.path.abspath(change.path)
        existing = os.path.dirname(target)
        # A write is a rename into the folder and a removal an unlink from it: both need the
        # folder writable. access(2) also reports a read-only file system (EROFS) for root.
        if not os.access(existing, os.W_OK | os.X_OK):
            raise OutputError(
                f"cannot write {change.path}: {existing} is not writable "
                "(read-only file system or permissions)"
            )


def apply(changes: Sequence[FileChange]) -> list[FileChange]:
    """Apply the changes in order; on failure restore every file already changed. Returns done."""
    todo = [c for c in changes if _current(c.path) != c.data]
    check(todo)
    done: list[tuple[FileChange, bytes | None, int | None]] = []
    created_dirs: list[str] = []
    try:
        for change in todo:
            before = _current(change.path)
            mode = _mode(change.path)
            if change.data is None:
                _remove(change.path)
            else:
                for directory in missing_dirs(change.path):
                    _mkdir(directory)
                    created_dirs.append(directory)
                new_mode = change.mode if change.mode is not None else (mode or 0o644)
                atomic_write(change.path, change.data, new_mode)
            done.append((change, before, mode))
    except OutputError:
        _rollback(done, created_dirs)
        raise
    return [c for c, _, _ in done]


def _mode(path: str) -> int | None:
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        return None


def _mkdir(directory: str) -> None:
    try:
        os.mkdir(directory, 0o755)
    except OSError as exc:
        raise OutputError(f"cannot create folder {directory}: {exc.strerror}") from None


def _remove(path: str) -> None:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            os.rmdir(path)
            return
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        reason = "read-only file system" if exc.errno == errno.EROFS else exc.strerror
        raise OutputError(f"cannot remove {path}: {reason}") from None


def _rollback(
    done: list[tuple[FileChange, bytes | None, int | None]], created_dirs: list[str]
) -> None:
    for change, before, mode in reversed(done):
        with contextlib.suppress(OSError, OutputError):
            if change.data is None and before == b"":
                os.mkdir(change.path, 0o755)  # a folder that was removed
            elif before is None:
                os.unlink(change.path)
            else:
                atomic_write(change.path, before, mode if mode is not None else 0o644)
    for directory in reversed(created_dirs):
        with contextlib.suppress(OSError):
            os.rmdir(directory)


def removable_dirs(dirs: Sequence[str], removed: Sequence[str]) -> list[FileChange]:
    """Folders (innermost first) that are empty once the files in `removed` are gone."""
    gone = {os.path.abspath(p) for p in removed}
    out: list[FileChange] = []
    for directory in sorted(dirs, key=len, reverse=True):
        try:
            entries = {os.path.join(directory, e) for e in os.listdir(directory)}
        except OSError:
            continue
        if entries <= gone:
            out.append(FileChange(directory, None, "folder created by gpuctk"))
            gone.add(os.path.abspath(directory))
    return out


def file_mode(path: str) -> int | None:
    """The permission bits of an existing file (following links), None when there is none."""
    return _mode(path)


def write_target(path: str) -> str:
    """Where to write `path`: through a symlink to its target, so that the link survives."""
    return os.path.realpath(path) if os.path.islink(path) else path


def render(plan: Plan) -> str:
    """What --dry-run prints: every file that would change, with its full new content."""
    parts: list[str] = []
    for change in plan.effective():
        if change.data is None:
            parts.append(f"# --- would remove {change.path} ({change.what}) ---\n")
        else:
            text = change.data.decode("utf-8")
            parts.append(f"# --- would write {change.path} ({change.what}) ---\n{text}")
    if not parts:
        parts.append("# nothing to change\n")
    return "".join(parts)


def restart_service(argv: list[str], written: str) -> str:
    """Run the restart command `argv` after `written` ("files written") succeeded; its
    shell-quoted form on success. OutputError when it cannot run, GpuctkError with its last
    stderr line when it fails (the files stay written either way: the message says so)."""
    import shlex
    import subprocess

    from gpuctk.errors import GpuctkError

    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise OutputError(f"{written}; cannot run {argv[0]}: {exc.strerror}") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise GpuctkError(f"{written}; `{shlex.join(argv)}` failed: {last}")
    return shlex.join(argv)
