"""Keep a container from making device nodes for GPUs it was not given.

The NVIDIA driver's `/proc/driver/nvidia/params` says `ModifyDeviceFiles: 1` by default: NVML
in a container then mknods /dev/nvidia<N> for every GPU of the machine. The guard (the hook's
`disable-device-node-modification` action, also the last step of `createContainer`) mounts over
the container's params file a read-only copy of it that says `ModifyDeviceFiles: 0`, as the
reference toolkit's hook of that name does. runc refuses config.json mounts inside /proc, so
this runs as a createContainer hook: in the container's mount namespace, after the runtime
mounted the container's /proc and before the container runs anything.

The guard has one implementation, in C: `guard()` in hook/cdihook.c, which the spec's
`gpuctk-cdi-hook` entry runs, and which gpuctk-hook runs too (`protect`) with the root it
opened passed as a descriptor (`gpuctk-cdi-hook disable-device-node-modification --root-fd N`:
that form does the guard alone, prints its outcome and never hands anything back):

- the copy is made of the container's own params file (resolved inside the root: the procfs
  the runtime mounted there, which the image cannot reach before it starts), at most
  MAX_BYTES; no such file (no driver loaded), or one that says anything but
  `ModifyDeviceFiles: 1`: nothing is done; a root whose /proc is the image's folder (the hook
  run by hand on a folder): nothing is done;
- the copy is a new file in the container's own /dev (the tmpfs the runtime mounts there: on
  another mount than the root's, not the host's /dev; a folder a user namespace's root can
  write), bound from the descriptor it was written through (never by its name) and removed
  once bound. Where the root has no such /dev, or it is full or read-only, the copy lies on a
  tmpfs of its own, mounted on an empty folder made for it in the hook's /run (SCRATCH) and
  detached again, the folder removed, once the copy is bound;
- the bind goes through descriptors: with the new mount API (5.12 and later) the copy is
  cloned into a detached mount made read-only, nosuid, nodev, noexec before it is attached
  onto the target opened inside the root (where the request made the root's propagation
  shared, the copies the kernel propagates to the host are read-only too); older kernels get
  a bind through /proc/self/fd of both descriptors and a read-only remount of the new mount,
  checked to be the copy. Either way the container sees the one file, read-only.

gpuctk-runtime adds the action's hook entry to a GPU container whose spec's own gpuctk hook
does not run (gpuctk.hook.verbs.nodeguard).
"""

from __future__ import annotations

import os
import sys

from gpuctk.cdi.node.facts import GUARD_ACTION
from gpuctk.errors import GpuctkError

NAME = GUARD_ACTION
PROGRAM = "gpuctk-cdi-hook"  # hook/cdihook.c: the guard's one implementation
ROOT_FD_OPT = "--root-fd"  # gpuctk-hook's form: the container root as an inherited descriptor
PARAMS = "/proc/driver/nvidia/params"
MAX_BYTES = 64 * 1024
KEY = b"ModifyDeviceFiles: "
SCRATCH = "/run"
SCRATCH_PREFIX = ".gpuctk-params-"  # + 12 random hex digits: the copy in /dev, a folder in SCRATCH
TMPFS_MAGIC = 0x01021994  # statfs(2)'s f_type of a tmpfs


def installed() -> str:
    """The compiled gpuctk-cdi-hook this install has: gpuctk.hook's copy (setup.py's build),
    else the one beside the interpreter (a venv's bin/, where tests/run.sh builds it for an
    editable install); "" where there is none."""
    from gpuctk import hook

    for folder in (
        os.path.dirname(os.path.abspath(hook.__file__)),
        os.path.dirname(sys.executable),
    ):
        path = os.path.join(folder, PROGRAM)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return ""


def program() -> str:
    """gpuctk-cdi-hook beside this gpuctk-hook (as named, then its real file: the one that
    handed the container over, or the deb's), else installed(); "" where there is none."""
    me = sys.argv[0] if sys.argv else ""
    for mine in [me, os.path.realpath(me)] if me[:1] == "/" else []:
        path = os.path.join(os.path.dirname(mine), PROGRAM)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return installed()


def protect(root_fd: int) -> str:
    """The guard (see the module docstring) for the container root `root_fd`, done by
    gpuctk-cdi-hook; returns what was done, in words. GpuctkError when it cannot be done."""
    import subprocess

    exe = program()
    if not exe:
        raise GpuctkError(
            f"{NAME}: no {PROGRAM} beside gpuctk-hook or in the gpuctk package: reinstall "
            "gpuctk (pip install ., the deb or the node image), which builds it"
        )
    try:
        done = subprocess.run(
            [exe, NAME, ROOT_FD_OPT, str(root_fd)], pass_fds=(root_fd,), env={},
            stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GpuctkError(f"{NAME}: {exe}: {exc}") from None
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines() or ["no message"]
        why = lines[-1].removeprefix(f"{PROGRAM}: error: ")
        raise GpuctkError(f"{NAME}: {why} (exit {done.returncode})")
    return done.stdout.decode(errors="replace").strip()
