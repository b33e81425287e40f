"""`gpuctk doctor`'s device-plugin checks (kubernetes layer), from the kubelet's folder
`<kubelet-root>/device-plugins` and its checkpoint there (gpuctk.doctor.checkpoint):

- kubernetes.device-plugin: a device plugin for the kind's vendor serves the node: gpuctk's
  (`gpuctk-<resource>.sock`, `gpuctk device-plugin`) or NVIDIA's (`nvidia-*.sock`), its socket
  listening (one nobody listens on is a plugin that is gone) and its resources registered
  (in the checkpoint's RegisteredDevices). Without one, pods that request nvidia.com/gpu stay
  Pending ("Insufficient nvidia.com/gpu").
- kubernetes.device-plugin-names: what the plugin hands out resolves in the CDI specs the cdi
  layer read (the shim's spec dirs): for each container the checkpoint gave devices of the
  vendor (whose pod is still on the node), the CDI devices and `cdi.k8s.io/` annotations of
  the plugin's answer, else the NVIDIA_VISIBLE_DEVICES list or device mounts it passed, as
  the shim reads them (gpuctk.hook.requests.devices), else its device IDs. A name no spec defines
  fails (that container cannot start, nor restart); a device gpuctk's plugin advertises that no
  spec names is a warning (the next pod given it fails).
"""

from __future__ import annotations

import errno
import os
import socket
import stat

from gpuctk.doctor import checkpoint
from gpuctk.doctor.cdi import REFRESH_UNIT_DIRS, _shown, generate_fix
from gpuctk.doctor.checkpoint import Checkpoint, Entry
from gpuctk.doctor.context import Context, Findings
from gpuctk.doctor.report import Result, failed, ok, skipped, warning

SERVICE = "gpuctk-device-plugin"  # the deb's unit, shipped disabled
DAEMONSET = "kubectl apply -k packaging/kubernetes/device-plugin"
RESTART_DS = "kubectl -n gpuctk-system rollout restart daemonset/gpuctk-device-plugin"
PLUGIN = ("kubernetes.device-plugin", "GPU device plugin registered with the kubelet")
NAMES = ("kubernetes.device-plugin-names", "device plugin's devices resolve in CDI specs")


def kubelet_root(ctx: Context) -> str:
    return ctx.kubelet_root or ctx.host("/var/lib/kubelet")


def _listening(folder: str, name: str) -> bool | None:
    """Whether something listens on the socket `name` in `folder` (None: not a socket). The
    connect goes through /proc/self/fd (a socket path is limited to 107 bytes)."""
    path = os.path.join(folder, name)
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            return None
    except OSError:
        return None
    try:
        dir_fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
    try:
        via = f"/proc/self/fd/{dir_fd}/{name}"
        sock.connect(via if os.path.isdir(f"/proc/self/fd/{dir_fd}") else path)
    except (BlockingIOError, InterruptedError):
        return True  # a full backlog: it listens
    except OSError as exc:
        return exc.errno != errno.ECONNREFUSED  # refused: nobody; other errors: cannot tell
    finally:
        sock.close()
        os.close(dir_fd)
    return True


def _unit_installed(ctx: Context) -> bool:
    return any(os.path.isfile(ctx.host(f"{d}/{SERVICE}.service")) for d in REFRESH_UNIT_DIRS)


def _nvidia_socket(resource: str) -> str:
    """NVIDIA's k8s-device-plugin's socket for a resource: `nvidia-gpu.sock`."""
    return f"nvidia-{resource.partition('/')[2]}.sock"


def _owner(name: str) -> str:
    return "gpuctk's plugin" if name.startswith("gpuctk-") else "NVIDIA's plugin"


def plugin_sockets(folder: str) -> dict[str, bool]:
    """gpuctk's and NVIDIA's plugin sockets in the folder -> whether something listens."""
    found: dict[str, bool] = {}
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return found
    for name in names:
        if name.startswith(("gpuctk-", "nvidia")):
            listening = _listening(folder, name)
            if listening is not None:
                found[name] = listening
    return found


def _socket_of(resource: str, sockets: dict[str, bool]) -> str | None:
    from gpuctk.deviceplugin.resources import socket_name

    for name in (socket_name(resource), _nvidia_socket(resource)):
        if name in sockets:
            return name
    return None


def _start_fix(ctx: Context) -> str:
    if _unit_installed(ctx):
        return f"systemctl enable --now {SERVICE}   # or the DaemonSet: {DAEMONSET}"
    return f"{DAEMONSET}   # gpuctk's plugin (install.md); or NVIDIA's k8s-device-plugin"


def check_plugin(
    ctx: Context, folder: str, sockets: dict[str, bool], cp: Checkpoint | None, note: str
) -> Result:
    id_, title = PLUGIN
    from gpuctk.deviceplugin.resources import socket_name

    domain = ctx.kind.partition("/")[0] + "/"
    registered = {
        r: ids
        for r, ids in (cp.registered if cp else ())
        if r.startswith(domain) or socket_name(r) in sockets
    }
    evidence: list[str] = []
    unregistered: list[str] = []
    for name, live in sockets.items():
        resource = next((r for r in registered if _socket_of(r, {name: live})), None)
        state = "listening" if live else "nobody listens: the plugin is not running"
        if resource is not None:
            state += f", registered: {resource} ({len(registered[resource])} devices)"
        elif live and cp is not None:
            state += ", its resource not registered (not in the kubelet checkpoint)"
            unregistered.append(name)
        evidence.append(f"{folder}/{name}: {_owner(name)}, {state}")
    for resource, ids in registered.items():
        if _socket_of(resource, sockets) is None:
            evidence.append(f"kubelet checkpoint: {resource} ({len(ids)} devices), no socket")
    evidence += [note] if note else []
    if not sockets and not registered:
        evidence.insert(
            0,
            f"{folder}: no gpuctk-*.sock or nvidia*.sock and no {domain}* in the kubelet "
            f"checkpoint: pods that request {ctx.kind} stay Pending (Insufficient {ctx.kind})",
        )
        return warning(id_, title, evidence, _start_fix(ctx))
    if sockets and not any(sockets.values()):  # sockets, none listening
        evidence.append("the kubelet counts its devices unhealthy: no new pod gets one")
        return warning(id_, title, evidence, _restart_fix(ctx, list(sockets)))
    if unregistered:
        return warning(id_, title, evidence, _logs_fix(ctx, unregistered))
    return ok(id_, title, *evidence)


NVIDIA_PODS = "kubectl get pods -A -o wide | grep nvidia-device-plugin"


def _restart_fix(ctx: Context, sockets: list[str]) -> str:
    if not any(n.startswith("gpuctk-") for n in sockets):
        return f"{NVIDIA_PODS}   # delete this node's: its DaemonSet starts it again"
    return f"systemctl restart {SERVICE}" if _unit_installed(ctx) else RESTART_DS


def _logs_fix(ctx: Context, sockets: list[str]) -> str:
    if not any(n.startswith("gpuctk-") for n in sockets):
        return f"{NVIDIA_PODS}   # then kubectl logs -n NAMESPACE POD: why the kubelet refused it"
    if _unit_installed(ctx):
        return f"journalctl -u {SERVICE}   # why the kubelet refused it"
    return "kubectl -n gpuctk-system logs daemonset/gpuctk-device-plugin   # why it was refused"


def handed(entry: Entry, kind: str) -> list[str]:
    """The CDI names a container was given, as the engine or the shim resolves them."""
    from gpuctk.hook.requests import devices

    answer = entry.answer
    if answer is not None:
        annotations = dict(answer.annotations)
        names = [*answer.cdi_devices, *devices.from_annotations(annotations, ("cdi.k8s.io/",))]
        if names:
            return list(dict.fromkeys(names))
        mounts = [{"source": m.host_path, "destination": m.container_path} for m in answer.mounts]
        env = dict(answer.envs).get(devices.VISIBLE_DEVICES)
        if env == devices.MOUNTS_ROOT:
            return devices.from_mounts(mounts, kind)
        if env is not None:
            return devices.from_visible_devices(env, kind)[0]
    ids = [i.partition("::")[0] for i in entry.device_ids]  # NVIDIA's replicas: <ID>::<n>
    return devices.from_visible_devices(",".join(ids), kind)[0] if ids else []


def _allocated(
    ctx: Context, cp: Checkpoint, ours: set[str], known: frozenset[str]
) -> tuple[list[str], int, int]:
    """(problems, containers checked, entries of pods gone) of the checkpoint's entries."""
    from gpuctk.errors import RequestError

    domain = ctx.kind.partition("/")[0] + "/"
    pods_dir = os.path.join(kubelet_root(ctx), "pods")
    try:
        pods: set[str] | None = set(os.listdir(pods_dir))
    except OSError:  # no pods folder: every entry counts
        pods = None
    problems: list[str] = []
    checked = gone = 0
    for e in cp.entries:
        if not e.resource.startswith(domain) and e.resource not in ours:
            continue
        if pods is not None and e.pod_uid not in pods:
            gone += 1  # the kubelet drops a gone pod's entry at its next allocation
            continue
        checked += 1
        where = f"pod {e.pod_uid} container {e.container} ({e.resource})"
        try:
            names = handed(e, ctx.kind)
        except RequestError as exc:
            problems.append(f"{where}: the shim refuses what it was given: {exc.message}")
            continue
        missing = [n for n in names if n not in known]
        if missing:
            problems.append(f"{where}: {', '.join(missing)} in no CDI spec")
    return problems, checked, gone


def check_names(
    ctx: Context, found: Findings, sockets: dict[str, bool], cp: Checkpoint | None, note: str
) -> Result:
    id_, title = NAMES
    if cp is None:
        return skipped(id_, title, note or "no kubelet checkpoint: nothing registered yet")
    if found.cdi_devices is None:
        return skipped(id_, title, "the CDI specs were not read")
    from gpuctk.deviceplugin.resources import socket_name

    known = found.cdi_devices
    ours = {r for r, _ in cp.registered if socket_name(r) in sockets}
    problems, checked, gone = _allocated(ctx, cp, ours, known)
    advertised: list[str] = []
    for resource in sorted(ours):
        all_ids = cp.registered_ids(resource) or ()
        ids = [i for i in all_ids if f"{ctx.kind}={i}" not in known]
        if ids:
            more = f", ... ({len(ids)} of {len(all_ids)})" if ids[3:] else ""
            shown = ", ".join(ids[:3]) + more
            advertised.append(
                f"gpuctk's plugin advertises {resource} {shown}: {ctx.kind}=<ID> is in no CDI "
                "spec (a pod given one fails to start)"
            )
    if not checked and not ours:
        return skipped(id_, title, "no device of the plugin allocated or advertised here")
    dirs = ", ".join(found.spec_dirs)
    evidence = [f"{checked} container(s) with GPUs checked against the specs in {dirs}"]
    if gone:
        evidence.append(f"{gone} checkpoint entr(ies) of pods no longer on the node, not checked")
    fix = generate_fix(ctx)
    uuids = any(n.partition("=")[2].startswith(("GPU-", "MIG-")) for n in known)
    if (problems or advertised) and not uuids:
        evidence.append(
            "the specs name no device by UUID, as the plugin's names are: generate it with the "
            "default --device-name-strategy (index and uuid)"
        )
    if problems:
        tail = ["a container given a device no spec names fails to start (unresolvable device)"]
        return failed(id_, title, [*_shown(problems), *advertised, *tail, *evidence], fix)
    if advertised:
        return warning(id_, title, [*advertised, *evidence], fix)
    return ok(id_, title, *evidence)


def plugin_checks(ctx: Context, found: Findings) -> list[Result]:
    folder = os.path.join(kubelet_root(ctx), "device-plugins")
    if not os.path.isdir(folder):
        return [skipped(*PLUGIN, "no device-plugin dir"), skipped(*NAMES, "no device-plugin dir")]
    note = ""
    try:
        cp = checkpoint.read(folder)
    except checkpoint.Unreadable as exc:
        cp, note = None, f"kubelet checkpoint unreadable: {exc}"
    sockets = plugin_sockets(folder)
    return [
        check_plugin(ctx, folder, sockets, cp, note),
        check_names(ctx, found, sockets, cp, note),
    ]
