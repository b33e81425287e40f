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

from gpuctk.cdi.node.facts import GUARD_ACTION
from gpuctk.errors import GpuctkError
from gpuctk.hook import compiled

NAME = GUARD_ACTION
ROOT_FD_OPT = compiled.ROOT_FD_OPT  # gpuctk-hook's form: the root as an inherited descriptor
PARAMS = "/proc/driver/nvidia/params"
MAX_BYTES = 64 * 1024
KEY = b"ModifyDeviceFiles: "
SCRATCH = "/run"
SCRATCH_PREFIX = ".gpuctk-params-"  # + 12 random hex digits: the copy in /dev, a folder in SCRATCH
TMPFS_MAGIC = 0x01021994  # statfs(2)'s f_type of a tmpfs


def protect(root_fd: int) -> str:
    """The guard (see the module docstring) for the container root `root_fd`, done by
    gpuctk-cdi-hook; returns what was done, in words. GpuctkError when it cannot be done."""
    fd = compiled.high(os.dup(root_fd))
    try:
        done = compiled.run([NAME, ROOT_FD_OPT, str(fd)], (fd,), NAME)
    finally:
        os.close(fd)
    if done.returncode != 0:
        raise GpuctkError(f"{NAME}: {compiled.why(done)}")
    return done.stdout.decode(errors="replace").strip()
