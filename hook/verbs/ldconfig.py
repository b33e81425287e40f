"""Refresh a container's ld cache with the HOST's ldconfig, confined to the container root.

No binary from the image ever runs: the host ldconfig is opened here (a root-owned regular file,
not group/world-writable) and executed by descriptor (execveat) in a child that has
  1. unshared a private mount namespace (nothing it does is seen by the container or the host)
     and in it remounted read-only every mount below the root that is not the root's own file
     system (bind-mounted driver files, volumes: ldconfig writes only to the root itself),
  2. chroot'ed into the container root (re-opened in the new namespace, checked by inode),
  3. lazily detached the root's /proc and /sys (no /proc/<pid>/root, no writable sysfs),
  4. dropped every capability but DAC_OVERRIDE, DAC_READ_SEARCH and FOWNER from its bounding,
     inheritable and ambient sets (no chroot, mount or ptrace: a bug in ldconfig triggered by a
     hostile ELF file cannot climb out), set no_new_privs, closed every other descriptor and
     cleared the environment.
Only a statically linked ldconfig can run like that (glibc always builds ldconfig static: Debian,
Ubuntu's ldconfig.real, RHEL, SUSE). A dynamic one would need a loader and libraries, and the
only ones inside the chroot are the image's: it is refused with a message naming the fix
(GPUCTK_LDCONFIG / --ldconfig-path pointing at a static ldconfig). Running it from outside with
`-r ROOT` is not used either: ldconfig resolves links under ROOT with path strings, which races.

Where the kernel allows it, the child then also leaves host root behind: it is forked as the
first process of a new pid namespace (it can name no host process) and, after the mount work
above and before the chroot, enters a new user namespace whose only mapping is the unprivileged
host id 65534 (uid and gid) as 0 inside, with no supplementary groups and an empty bounding set.
It keeps no capability over anything of the host (no open_by_handle_at, no signal to host root's
processes, no write to a file host root owns), so it cannot write the root's files either:
gpuctk.hook.verbs.ldrebuild hands it a scratch folder and installs its cache and SONAME links. Where
user namespaces are refused (user.max_user_namespaces=0, a seccomp filter, a hook that is not
host root), the child runs as host root with the three capabilities above, as before, and the
hook logs that at debug level.
"""

from __future__ import annotations

import os
import select
import stat
import struct
import time

from gpuctk import libc
from gpuctk.errors import GpuctkError
from gpuctk.hook.compiled import root_seen
from gpuctk.hook.verbs import mounts, namespaces
from gpuctk.log import hook as hooklog

CANDIDATES = ("/sbin/ldconfig.real", "/sbin/ldconfig", "/usr/sbin/ldconfig")
KEEP_CAPS = (1, 2, 3)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER
TIMEOUT = 60.0
WARNING = "gpuctk-hook: warning: "  # lines the child writes for the hook to log as warnings
_PT_INTERP = 3
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT, _AMBIENT_CLEAR_ALL = 24, 38, 47, 4
_CAP_V3 = 0x20080522  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words per set
_SIGKILL = 9  # not signal.SIGKILL: `import signal` pulls in enum at every hook start
LISTING_LIMIT = 32 << 20  # the most of `ldconfig -v` (stdout) read for SONAME links
OUTPUT_LIMIT = 1 << 20  # the most of its messages (stderr) kept for the log


class LdconfigError(GpuctkError):
    """The host ldconfig cannot be used, or failed inside the container root."""


# ELF class -> (e_phoff format and offset, e_phentsize/e_phnum offset, p_offset, p_filesz)
_ELF_LAYOUT = {1: ("I", 28, 42, ("I", 4), ("I", 16)), 2: ("Q", 32, 54, ("Q", 8), ("Q", 32))}


def elf_interpreter(fd: int) -> str | None:
    """The PT_INTERP of an ELF file (None when statically linked); LdconfigError if not ELF."""
    head = os.pread(fd, 64, 0)
    if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
        raise LdconfigError("not an ELF file")
    end = "<" if head[5] == 1 else ">"
    word, phoff_at, sizes_at, (off_fmt, off_at), (size_fmt, size_at) = _ELF_LAYOUT[head[4]]
    (phoff,) = struct.unpack_from(end + word, head, phoff_at)
    phentsize, phnum = struct.unpack_from(end + "HH", head, sizes_at)
    if phnum > 256 or phentsize < size_at + 8:
        raise LdconfigError("malformed ELF program headers")
    table = os.pread(fd, phentsize * phnum, phoff)
    for at in range(0, len(table) - phentsize + 1, phentsize):
        if struct.unpack_from(end + "I", table, at)[0] != _PT_INTERP:
            continue
        (offset,) = struct.unpack_from(end + off_fmt, table, at + off_at)
        (size,) = struct.unpack_from(end + size_fmt, table, at + size_at)
        return os.pread(fd, min(size, 4096), offset).rstrip(b"\0").decode("utf-8", "replace")
    return None


def open_host_ldconfig(path: str | None = None) -> tuple[int, str]:
    """Open the host's static ldconfig: `path` (a leading '@' is allowed, as nvidia-ctk writes
    it) or the first of CANDIDATES that exists. Returns (descriptor, path)."""
    candidates = [path.removeprefix("@")] if path else list(CANDIDATES)
    root: int | None = None  # root_seen(), asked once, at the first file found
    for candidate in candidates:
        try:
            fd = os.open(candidate, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise LdconfigError(f"cannot open host ldconfig {candidate}: {exc.strerror}") from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o111:
                raise LdconfigError(f"host ldconfig {candidate} is not an executable file")
            if root is None:
                try:
                    root = root_seen()
                except GpuctkError as exc:
                    raise LdconfigError(f"host ldconfig {candidate}: {exc.message}") from None
            if st.st_uid != root or st.st_mode & 0o022:  # root's, in a user namespace too
                raise LdconfigError(
                    f"host ldconfig {candidate} is not root-owned and write-protected"
                )
            if os.pread(fd, 2, 0) == b"#!":  # Ubuntu's wrapper script: use ldconfig.real
                if path is None:
                    os.close(fd)
                    continue
                raise LdconfigError(f"host ldconfig {candidate} is a script, not a binary")
            try:
                interp = elf_interpreter(fd)
            except LdconfigError as exc:
                raise LdconfigError(f"host ldconfig {candidate}: {exc}") from exc
            if interp is not None:
                raise LdconfigError(
                    f"host ldconfig {candidate} is dynamically linked (needs {interp}); only a "
                    "statically linked ldconfig can run confined in the container root: set "
                    "GPUCTK_LDCONFIG or --ldconfig-path to one"
                )
            return fd, candidate
        except BaseException:
            os.close(fd)
            raise
    raise LdconfigError(f"no host ldconfig found (looked for {', '.join(candidates)})")


def _child(
    root: tuple[int, str],
    exe_fd: int,
    argv: list[str],
    fds: tuple[int, int, int],
    sync: tuple[int, int],
    last_cap: int,
    userns: bool = True,
) -> None:
    """In the forked child: confine, then exec. Never returns. `fds`: stdin, stdout, stderr of
    ldconfig; `sync`: the pipe ends to tell the parent about the user namespace (4 bytes: 0 or
    the errno that refused it) and to wait for its uid map (one byte)."""
    null_fd, list_fd, out_fd = fds
    ready_fd, go_fd = sync
    step, err_fd = "start", out_fd
    try:
        step = "unshare the mount namespace"
        mounts.unshare_private_mounts()
        step = "open the container root"
        new_root = _reopen(*root)
        step = "make the other mounts below the root read-only"
        for warning in mounts.seal_submounts(new_root):
            os.write(out_fd, f"{WARNING}{warning}\n".encode("utf-8", "replace"))
        step = "enter the container root"
        os.fchdir(new_root)
        os.close(new_root)
        step = "detach /proc and /sys"  # relative to the root: a user namespace cannot unmount
        mounts.detach("proc")
        mounts.detach("sys")
        step = "drop supplementary groups"
        os.setgroups([])
        step = "enter a user namespace"  # before chroot: unshare refuses it in a chroot
        proc_pid = namespaces.proc_pid() if userns else 0
        refused = namespaces.new_user_namespace() if proc_pid else -1
        os.write(ready_fd, struct.pack("=ii", refused, proc_pid))
        if not refused and os.read(go_fd, 1) != b"g":
            raise OSError("no uid map came from the hook")
        os.close(ready_fd)
        os.close(go_fd)
        step = "chroot into the container root"
        os.chroot(".")
        os.chdir("/")
        keep: tuple[int, ...] = KEEP_CAPS
        if not refused:
            step = "become the mapped unprivileged user"
            os.setresgid(0, 0, 0)
            os.setresuid(0, 0, 0)
            keep = ()  # what they allow in the namespace covers no file of the root
        step = "drop capabilities"
        prctl = libc.function("prctl")
        for cap in range(last_cap + 1):
            if cap not in keep and prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                raise OSError(libc.get_errno(), "PR_CAPBSET_DROP")
        prctl(_PR_CAP_AMBIENT, _AMBIENT_CLEAR_ALL, 0, 0, 0)
        header = libc.buffer(struct.pack("=Ii", _CAP_V3, 0))  # struct __user_cap_header_struct
        data = libc.buffer(bytes(24))  # struct __user_cap_data_struct[2]: eff, perm, inh
        if libc.function("capget")(header, data) != 0:
            raise OSError(libc.get_errno(), "capget")
        eff0, perm0, _, eff1, perm1, _ = struct.unpack("=6I", data.raw)
        caps = struct.pack("=6I", eff0, perm0, 0, eff1, perm1, 0) if keep else bytes(24)
        data = libc.buffer(caps)  # no inheritable; in the namespace, none at all
        if libc.function("capset")(header, data) != 0:
            raise OSError(libc.get_errno(), "capset")
        if prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(libc.get_errno(), "PR_SET_NO_NEW_PRIVS")
        step = "set up descriptors"
        os.dup2(null_fd, 0)
        os.dup2(list_fd, 1)
        os.dup2(out_fd, 2)
        err_fd = 2
        os.closerange(3, exe_fd)
        os.closerange(exe_fd + 1, 1 << 20)
        step = "execute the host ldconfig"
        os.execve(exe_fd, argv, {})
    except BaseException as exc:  # report whatever it was, then exit
        msg = f"cannot {step}: {exc}\n".encode("utf-8", "replace")
        try:
            os.write(err_fd, msg)
        finally:
            os._exit(127)


def _reopen(root_fd: int, root_path: str) -> int:
    """The root as seen from the new mount namespace. A descriptor opened before unshare()
    still names the old namespace's mounts (its /proc could not be detached, its binds not
    sealed), so the trusted host path is opened again and must be the same directory."""
    fd = os.open(root_path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    a, b = os.fstat(fd), os.fstat(root_fd)
    if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
        os.close(fd)
        raise OSError(f"{root_path} is not the container root any more")
    return fd


def run_confined(
    root_fd: int,
    root_path: str,
    exe_fd: int,
    args: list[str],
    timeout: float = TIMEOUT,
    userns: bool = True,
) -> tuple[str, bytes]:
    """Run the opened host ldconfig with `args` confined to the root (`root_fd`, whose trusted
    host path is `root_path`); returns its stderr (and the confining steps' warnings) and its
    stdout. Unprivileged where user namespaces are allowed: see the module's docstring."""
    with open("/proc/sys/kernel/cap_last_cap", "rb") as f:
        last_cap = int(f.read())
    mine: list[int] = []  # the ends this process keeps; the child's are closed after fork
    child: list[int] = []
    try:
        child.append(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))
        for _ in range(3):  # ldconfig's stdout (the listing), its stderr, "ready"
            r, w = os.pipe2(os.O_CLOEXEC)
            mine.append(r)
            child.append(w)
        go_r, go_w = os.pipe2(os.O_CLOEXEC)
        mine.append(go_w)
        child.append(go_r)
        list_r, out_r, ready_r, _ = mine
        null_fd, list_w, out_w, ready_w, _ = child
        deadline = time.monotonic() + timeout
        pid = namespaces.fork_in_new_pid_namespace()
        if pid == 0:
            for fd in mine:
                os.close(fd)
            _child((root_fd, root_path), exe_fd, ["ldconfig", *args],
                   (null_fd, list_w, out_w), (ready_w, go_r), last_cap, userns)  # fmt: skip
        for fd in child:
            os.close(fd)
        child.clear()
        refused = ""
        try:
            namespaces.map_user(ready_r, go_w, deadline)
        except BaseException as exc:
            os.kill(pid, _SIGKILL)
            os.waitpid(pid, 0)
            if not isinstance(exc, namespaces.MapRefused):
                raise
            refused = str(exc) or "refused"
        if not refused:
            (listing, output), status = _collect(
                pid, [(list_r, LISTING_LIMIT), (out_r, OUTPUT_LIMIT)], deadline
            )
    finally:
        for fd in mine + child:
            os.close(fd)
    if refused:  # not host root (the hook in a user namespace): as before, once more
        hooklog.log(
            "debug",
            f"the host ldconfig's user namespace could not be mapped "
            f"({refused}): it runs as host root, confined as before",
            to_stderr=False,
        )
        return run_confined(root_fd, root_path, exe_fd, args, timeout, userns=False)
    text = output.decode("utf-8", "replace").strip()
    if status is None:
        raise LdconfigError(
            f"host ldconfig did not finish within {timeout:.0f}s in the container root"
        )
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        last = text.splitlines()[-1] if text else f"exit status {code}"
        raise LdconfigError(f"host ldconfig failed in the container root: {last}")
    return text, listing


def _collect(
    pid: int, limits: list[tuple[int, int]], deadline: float
) -> tuple[list[bytes], int | None]:
    """Read each (descriptor, most bytes kept) to its end, then reap the child; all bounded
    by `deadline` (the child is killed past it: status None)."""
    chunks: dict[int, list[bytes]] = {fd: [] for fd, _ in limits}
    sizes = {fd: [0, limit] for fd, limit in limits}
    open_fds = [fd for fd, _ in limits]

    def joined() -> list[bytes]:
        return [b"".join(chunks[fd]) for fd, _ in limits]

    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, _SIGKILL)
            os.waitpid(pid, 0)
            return joined(), None
        ready, _, _ = select.select(open_fds, [], [], left)
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.remove(fd)
            elif sizes[fd][0] < sizes[fd][1]:
                chunks[fd].append(chunk)
                sizes[fd][0] += len(chunk)
    while time.monotonic() < deadline:  # output closed: wait for the exit, still bounded
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return joined(), status
        time.sleep(0.001)
    os.kill(pid, _SIGKILL)
    os.waitpid(pid, 0)
    return joined(), None
