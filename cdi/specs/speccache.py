"""A pre-parsed cache of the CDI spec files, for the container-create path.

Every `gpuctk-runtime create` reads the spec dirs. Decoding a spec as JSON is cheap; as YAML
(what `nvidia-ctk` and most guides write) PyYAML's import alone costs more than the rest of a
create (docs/benchmarks.md). The shim keeps the
decoded documents in one file, `$GPUCTK_STATE_DIR/specs.cache` (default /run/gpuctk, a tmpfs:
gone at reboot), in `marshal` format (built in, and the fastest decoder Python has).

Keyed on the identity of the descriptor the loader opened, after the trust policy accepted it:
path, device, inode, size, mtime and ctime (ns). A spec rewritten by rename (what `gpuctk cdi
generate` does) has a new inode; one edited in place a new mtime/ctime, which no user can set
back (ctime). A file is cached only once it has been left alone for SETTLE_NS: the kernel's
file timestamps are coarse (a jiffy), so two writes in one tick could share an identity, the
"racy git" problem; an entry from a file that settled cannot be shadowed that way.

Trust: the cache is read only from a folder owned by this uid and writable by no one else, nor
any folder above it (gpuctk.fs.open_private_dir), through its descriptor, and only when the
file is owned by this uid and not group/world-writable (checked on the open descriptor);
`marshal` is not meant for hostile input, and with these checks only the shim's own uid (root)
can have written it. Anything unexpected (missing, corrupt, foreign) is an empty
cache; writing is atomic (rename), never fsync'd, and failures are ignored: a cache miss only
costs the parse. `GPUCTK_SPEC_CACHE=0` turns it off.
"""

from __future__ import annotations

import os
import time

from gpuctk.fs import stat_identity

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

FILE_NAME = "specs.cache"
FORMAT = "gpuctk-specs-1"
MAX_BYTES = 32 << 20
MAX_ENTRIES = 64
CACHE_ENV = "GPUCTK_SPEC_CACHE"  # =CACHE_OFF: no spec cache, plan or front plan
CACHE_OFF = "0"
SETTLE_NS = 1_000_000_000


class SpecCache:
    """The decoded spec documents of one cache file (see the module docstring)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.path = os.path.join(folder, FILE_NAME)
        self.entries: dict[str, tuple[tuple[int, ...], dict[str, Any]]] = {}
        self.used: set[str] = set()
        self.dirty = False
        self.hits = 0
        self._load()

    @classmethod
    def for_this_process(cls, environ: dict[str, str] | None = None) -> SpecCache | None:
        """The cache in $GPUCTK_STATE_DIR (default /run/gpuctk), or None when turned off."""
        from gpuctk.statedir import state_dir

        env = os.environ if environ is None else environ
        if env.get(CACHE_ENV) == CACHE_OFF:
            return None
        return cls(state_dir(env))

    def _load(self) -> None:
        from gpuctk.writes import load_private_marshal

        doc = load_private_marshal(self.folder, self.path, MAX_BYTES, FORMAT)
        if doc is None:
            return
        entries = doc.get("entries")
        if isinstance(entries, dict):
            self.entries = {
                path: entry
                for path, entry in entries.items()
                if isinstance(path, str)
                and isinstance(entry, tuple)
                and len(entry) == 2
                and isinstance(entry[1], dict)
            }

    def get(self, path: str, st: os.stat_result) -> dict[str, Any] | None:
        """The cached document for `path` if it was cached from a file of this identity."""
        entry = self.entries.get(path)
        if entry is None or entry[0] != stat_identity(st):
            return None
        self.used.add(path)
        self.hits += 1
        return entry[1]

    def put(self, path: str, st: os.stat_result, doc: dict[str, Any]) -> None:
        """Offer a freshly decoded document; kept only if its file has settled."""
        self.used.add(path)
        if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < SETTLE_NS:
            if self.entries.pop(path, None) is not None:
                self.dirty = True
            return
        self.entries[path] = (stat_identity(st), doc)
        self.dirty = True

    def save(self) -> bool:
        """Write the cache if it changed (entries of vanished files dropped); True if written."""
        if not self.dirty:
            return False
        keep = {
            path: entry
            for path, entry in self.entries.items()
            if path in self.used or os.path.exists(path)
        }
        if len(keep) > MAX_ENTRIES:
            keep = {p: e for p, e in keep.items() if p in self.used}
        from gpuctk.writes import save_private_marshal

        if not save_private_marshal(
            self.folder, self.path, {"format": FORMAT, "entries": keep}, MAX_BYTES
        ):
            return False
        self.dirty = False
        return True
