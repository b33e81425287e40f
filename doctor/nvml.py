"""`gpuctk doctor` layer 2: NVML.

NVML loads (or a `--simulate` profile stands in) and agrees with the kernel module's version,
counts GPUs, reports MIG mode and devices, and every GPU and MIG device it names has its device
nodes. The machine it reads, and each GPU's persistence mode, are kept in the findings for the
layers after it (the driver layer's persistence check among them).
"""

from __future__ import annotations

import os

from gpuctk.doctor.context import Context, Findings
from gpuctk.doctor.driver import ROOT_FIX, join_fixes, mknod_fix, node_id, nvidia_major
from gpuctk.doctor.report import Result, failed, ok, skipped, warning
from gpuctk.errors import GpuctkError

NVIDIA_MAJOR = 195  # the nvidia char major, when <proc>/devices names none


def check_nvml(ctx: Context, found: Findings) -> Result:
    title = "NVML loads and answers"
    if ctx.simulate:
        from gpuctk.cdi.node.profile import load_profile

        try:
            found.machine = load_profile(ctx.simulate)
        except GpuctkError as exc:
            return failed("nvml.load", title, [exc.message], "gpuctk cdi generate --help")
        found.machine_source = f"profile {ctx.simulate} (--simulate)"
        return ok("nvml.load", title, f"machine from {found.machine_source}")
    from gpuctk.cdi.discover import Roots, load_nvml
    from gpuctk.cdi.node.nvml import survey

    roots = Roots(ctx.driver_root, ctx.dev_root, ctx.proc_root, ctx.sys_root)
    try:
        (machine, found.persistence), library = load_nvml(roots, ctx.nvml_library, survey)
    except GpuctkError as exc:
        return failed(
            "nvml.load", title, [_nvml_evidence(ctx, exc.message)], _nvml_fix(ctx, exc.message)
        )
    found.machine_source = f"NVML ({library})"
    m = found.machine = machine
    evidence = [f"{library}: driver {m.driver_version}, CUDA {m.cuda_driver_version}"]
    if found.kernel_version and found.kernel_version != m.driver_version:
        evidence.append(f"kernel module is {found.kernel_version}, NVML {m.driver_version}")
        return failed(
            "nvml.load", title, evidence, "reboot the node (driver upgraded without a reboot)"
        )
    return ok("nvml.load", title, *evidence)


def _nvml_evidence(ctx: Context, message: str) -> str:
    if ctx.driver_root == "/" or "--driver-root" not in message:
        return message  # else NVML's advice names the flag that was given
    return f"{message.split(':', 1)[0]}: not under driver root {ctx.driver_root}, nor system-wide"


def _nvml_fix(ctx: Context, message: str) -> str:
    if "not found" in message or "cannot be loaded" in message:
        if ctx.driver_root == "/":
            return "install the driver, or pass --driver-root / --nvml-library"
        if not os.path.isdir(ctx.driver_root):
            return ROOT_FIX
        return f"install the driver, check --driver-root {ctx.driver_root}, or pass --nvml-library"
    if "permission" in message:
        return "run gpuctk doctor as root"
    if "versions differ" in message:
        return "reboot the node (or reload the nvidia modules)"
    return "modprobe nvidia && nvidia-smi   # then read dmesg for NVRM/Xid errors"


def check_gpus(ctx: Context, found: Findings) -> Result:
    title = "GPUs found"
    m = found.machine
    if m is None:
        return skipped("nvml.gpus", title, "NVML unavailable")
    if not m.gpus:
        return failed(
            "nvml.gpus",
            title,
            [f"{found.machine_source}: 0 GPUs"],
            "lspci -d 10de: ; dmesg | grep -i nvrm   # GPU not bound to the nvidia driver?",
        )
    names = sorted({g.name for g in m.gpus})
    return ok("nvml.gpus", title, f"{len(m.gpus)} GPU(s): {', '.join(names)}")


def check_mig(ctx: Context, found: Findings) -> Result:
    title = "MIG mode and devices"
    m = found.machine
    if m is None:
        return skipped("nvml.mig", title, "NVML unavailable")
    enabled = [g for g in m.gpus if g.mig_enabled]
    if not enabled:
        return ok("nvml.mig", title, "MIG off on every GPU")
    empty = [g for g in enabled if not g.mig_devices]
    evidence = [
        f"GPU {g.index}: MIG on, {len(g.mig_devices)} device(s)"
        + (f": {', '.join(sorted({d.profile for d in g.mig_devices}))}" if g.mig_devices else "")
        for g in enabled
    ]
    if empty:
        ids = ",".join(str(g.index) for g in empty)
        return warning(
            "nvml.mig",
            title,
            [*evidence, f"GPU(s) {ids}: MIG on but no MIG devices: no container can use them"],
            f"nvidia-smi mig -i {ids} -cgi <profile> -C   # or disable MIG: nvidia-smi -i {ids} "
            "-mig 0",
        )
    return ok("nvml.mig", title, *evidence)


def check_gpu_nodes(ctx: Context, found: Findings) -> Result:
    title = "every GPU and MIG device has its device nodes"
    m = found.machine
    if m is None:
        return skipped("nvml.device-nodes", title, "NVML unavailable")
    from gpuctk.cdi.node import devnodes

    nv = nvidia_major(found.char_majors) or NVIDIA_MAJOR
    caps = found.char_majors.get("nvidia-caps")
    bad: list[str] = []
    fixes: list[str] = []
    table = None
    for g in m.gpus:
        host = ctx.dev(f"/dev/nvidia{g.minor}")
        got = node_id(host)
        if got != (nv, g.minor):
            what = "missing" if got is None else f"is {got[0]}:{got[1]}"
            bad.append(f"GPU {g.index} ({g.uuid}): {host} {what}, expected {nv}:{g.minor}")
            fixes.append(
                f"nvidia-modprobe -c={g.minor}" if got is None else mknod_fix(host, nv, g.minor)
            )
        for d in g.mig_devices:
            if table is None:
                try:
                    table = dict(devnodes.read_mig_minors(ctx.proc_root))
                except GpuctkError as exc:
                    bad.append(exc.message)
                    table = {}
                    fixes.append("modprobe nvidia (its nvidia-caps part creates mig-minors)")
                    continue
            for cap in (f"gpu{g.minor}/gi{d.gi}/access", f"gpu{g.minor}/gi{d.gi}/ci{d.ci}/access"):
                minor = table.get(cap)
                if minor is None:
                    if table:
                        bad.append(f"MIG {d.name}: no {cap} in mig-minors")
                    continue
                node = ctx.dev(f"/dev/nvidia-caps/nvidia-cap{minor}")
                got = node_id(node)
                if got is None or got[1] != minor or (caps is not None and got[0] != caps):
                    what = "missing" if got is None else f"is {got[0]}:{got[1]}"
                    bad.append(f"MIG {d.name} ({cap}): {node} {what}")
                    fixes.append(mknod_fix(node, caps or 0, minor, "444"))
    count = len(m.gpus) + len(m.mig_devices)
    if bad:
        return failed("nvml.device-nodes", title, bad, join_fixes(fixes))
    return ok("nvml.device-nodes", title, f"{count} device(s) matched under {ctx.dev('/dev')}")


def nvml_checks(ctx: Context, found: Findings) -> list[Result]:
    return [
        check_nvml(ctx, found),
        check_gpus(ctx, found),
        check_mig(ctx, found),
        check_gpu_nodes(ctx, found),
    ]
