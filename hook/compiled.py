"""gpuctk-cdi-hook (hook/cdihook.c) as gpuctk-hook and gpuctk-runtime run it for the rules
written in C alone: the device node guard (gpuctk.hook.verbs.nodeprotect), the ld cache merge
(gpuctk.hook.verbs.ldmerge), NVIDIA_DRIVER_CAPABILITIES (capabilities()), root's owner
(root_seen()), the link policy (links_in_root()), and the reading of a hook entry's and runc's
arguments (read_args(), gpuctk.hook.shim.runcargs). Each form takes what Python resolved, as
inherited descriptors or arguments, and never hands anything back. The C is a required part
of every install (setup.py builds it; no compiler, no install).
"""

from __future__ import annotations

import errno
import os
import sys

from gpuctk.cdi.node.facts import COMPILED_HOOK, HOOK_OPTIONS, compiled_beside
from gpuctk.errors import GpuctkError, UsageError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: typing's import is costly at every start
if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpuctk.rootfs import InRootError

    # read_args(): KIND, START, STOP, NAME, VALUE, CAPABILITY, TARGET, LINK
    Arg = tuple[str, int, int, str, str, str, str, str]

PROGRAM = COMPILED_HOOK
ERROR_PREFIX = f"{PROGRAM}: error: "
ROOT_FD_OPT = "--root-fd"  # the guard's form: the container root as an inherited descriptor
MERGE_VERB = "merge-ld-cache"  # the ld cache merge's form (gpuctk.hook.verbs.ldmerge.merged)
CAPS_VERB = "driver-capabilities"  # the container's capabilities' form (capabilities())
CONFIG_FD_OPT = "--config-fd"  # its OCI config, as an inherited descriptor
ROOT_SEEN_VERB = "root-seen"  # root_seen()'s form
LINKS_VERB = "make-links"  # the link policy's form (links_in_root())
DIR_FD_OPT = "--dir-fd"  # a link's folder, as an inherited descriptor
READ_ARGS_VERB = "read-args"  # the reading of a hook entry's arguments' form (read_args())
RUNC_ARGS_VERB = "runc-args"  # the reading of runc's arguments' form (runcargs.parse_argv)
SERVED_VERBS = (MERGE_VERB, CAPS_VERB, ROOT_SEEN_VERB, LINKS_VERB, READ_ARGS_VERB, RUNC_ARGS_VERB)
LINK_OUTCOMES = ("made", "kept", "left")  # what links_in_root() says of each link
LINKS_PER_RUN = 256  # links asked for in one run of the C (its argument list, descriptors)


def installed() -> str:
    """The compiled gpuctk-cdi-hook this install has: gpuctk.hook's copy (setup.py's build),
    else the one beside the interpreter (a venv's bin/, where tests/run.sh builds it for an
    editable install); "" where there is none."""
    from gpuctk import hook

    package = os.path.dirname(os.path.abspath(hook.__file__))
    for folder in (package, os.path.dirname(sys.executable)):
        path = os.path.join(folder, PROGRAM)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return ""


def program() -> str:
    """The gpuctk-cdi-hook of this Python's own install (installed(): built with it, so never
    of another version), else the one beside this launcher (as named, then its real file);
    "" where there is none."""
    me = sys.argv[0] if sys.argv else ""
    return installed() or (compiled_beside(me) if me[:1] == "/" else "")


class Done:
    """What a run of gpuctk-cdi-hook gave: its exit status and output."""

    __slots__ = ("returncode", "stderr", "stdout")

    def __init__(self, returncode: int, stdout: bytes, stderr: bytes) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def high(fd: int) -> int:
    """`fd`, moved above the standard streams where it took one's number (a caller that ran
    with 0, 1 or 2 closed): the spawn puts /dev/null and pipes there."""
    if fd > 2:
        return fd
    import fcntl

    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    finally:
        os.close(fd)


def memfd(name: str, data: bytes) -> int:
    """A memory file holding `data`, at its start, above the standard streams (high()): what
    a form of the C reads from an inherited descriptor."""
    fd = high(os.memfd_create(name, os.MFD_CLOEXEC))
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def run(args: list[str], fds: tuple[int, ...], what: str, timeout: float = 60.0) -> Done:
    """gpuctk-cdi-hook `args` with `fds` (each above 2: high()) inherited under their numbers
    and no other descriptor, an empty environment, SIGPIPE and SIGXFSZ at their defaults (not
    Python's "ignore"), /dev/null on stdin, its output read whole, waited for even where
    SIGCHLD is ignored; killed after `timeout` seconds or when this process is interrupted.
    Spawned with os.posix_spawn: subprocess's import alone costs a container start several
    ms. GpuctkError (`what`: the job, for the message) when it is not installed, cannot run or
    hangs; the caller reads the exit status."""
    import _signal  # type: ignore[import-not-found]  # signal would load enum: the hook avoids it
    import time

    exe = program()
    if not exe:
        raise GpuctkError(
            f"{what}: no {PROGRAM} beside gpuctk-hook or in the gpuctk package: reinstall "
            "gpuctk (pip install ., the deb or the node image), which builds it"
        )
    if any(fd < 3 for fd in fds):
        raise GpuctkError(f"{what}: descriptors {fds}: one has a standard stream's number")
    out_r, out_w = (high(fd) for fd in os.pipe())
    err_r, err_w = (high(fd) for fd in os.pipe())
    null = high(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
    actions: list[tuple[int, ...]] = [
        (os.POSIX_SPAWN_DUP2, null, 0), (os.POSIX_SPAWN_DUP2, out_w, 1),
        (os.POSIX_SPAWN_DUP2, err_w, 2),
    ]  # fmt: skip
    actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in _inherited({*fds, out_w, err_w, null})]
    ignored = _signal.getsignal(_signal.SIGCHLD) == _signal.SIG_IGN  # no exit status then
    if ignored:
        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
    deadline = time.monotonic() + timeout
    try:
        try:
            for fd in fds:
                os.set_inheritable(fd, True)
            pid = os.posix_spawn(  # Python's own SIGPIPE and SIGXFSZ "ignore" not passed on
                exe, [exe, *args], {}, file_actions=actions,
                setsigdef=(_signal.SIGPIPE, _signal.SIGXFSZ),
            )  # fmt: skip
        except OSError as exc:
            os.close(out_r)
            os.close(err_r)
            raise GpuctkError(f"{what}: {exe}: {exc.strerror}") from None
        finally:
            for fd in fds:
                os.set_inheritable(fd, False)
            for fd in (out_w, err_w, null):
                os.close(fd)
        try:
            out, err = _read_both(out_r, err_r, deadline)
            status = _wait(pid, deadline)
        except BaseException as exc:  # a hang, or this process interrupted: never left behind
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            if isinstance(exc, TimeoutError):
                why = f"{exe} did not finish in {timeout:g} s (killed)"
                raise GpuctkError(f"{what}: {why}") from None
            raise
        finally:
            os.close(out_r)
            os.close(err_r)
    finally:
        if ignored:
            _signal.signal(_signal.SIGCHLD, _signal.SIG_IGN)
    return Done(status, out, err)


def _inherited(keep: set[int]) -> list[int]:
    """This process's descriptors above 2, other than `keep`, that a spawned program would
    inherit (those not close-on-exec): the spawn closes them."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd > 2 and fd not in keep and os.get_inheritable(fd):
                out.append(fd)
        except OSError:  # the listing's own descriptor, closed since
            continue
    return out


def _wait(pid: int, deadline: float) -> int:
    """The exit status of `pid`; TimeoutError past `deadline` (time.monotonic)."""
    import time

    while True:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            raise TimeoutError
        time.sleep(0.0005)


def _read_both(out_fd: int, err_fd: int, deadline: float) -> tuple[bytes, bytes]:
    """Both pipes read to their end; TimeoutError past `deadline` (time.monotonic)."""
    import select
    import time

    chunks: dict[int, list[bytes]] = {out_fd: [], err_fd: []}
    poll = select.poll()
    for fd in chunks:
        poll.register(fd, select.POLLIN)
    open_ = set(chunks)
    while open_:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        for fd, _ in poll.poll(left * 1000):
            data = os.read(fd, 1 << 16)
            if data:
                chunks[fd].append(data)
            else:
                poll.unregister(fd)
                open_.discard(fd)
    return b"".join(chunks[out_fd]), b"".join(chunks[err_fd])


def why(done: Done) -> str:
    """The C's error line (or gpuctk-hook's, where an older C handed the form back), without
    the program's prefix."""
    lines = done.stderr.decode(errors="replace").strip().splitlines() or ["no message"]
    line = lines[-1].removeprefix(ERROR_PREFIX).removeprefix("gpuctk-hook: error: ")
    return f"{line} (exit {done.returncode})"


def capabilities(config: object) -> tuple[frozenset[str], int]:
    """What the OCI config `config` (as parsed) asks for by NVIDIA_DRIVER_CAPABILITIES, as
    gpuctk-cdi-hook reads it at every container start (`container_caps` in hook/cdihook.c,
    the rule's one home), and how many of its words name no capability (ignored, as the
    reference runtime does). Only process.env is passed on: the config's keys were checked
    where it was read (gpuctk.hook.ocikeys refuses a key runc reads in another case).
    GpuctkError where the C cannot tell (a value of another type: no engine writes one) or
    does not run."""
    from gpuctk.jsonfast import dumps, loads

    what = "the container's driver capabilities"
    read: dict[str, object] = {}  # what the rule reads: the keys were checked (ocikeys)
    if isinstance(config, dict) and "process" in config:
        process = config["process"]
        if isinstance(process, dict):
            process = {"env": process["env"]} if "env" in process else {}
        read["process"] = process
    try:
        fd = memfd("oci-config", dumps(read))
    except (ValueError, OSError) as exc:  # a number JSON cannot carry; no memory
        raise GpuctkError(f"{what}: the OCI config cannot be passed on: {exc}") from None
    try:
        done = run([CAPS_VERB, CONFIG_FD_OPT, str(fd)], (fd,), what)
    finally:
        os.close(fd)
    try:
        doc = loads(done.stdout.decode("ascii")) if done.returncode == 0 else None
        caps, unknown = doc["asked"], doc["unknown"]  # type: ignore[index]
        if isinstance(caps, list) and type(unknown) is int:
            return frozenset(str(c) for c in caps), unknown
    except (ValueError, TypeError, KeyError):
        pass
    raise GpuctkError(f"{what}: {why(done)}")


_ASKED: dict[tuple[str, ...], tuple[Done, list[str]]] = {}  # asked()'s runs, 64 at most


def asked(args: Sequence[str], what: str) -> tuple[Done, list[str]]:
    """A run of a form of the C that reads its arguments alone (read-args, runc-args) and its
    stdout's fields, each ended by a NUL byte, kept in this process: the same arguments read
    the same. UsageError for an argument no program can be given; GpuctkError where none runs."""
    key = tuple(args)
    if key in _ASKED:
        return _ASKED[key]
    for word in key:
        try:
            bad = "a NUL byte" if b"\0" in os.fsencode(word) else ""
        except UnicodeError:
            bad = "a lone surrogate"
        if bad:
            raise UsageError(f"{what}: argument {word!r} holds {bad}, no program's argument")
    try:
        done = run(list(key), (), what)
    except OSError as exc:  # no descriptor or process left for it
        raise GpuctkError(f"{what}: {PROGRAM}: {exc}") from None
    if len(_ASKED) >= 64:
        _ASKED.clear()
    _ASKED[key] = done, [os.fsdecode(f) for f in done.stdout.split(b"\0")]
    return _ASKED[key]


def read_args(verb: str, args: Sequence[str]) -> tuple[Arg, ...]:
    """`args` after `verb` (of facts.HOOK_OPTIONS) in a hook entry, as gpuctk-cdi-hook reads
    them at every start (`read_args`, `split_link` in hook/cdihook.c, the one reading): per
    argument (KIND, START, STOP, NAME, VALUE, CAPABILITY, TARGET, LINK), KIND "o" an option
    and its VALUE, "l" a --link or --link-for whose VALUE splits ("" CAPABILITY for a --link),
    "i" one the verb does not take; args[START:STOP] its words. UsageError where the C
    refuses them (a value missing), GpuctkError where it does not run."""
    what = f"the hook entry's arguments of {verb}"
    done, fields = asked([READ_ARGS_VERB, verb, *args], what)
    if done.returncode == 2 and done.stderr.strip():
        raise UsageError(done.stderr.decode(errors="replace").strip().splitlines()[-1])
    if done.returncode != 0 or len(fields) % 8 != 1 or fields[-1]:
        raise GpuctkError(f"{what}: {why(done)}")
    rows = zip(*[iter(fields)] * 8, strict=False)  # the last, empty field left out
    return tuple((kind, int(start), int(stop), name, value, cap, target, link)
                 for kind, start, stop, name, value, cap, target, link in rows)  # fmt: skip


def entry_links(args: Sequence[str]) -> list[tuple[int, int, str, str, str, str]]:
    """(START, STOP, NAME, CAPABILITY, TARGET, LINK) of each --link and --link-for that splits
    in a hook entry's whole `args`, as read_args() reads what follows the first of args[1:]
    that is a gpuctk-hook verb (`nvidia-ctk hook create-symlinks` has a word before it); none
    without one. UsageError where the C refuses the arguments (so would the hook)."""
    at = next((i for i, arg in enumerate(args) if i and arg in HOOK_OPTIONS), 0)
    read = read_args(args[at], args[at + 1 :]) if at else ()
    return [(at + 1 + start, at + 1 + stop, name, cap, target, link)
            for kind, start, stop, name, _value, cap, target, link in read
            if kind == "l"]  # fmt: skip


def root_seen() -> int:
    """The uid under which this process sees host root's files, as gpuctk-cdi-hook tells it
    (`root_seen` in hook/cdihook.c, the rule's one home): 0, or inside a user namespace that
    maps no host uid 0 (Kubernetes' `hostUsers: false`, podman's --userns), the kernel's
    overflow uid; (uid_t)-1, no file's, where the kernel does not say. GpuctkError where the C
    does not run."""
    what = "the owner of host root's files"
    done = run([ROOT_SEEN_VERB], (), what)
    word = done.stdout.strip()
    if done.returncode != 0 or not word.isdigit():
        raise GpuctkError(f"{what}: {why(done)}")
    return int(word)


def links_in_root(
    root_fd: int, links: Sequence[tuple[str, str]], *, parents: bool = True
) -> list[str | InRootError]:
    """Each (TARGET, PATH) of `links` made a symlink inside the root `root_fd` by gpuctk-cdi-hook's
    link policy (`link_at` in hook/cdihook.c, its one home): PATH's folder opened here, inside
    the root and on its own mount (gpuctk.rootfs.parent_in_root; its missing parents made
    where `parents`), once per folder, the links made there by the C, LINKS_PER_RUN at a time.
    For each link, in order: "made" (made, or an image's link naming something else swapped
    for it), "kept" (it names TARGET already), "left" (the image's own file, folder or node
    there), or the InRootError that stopped it. GpuctkError where the C does not run."""
    out: list[str | InRootError] = []
    for start in range(0, len(links), LINKS_PER_RUN):
        out += _links_run(root_fd, links[start : start + LINKS_PER_RUN], parents)
    return out


def _links_run(
    root_fd: int, links: Sequence[tuple[str, str]], parents: bool
) -> list[str | InRootError]:
    from gpuctk.rootfs import InRootError, parent_in_root, split_in_root

    out: list[str | InRootError] = []
    folders: dict[str, int] = {}  # a link's folder -> its descriptor, opened once
    args: list[str] = []
    at: list[tuple[int, str]] = []  # each link the C is asked for: its place in out, its path
    try:
        for target, path in links:
            if not target or "\0" in target:
                why_ = f"invalid symlink target {target!r} for {path}"
                out.append(InRootError(why_, errno.EINVAL))
                continue
            try:
                folder, name = split_in_root(path)
                if folder not in folders:
                    folders[folder] = high(parent_in_root(root_fd, path, parents)[0])
            except InRootError as exc:
                out.append(exc)
                continue
            except OSError as exc:  # no descriptor left
                why_ = f"cannot open the folder of {path}: {exc.strerror}"
                out.append(InRootError(why_, exc.errno or errno.EIO))
                continue
            args += [DIR_FD_OPT, str(folders[folder]), name, target]
            at.append((len(out), path))
            out.append("")
        if not at:
            return out
        done = run([LINKS_VERB, *args], tuple(folders.values()), "the container's links")
    finally:
        for fd in folders.values():
            os.close(fd)
    words = done.stdout.decode("ascii", "replace").splitlines()
    if done.returncode != 0 or len(words) != len(at):
        raise GpuctkError(f"the container's links: {why(done)}")
    for (i, path), word in zip(at, words, strict=True):
        err = int(word[6:]) if word.startswith("error ") and word[6:].isdigit() else 0
        if word in LINK_OUTCOMES:
            out[i] = word
        else:
            out[i] = InRootError(
                f"cannot create symlink {path} in the container root: "
                f"{os.strerror(err) if err else word}",
                err or errno.EIO,
            )
    return out
