"""The CDI spec model. `ContainerEdits` is the ONE intermediate form of "what to inject".

The generator builds these records; the shim, the precreate hook and the hook's legacy mode read
specs into them (or straight into dicts of the same shape) and apply them to an OCI spec dict.
`to_dict()` yields exactly the CDI JSON shape, leaving out empty fields so that the spec's
minimum cdiVersion (gpuctk.cdi.specs.version) is not raised by fields that carry nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuctk.records import record

if TYPE_CHECKING:
    from gpuctk.cdi.specs.shape import (
        DeviceDoc,
        DeviceNodeDoc,
        EditsDoc,
        HookDoc,
        MountDoc,
        NetDeviceDoc,
        SpecDoc,
    )


@record
class DeviceNode:
    path: str
    host_path: str | None = None
    type: str | None = None  # "c", "b", "u", "p"
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None
    permissions: str | None = None  # cgroup permissions, "rwm"
    uid: int | None = None
    gid: int | None = None

    def to_dict(self) -> DeviceNodeDoc:
        d: DeviceNodeDoc = {"path": self.path}
        if self.host_path is not None and self.host_path != self.path:
            d["hostPath"] = self.host_path
        if self.type is not None:
            d["type"] = self.type
        if self.major is not None:
            d["major"] = self.major
        if self.minor is not None:
            d["minor"] = self.minor
        if self.file_mode is not None:
            d["fileMode"] = self.file_mode
        if self.permissions is not None:
            d["permissions"] = self.permissions
        if self.uid is not None:
            d["uid"] = self.uid
        if self.gid is not None:
            d["gid"] = self.gid
        return d


@record
class Mount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = ()
    type: str | None = None

    def to_dict(self) -> MountDoc:
        d: MountDoc = {"hostPath": self.host_path, "containerPath": self.container_path}
        if self.options:
            d["options"] = list(self.options)
        if self.type:
            d["type"] = self.type
        return d


@record
class Hook:
    hook_name: str  # "createContainer", "prestart", ...
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = None

    def to_dict(self) -> HookDoc:
        d: HookDoc = {"hookName": self.hook_name, "path": self.path}
        if self.args:
            d["args"] = list(self.args)
        if self.env:
            d["env"] = list(self.env)
        if self.timeout is not None:
            d["timeout"] = self.timeout
        return d


@record
class NetDevice:
    host_interface_name: str
    name: str

    def to_dict(self) -> NetDeviceDoc:
        return {"hostInterfaceName": self.host_interface_name, "name": self.name}


@record
class ContainerEdits:
    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()
    net_devices: tuple[NetDevice, ...] = ()  # CDI 1.1
    additional_gids: tuple[int, ...] = ()  # CDI 0.7.0

    def to_dict(self) -> EditsDoc:
        d: EditsDoc = {}
        if self.env:
            d["env"] = list(self.env)
        if self.device_nodes:
            d["deviceNodes"] = [n.to_dict() for n in self.device_nodes]
        if self.net_devices:
            d["netDevices"] = [n.to_dict() for n in self.net_devices]
        if self.mounts:
            d["mounts"] = [m.to_dict() for m in self.mounts]
        if self.hooks:
            d["hooks"] = [h.to_dict() for h in self.hooks]
        if self.additional_gids:
            d["additionalGids"] = list(self.additional_gids)
        return d

    def is_empty(self) -> bool:
        return not (
            self.env
            or self.device_nodes
            or self.mounts
            or self.hooks
            or self.net_devices
            or self.additional_gids
        )


@record
class Device:
    name: str
    edits: ContainerEdits
    annotations: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> DeviceDoc:
        d: DeviceDoc = {"name": self.name}
        if self.annotations:
            d["annotations"] = dict(self.annotations)
        d["containerEdits"] = self.edits.to_dict()
        return d


@record
class Spec:
    kind: str  # "nvidia.com/gpu"
    devices: tuple[Device, ...]
    edits: ContainerEdits = ContainerEdits()
    annotations: tuple[tuple[str, str], ...] = ()
    version: str = ""  # filled by generate with the minimum needed

    def to_dict(self) -> SpecDoc:
        d: SpecDoc = {"cdiVersion": self.version, "kind": self.kind}
        if self.annotations:
            d["annotations"] = dict(self.annotations)
        d["devices"] = [dev.to_dict() for dev in self.devices]
        if not self.edits.is_empty():
            d["containerEdits"] = self.edits.to_dict()
        return d
