"""The runtime memo: what lets gpuctk-runtime's front skip Python.

After each Python start the shim writes `$GPUCTK_STATE_DIR/runtime` (default /run/gpuctk): the
config file in force and whether it exists, the low-level runtime it resolved, and the strings
one of which a config.json asking for a GPU must contain. The front (gpuctk-cdi-hook
runtime-front: hook/shimfront.c's memo_holds() and no_request(), which gpuctk.install.launchers'
sh launcher execs) runs that runtime itself for the verbs after a create, and for a create whose
config.json holds none of the strings. Written only into a folder this uid alone can write.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from gpuctk.hook.config import Settings

MEMO_NAME = "runtime"  # in the state folder
MEMO_TAG = "gpuctk-runtime memo 5"  # the memo's first line: the format the front reads
PRESENT, ABSENT = "present", "absent"  # the config file, when the memo was written
SEARCH = "create-search"  # the request line's first word, the markers after it (tabs between)
PYTHON = "create-python"  # the request line without markers: every create starts Python
MAX_BYTES = 1 << 16  # a memo the front reads


def request_markers(settings: Settings) -> list[str] | None:
    """Strings at least one of which a config.json that asks for a GPU must contain, as
    gpuctk.hook.requests.devices reads requests under `settings`: the NVIDIA_VISIBLE_DEVICES name,
    each annotation prefix, and with accept-volume-mounts the device-list mount folder. None
    when one cannot be given to the front: empty, or with a character that JSON writes
    escaped other than `/` (a quote, a backslash, a control character) or that Go's JSON
    writes escaped (<, >, &, U+2028 and U+2029), which the front's search of the text could
    miss (it sends a `\\/` escape, and any `\\u` escape but Go's of <, > and &, to Python)."""
    from gpuctk.hook.requests.devices import VISIBLE_DEVICES

    markers = [VISIBLE_DEVICES, *settings.annotation_prefixes]
    if settings.accept_volume_mounts:
        markers.append("nvidia-container-devices")
    if any(not m or any(c in '"\\<>&\u2028\u2029' or c < " " for c in m) for m in markers):
        return None
    return markers


def remember_runtime(
    runtime: str,
    environ: Mapping[str, str] | None = None,
    markers: list[str] | None = None,
    settings: Settings | None = None,
) -> bool:
    """Write the runtime memo gpuctk-runtime's front reads (hook/shimfront.c's memo_holds()): the
    config file in force and whether it exists, the resolved `runtime`
    (gpuctk.hook.shim.runtime_main.find_runtime: the PATH plays no part), so that the verbs after a
    create skip Python, and the request `markers` (request_markers), so that a create whose
    config.json contains none of them skips Python too (without markers, every create starts
    Python). Written only into a folder that this uid alone can write, up to /
    (gpuctk.fs.open_private_dir; created 0700 if missing), through its descriptor, only when
    it changes or the config or the runtime changed after it (the front would not take it),
    never fsync'd (it is a cache: a lost or stale memo just means a Python start). With
    `settings`, the config they were read from (their source_identity) must still be the file
    in place, or no memo is written: one written after a change it did not read would hold
    past that change. True when the memo is current."""
    from gpuctk.hook.config import config_path
    from gpuctk.statedir import state_dir

    env = os.environ if environ is None else environ
    folder = state_dir(env)
    conf, _ = config_path(env)
    present = PRESENT if os.path.exists(conf) else ABSENT
    create = "\t".join([SEARCH, *markers]) if markers else PYTHON
    lines = (MEMO_TAG, conf, present, runtime, create)
    text = "".join(f"{line}\n" for line in lines).encode()
    if any("\n" in line or "\0" in line for line in lines) or len(text) > MAX_BYTES:
        return False  # not representable in the front's line reads
    from gpuctk.errors import GpuctkError
    from gpuctk.fs import open_private_dir, read_limited
    from gpuctk.writes import atomic_write

    try:
        dir_fd = open_private_dir(folder, create=True)
    except (GpuctkError, OSError):
        return False  # not ours alone: never leave a memo where others could swap it
    try:
        try:
            fd = os.open(MEMO_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            try:
                st = os.fstat(fd)
                if (
                    st.st_uid == os.geteuid()
                    and not _newer_than(st, (conf, runtime))  # the front's -nt tests hold
                    and read_limited(fd, len(text)) == text
                ):
                    return True
            finally:
                os.close(fd)
        except OSError:
            pass
        if settings is not None and not _as_read(conf, settings):
            return False  # the config changed since it was read
        atomic_write(
            f"{folder}/{MEMO_NAME}", text, mode=0o644, durable=False, dir_fd=dir_fd, sweep=True
        )
    except GpuctkError:
        return False
    finally:
        os.close(dir_fd)
    return True


def _newer_than(memo: os.stat_result, paths: Sequence[str]) -> bool:
    """Whether one of `paths` changed after the memo `memo` was written: its ctime past the
    memo's mtime, the link's own or the file's (hook/shimfront.c's changed_after(), under which
    the front refuses it: a link switched to another, older file is a change)."""
    for path in paths:
        for look in (os.lstat, os.stat):
            try:
                if look(path).st_ctime_ns > memo.st_mtime_ns:
                    return True
            except OSError:
                pass
    return False


def _as_read(conf: str, settings: Settings) -> bool:
    """Whether `conf` is still the file `settings` were read from (missing where they are the
    defaults), by the identity the plans take (gpuctk.hook.shim.plans.identity)."""
    from gpuctk.hook.shim.plans import identity

    try:
        return identity(conf) == settings.source_identity
    except OSError:
        return False


def forget_runtime(environ: Mapping[str, str] | None = None) -> None:
    """Remove the runtime memo (when its runtime is no longer found): the front then starts
    Python for every verb until a create or another verb writes it again. Only in a folder
    that this uid alone can write (gpuctk.fs.open_private_dir); a failure is ignored."""
    from gpuctk.errors import GpuctkError
    from gpuctk.fs import open_private_dir
    from gpuctk.statedir import state_dir

    folder = state_dir(environ)
    try:
        dir_fd = open_private_dir(folder)
    except (GpuctkError, OSError):
        return
    try:
        os.unlink(MEMO_NAME, dir_fd=dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
