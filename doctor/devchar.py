"""`gpuctk doctor`, driver layer: every NVIDIA device node has its /dev/char/MAJOR:MINOR link.

runc's systemd cgroup driver allows a container's devices as `DeviceAllow=/dev/char/MAJOR:MINOR`;
a node without that link works until the next `systemctl daemon-reload`, when systemd re-applies
the policy without it and running GPU containers lose their GPUs. So a missing or wrong link is
a warning (it bites later), fixed by `gpuctk system create-dev-char-symlinks`.

The links are looked for where runc and systemd look, the host's /dev/char (under --host-root),
whatever the dev root: with a driver container's /run/nvidia/driver as the dev root the nodes
are found there, and each link must lead (from the host) to a node of the same numbers. The fix
writes there too: --driver-root only says where the nodes are.
"""

from __future__ import annotations

import shlex

from gpuctk.doctor.context import Context, Findings
from gpuctk.doctor.report import Result, ok, skipped, warning
from gpuctk.errors import GpuctkError

CHECK = "driver.dev-char"
TITLE = "/dev/char links for the NVIDIA device nodes (systemd cgroup driver)"
MAX_SHOWN = 6
DEV_CHAR = "/dev/char"


def fix_command(ctx: Context) -> str:
    argv = ["gpuctk", "system", "create-dev-char-symlinks"]
    if ctx.dev_root != "/":
        argv += ["--driver-root", ctx.dev_root]
    if ctx.host(DEV_CHAR) != DEV_CHAR:
        argv += ["--dev-char-path", ctx.host(DEV_CHAR)]
    if ctx.proc_root != "/proc":
        argv += ["--proc-root", ctx.proc_root]
    return shlex.join(argv)


def check_dev_char(ctx: Context, found: Findings) -> Result:
    from gpuctk.cdi.node import devchar

    dev, dev_char = ctx.dev("/dev"), ctx.host(DEV_CHAR)
    majors = found.char_majors or devchar.read_char_majors(ctx.proc_root)
    try:
        nodes = devchar.find_nodes(dev, devchar.nvidia_majors(majors))
    except GpuctkError as exc:
        return skipped(CHECK, TITLE, exc.message)
    if not nodes:
        return skipped(CHECK, TITLE, f"no NVIDIA device nodes in {dev}")
    wrong = devchar.check_links(dev, dev_char, nodes)
    if not wrong:
        return ok(CHECK, TITLE, f"{len(nodes)} NVIDIA node(s) in {dev} linked in {dev_char}")
    shown = [why for _, why in wrong[:MAX_SHOWN]]
    if len(wrong) > MAX_SHOWN:
        shown.append(f"... and {len(wrong) - MAX_SHOWN} more")
    evidence = [
        *shown,
        f"{len(wrong)} of {len(nodes)} NVIDIA node(s) have no correct link: with the systemd "
        "cgroup driver, running GPU containers lose them at the next systemctl daemon-reload",
    ]
    return warning(CHECK, TITLE, evidence, fix_command(ctx))


def devchar_checks(ctx: Context, found: Findings) -> list[Result]:
    return [check_dev_char(ctx, found)]
