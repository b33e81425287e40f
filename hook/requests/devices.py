"""Which CDI devices a container asks for, read from its OCI config (config.json) as a dict.

Sources, in this order; the first that names anything is the request (as the reference
nvidia-container-runtime in CDI mode, internal/modifier/cdi.go, does):

1. annotations whose key starts with a configured prefix (default `cdi.k8s.io/`): the value is
   a comma-separated list of fully qualified names (`nvidia.com/gpu=0`), as the Kubernetes
   device plugin writes them; an unqualified name there is an error;
2. when `accept-volume-mounts` is on (off by default): `/dev/null` mounts at
   `/var/run/nvidia-container-devices/<name>` (a bare name: `0`, `GPU-...`, `all`) or
   `/var/run/nvidia-container-devices/cdi/<vendor>/<class>/<name>`;
3. NVIDIA_VISIBLE_DEVICES (the last value wins when the env lists it twice), comma-separated:
   `void`, empty or unset: nothing at all; `none`: the driver files without any GPU; `all`;
   indices `0,1`; MIG `0:1`; `GPU-`/`MIG-` UUIDs; qualified names (`nvidia.com/gpu=0`). Any
   `void` wins over `none`, which wins over `all`, which wins over a list. Honoured for an
   unprivileged container (no CAP_SYS_ADMIN in the bounding set) only as
   `accept-envvar-unprivileged` says (env_allowed): `true`, `false`, or `auto` (the default):
   not in a Kubernetes container, yes elsewhere. A request ignored so is one note (a warning
   line: why, and what to set), and its value is not parsed.

Kubernetes container (is_kubernetes): config.json carries the CRI runtime's own annotations,
which it sets on every container it creates and which neither a pod nor an image can remove:
containerd's CRI plugin (1.6, 1.7, 2.x) `io.kubernetes.cri.container-type` and
`io.kubernetes.cri.sandbox-id`; CRI-O `io.kubernetes.cri-o.ContainerType` with its
`io.container.manager` not `libpod` (podman sets the same ContainerType key on the containers
of its own pods, and marks them `libpod`; CRI-O marks its own `cri-o`). There the orchestrator
grants GPUs (CDI annotations or the CRI CDI field, the device plugin's mounts), and an env entry
may as well be the image's own (`ENV NVIDIA_VISIBLE_DEVICES=all` in every CUDA base image) as
the plugin's `envvar` strategy: it is no grant. Setting those annotations by hand (podman
`--annotation`, docker `--annotation`) only makes the rule stricter.

A request from the device list (sources 2 and 3) that names GPUs also carries the IMEX channels
the container asks for (NVIDIA_IMEX_CHANNELS, `imex/<N>` mounts: gpuctk.hook.requests.imex) as
nvidia.com/imex-channel devices; one without a GPU (`none`) never does, and neither does a
request from annotations (the orchestrator names channels there itself).

Bare names get the configured default kind. Sources 2 and 3, the device list, are written by
the image or request author, not the orchestrator: they select devices of the default kind
only, and of the kinds the config's `device-list-kinds` names; a qualified name of any other
kind (another vendor's spec, gpuctk's own nvidia.com/nic) is a RequestError. Other kinds come
from CDI annotations (or the engine's own CDI field). Input is bounded: at most MAX_DEVICES
names, each at most MAX_NAME_LEN bytes, charset checked; violations raise RequestError.
"""

from __future__ import annotations

from gpuctk.errors import RequestError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Container, Iterable, Mapping
    from typing import Any

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
ANNOTATIONS = "annotations"  # a Request's source when CDI annotations ask
DEVICE_MOUNTS = "mounts"  # a Request's source when device-list mounts ask
MOUNTS_ROOT = "/var/run/nvidia-container-devices"
IMEX_MOUNTS = "imex/"  # IMEX channel mounts (gpuctk.hook.requests.imex)
IMEX_ENV = "NVIDIA_IMEX_CHANNELS"
MAX_DEVICES = 1024
MAX_NAME_LEN = 256  # a qualified name: vendor/class=name
MAX_VALUE_LEN = 256 * 1024  # one env value or annotation value
CAP_SYS_ADMIN = "CAP_SYS_ADMIN"
# set by the CRI runtime on every container it creates (see the module docstring)
CRI_MARKERS = ("io.kubernetes.cri.container-type", "io.kubernetes.cri.sandbox-id")
CRIO_MARKER = "io.kubernetes.cri-o.ContainerType"
KUBERNETES_MARKERS = (*CRI_MARKERS, CRIO_MARKER)
MANAGER = "io.container.manager"  # podman: `libpod`, CRI-O: `cri-o`
ENVVAR_FIX = (
    "grant GPUs through the device plugin's --device-list-strategy=cdi-annotations or "
    "cdi-cri (or volume-mounts with accept-volume-mounts = true), or set "
    "accept-envvar-unprivileged = true in the gpuctk config knowingly (any image may then take "
    "every GPU)"
)


class Request:
    """What a container asked for: qualified `devices`, and/or `driver_only`
    (NVIDIA_VISIBLE_DEVICES=none) for `kind`'s spec-level edits without a GPU (`devices` then
    holds IMEX channels only); `source` says where it came from ("" when nothing was asked);
    `notes` are messages worth logging (ignored requests)."""

    __slots__ = ("devices", "driver_only", "kind", "notes", "source")

    def __init__(
        self,
        devices: Iterable[str] = (),
        *,
        source: str = "",
        driver_only: bool = False,
        kind: str = "",
        notes: Iterable[str] = (),
    ) -> None:
        self.devices = tuple(devices)
        self.source = source
        self.driver_only = driver_only
        self.kind = kind
        self.notes = tuple(notes)

    def __bool__(self) -> bool:
        return bool(self.devices) or self.driver_only

    def __repr__(self) -> str:
        what = "driver only" if self.driver_only else ",".join(self.devices) or "nothing"
        return f"Request({what} from {self.source or '-'})"


def _is_qualified(name: str) -> bool:
    from gpuctk.cdi.specs.names import is_qualified_name

    return is_qualified_name(name)


def _bare_name_problem(name: str) -> str | None:
    from gpuctk.cdi.specs.names import device_name_problem

    return device_name_problem(name)


def _check_bounds(names: list[str], where: str) -> None:
    if len(names) > MAX_DEVICES:
        raise RequestError(f"{where}: {len(names)} devices requested; at most {MAX_DEVICES}")
    for name in names:
        if len(name) > MAX_NAME_LEN:
            raise RequestError(
                f"{where}: device name {name[:40]!r}... is {len(name)} characters long; "
                f"at most {MAX_NAME_LEN}"
            )
        if "\x00" in name:
            raise RequestError(f"{where}: device name {name!r} contains a NUL character")


def _qualify(name: str, kind: str, where: str, kinds: Container[str] = ()) -> str:
    """The qualified form of one device-list name: kind prefixed to a bare name; a qualified
    name only of `kind` or one of `kinds`."""
    if "=" in name or "/" in name:
        if not _is_qualified(name):
            from gpuctk.cdi.specs.names import qualified_name_problem

            raise RequestError(f"{where}: {qualified_name_problem(name)}")
        named = name.partition("=")[0]
        if named != kind and named not in kinds:
            raise RequestError(
                f"{where}: {name!r} is of kind {named}; the device list (NVIDIA_VISIBLE_DEVICES, "
                f"device mounts) selects {kind} devices only: ask for it with a CDI annotation "
                "(cdi.k8s.io/...) or the engine's CDI devices, or name the kind in "
                "device-list-kinds in the gpuctk config"
            )
        return name
    problem = _bare_name_problem(name)
    if problem:
        raise RequestError(f"{where}: {problem}")
    return f"{kind}={name}"


def _dedupe(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))


def from_annotations(annotations: Any, prefixes: Iterable[str]) -> list[str]:
    """Qualified names from annotations with one of `prefixes` (keys sorted: deterministic)."""
    if not isinstance(annotations, dict) or not annotations:
        return []
    prefixes = tuple(prefixes)
    found: list[str] = []
    for key in sorted(annotations):
        if not isinstance(key, str) or not key.startswith(prefixes):
            continue
        value = annotations[key]
        where = f"annotation {key!r}"
        if not isinstance(value, str):
            raise RequestError(f"{where}: value must be a string")
        if len(value) > MAX_VALUE_LEN:
            raise RequestError(f"{where}: value longer than {MAX_VALUE_LEN} characters")
        names = [n.strip() for n in value.split(",")]
        _check_bounds(names, where)
        for name in names:
            if not _is_qualified(name):
                raise RequestError(
                    f"{where}: invalid device name {name!r} (expected a fully qualified CDI "
                    "name such as nvidia.com/gpu=0)"
                )
            found.append(name)
    names = _dedupe(found)
    _check_bounds(names, "annotations")
    return names


def request_mounts(mounts: Any) -> list[str]:
    """The paths, relative to /var/run/nvidia-container-devices/, of the `/dev/null` mounts
    under it (the device plugin's volume-mounts strategy); a `..` there is a RequestError."""
    if not isinstance(mounts, list):
        return []
    import posixpath

    root = MOUNTS_ROOT + "/"
    found: list[str] = []
    for mount in mounts:
        if not isinstance(mount, dict):
            continue
        source, dest = mount.get("source"), mount.get("destination")
        if not isinstance(source, str) or not isinstance(dest, str):
            continue
        if posixpath.normpath(source) != "/dev/null":
            continue
        norm = posixpath.normpath(dest)
        if ".." in dest.split("/") and (dest.startswith(root) or norm.startswith(root)):
            raise RequestError(f"mount {dest[:120]!r}: '..' in a device request mount")
        if norm.startswith(root):
            found.append(norm[len(root) :])
    return found


def from_mounts(mounts: Any, kind: str, kinds: Container[str] = ()) -> list[str]:
    """Names from `/dev/null` mounts under /var/run/nvidia-container-devices, of `kind` (bare
    names) or one of `kinds`."""
    root = MOUNTS_ROOT + "/"
    found: list[str] = []
    for rel in request_mounts(mounts):
        where = f"mount {root + rel!r}"
        if rel.startswith(IMEX_MOUNTS):  # IMEX channels: gpuctk.hook.requests.imex
            continue
        if rel.startswith("cdi/"):
            parts = rel[4:].split("/")
            if len(parts) != 3:
                raise RequestError(f"{where}: expected {root}cdi/<vendor>/<class>/<name>")
            name = f"{parts[0]}/{parts[1]}={parts[2]}"
            _check_bounds([name], where)
            found.append(_qualify(name, kind, where, kinds))
        else:
            _check_bounds([rel], where)
            if "/" in rel:
                raise RequestError(f"{where}: expected {root}<name> or {root}cdi/...")
            found.append(_qualify(rel, kind, where, kinds))
    names = _dedupe(found)
    _check_bounds(names, "mounts")
    return names


def env_value(env: Any, key: str) -> str | None:
    """The value of `key` in an OCI env list (the last entry wins), None when unset."""
    value = None
    if isinstance(env, list):
        prefix = key + "="
        for item in env:
            if isinstance(item, str) and item.startswith(prefix):
                value = item[len(prefix) :]
    return value


def env_map(env: Any) -> dict[str, str]:
    """An OCI env list as a dict (the last entry for a key wins)."""
    out: dict[str, str] = {}
    if isinstance(env, list):
        for item in env:
            if isinstance(item, str):
                key, sep, value = item.partition("=")
                if sep:
                    out[key] = value
    return out


def from_visible_devices(
    value: str | None, kind: str, kinds: Container[str] = ()
) -> tuple[list[str], bool]:
    """(qualified names, driver_only) for an NVIDIA_VISIBLE_DEVICES value: names of `kind`
    (bare or qualified) or, qualified, of one of `kinds`."""
    if value is None:
        return [], False
    if len(value) > MAX_VALUE_LEN:
        raise RequestError(f"{VISIBLE_DEVICES}: longer than {MAX_VALUE_LEN} characters")
    names = [n.strip() for n in value.split(",")]
    names = [n for n in names if n]
    if not names or "void" in names:
        return [], False
    if "none" in names:
        return [], True
    if "all" in names:
        names = ["all"]
    _check_bounds(names, VISIBLE_DEVICES)
    names = _dedupe(_qualify(n, kind, VISIBLE_DEVICES, kinds) for n in names)
    return names, False


def is_privileged(config: Mapping[str, Any]) -> bool:
    """CAP_SYS_ADMIN in process.capabilities.bounding (the reference's test for --privileged)."""
    process = config.get("process")
    caps = process.get("capabilities") if isinstance(process, dict) else None
    bounding = caps.get("bounding") if isinstance(caps, dict) else None
    return isinstance(bounding, list) and CAP_SYS_ADMIN in bounding


def is_kubernetes(config: Mapping[str, Any]) -> bool:
    """Whether the CRI runtime's own annotations mark `config` as a Kubernetes container."""
    annotations = config.get("annotations")
    if not isinstance(annotations, dict):
        return False
    if any(key in annotations for key in CRI_MARKERS):
        return True
    return CRIO_MARKER in annotations and annotations.get(MANAGER) != "libpod"


def env_allowed(config: Mapping[str, Any], accept_unprivileged: bool | None) -> str:
    """Why an env request (NVIDIA_VISIBLE_DEVICES, NVIDIA_IMEX_CHANNELS) in `config` is ignored
    under `accept-envvar-unprivileged` (None: auto); "" when it is honoured."""
    if accept_unprivileged is True or is_privileged(config):
        return ""
    if accept_unprivileged is False:
        return "an unprivileged container (accept-envvar-unprivileged = false)"
    if is_kubernetes(config):
        return (
            "an unprivileged Kubernetes container, where the image may have set it and the "
            "orchestrator grants GPUs otherwise (accept-envvar-unprivileged = auto)"
        )
    return ""


def ignored_note(key: str, value: str, why: str) -> str:
    """The warning line of an env request ignored for `why` (env_allowed)."""
    shown = value if len(value) <= 80 else value[:80] + "..."
    return f"ignoring {key}={shown} in {why}: no GPU from it; {ENVVAR_FIX}"


def asks(value: str | None) -> bool:
    """Whether an env value would ask for anything (as from_visible_devices and
    gpuctk.hook.requests.imex.from_env read it), without parsing its names."""
    names = {n.strip() for n in value.split(",")} - {""} if value is not None else set()
    return bool(names) and "void" not in names


def requested(
    config: Mapping[str, Any],
    *,
    kind: str = "nvidia.com/gpu",
    annotation_prefixes: Iterable[str] = ("cdi.k8s.io/",),
    accept_volume_mounts: bool = False,
    accept_envvar_unprivileged: bool | None = None,
    device_list_kinds: Iterable[str] = (),
) -> Request:
    """The request in the OCI config dict `config` (see the module docstring);
    `accept_envvar_unprivileged`: None for auto; `device_list_kinds`: the kinds besides `kind`
    that the device list may name."""
    names = from_annotations(config.get("annotations"), annotation_prefixes)
    if names:
        return Request(names, source=ANNOTATIONS, kind=kind)
    kinds = frozenset(device_list_kinds)
    process = config.get("process")
    env = process.get("env") if isinstance(process, dict) else None
    refused = env_allowed(config, accept_envvar_unprivileged)
    if accept_volume_mounts:
        names = from_mounts(config.get("mounts"), kind, kinds)
        if names:
            return _with_imex(Request(names, source=DEVICE_MOUNTS, kind=kind), config, env, refused)
    value = env_value(env, VISIBLE_DEVICES)
    if refused:
        notes = [ignored_note(VISIBLE_DEVICES, value or "", refused)] if asks(value) else []
        return Request(kind=kind, notes=notes)  # IMEX channels come only beside a GPU
    names, driver_only = from_visible_devices(value, kind, kinds)
    if not names:  # nothing, or `none`: the driver files without a GPU, so no IMEX channel
        return Request(kind=kind, source=VISIBLE_DEVICES if driver_only else "",
                       driver_only=driver_only)  # fmt: skip
    req = Request(names, source=VISIBLE_DEVICES, kind=kind)
    return _with_imex(req, config, env, refused, mounts=accept_volume_mounts)


def _with_imex(
    req: Request, config: Mapping[str, Any], env: Any, refused: str, *, mounts: bool = True
) -> Request:
    """`req` (GPUs from the device list) with the IMEX channels the container asks for
    (gpuctk.hook.requests.imex; `mounts`: volume mounts accepted; `refused`: why the env is not
    honoured, "" when it is)."""
    value = env_value(env, IMEX_ENV)
    if value is None and not mounts:
        return req
    from gpuctk.hook.requests import imex

    found = request_mounts(config.get("mounts")) if mounts else []
    rels = [rel for rel in found if rel.startswith(IMEX_MOUNTS)]
    channels, notes = imex.requested(value, rels, refused=refused)
    if not channels and not notes:
        return req
    devices = _dedupe([*req.devices, *channels])
    _check_bounds(devices, "device requests")
    return Request(
        devices, source=req.source, driver_only=req.driver_only, kind=req.kind,
        notes=[*req.notes, *notes],
    )  # fmt: skip
