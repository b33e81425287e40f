"""`gpuctk doctor --pod NAMESPACE/NAME`: why is this pod Pending, why does it see no GPU, from
this node's side (no API server needed).

The sources, under the kubelet root (`--kubelet-root`, else /var/lib/kubelet under --host-root):
the pod resources API (`pod-resources/kubelet.sock`, gpuctk.doctor.podresources: the pods the
kubelet runs, by namespace/name, and each container's devices), the device manager's checkpoint
(`device-plugins/kubelet_internal_checkpoint`, gpuctk.doctor.checkpoint: registered devices, and
allocations by pod UID with the plugin's answers) and the pod folders (`pods/<UID>`). Without
the API (no socket, no grpcio) the checkpoint alone knows pods by UID: `--pod UID` then works.

- kubernetes.pod: the pod is on this node (its UID: the checkpoint entry whose container,
  resource and device IDs match the API's).
- kubernetes.pod-devices: each container's GPU devices (resource, IDs) and whether the CDI
  names they are handed over as (gpuctk.doctor.devplugin.handed) resolve in the specs.
- kubernetes.pod-capacity, when the pod has no GPU here: registered vs allocated devices of the
  kind, the plugin's socket, and resources of the vendor under another name: the reasons a pod
  stays Pending (no plugin, every GPU allocated, a resource name the node does not offer).
"""

from __future__ import annotations

import os

from gpuctk.doctor import checkpoint, devplugin, podresources
from gpuctk.doctor.cdi import _shown, generate_fix
from gpuctk.doctor.checkpoint import Checkpoint, Entry
from gpuctk.doctor.context import Context, Findings
from gpuctk.doctor.podresources import Container, Devices, Pod
from gpuctk.doctor.report import Result, failed, ok, skipped, warning

POD = ("kubernetes.pod", "the pod is on this node")
DEVICES = ("kubernetes.pod-devices", "the pod's GPU devices resolve in the CDI specs")
CAPACITY = ("kubernetes.pod-capacity", "a GPU of the kind is free for a pod")
DESCRIBE = "kubectl describe pod -n {ns} {name}   # Events: the scheduler's reason"
ON_NODE = "kubectl get pods -A -o wide --field-selector spec.nodeName=NODE   # who holds them"


def _active_pods(root: str) -> set[str] | None:
    """The UIDs of the pod folders (None: no pods folder)."""
    try:
        return set(os.listdir(os.path.join(root, "pods")))
    except OSError:
        return None


def _uid_of(pod: Pod, cp: Checkpoint | None) -> str | None:
    """The UID of the checkpoint entry that has the same container, resource and devices."""
    for c in pod.containers:
        for d in c.devices:
            for e in cp.entries if cp else ():
                if (e.container, e.resource, set(e.device_ids)) == (c.name, d.resource, set(d.ids)):
                    return e.pod_uid
    return None


def _from_checkpoint(uid: str, cp: Checkpoint | None) -> Pod:
    """A pod known by UID only: its containers' devices as the checkpoint has them."""
    containers: dict[str, list[Devices]] = {}
    for e in cp.entries if cp else ():
        if e.pod_uid == uid:
            containers.setdefault(e.container, []).append(Devices(e.resource, e.device_ids))
    return Pod("", uid, tuple(Container(n, tuple(d)) for n, d in containers.items()))


def _entry(cp: Checkpoint | None, uid: str | None, container: str, resource: str) -> Entry | None:
    for e in cp.entries if cp and uid else ():
        if (e.pod_uid, e.container, e.resource) == (uid, container, resource):
            return e
    return None


def check_devices(
    ctx: Context, found: Findings, pod: Pod, uid: str | None, cp: Checkpoint | None
) -> Result | None:
    """None when no container of the pod was given a device of the kind's vendor."""
    from gpuctk.errors import RequestError

    domain = ctx.kind.partition("/")[0] + "/"
    known = found.cdi_devices
    lines: list[str] = []
    problems: list[str] = []
    for c in pod.containers:
        for d in c.devices:
            if not d.resource.startswith(domain):
                continue
            where = f"container {c.name}: {d.resource} {', '.join(d.ids)}"
            entry = _entry(cp, uid, c.name, d.resource) or Entry(
                uid or "", c.name, d.resource, d.ids
            )
            try:
                names = devplugin.handed(entry, ctx.kind)
            except RequestError as exc:
                problems.append(f"{where}: the shim refuses what it was given: {exc.message}")
                continue
            missing = [n for n in names if known is not None and n not in known]
            if missing:
                problems.append(f"{where}: {', '.join(missing)} in no CDI spec: it cannot start")
            else:
                lines.append(f"{where} -> {', '.join(names)}")
        for name in c.cdi_devices:  # resource claims: the engine resolves these names itself
            if known is not None and name.startswith(domain) and name not in known:
                problems.append(f"container {c.name}: claim device {name} in no CDI spec")
            elif name.startswith(domain):
                lines.append(f"container {c.name}: claim device {name}")
    if not lines and not problems:
        return None
    id_, title = DEVICES
    if known is None:
        return warning(id_, title, [*lines, "the CDI specs were not read"], "gpuctk doctor")
    dirs = ", ".join(found.spec_dirs)
    if problems:
        evidence = [*_shown(problems), *lines, f"checked against the specs in {dirs}"]
        if not any(n.partition("=")[2].startswith(("GPU-", "MIG-")) for n in known):
            evidence.append("the specs name no device by UUID, as device plugins hand them out")
        return failed(id_, title, evidence, generate_fix(ctx))
    return ok(id_, title, *lines, f"resolved in the specs in {dirs}")


def check_capacity(
    ctx: Context, root: str, cp: Checkpoint | None, note: str, sockets: dict[str, bool]
) -> Result:
    id_, title = CAPACITY
    kind = ctx.kind
    domain = kind.partition("/")[0] + "/"
    others = [f"{r} ({len(i)})" for r, i in (cp.registered if cp else ()) if r.startswith(domain)]
    others = [o for o in others if not o.startswith(f"{kind} (")]
    offered = f"the node offers {', '.join(others)}: the pod must request one of these"
    registered = cp.registered_ids(kind) if cp else None
    if registered is None:
        where = note or (f"kubelet checkpoint {cp.path}" if cp else "no kubelet checkpoint")
        evidence = [f"{kind}: registered by no device plugin ({where}): a pod that requests it "
                    f"stays Pending (Insufficient {kind})"]  # fmt: skip
        if others:
            fix = f"kubectl describe node NODE | grep {domain}   # request a resource it offers"
            return failed(id_, title, [*evidence, offered], fix)
        return failed(id_, title, evidence, devplugin._start_fix(ctx))
    pods = _active_pods(root)
    holders: dict[str, str] = {}
    for e in cp.entries if cp else ():
        if e.resource == kind and (pods is None or e.pod_uid in pods):
            holders.update(dict.fromkeys(e.device_ids, e.pod_uid))
    free = [i for i in registered if i not in holders]
    evidence = [
        f"{kind}: {len(registered)} registered, {len(holders)} allocated to "
        f"{len(set(holders.values()))} pod(s), {len(free)} free (kubelet checkpoint)"
    ]
    socket = devplugin._socket_of(kind, sockets)
    if socket is None or not sockets[socket]:
        state = "is gone" if socket is None else f"{socket}: nobody listens"
        evidence.append(f"the plugin serving {kind} {state}: the kubelet counts its devices "
                        "unhealthy, a pod that requests one stays Pending")  # fmt: skip
        fix = devplugin._start_fix(ctx)
        return failed(id_, title, evidence, fix if socket is None else
                      devplugin._restart_fix(ctx, [socket]))  # fmt: skip
    evidence.append(f"{socket}: the plugin listens")
    if not free:
        evidence.append(f"every {kind} is allocated: a pod that requests one stays Pending "
                        "until a GPU pod on this node ends")  # fmt: skip
        return warning(id_, title, evidence, ON_NODE)
    evidence += [offered] if others else []
    return ok(id_, title, *evidence)


def _unknown(target: str, evidence: list[str]) -> Result:
    ns, _, name = target.partition("/")
    fix = DESCRIBE.format(ns=ns, name=name) if name else "kubectl get pods -A -o wide"
    return warning(*POD, evidence, fix)


def pod_checks(ctx: Context, found: Findings, target: str) -> list[Result]:
    """The report for `target`: NAMESPACE/NAME, or a pod UID."""
    root = devplugin.kubelet_root(ctx)
    if not os.path.isdir(root):
        return [skipped(*POD, f"{root}: absent: no kubelet on this node")]
    folder = os.path.join(root, "device-plugins")
    cp, note = None, ""
    try:
        cp = checkpoint.read(folder) if os.path.isdir(folder) else None
    except checkpoint.Unreadable as exc:
        note = f"kubelet checkpoint unreadable: {exc}"
    sockets = devplugin.plugin_sockets(folder)
    api = os.path.join(root, podresources.SOCKET)
    pod: Pod | None = None
    evidence: list[str] = []
    try:
        listed: list[Pod] | None = podresources.list_pods(api)
    except podresources.Unavailable as exc:
        listed = None
        evidence.append(f"pod-resources API not read: {exc}; the kubelet checkpoint knows pods "
                        "by UID only")  # fmt: skip
    if listed is not None and "/" in target:
        pod = next((p for p in listed if f"{p.namespace}/{p.name}" == target), None)
        uid = _uid_of(pod, cp) if pod else None
        evidence.append(f"{target}: {'among' if pod else 'not among'} the {len(listed)} pods "
                        f"the kubelet runs ({api})")  # fmt: skip
    elif "/" not in target:  # a UID: the checkpoint and the pod folders know it
        uid = target
        on_node = target in (_active_pods(root) or ()) or any(
            e.pod_uid == target for e in (cp.entries if cp else ())
        )
        pod = _from_checkpoint(target, cp) if on_node else None
        evidence.append(f"pod UID {target}: {'a' if pod else 'no'} pod folder or checkpoint "
                        f"entry in {root}")  # fmt: skip
    else:
        uid = None
        uids = sorted({e.pod_uid for e in cp.entries} if cp else ())
        evidence.append(f"pods with devices here, by UID: {', '.join(uids) or 'none'}")
        ns, _, name = target.partition("/")
        fix = (f"gpuctk doctor --pod $(kubectl get pod -n {ns} {name} "
               "-o jsonpath='{.metadata.uid}')")  # fmt: skip
        return [warning(*POD, evidence, fix), check_capacity(ctx, root, cp, note, sockets)]
    if pod is None:
        evidence.append("not scheduled to this node (a pod Pending for a GPU is on no node), "
                        "or gone from it")  # fmt: skip
        return [_unknown(target, evidence), check_capacity(ctx, root, cp, note, sockets)]
    if uid:
        folder_state = "present" if os.path.isdir(os.path.join(root, "pods", uid)) else "absent"
        evidence.append(f"UID {uid} (kubelet checkpoint), pod folder {folder_state}")
    else:
        evidence.append("no device entry in the kubelet checkpoint: its UID is not known here")
    results = [ok(*POD, *evidence)]
    devices = check_devices(ctx, found, pod, uid, cp)
    if devices is not None:
        return [*results, devices]
    domain = ctx.kind.partition("/")[0] + "/"
    nothing = f"no container of the pod was given a {domain}* device: it sees no GPU"
    describe = DESCRIBE.format(ns=pod.namespace, name=pod.name) if pod.namespace else None
    results.append(warning(*DEVICES, [nothing], describe or "kubectl get pods -A -o wide"))
    return [*results, check_capacity(ctx, root, cp, note, sockets)]
