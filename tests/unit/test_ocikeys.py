"""gpuctk.hook.ocikeys: keys runc's decoder folds onto an OCI field name are refused; map
fields' keys, unknown keys and keys that fold onto nothing are accepted."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuctk.errors import ValidationError
from gpuctk.hook import ocikeys
from gpuctk.hook.ocikeys import check_keys, fold

RUNC_SPEC = {  # `runc spec`, as runc 1.1.5 writes it, with a GPU request
    "ociVersion": "1.0.2-dev",
    "process": {
        "terminal": False,
        "user": {"uid": 0, "gid": 0},
        "args": ["sh"],
        "env": ["PATH=/usr/bin:/bin", "TERM=xterm", "NVIDIA_VISIBLE_DEVICES=0"],
        "cwd": "/",
        "capabilities": {k: ["CAP_AUDIT_WRITE", "CAP_KILL"] for k in ("bounding", "effective")},
        "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
        "noNewPrivileges": True,
    },
    "root": {"path": "rootfs", "readonly": True},
    "hostname": "runc",
    "mounts": [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid"]},
    ],
    "linux": {
        "resources": {"devices": [{"allow": False, "access": "rwm"}]},
        "namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "mount"}],
        "maskedPaths": ["/proc/acpi"],
        "readonlyPaths": ["/proc/bus"],
    },
}


def with_(path: str, key: str, value: Any) -> dict[str, Any]:
    """RUNC_SPEC with `key` = `value` set in the object at `path` (dotted, list indices)."""
    doc = json.loads(json.dumps(RUNC_SPEC))
    obj: Any = doc
    for part in filter(None, path.split(".")):
        obj = obj[int(part)] if isinstance(obj, list) else obj.setdefault(part, {})
    obj[key] = value
    return doc


def test_an_ordinary_config_is_accepted() -> None:
    check_keys(RUNC_SPEC, "config.json")
    check_keys({}, "config.json")


@pytest.mark.parametrize(
    "path, key, at, name",
    [
        ("", "Process", "/", "process"),
        ("", "proce\u017fs", "/", "process"),
        ("", "PROCESS", "/", "process"),
        ("", "ociversion", "/", "ociVersion"),
        ("", "Root", "/", "root"),
        ("linux", "Devices", "/linux", "devices"),
        ("linux.resources", "Devices", "/linux/resources", "devices"),
        ("linux.resources.devices.0", "Allow", "/linux/resources/devices/0", "allow"),
        ("mounts.1", "Destination", "/mounts/1", "destination"),
        ("process", "Env", "/process", "env"),
        ("process.capabilities", "Bounding", "/process/capabilities", "bounding"),
        ("process.user", "UID", "/process/user", "uid"),
        ("linux.resources.memory", "\u212aernel", "/linux/resources/memory", "kernel"),
        ("hooks", "Prestart", "/hooks", "prestart"),
        ("windows.network", "dnssearchlist", "/windows/network", "DNSSearchList"),
    ],
)
def test_a_folded_key_is_refused(path: str, key: str, at: str, name: str) -> None:
    with pytest.raises(ValidationError) as got:
        check_keys(with_(path, key, 1), "/b/config.json")
    message = got.value.message
    assert message == (
        f"/b/config.json: key {key!a} at {at} is not an OCI name (runc reads it as "
        f"{name!r}); spell it exactly {name!r}"
    )
    assert "\n" not in message and message.isascii()


def test_nested_lists_and_maps_of_structs() -> None:
    hook = {"path": "/bin/true", "Args": ["true"]}
    with pytest.raises(ValidationError, match="at /hooks/poststop/1 "):
        check_keys({"hooks": {"poststop": [{"path": "/x"}, hook]}}, "c")
    seccomp = {"syscalls": [{"names": ["read"], "action": "A", "args": [{"Index": 0}]}]}
    with pytest.raises(ValidationError, match="at /linux/seccomp/syscalls/0/args/0 "):
        check_keys({"linux": {"seccomp": seccomp}}, "c")
    with pytest.raises(ValidationError, match=r"'Name' at /linux/netDevices/eth\\n0 "):
        check_keys({"linux": {"netDevices": {"eth\n0": {"Name": "x"}}}}, "c")
    with pytest.raises(ValidationError, match="at /linux/resources/rdma/mlx5_0 "):
        check_keys({"linux": {"resources": {"rdma": {"mlx5_0": {"HcaHandles": 1}}}}}, "c")


@pytest.mark.parametrize(
    "path, key, value",
    [
        ("annotations", "Process", "x"),
        ("annotations", "root", "x"),
        ("linux.sysctl", "Process", "x"),
        ("linux.resources.unified", "Memory.Max", "1"),
        ("linux.netDevices", "Eth0", {"name": "x"}),
        ("linux.timeOffsets", "Monotonic", {"secs": 1}),
        ("windows", "credentialSpec", {"Process": {"Root": 1}}),
        ("", "x-future", {"Process": 1}),
        ("linux", "x-future", [{"Devices": 1}]),
        ("", "pr\u00f3cess", {}),  # folds onto no ASCII letter
        ("", "\u0130d", 1),  # U+0130 folds to itself in Go, not to i
        ("", "proc\u0435ss", {}),  # Cyrillic e
        ("process", "env ", []),
        ("", "", 1),
    ],
)
def test_free_keys_and_keys_that_fold_onto_nothing_are_accepted(
    path: str, key: str, value: Any
) -> None:
    check_keys(with_(path, key, value), "config.json")


@pytest.mark.parametrize(
    "doc",
    [
        {"process": "x", "linux": [], "mounts": {"a": {"Destination": 1}}},
        {"mounts": ["x", None, [{"Destination": 1}]], "hooks": {"prestart": "x"}},
        {"linux": {"netDevices": [], "resources": {"rdma": {"a": "x"}}}},
        {"process": None, "root": 5},
    ],
)
def test_wrong_types_are_left_to_the_readers(doc: dict[str, Any]) -> None:
    check_keys(doc, "config.json")  # runc refuses them itself; nothing here reads as a struct


def test_fold() -> None:
    assert fold("Process") == "process" and fold("proce\u017fs") == "process"
    assert fold("\u212aERNEL") == "kernel" and fold("pr\u00f3cess") == ""
    assert fold("") == ""


def _tables() -> list[tuple[str, dict[str, Any]]]:
    out, todo = [], [("/", ocikeys.SPEC)]
    while todo:
        path, fields = todo.pop()
        out.append((path, fields))
        todo += [(f"{path}{k}/", c[1]) for k, c in fields.items() if c is not None]
    return out


def test_no_two_names_of_a_struct_fold_alike() -> None:
    for path, fields in _tables():
        assert len({fold(k) for k in fields}) == len(fields), path
        assert all(k.isascii() and k.isidentifier() for k in fields), path
