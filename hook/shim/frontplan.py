"""Front plans: what lets gpuctk-runtime's create run without Python (hook/shimfront.c).

When the shim has resolved a request in full (gpuctk.hook.shim.plans), it also writes, where it can,
the request's edits in the shape the compiled front applies them:
`$GPUCTK_STATE_DIR/front/<key checksum>.json` (default /run/gpuctk, a tmpfs). The next create
with the same key then goes from the front (`gpuctk-cdi-hook runtime-front`) to its compiled
create, which reads
config.json, finds the plan, applies it, writes config.json back and execs the runtime, in
about a millisecond; anything it does not fully understand goes to Python as before.

The key is what the request and its edits depend on besides the specs and the config
(gpuctk.hook.requests.devices, gpuctk.hook.requests.require, gpuctk.hook.requests.drivercaps, the
device nodes' owner in gpuctk.cdi.specs.apply). The compiled create alone computes it
(hook/shimfront.c request_key); the shim asks it (gpuctk.hook.shim.frontkey) for the config's text
as read, and writes the plan under the file name and key it says. So only a shim started by the
launchers' front (gpuctk.install.launchers, which names it) writes plans: nothing else would read
them. The key: every env entry that starts with `NVIDIA_` or `CUDA_VERSION`, in order;
`privileged=0|1` (CAP_SYS_ADMIN in the bounding set); `uid=N`, `gid=N` (process.user); `env=N` and
each env entry's name (up to its `=`), `mounts=N` and each mount destination, `device-list=K` and
the source of each of the K mounts whose destination names nvidia-container-devices (with its
destination, what a volume-mounts request is read from: gpuctk.hook.requests.devices), `devices=N`
and each `linux.devices` path (the places the edits land, so that the plan can say where);
`markers=K` and the key of each of the K annotations that tell a Kubernetes container
(devices.KUBERNETES_MARKERS, and devices.MANAGER with its value: whether an unprivileged env
request is a grant there, devices.env_allowed), in the document's order; then the key and the
value of each annotation whose key starts with one of the config's CDI annotation prefixes, in the
document's order. Those prefixes are Python's to decide: `front/keyed-on` names them (for the
config file in force) for the front to build the key with, and each plan names those it was keyed
on (`cdi_prefixes`). The front sends anything else that could carry a request to Python: a
device-list mount whose source is not a plain string, a keyed env entry or an env entry's name
that is not printable ASCII without a quote or a backslash once its escapes are decoded (the key
holds the decoded text: Go's JSON, every engine's, writes <, > and & as escapes, as in every CUDA
image's NVIDIA_REQUIRE_CUDA), an escape in a CDI annotation or in io.container.manager's value.

A plan is written only for a request from CDI annotations, device-list mounts or
NVIDIA_VISIBLE_DEVICES that resolved with no note and no error, in a world
(gpuctk.hook.shim.plans.Plans.snapshot, plus the config file) left alone for SETTLE_NS, whose edits
are env, device nodes, bind mounts and hooks only, each device path and mount destination once, and
whose hooks are all `gpuctk-cdi-hook createContainer` entries (the compiled front of the spec hook)
with the device node guard on or disabled in the entry itself. The front keeps that entry where the
Python shim does its work in the shim (gpuctk.hook.shim.shimroot): inside runc it does nothing for
the common image and hands the rest to gpuctk-hook, and it guards /proc/driver/nvidia/params, so
every image is served as an engine that applies the spec itself (podman, containerd's CDI) serves
it.

The edits are what gpuctk.cdi.specs.apply makes of them on a config with the key's names (`render`):
the new env, mounts and linux.devices lists as recipes, each item the index of the config's item
that stands there or an item of the edits' (env by key, device entries by path, mounts by
destination then by depth: apply's rules, written nowhere else), the cgroup rules and each hook
stage's entries as apply appends them; the front only assembles them. `world` is the identity of
gpuctk's code, the config file, the spec dirs and files, checked at every create. `lines` are the
shim's `injected` line as gpuctk.log writes it (shim_lines) for the engine's --log by its format and
for the config's `log-file`, with the time and the container id as marks the front fills (the time
as gpuctk.log.STAMP_FORMAT and the lines' `zone`, while the local offset is the zone's): the front
writes them where the shim would, and knows no line format and no zone's spelling (no plan at the
debug level, where the shim logs more).

Which host files root may use (hook files, mount sources, device nodes, the runtime, the log
file) is decided in Python when a plan is written, and the plan's `chain` and `log_id` let the
front check they are still what was decided (gpuctk.hook.shim.filechain): the front checks no
rule of its own there, and takes the plan only with its `runtime`.

Trust: written only into a folder this uid alone can write, up to / (open_private_dir), mode 0600,
and only where the front reads plans (its private_folder: no link on the way; front-key says, and a
shim whose state folder fails it warns what to set instead of writing plans nobody reads). Writes
are atomic, never fsync'd, at most MAX_PLANS files: a write past that removes the plans the front
read longest ago (it sets a plan's mtime when it reads it). `GPUCTK_SPEC_CACHE=0` turns this off
with the other caches.
"""

from __future__ import annotations

import os

from gpuctk.cdi.node import facts

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from gpuctk.cdi.specs.shape import EditsDoc
    from gpuctk.hook.config import Settings
    from gpuctk.hook.requests.devices import Request
    from gpuctk.hook.shim.frontkey import FrontKey

FOLDER_NAME = "front"
FORMAT = "gpuctk-front-plan-7"
PREFIXES_NAME = "keyed-on"  # no .json: never evicted with the plans
PREFIXES_FORMAT = "gpuctk-front-prefixes-1"
CONFIG_FIELD = "config"  # a plan's and the prefixes' field: the config file they were made for
RUNTIME_FIELD = "runtime"  # a plan's field: the low-level runtime it was made for
MAX_PLANS = 256  # a plan per request and shape of container; the ones read longest ago go
MAX_BYTES = 1 << 20
SHIM_FRONT_ENV = "GPUCTK_SHIM_FRONT"  # =off (gpuctk.cdi.node.facts.FRONT_OFF): all to Python
SHIM_FRONT_TRACE_ENV = "GPUCTK_SHIM_FRONT_TRACE"  # set: say which way each create went
_EDIT_KEYS = frozenset(("env", "deviceNodes", "mounts", "hooks"))


def keep(
    compiled: str,
    config: bytes,
    state: str,
    req: Request,
    edits: EditsDoc,
    settings: Settings,
    world: Callable[[], tuple[Any, ...] | None],
    runtime: str,
    warn: Callable[[str], None],
) -> bool:
    """Write the front plan of this request unless one that holds is there: for the compiled
    create `compiled` (the launchers' gpuctk-cdi-hook; "" when none runs: no plan), the OCI
    config whose text was `config` before any edit, the `edits` resolved in `world()`
    (Plans.snapshot, called only where a plan may be written; None: not settled), a create
    that execs `runtime`. True if written. Where the compiled create would read no plan from
    the front folder (its rule, asked with the key), `warn` says so and nothing is written."""
    if not compiled or not runtime:
        return False
    edits = guarded(edits, settings, compiled)
    if not eligible(req, edits, settings):
        return False
    from gpuctk.fs import private_folder
    from gpuctk.hook.shim.frontkey import key_of
    from gpuctk.statedir import STATE_DIR_ENV

    folder = os.path.join(state, FOLDER_NAME)
    if not private_folder(folder, create=True):  # Python's own rule: no plan
        return False
    key = key_of(compiled, config, settings.annotation_prefixes, state)
    if key is None:
        return False
    if not key.folder:
        warn(
            f"the compiled create reads no plan from {folder} (a symlink on the way to it, or a "
            "folder others can write), so every GPU create here starts Python; fix: set "
            f"{STATE_DIR_ENV} to the real path, in folders root alone can write"
        )
        return False
    if current(state, key, settings.annotation_prefixes):
        return False
    held = world()
    return held is not None and offer(state, key, req, edits, settings, held, runtime)


def guarded(edits: EditsDoc, settings: Settings, compiled: str) -> EditsDoc:
    """`edits` with the device node guard's entry where the Python create adds one
    (gpuctk.hook.verbs.nodeguard: the same rule), naming the compiled create's
    gpuctk-cdi-hook for a spec with no gpuctk hook entry."""
    from gpuctk.hook.shim.shimroot import gpuctk_hooks
    from gpuctk.hook.verbs.nodeguard import guard, mode

    return guard(edits, gpuctk_hooks(edits), mode(settings), lambda _: None, path=compiled)


def eligible(req: Request, edits: EditsDoc, settings: Settings) -> bool:
    """Whether the compiled create could apply these edits for this request."""
    from gpuctk.cdi.specs.apply import BIND_TYPES
    from gpuctk.hook.requests.devices import ANNOTATIONS, DEVICE_MOUNTS, VISIBLE_DEVICES

    if req.source not in (VISIBLE_DEVICES, ANNOTATIONS, DEVICE_MOUNTS) or req.notes:
        return False
    if any(v for k, v in edits.items() if k not in _EDIT_KEYS):
        return False
    mounts = edits.get("mounts") or []
    nodes = edits.get("deviceNodes") or []
    if len({m["containerPath"] for m in mounts}) != len(mounts):
        return False
    if len({n["path"] for n in nodes}) != len(nodes):
        return False
    if any((m.get("type") or "") not in BIND_TYPES for m in mounts):
        return False
    for hook in edits.get("hooks") or []:
        args = list(hook.get("args") or [])
        if (
            hook.get("hookName") != facts.HOOK_VERB
            or os.path.basename(hook["path"]) != facts.COMPILED_HOOK
            or (args[1:2] != [facts.HOOK_VERB] and args[1:] != [facts.GUARD_ACTION])
        ):
            return False
        if not settings.disable_device_node_modification and facts.GUARD_ACTION not in args:
            return False  # the entry would guard where this config says not to
    return True


def _identities(
    world: tuple[Any, ...], conf: str, settings: Settings, nodes: list[str]
) -> list[list[Any]] | None:
    """The plans' world (Plans.snapshot), this module, the config file as `settings` were read
    from it (its identity then: a file changed since is not this plan's) and the host `nodes`
    whose numbers the edits take from the host, as gpuctk.hook.shim.plans.entries records
    them; None when the config is not settled or a file cannot be looked at."""
    import time

    from gpuctk.cdi.specs.speccache import SETTLE_NS
    from gpuctk.hook.shim.plans import entries, identity

    conf_id = settings.source_identity if settings.source else None
    if settings.source and (settings.source != conf or conf_id is None):
        return None
    if conf_id is not None and time.time_ns() - max(conf_id[3], conf_id[4]) < SETTLE_NS:
        return None
    try:
        pairs = [(__file__, identity(__file__)), (conf, conf_id),
                 *((n, identity(n)) for n in nodes)]  # fmt: skip
    except OSError:
        return None
    if any(ident is None for _, ident in (pairs[:1] + pairs[2:])):
        return None
    return [*world[1], *entries(pairs)]


class _At(str):
    """An env entry's name in the config a recipe is made for, and its index there."""

    at: int

    def __new__(cls, name: str, at: int) -> _At:
        made = super().__new__(cls, name)
        made.at = at
        return made


_AT = "\0at"  # the member of a mount or device placeholder that holds its index (not JSON's)


def render(edits: EditsDoc, key: FrontKey) -> dict[str, Any]:
    """The plan's edits: what gpuctk.cdi.specs.apply (host paths checked) makes of `edits` on a
    config with `key`'s names and user, env, mounts and linux.devices as recipes (the new list,
    each item the index of the config's item there or an item of the edits'; None: untouched),
    the cgroup rules and each hook stage's entries as apply appends them."""
    from gpuctk.cdi.specs import apply

    config: dict[str, Any] = {
        "process": {
            "env": [_At(name, i) for i, name in enumerate(key.env)],
            "user": {"uid": key.uid, "gid": key.gid},
        },
        "mounts": [{"destination": d, _AT: i} for i, d in enumerate(key.mounts)],
        "linux": {
            "devices": [{"path": p, _AT: i} for i, p in enumerate(key.devices)],
            "resources": {"devices": []},
        },
        "hooks": {},
    }
    apply.apply(config, edits)
    return {
        "env": _recipe(config["process"]["env"]) if edits.get("env") else None,
        "devices": _recipe(config["linux"]["devices"]) if edits.get("deviceNodes") else None,
        "rules": config["linux"]["resources"]["devices"],
        "mounts": _recipe(config["mounts"]) if edits.get("mounts") else None,
        "hooks": config["hooks"],
    }


def _recipe(items: list[Any]) -> list[Any]:
    """Each item the index of a placeholder (the config's item there), else the item itself."""
    return [
        item.at if isinstance(item, _At)
        else item[_AT] if isinstance(item, dict) and _AT in item
        else item
        for item in items
    ]  # fmt: skip


def offer(
    state: str,
    key: FrontKey,
    req: Request,
    edits: EditsDoc,
    settings: Settings,
    world: tuple[Any, ...],
    runtime: str,
) -> bool:
    """Write the front plan of `key` for `edits` (as `keep`); True if written."""
    from gpuctk.errors import GpuctkError
    from gpuctk.hook.config import config_path
    from gpuctk.hook.requests.cdiedits import injected
    from gpuctk.hook.shim import filechain
    from gpuctk.log import ID_MARK, STAMP_MARK, shim_lines

    conf, _ = config_path(os.environ)
    nodes = edits.get("deviceNodes") or []
    numbered = [n.get("hostPath") or n["path"] for n in nodes
                if not (n.get("type") and "major" in n and "minor" in n)]  # fmt: skip
    identities = _identities(world, conf, settings, numbered)  # before the numbers are read
    log_file = settings.log_file or ""
    trusted = filechain.trusted_chain(edits, runtime, log_file)
    if identities is None or trusted is None:
        return False
    chain, log_id = trusted
    said = injected(ID_MARK, req)  # the shim's info line, in the same logs
    lines = shim_lines(settings.log_level, log_file, said)
    if lines is None or STAMP_MARK in said or said.count(ID_MARK) != 1:
        return False
    try:
        lists = render(edits, key)
    except GpuctkError:
        return False
    doc = {
        "format": FORMAT,
        "key": key.key,
        CONFIG_FIELD: conf,
        "world": identities,
        "cdi_prefixes": list(settings.annotation_prefixes),
        "lines": lines,
        "log_file": log_file,
        "log_id": log_id,
        RUNTIME_FIELD: runtime,
        "chain": [[path, *ident] for path, ident in sorted(chain.items())],
        **lists,
    }
    if not _keyed_on(state, conf, list(settings.annotation_prefixes)):
        return False
    return _write(state, key.file, doc)


def current(state: str, key: FrontKey, cdi_prefixes: Sequence[str]) -> bool:
    """Whether the front plan of `key` is there, its world still holds, its lines' zone is
    the local one (the offset changes twice a year where clocks change) and `front/keyed-on`
    names `cdi_prefixes` for this config: a create that found the request's plan then need
    not offer one again."""
    from gpuctk.hook.config import config_path
    from gpuctk.hook.shim import filechain, plans
    from gpuctk.jsonfast import loads
    from gpuctk.log import stamp_zone
    from gpuctk.writes import read_private

    folder = os.path.join(state, FOLDER_NAME)
    data = read_private(folder, os.path.join(folder, key.file), MAX_BYTES)
    try:  # read as the front reads it: a file of ours alone, no link
        doc = loads(data.decode()) if data is not None else None
    except ValueError:
        return False
    return (
        isinstance(doc, dict)
        and doc.get("format") == FORMAT
        and doc.get("key") == key.key
        and doc.get(CONFIG_FIELD) == config_path(os.environ)[0]
        and isinstance(doc.get("lines"), dict)
        and doc["lines"].get("zone", None) in (None, stamp_zone())
        and plans.holds(doc.get("world"))
        and filechain.holds(doc.get("chain"))
        and _keyed_on_holds(state, doc[CONFIG_FIELD], list(cdi_prefixes))
    )


def _keyed_on(state: str, conf: str, cdi_prefixes: list[str]) -> bool:
    """`front/keyed-on` names `cdi_prefixes` for the config file `conf` (written if not)."""
    return _keyed_on_holds(state, conf, cdi_prefixes) or _write(
        state, PREFIXES_NAME, _keyed_on_doc(conf, cdi_prefixes)
    )


def _keyed_on_doc(conf: str, cdi_prefixes: list[str]) -> dict[str, Any]:
    return {"format": PREFIXES_FORMAT, CONFIG_FIELD: conf, "prefixes": cdi_prefixes}


def _keyed_on_holds(state: str, conf: str, cdi_prefixes: list[str]) -> bool:
    from gpuctk.jsonfast import loads
    from gpuctk.writes import read_private

    doc = _keyed_on_doc(conf, cdi_prefixes)
    folder = os.path.join(state, FOLDER_NAME)
    data = read_private(folder, os.path.join(folder, PREFIXES_NAME), MAX_BYTES)
    try:
        return data is not None and bool(loads(data.decode()) == doc)
    except ValueError:
        return False


def _write(state: str, name: str, doc: dict[str, Any]) -> bool:
    from gpuctk.fs import private_folder
    from gpuctk.hook.shim.plans import evict
    from gpuctk.jsonfast import dumps
    from gpuctk.writes import write_private

    data = dumps(doc)
    folder = os.path.join(state, FOLDER_NAME)
    if not data.isascii() or not private_folder(state, create=True):
        return False
    if not write_private(folder, os.path.join(folder, name), data, MAX_BYTES):
        return False
    evict(folder, name, ".json", MAX_PLANS)
    return True
