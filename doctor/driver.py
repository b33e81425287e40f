"""`gpuctk doctor` layer 1: the kernel driver.

The module is loaded (`<proc>/driver/nvidia/version`), the user-space libraries under the
driver root carry the module's version, the device nodes exist with the majors that
`<proc>/devices` gives (nvidia-modeset only where a display driver needs it: a headless
compute node has none, as NVIDIA's spec), and persistence mode is on (NVML's answer, read after
the NVML layer, gpuctk.doctor.nvml; the daemon's socket only where NVML cannot tell). The
helpers for device nodes and fix commands serve both layers.
"""

from __future__ import annotations

import os
import re
import stat

from gpuctk.cdi.node.devchar import parse_char_majors
from gpuctk.doctor.context import Context, Findings
from gpuctk.doctor.report import Result, failed, ok, skipped, warning
from gpuctk.errors import GpuctkError

_KERNEL_VERSION = re.compile(r"Kernel Module(?: for [A-Za-z0-9_]+)?\s+(\d+(?:\.\d+)+)")
PERSISTENCED_SOCKET = "/var/run/nvidia-persistenced/socket"
MODESET = "/dev/nvidia-modeset"  # only the display driver (nvidia-modeset.ko) serves it
MAX_PROC_FILE = 1 << 20


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_PROC_FILE).decode("utf-8", "replace")
    except OSError:
        return None


def kernel_version(text: str) -> str | None:
    """The version in /proc/driver/nvidia/version ("NVRM version: ... Kernel Module  535.x ...")."""
    match = _KERNEL_VERSION.search(text)
    return match.group(1) if match else None


def nvidia_major(majors: dict[str, int]) -> int | None:
    for name in ("nvidia-frontend", "nvidia"):
        if name in majors:
            return majors[name]
    return None


def node_id(path: str) -> tuple[int, int] | None:
    """(major, minor) of the char device at `path`; None when absent or not a char device."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        return None
    return os.major(st.st_rdev), os.minor(st.st_rdev)


def join_fixes(fixes: list[str], limit: int = 4) -> str:
    """Fix commands joined with &&, the first `limit` of them (the evidence names the rest)."""
    unique = list(dict.fromkeys(fixes))
    text = " && ".join(unique[:limit])
    if len(unique) > limit:
        text += f"   # and {len(unique) - limit} more like it"
    return text


def mknod_fix(path: str, major: int, minor: int, mode: str = "666") -> str:
    return f"rm -f {path} && mknod -m {mode} {path} c {major} {minor}"


def check_module(ctx: Context, found: Findings) -> Result:
    title = "kernel module loaded"
    path = ctx.proc("driver/nvidia/version")
    text = _read(path)
    if text is None:
        return failed(
            "driver.module",
            title,
            [f"{path}: missing: the nvidia kernel module is not loaded"],
            "modprobe nvidia && dmesg | grep -i nvrm   # or install the driver",
        )
    found.kernel_version = kernel_version(text)
    first = text.strip().splitlines()[0] if text.strip() else ""
    if found.kernel_version is None:
        return warning(
            "driver.module", title, [f"{path}: no version in {first!r}"], "check dmesg for NVRM"
        )
    return ok("driver.module", title, f"{path}: kernel module {found.kernel_version}")


def check_libraries(ctx: Context, found: Findings) -> Result:
    title = "user-space driver matches the kernel module"
    version = found.kernel_version
    if version is None:
        return skipped("driver.libraries", title, "kernel module version unknown")
    from gpuctk.cdi.discover import NVML_DIRS
    from gpuctk.cdi.node.driverfiles import discover_driver_files

    try:
        files = discover_driver_files(ctx.driver_root, version)
    except GpuctkError as exc:
        return failed("driver.libraries", title, [exc.message], "check --driver-root")
    names = {os.path.basename(f.host_path) for f in files.libraries}
    wanted = [f"libnvidia-ml.so.{version}", f"libcuda.so.{version}"]
    missing = [n for n in wanted if n not in names]
    if not missing:
        return ok(
            "driver.libraries",
            title,
            f"{len(files.libraries)} driver libraries of {version} under {ctx.driver_root}",
        )
    others = sorted(
        {
            n.removeprefix("libnvidia-ml.so.")
            for d in NVML_DIRS
            for n in _listdir(os.path.join(ctx.driver_root, d))
            if n.startswith("libnvidia-ml.so.") and n.count(".") >= 3
        }
    )
    evidence = [f"kernel module {version}; missing under {ctx.driver_root}: {', '.join(missing)}"]
    if others:
        evidence.append(f"user-space driver found: {', '.join(others)} (upgraded without reboot?)")
        fix = "reboot the node (or reload the modules: rmmod nvidia_uvm nvidia_drm "
        fix += "nvidia_modeset nvidia && modprobe nvidia)"
    else:
        fix = "install the NVIDIA driver user-space libraries, or point --driver-root at them"
    return failed("driver.libraries", title, evidence, fix)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def check_nodes(ctx: Context, found: Findings) -> Result:
    title = "device nodes present with the driver's majors"
    devices = ctx.proc("devices")
    text = _read(devices)
    if text is None:
        return skipped("driver.device-nodes", title, f"{devices}: cannot read")
    majors = found.char_majors = parse_char_majors(text)
    nv = nvidia_major(majors)
    if nv is None:
        return failed(
            "driver.device-nodes",
            title,
            [f"{devices}: no nvidia char device major (module not loaded?)"],
            "modprobe nvidia",
        )
    uvm = majors.get("nvidia-uvm")
    caps = majors.get("nvidia-caps")
    expected: list[tuple[str, int | None, int | None, bool, str]] = [
        ("/dev/nvidiactl", nv, 255, True, "nvidia-modprobe -c=0"),
        ("/dev/nvidia-uvm", uvm, 0, True, "nvidia-modprobe -u -c=0"),
        ("/dev/nvidia-uvm-tools", uvm, 1, True, "nvidia-modprobe -u -c=0"),
        (MODESET, nv, 254, False, "nvidia-modprobe -m"),
    ]
    for name in sorted(_listdir(ctx.dev("/dev"))):
        if name.startswith("nvidia") and name[6:].isdigit():
            expected.append((f"/dev/{name}", nv, int(name[6:]), True, ""))
    for name in sorted(_listdir(ctx.dev("/dev/nvidia-caps"))):
        if name.startswith("nvidia-cap") and name[10:].isdigit():
            expected.append((f"/dev/nvidia-caps/{name}", caps, int(name[10:]), True, ""))
    bad: list[str] = []
    fixes: list[str] = []
    warn: list[str] = []
    info: list[str] = []
    good = 0
    for path, major, minor, required, tool in expected:
        host = ctx.dev(path)
        got = node_id(host)
        if major is None:
            if got is not None or required:
                warn.append(f"{host}: the driver has no major for it in {devices}")
            continue
        if got is None and path == MODESET:  # no display driver: normal on a compute node
            info.append(f"{host}: absent: normal on a headless node (only a display driver "
                        "uses it; NVIDIA's spec has none either)")  # fmt: skip
            continue
        if got is None:
            (bad if required else warn).append(f"{host}: missing or not a character device")
            if required:
                fixes.append(tool or mknod_fix(host, major, minor or 0))
        elif got[0] != major or (minor is not None and got[1] != minor):
            bad.append(f"{host}: is {got[0]}:{got[1]}, the driver says {major}:{minor}")
            fixes.append(mknod_fix(host, major, minor or 0))
        else:
            good += 1
    evidence = [*bad, *warn, f"{good} node(s) correct under {ctx.dev('/dev')}", *info]
    if bad:
        return failed("driver.device-nodes", title, evidence, join_fixes(fixes))
    if warn:
        return warning("driver.device-nodes", title, evidence, "nvidia-modprobe -m -u -c=0")
    return ok("driver.device-nodes", title, *evidence)


def check_persistence(ctx: Context, found: Findings) -> Result:
    """Persistence mode as NVML reports it: the kernel driver's state, whoever set it
    (nvidia-persistenced, or `nvidia-smi -pm 1`, with no daemon and so no socket). Only where
    NVML cannot tell (a --simulate profile, NVML unavailable) does the daemon's socket stand in."""
    title = "persistence mode on"
    if found.kernel_version is None:
        return skipped("driver.persistence", title, "kernel module not loaded")
    socket = ctx.host(PERSISTENCED_SOCKET)
    try:
        is_socket = stat.S_ISSOCK(os.stat(socket).st_mode)
    except OSError:
        is_socket = False
    daemon = (f"{socket}: nvidia-persistenced is running" if is_socket else
              f"no {socket}: nvidia-persistenced is not running (optional: the mode is the "
              "kernel driver's)")  # fmt: skip
    modes = found.persistence
    m = found.machine
    if m is not None and m.gpus and modes and all(v is not None for v in modes):
        off = [g for g, on in zip(m.gpus, modes, strict=False) if not on]
        if not off:
            on = f"NVML: persistence mode enabled on all {len(m.gpus)} GPU(s)"
            return ok("driver.persistence", title, on, daemon)
        ids = ",".join(str(g.index) for g in off)
        return warning(
            "driver.persistence",
            title,
            [
                f"NVML: persistence mode disabled on GPU(s) {ids}: each is re-initialised for "
                "every first user (slow starts, lost state between containers)",
                daemon,
            ],
            "systemctl enable --now nvidia-persistenced   # or: nvidia-smi -pm 1",
        )
    if is_socket:
        return ok("driver.persistence", title, daemon)
    return warning(
        "driver.persistence",
        title,
        [
            f"{socket}: absent, and NVML did not report the mode: GPUs may be re-initialised "
            "for every first user (slow starts, lost state between containers)"
        ],
        "systemctl enable --now nvidia-persistenced   # or: nvidia-smi -pm 1",
    )


ROOT_FIX = "pass the driver's folder as --driver-root (/, or /run/nvidia/driver for the Operator)"


def driver_checks(ctx: Context, found: Findings) -> list[Result]:
    """The driver layer; a --driver-root that is not a folder is its own failure, listed first."""
    title, why = "user-space driver matches the kernel module", ""
    if not os.path.isdir(ctx.driver_root):
        why = f"driver root {ctx.driver_root} is not a directory"
    root = [failed("driver.root", "driver root is a folder", [why], ROOT_FIX)] if why else []
    module = check_module(ctx, found)
    libraries = skipped("driver.libraries", title, why) if why else check_libraries(ctx, found)
    return [*root, module, libraries, check_nodes(ctx, found)]


def persistence_checks(ctx: Context, found: Findings) -> list[Result]:
    """The driver layer's last check, run after the NVML layer (whose answer it reads)."""
    return [check_persistence(ctx, found)]
