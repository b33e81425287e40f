"""Who may write the CDI specs the shim and the hook act on, and the executables they name.

A CDI spec is code for a root process: its mounts, device nodes and hooks are carried out as root
in every container that asks for a device. So the spec dirs the container-create path reads
(gpuctk-runtime, gpuctk-hook prestart / precreate, through gpuctk.cdi.specs.registry) are trusted
only
as far as the accounts that can write them, or swap them:

- a spec dir, and every folder above it, must be owned by root (or by the user gpuctk runs as: a
  rootless engine) and not writable by its group or by others; a sticky folder others can write
  (/tmp) is crossed only to an entry of root's; the spec dir itself may not be writable by
  others at all (sticky or not: anyone could plant a file);
- a spec file must be a regular file with the same owner rule, not group- or world-writable,
  opened through the spec dir's descriptor; its owner and mode are checked on the descriptor
  the bytes are then read from (no race between the check and the read); a symlink is followed
  only from a folder that passed, and judged by the file it leads to, up through its folders;
- a hook a spec names (containerEdits.hooks[].path) is run by the low-level runtime as root:
  it must be an absolute path whose file and folders pass the same rules; a path missing from a
  folder only root can write is let through (the runtime then says it is missing), one missing
  from a folder others can write is not. gpuctk.cdi.specs.apply checks this on every apply (also for
  a remembered plan: the files may have changed since), without importing this module.

The walk is gpuctk.fs.open_trusted_dir / trusted_file. A refused dir or file is skipped (never
read), logged as a warning naming it, the component at fault and the fix, and named again if a
request then cannot be resolved; a refused hook fails the create.
"""

from __future__ import annotations

import os


def open_spec_dir(path: str) -> int:
    """A descriptor of the spec dir `path`, opened for listing, after the trust walk; the
    caller closes it. TrustError; OSError (FileNotFoundError, NotADirectoryError: no dir)."""
    from gpuctk.fs import open_trusted_dir

    return open_trusted_dir(path, flags=os.O_RDONLY)
