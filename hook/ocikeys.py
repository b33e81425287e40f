"""config.json keys as runc reads them: a key that only folds onto an OCI name is refused.

runc decodes config.json with Go's encoding/json, which sets a struct field from an object key
that equals the field's name case-insensitively, under Unicode simple folding, when no key
names it exactly: `"Process"`, `"PROCESS"` and `"proce\u017fs"` (U+017F, the long s, folds to
`s`; U+212A, the Kelvin sign, to `k`) all set `process`, and `"ociversion"` sets `ociVersion`.
Python's dict reads them as other keys, so the shim and runc would see different requests (a
`process` that asks for nothing, a `Process` whose env holds NVIDIA_VISIBLE_DEVICES), and
in-root work could be done in a `root` that is not the one runc uses.

check_keys() refuses such a key, naming it and where it is, in every object runc decodes as a
struct (SPEC below: the runtime-spec specs-go types of v1.3.0, a superset of older runc's).
The values of map fields (annotations, linux.sysctl, linux.resources.unified,
windows.credentialSpec) hold free keys and are not looked at; the values of maps of structs
(linux.netDevices, linux.timeOffsets, linux.resources.rdma) are checked as those structs.
Unknown keys that fold onto no field are left alone, as runc leaves them.

Cost: one dict lookup per key of the config's struct objects; a key that is not an exact field
name is folded (ASCII lower-casing; for a non-ASCII key, U+017F and U+212A mapped first: no
other non-ASCII rune folds onto an ASCII letter) and looked up in that struct's folded names,
built on first use. Depth is the schema's (at most seven levels), never the document's.
"""

from __future__ import annotations

from gpuctk.errors import ValidationError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: typing's import is costly at every start
if TYPE_CHECKING:
    from typing import Any

STRUCT, LIST, MAP = 1, 2, 3  # a field holding one struct, a list of them, a map of them

# Each struct runc decodes: {field: None for a field holding no struct, or (STRUCT|LIST|MAP,
# the struct's fields)} (literal dicts: cheap to build at import).
_ID_MAP = {"containerID": None, "hostID": None, "size": None}  # fmt: skip
_HOOK = (LIST, {"path": None, "args": None, "env": None, "timeout": None})  # fmt: skip
_THROTTLE = (LIST, {"major": None, "minor": None, "rate": None})  # fmt: skip
_NAMESPACE = {"type": None, "path": None}  # fmt: skip
_PROCESS = {
    "terminal": None, "args": None, "commandLine": None, "env": None, "cwd": None,
    "noNewPrivileges": None, "apparmorProfile": None, "oomScoreAdj": None, "selinuxLabel": None,
    "consoleSize": (STRUCT, {"height": None, "width": None}),
    "user": (STRUCT, {
        "uid": None, "gid": None, "umask": None, "additionalGids": None, "username": None,
    }),
    "capabilities": (STRUCT, {
        "bounding": None, "effective": None, "inheritable": None, "permitted": None,
        "ambient": None,
    }),
    "rlimits": (LIST, {"type": None, "hard": None, "soft": None}),
    "scheduler": (STRUCT, {
        "policy": None, "nice": None, "priority": None, "flags": None, "runtime": None,
        "deadline": None, "period": None,
    }),
    "ioPriority": (STRUCT, {"class": None, "priority": None}),
    "execCPUAffinity": (STRUCT, {"initial": None, "final": None}),
}  # fmt: skip
_RESOURCES = {
    "unified": None,
    "devices": (LIST, {"allow": None, "type": None, "major": None, "minor": None, "access": None}),
    "memory": (STRUCT, {
        "limit": None, "reservation": None, "swap": None, "kernel": None, "kernelTCP": None,
        "swappiness": None, "disableOOMKiller": None, "useHierarchy": None,
        "checkBeforeUpdate": None,
    }),
    "cpu": (STRUCT, {
        "shares": None, "quota": None, "burst": None, "period": None, "realtimeRuntime": None,
        "realtimePeriod": None, "cpus": None, "mems": None, "idle": None,
    }),
    "pids": (STRUCT, {"limit": None}),
    "blockIO": (STRUCT, {
        "weight": None, "leafWeight": None,
        "weightDevice": (LIST, {"major": None, "minor": None, "weight": None, "leafWeight": None}),
        "throttleReadBpsDevice": _THROTTLE, "throttleWriteBpsDevice": _THROTTLE,
        "throttleReadIOPSDevice": _THROTTLE, "throttleWriteIOPSDevice": _THROTTLE,
    }),
    "hugepageLimits": (LIST, {"pageSize": None, "limit": None}),
    "network": (STRUCT, {"classID": None, "priorities": (LIST, {"name": None, "priority": None})}),
    "rdma": (MAP, {"hcaHandles": None, "hcaObjects": None}),
}  # fmt: skip
_LINUX = {
    "sysctl": None, "cgroupsPath": None, "rootfsPropagation": None, "maskedPaths": None,
    "readonlyPaths": None, "mountLabel": None, "uidMappings": (LIST, _ID_MAP),
    "gidMappings": (LIST, _ID_MAP), "resources": (STRUCT, _RESOURCES),
    "namespaces": (LIST, _NAMESPACE),
    "devices": (LIST, {
        "path": None, "type": None, "major": None, "minor": None, "fileMode": None, "uid": None,
        "gid": None,
    }),
    "netDevices": (MAP, {"name": None}),
    "seccomp": (STRUCT, {
        "defaultAction": None, "defaultErrnoRet": None, "architectures": None, "flags": None,
        "listenerPath": None, "listenerMetadata": None,
        "syscalls": (LIST, {
            "names": None, "action": None, "errnoRet": None,
            "args": (LIST, {"index": None, "value": None, "valueTwo": None, "op": None}),
        }),
    }),
    "intelRdt": (STRUCT, {
        "closID": None, "schemata": None, "l3CacheSchema": None, "memBwSchema": None,
        "enableMonitoring": None,
    }),
    "memoryPolicy": (STRUCT, {"mode": None, "nodes": None, "flags": None}),
    "personality": (STRUCT, {"domain": None, "flags": None}),
    "timeOffsets": (MAP, {"secs": None, "nanosecs": None}),
}  # fmt: skip
_SOLARIS = {
    "milestone": None, "limitpriv": None, "maxShmMemory": None,
    "anet": (LIST, {
        "linkname": None, "lowerLink": None, "allowedAddress": None,
        "configureAllowedAddress": None, "defrouter": None, "linkProtection": None,
        "macAddress": None,
    }),
    "cappedCPU": (STRUCT, {"ncpus": None}),
    "cappedMemory": (STRUCT, {"physical": None, "swap": None}),
}  # fmt: skip
_WINDOWS = {
    "layerFolders": None, "credentialSpec": None, "servicing": None,
    "ignoreFlushesDuringBoot": None, "devices": (LIST, {"id": None, "idType": None}),
    "resources": (STRUCT, {
        "memory": (STRUCT, {"limit": None}),
        "cpu": (STRUCT, {
            "count": None, "shares": None, "maximum": None,
            "affinity": (LIST, {"mask": None, "group": None}),
        }),
        "storage": (STRUCT, {"iops": None, "bps": None, "sandboxSize": None}),
    }),
    "hyperv": (STRUCT, {"utilityVMPath": None}),
    "network": (STRUCT, {
        "endpointList": None, "allowUnqualifiedDNSQuery": None, "DNSSearchList": None,
        "networkSharedContainerName": None, "networkNamespace": None,
    }),
}  # fmt: skip
_VM = {
    "hypervisor": (STRUCT, {"path": None, "parameters": None}),
    "kernel": (STRUCT, {"path": None, "parameters": None, "initrd": None}),
    "image": (STRUCT, {"path": None, "format": None}),
    "hwconfig": (STRUCT, {
        "deviceTree": None, "vcpus": None, "memory": None, "dtdevs": None, "irqs": None,
        "iomems": (LIST, {"firstGFN": None, "firstMFN": None, "nrMFNs": None}),
    }),
}  # fmt: skip
_FREEBSD = {
    "devices": (LIST, {"path": None, "mode": None}),
    "jail": (STRUCT, {
        "parent": None, "host": None, "ip4": None, "ip4Addr": None, "ip6": None, "ip6Addr": None,
        "vnet": None, "interface": None, "vnetInterfaces": None, "sysvmsg": None,
        "sysvsem": None, "sysvshm": None, "enforceStatfs": None,
        "allow": (STRUCT, {
            "setHostname": None, "rawSockets": None, "chflags": None, "mount": None,
            "quotas": None, "socketAf": None, "mlock": None, "reservedPorts": None,
            "suser": None,
        }),
    }),
}  # fmt: skip
SPEC = {
    "ociVersion": None, "hostname": None, "domainname": None, "annotations": None,
    "process": (STRUCT, _PROCESS), "root": (STRUCT, {"path": None, "readonly": None}),
    "mounts": (LIST, {
        "destination": None, "type": None, "source": None, "options": None,
        "uidMappings": (LIST, _ID_MAP), "gidMappings": (LIST, _ID_MAP),
    }),
    "hooks": (STRUCT, {
        "prestart": _HOOK, "createRuntime": _HOOK, "createContainer": _HOOK,
        "startContainer": _HOOK, "poststart": _HOOK, "poststop": _HOOK,
    }),
    "linux": (STRUCT, _LINUX), "solaris": (STRUCT, _SOLARIS), "windows": (STRUCT, _WINDOWS),
    "vm": (STRUCT, _VM), "zos": (STRUCT, {"namespaces": (LIST, _NAMESPACE)}),
    "freebsd": (STRUCT, _FREEBSD),
}  # fmt: skip

_FOLDED: dict[int, dict[str, str]] = {}  # id(fields) -> {folded name: name}


def fold(key: str) -> str:
    """`key` as Go's encoding/json compares it with an ASCII field name (lower case), or ""
    when it cannot equal one: of the non-ASCII runes only U+017F (s) and U+212A (k) fold onto
    ASCII letters."""
    if not key.isascii():
        key = key.replace("\u017f", "s").replace("\u212a", "k")
        if not key.isascii():
            return ""
    return key.lower()


def _folded(fields: dict[str, Any]) -> dict[str, str]:
    table = _FOLDED.get(id(fields))
    if table is None:
        table = _FOLDED[id(fields)] = {name.lower(): name for name in fields}
    return table


class _Folded(Exception):
    """`key` folds onto the field `name`; `path` is filled in (innermost first) on the way out."""

    def __init__(self, key: str, name: str) -> None:
        super().__init__(key)
        self.key, self.name = key, name
        self.path: list[str] = []


def _walk(obj: dict[str, Any], fields: dict[str, Any]) -> None:
    for key, value in obj.items():
        child = fields.get(key, False)
        if child is False:  # not a field's exact name
            name = _folded(fields).get(fold(key))
            if name is not None:
                raise _Folded(key, name)
            continue
        if child is None or not value:
            continue
        kind, sub = child
        try:
            if kind == STRUCT:
                if type(value) is dict:
                    _walk(value, sub)
            elif kind == LIST:
                if type(value) is list:
                    for index, item in enumerate(value):
                        if type(item) is dict:
                            try:
                                _walk(item, sub)
                            except _Folded as exc:
                                exc.path.append(str(index))
                                raise
            elif type(value) is dict:  # MAP: free keys, struct values
                for name, item in value.items():
                    if type(item) is dict:
                        try:
                            _walk(item, sub)
                        except _Folded as exc:
                            exc.path.append(name.encode("unicode_escape").decode("ascii"))
                            raise
        except _Folded as exc:
            exc.path.append(key)
            raise


def check_keys(doc: dict[str, Any], where: str) -> None:
    """ValidationError when the OCI config `doc` (read from `where`) has a key that runc would
    read as an OCI field it does not name exactly (see the module docstring)."""
    try:
        _walk(doc, SPEC)
    except _Folded as exc:
        at = "/" + "/".join(reversed(exc.path))
        raise ValidationError(
            f"{where}: key {exc.key!a} at {at} is not an OCI name (runc reads it as "
            f"{exc.name!r}); spell it exactly {exc.name!r}"
        ) from None
