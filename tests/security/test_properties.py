"""Property-based tests (hypothesis) of every parser on the container-create path and of the
node files the generator reads: whatever the input, the result is well-formed or the error is
the documented one (never IndexError, KeyError, TypeError, RecursionError, ...).

- device requests: NVIDIA_VISIBLE_DEVICES values, CDI annotations, device-mount destinations;
  every name that comes out is a qualified CDI name of bounded size with no path in its device
  part, at most MAX_DEVICES of them;
- config.json shapes: any JSON value in any field the request code reads;
- the OCI state and the hook's/shim's JSON decoders;
- ld.so.cache (random bytes and structured headers with hostile counts and offsets);
- mig-minors text; hook options (--link, --folder, --mode).
"""

from __future__ import annotations

import contextlib
import os
import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuctk import jsonfast
from gpuctk.cdi.node import devnodes, elf, ldcache
from gpuctk.cdi.specs.names import is_qualified_name
from gpuctk.errors import InputError, RequestError, UsageError
from gpuctk.hook import oci_state
from gpuctk.hook.requests import devices
from gpuctk.hook.verbs import hook_main, inroot

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KIND = "nvidia.com/gpu"
PIECES = st.sampled_from(
    ["0", "1", "all", "none", "void", "..", "/", "=", ",", " ", "\x00", "GPU-", "MIG-", ":",
     "nvidia.com/gpu=", "amd.com/gpu=", "../../etc", "\n", "é", "x" * 300]
)  # fmt: skip
REQUEST_TEXT = st.one_of(st.text(max_size=400), st.lists(PIECES, max_size=30).map("".join))
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | REQUEST_TEXT,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(REQUEST_TEXT, inner, max_size=5),
    max_leaves=30,
)


def check_names(names: list[str] | tuple[str, ...]) -> None:
    assert len(names) <= devices.MAX_DEVICES
    for name in names:
        assert is_qualified_name(name), name
        assert len(name) <= devices.MAX_NAME_LEN and "\x00" not in name
        device = name.partition("=")[2]
        assert "/" not in device and device not in ("", ".", ".."), name


@SETTINGS
@given(REQUEST_TEXT)
def test_visible_devices_values(value: str) -> None:
    try:
        names, driver_only = devices.from_visible_devices(value, KIND)
    except RequestError:
        return
    check_names(names)
    assert all(n.startswith(KIND + "=") for n in names)  # the image names the default kind only
    assert not (names and driver_only)


@SETTINGS
@given(st.dictionaries(st.one_of(st.just("cdi.k8s.io/x"), REQUEST_TEXT), JSON, max_size=4))
def test_annotation_values(annotations: dict[str, Any]) -> None:
    try:
        names = devices.from_annotations(annotations, ("cdi.k8s.io/",))
    except RequestError:
        return
    check_names(names)


DEST = st.lists(PIECES | st.sampled_from(["cdi", "nvidia.com", "gpu"]), max_size=8).map(
    lambda parts: "/var/run/nvidia-container-devices/" + "/".join(parts)
)


@SETTINGS
@given(
    st.lists(
        st.fixed_dictionaries({"source": st.just("/dev/null"), "destination": DEST | REQUEST_TEXT}),
        max_size=5,
    )
)
def test_device_mount_destinations(mounts: list[dict[str, str]]) -> None:
    try:
        names = devices.from_mounts(mounts, KIND)
    except RequestError:
        return
    check_names(names)
    assert all(n.startswith(KIND + "=") for n in names)
    for mount in mounts:
        if ".." in mount["destination"].split("/") and names:
            assert not mount["destination"].startswith(devices.MOUNTS_ROOT + "/")


@SETTINGS
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "annotations": JSON,
            "mounts": JSON,
            "process": st.one_of(
                JSON, st.fixed_dictionaries({}, optional={"env": JSON, "capabilities": JSON})
            ),
        },
    ),
    st.booleans(),
    st.booleans(),
)
def test_config_json_shapes(config: dict[str, Any], volumes: bool, unprivileged: bool) -> None:
    try:
        req = devices.requested(
            config, accept_volume_mounts=volumes, accept_envvar_unprivileged=unprivileged
        )
    except RequestError:
        return
    check_names(req.devices)


@SETTINGS
@given(st.binary(max_size=600) | JSON.map(jsonfast.dumps))
def test_json_decoders(data: bytes) -> None:
    with contextlib.suppress(InputError):
        oci_state.parse_state(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return
    try:
        value = jsonfast.loads(text)
    except ValueError:
        return
    assert jsonfast.loads(jsonfast.dumps(value).decode()) == value


@SETTINGS
@given(st.binary(max_size=2048))
def test_ld_cache_random_bytes(data: bytes) -> None:
    for blob in (data, ldcache.MAGIC_NEW + data, ldcache.MAGIC_OLD + b"\0" + data):
        try:
            entries = ldcache.parse_ld_cache(blob)
        except ValueError:
            continue
        assert len(entries) <= len(blob)


@SETTINGS
@given(
    nlibs=st.integers(0, 2**32 - 1),
    len_strings=st.integers(0, 2**32 - 1),
    flag=st.integers(0, 255),
    entries=st.lists(st.tuples(*[st.integers(0, 2**32 - 1)] * 3), max_size=8),
    strings=st.binary(max_size=200),
)
def test_ld_cache_structured_headers(
    nlibs: int, len_strings: int, flag: int, entries: list[tuple[int, int, int]], strings: bytes
) -> None:
    head = ldcache.MAGIC_NEW + struct.pack("<IIB3xI12x", nlibs, len_strings, flag, 0)
    assert len(head) == 48
    body = b"".join(struct.pack("<IIIIQ", f, k, v, 0, 0) for f, k, v in entries)
    try:
        parsed = ldcache.parse_ld_cache(head + body + strings)
    except ValueError:
        return
    assert len(parsed) <= len(entries)


MIG_LINE = st.one_of(
    st.builds(
        "gpu{}/gi{}/ci{}/access {}".format,
        st.integers(0, 99), st.integers(0, 99), st.integers(0, 99), st.integers(0, 2**40),
    ),
    st.builds("config {}".format, st.integers(-5, 10**12)),
    st.text(max_size=60),
)  # fmt: skip


@SETTINGS
@given(st.lists(MIG_LINE, max_size=20).map("\n".join))
def test_mig_minors(text: str) -> None:
    table = devnodes.parse_mig_minors(text)
    for key, minor in table.items():
        assert isinstance(key, str) and " " not in key and "\n" not in key
        assert 0 <= minor < 10**9


@SETTINGS
@given(REQUEST_TEXT, REQUEST_TEXT)
def test_hook_options(left: str, right: str) -> None:
    spec = f"{left}::{right}"
    try:
        _values, parts, _ignored = hook_main.parse("create-symlinks", ["--link", spec])
        target, link = inroot.parse_link(spec, parts.get(("link", spec)))
    except UsageError:
        pass
    else:
        assert link.startswith("/") and "\x00" not in target + link and "\n" not in link
        assert os.path.normpath(link) == link
    try:
        folder = inroot.check_folder(left)
    except UsageError:
        pass
    else:
        assert folder.startswith("/") and not set(folder) & set("\0\n ,:")
    try:
        mode = inroot.parse_mode(right)
    except UsageError:
        pass
    else:
        assert 0 <= mode <= 0o3777 and not mode & 0o4000  # never setuid


@SETTINGS
@given(st.binary(max_size=1024))
def test_elf_reader_random_bytes(data: bytes) -> None:
    for blob in (data, b"\x7fELF\x02\x01\x01" + data, b"\x7fELF\x01\x02\x01" + data):
        fd = os.memfd_create("elf")
        try:
            os.write(fd, blob)
            try:
                info = elf.read_elf_fd(fd)
            except ValueError:
                continue
            assert info.elf_class in (32, 64)
            assert info.soname is None or "\x00" not in info.soname
        finally:
            os.close(fd)
