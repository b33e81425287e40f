"""The CDI JSON shape, as types: what a spec file holds, key for key.

Written by gpuctk.cdi.specs.shapegen from the strict decoder's table
(gpuctk.cdi.specs.strict.OBJECTS), the shape's one declaration: edit that table, then run
`python -m gpuctk.cdi.specs.shapegen > cdi/specs/shape.py`.

One model for both sides. The generators build gpuctk.cdi.specs.spec records, whose `to_dict()`
returns these shapes; the create path (the registry, merge, apply and the host-path checks)
reads specs as these shapes. TypedDicts cost nothing at run time: modules on the create path
import this module only under TYPE_CHECKING, so mypy checks every key while the shim never
loads `typing`. A spec read from a file is held to the shape by gpuctk.cdi.specs.validate (strict
decoding, then every edit rule) before anything reads it as one.
"""

from __future__ import annotations

from typing import TypedDict

# total=False: every key is optional in the JSON (required ones are checked by validation)


class DeviceNodeDoc(TypedDict, total=False):
    path: str
    hostPath: str
    type: str  # "c", "b", "u", "p"
    major: int
    minor: int
    fileMode: int
    permissions: str  # cgroup access: a combination of "rwm", or "none"
    uid: int
    gid: int


class MountDoc(TypedDict, total=False):
    hostPath: str
    containerPath: str
    options: list[str]
    type: str


class HookDoc(TypedDict, total=False):
    hookName: str  # an OCI hook stage: "createContainer", "prestart", ...
    path: str
    args: list[str]
    env: list[str]
    timeout: int


class NetDeviceDoc(TypedDict, total=False):
    hostInterfaceName: str
    name: str


class IntelRdtDoc(TypedDict, total=False):
    closID: str
    l3CacheSchema: str
    memBwSchema: str
    schemata: list[str]
    enableMonitoring: bool
    enableCMT: bool
    enableMBM: bool


class EditsDoc(TypedDict, total=False):
    env: list[str]
    deviceNodes: list[DeviceNodeDoc]
    netDevices: list[NetDeviceDoc]
    hooks: list[HookDoc]
    mounts: list[MountDoc]
    intelRdt: IntelRdtDoc
    additionalGids: list[int]


class DeviceDoc(TypedDict, total=False):
    name: str
    annotations: dict[str, str]
    containerEdits: EditsDoc


class SpecDoc(TypedDict, total=False):
    cdiVersion: str
    kind: str
    annotations: dict[str, str]
    devices: list[DeviceDoc]
    containerEdits: EditsDoc
