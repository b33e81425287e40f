"""Resolved requests, remembered: the shim's create path without the CDI registry.

What a container gets for a request depends only on the request and the CDI specs: the same
`NVIDIA_VISIBLE_DEVICES=0` on the same spec files always resolves to the same merged edits, the
same notes and the same in-root preparation (the hook's links and folders, the SONAME of each
injected library from its ELF header). gpuctk-runtime resolves a request once, in
full, and keeps the result (a "plan") in `$GPUCTK_STATE_DIR/plans/` (default /run/gpuctk, a
tmpfs), one `marshal` file per request, so that creates running at once each add their own plan
and none overwrites another's (at most MAX_PLANS files: a write past that removes the oldest).
The next create with the same request takes the plan, after a few stat calls, instead of
importing and running the registry, the capability filter, the merge, the hook argument parser
and the ELF reader (a quarter of a create: docs/benchmarks.md).

A plan is keyed on the request as gpuctk.hook.requests.devices read it (kind, device names or driver
only), the raw NVIDIA_DRIVER_CAPABILITIES value and the NVIDIA_REQUIRE_* requirements that
gpuctk.hook.requests.require would check. It is valid for one "world": the spec dirs in force and,
for each, the identity (device, inode, size, mtime, ctime in ns) of the dir and of every spec file
listed in it, plus the identity of this module's own file (any reinstall of gpuctk rewrites it).
A dir's mtime and ctime change when an entry is added, removed or renamed, or its owner or mode
changes; a file's when it is written, chowned or chmodded. So a plan is used only while the trust
policy and the spec contents it was resolved under still hold. Like the spec cache (and with its
SETTLE_NS), a world is recorded only when every dir and file in it had been left alone that long
(coarse kernel timestamps: two writes in one tick could share an identity) and looked the same
before and after the registry read it, and only when the registry reported no error at all. A
dir or file that cannot be looked at (not missing: unreadable) means no world at all.

Failures are never remembered: a request that does not resolve, or whose requirement is unmet,
goes through the full path every time and fails there with its message. The per-container work
stays per container: the request itself, the in-root checks (musl loader, an image file where a
link would go, the image's ld cache) and every write.

A plan file holds its key (the file name is only a checksum of it) and its world.

Trust: read only from a folder owned by this uid that nobody else can write, up to /
(gpuctk.fs.open_private_dir), through its descriptor, and only a file owned by this uid that is
not group/world-writable (checked on the open descriptor): `marshal` is not meant for hostile
input. A remembered plan is used only while every spec dir and file it was resolved from has
the same identity: a folder above them that became writable since cannot have changed them
unseen (a swap or a rewrite gives a new identity), and the next full resolution refuses it.
Anything unexpected is an empty cache; writes are atomic and never fsync'd.
`GPUCTK_SPEC_CACHE=0` turns this off together with the spec cache.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any

    from gpuctk.hook.requests.devices import Request

FOLDER_NAME = "plans"
FORMAT = "gpuctk-plan-5"  # 5: no stage in the prep (its entry runs); the world as entries()
MAX_BYTES = 1 << 20  # one plan
MAX_PLANS = 64
CAPS_ENV = "NVIDIA_DRIVER_CAPABILITIES"  # as gpuctk.hook.requests.drivercaps.ENV


def identity(path: str) -> tuple[int, int, int, int, int] | None:
    """gpuctk.fs.stat_identity of `path` (symlinks followed), None if missing; OSError for
    one that cannot be looked at."""
    from gpuctk.fs import stat_identity

    try:
        return stat_identity(os.stat(path))
    except (FileNotFoundError, NotADirectoryError):
        return None


def key_of(req: Request, env: Mapping[str, str]) -> tuple[Any, ...]:
    """The plan key of a request: what resolution depends on besides the specs."""
    needs = any(k.startswith("NVIDIA_REQUIRE_") or k == "CUDA_VERSION" for k in env)
    # gpuctk.hook.requests.require reads only these (and NVIDIA_DISABLE_REQUIRE with them)
    if needs:
        from gpuctk.hook.requests.require import requirements

        reqs = tuple(requirements(env))
    else:
        reqs = ()
    return (req.kind, req.driver_only, req.devices, env.get(CAPS_ENV), reqs)


def entries(pairs: Iterable[tuple[str, tuple[int, ...] | None]]) -> list[list[Any]]:
    """A world as the plans and the front plans record it: [path, dev, ino, size, mtime_ns,
    ctime_ns] for each (path, identity), [path] for one missing (hook/shimfront.c reads it)."""
    return [[path, *ident] if ident is not None else [path] for path, ident in pairs]


def holds(world: Any) -> bool:
    """Whether each entry of a recorded world (entries()) still has its identity: stat calls
    only. False for anything that is not such a list, or a path that cannot be looked at."""
    try:
        return isinstance(world, list) and all(
            isinstance(entry, list) and entry
            and identity(entry[0]) == (tuple(entry[1:]) if len(entry) > 1 else None)
            for entry in world
        )  # fmt: skip
    except (OSError, TypeError, ValueError):
        return False


def file_name(key: tuple[Any, ...]) -> str:
    """The name of the plan file for `key`: a checksum of its repr (builtin types only, so
    the same in every process). Two keys with one name share a file; the key inside tells."""
    from zlib import crc32

    return f"{crc32(repr(key).encode()):08x}.plan"


class Plans:
    """The remembered plans of one state folder, for one list of spec dirs."""

    def __init__(self, state: str, spec_dirs: Sequence[str]) -> None:
        self.state = state
        self.path = os.path.join(state, FOLDER_NAME)
        self.spec_dirs = tuple(spec_dirs)

    @classmethod
    def for_this_process(
        cls, spec_dirs: Sequence[str], environ: Mapping[str, str] | None = None
    ) -> Plans | None:
        """The plans in $GPUCTK_STATE_DIR (default /run/gpuctk), or None when turned off."""
        from gpuctk.statedir import state_dir

        env = os.environ if environ is None else environ
        if env.get("GPUCTK_SPEC_CACHE", "1") == "0":
            return None
        return cls(state_dir(env), spec_dirs)

    def snapshot(self) -> tuple[Any, ...] | None:
        """The world as it is now: the spec dirs in force, then this module, each spec dir and
        each spec file listed in it, by identity (entries()). None when something in it is
        not settled yet (or cannot be listed)."""
        import time

        from gpuctk.cdi.specs.registry import spec_paths
        from gpuctk.cdi.specs.speccache import SETTLE_NS

        now = time.time_ns()
        pairs = []
        try:
            pairs.append((__file__, identity(__file__)))
            for directory in self.spec_dirs:
                ident = identity(directory)
                pairs.append((directory, ident))
                if ident is not None:
                    pairs += [(path, identity(path)) for path in spec_paths(directory)]
        except OSError:
            return None
        for _, ident in pairs:
            if ident is not None and now - max(ident[3], ident[4]) < SETTLE_NS:
                return None
        return (self.spec_dirs, entries(pairs))

    def _holds(self, world: object) -> bool:
        """Whether a stored world still holds for these spec dirs (holds(): stat calls only,
        no listing: a dir's own identity changes with its entries)."""
        return (
            isinstance(world, tuple)
            and len(world) == 2
            and world[0] == self.spec_dirs
            and holds(world[1])
        )

    def get(self, key: tuple[Any, ...]) -> dict[str, Any] | None:
        """The plan for `key`, if one was remembered in the world that still holds."""
        from gpuctk.writes import load_private_marshal

        doc = load_private_marshal(
            self.path, os.path.join(self.path, file_name(key)), MAX_BYTES, FORMAT
        )
        if doc is None or doc.get("key") != key:
            return None
        plan = doc.get("plan")
        if not isinstance(plan, dict) or not self._holds(doc.get("world")):
            return None
        return plan

    def offer(
        self, key: tuple[Any, ...], before: tuple[Any, ...] | None, plan: dict[str, Any]
    ) -> bool:
        """Remember `plan` if the world `before` the resolution is the world after it; True
        if written."""
        from gpuctk.fs import private_folder
        from gpuctk.writes import save_private_marshal

        if before is None or self.snapshot() != before:
            return False
        if not private_folder(self.state, create=True):
            return False
        doc = {"format": FORMAT, "key": key, "world": before, "plan": plan}
        name = file_name(key)
        if not save_private_marshal(self.path, os.path.join(self.path, name), doc, MAX_BYTES):
            return False
        evict(self.path, name, ".plan", MAX_PLANS)
        return True


def evict(folder: str, keep: str, suffix: str, most: int) -> None:
    """Remove the oldest `suffix` files of the private `folder` past `most` (never `keep`).
    Errors are ignored: creates at once may evict the same file, and a lost plan is only
    resolved again."""
    from gpuctk.errors import GpuctkError
    from gpuctk.fs import open_private_dir

    try:
        dir_fd = open_private_dir(folder)
    except (GpuctkError, OSError):
        return
    try:
        lfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            names = [n for n in os.listdir(lfd) if n.endswith(suffix) and n != keep]
        finally:
            os.close(lfd)
        aged = []
        if len(names) >= most:
            for n in names:
                st = os.stat(n, dir_fd=dir_fd, follow_symlinks=False)
                aged.append((st.st_mtime_ns, n))
        for _, n in sorted(aged)[: len(aged) - most + 1]:
            os.unlink(n, dir_fd=dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
