"""The host side of `gpuctk install`: paths inside a host root, the copied application, the record.

A DaemonSet sees the node's root at /host. Host paths (what the node's containerd, systemd and
shells see) are resolved under that root with the root as `/`: an absolute link such as Debian's
/var/run -> /run leads to HOST/run, never to the agent container's own /run. The node is trusted
(it is the machine being configured), so this is path resolution, not a security boundary.

Commands that must see the host as the host sees itself (the CDI generator, which records host
paths and loads the host's NVML; `runtime configure`, which records host paths in containerd's
config and runs the host's containerd) run from the COPIED application, chrooted into the root:
that also proves the copy works on the host before containerd is pointed at it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from gpuctk.errors import InputError, OutputError
from gpuctk.install import launchers
from gpuctk.writes import atomic_write

MARKER = ".gpuctk-install.json"  # in the copied prefix: it is gpuctk's, and its digest
LAUNCHER_MARK = launchers.LAUNCHER_MARK.encode()  # a line every launcher carries
LAUNCHERS = (*launchers.ENTRY_POINTS, launchers.FRONT)  # the front carries the mark too
STATE = "/var/lib/gpuctk/install.json"
HOST_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
}
_MAX_LINKS = 40
REFRESH_TIMEOUT = 120.0  # a periodic pass must not keep SIGTERM waiting on a stuck NVML


def resolve(host: str, path: str) -> str:
    """Host path `path` as a path under `host`, every link resolved with `host` as `/`."""
    if not os.path.isabs(path):
        raise InputError(f"{path!r} is not an absolute path")
    parts = [p for p in path.split("/") if p]
    done: list[str] = []
    links = 0
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        candidate = os.path.join(host, *done, part)
        if os.path.islink(candidate):
            links += 1
            if links > _MAX_LINKS:
                raise InputError(f"{path}: too many levels of symbolic links under {host}")
            target = os.readlink(candidate)
            if target.startswith("/"):
                done = []
            parts = [p for p in target.split("/") if p] + parts
            continue
        done.append(part)
    return os.path.join(os.path.abspath(host), *done)


def makedirs(host: str, path: str) -> list[str]:
    """Create host folder `path` and missing parents; the host paths made, outermost first."""
    created: list[str] = []
    parts = [p for p in path.split("/") if p]
    for i in range(1, len(parts) + 1):
        host_path = "/" + "/".join(parts[:i])
        real = resolve(host, host_path)
        if os.path.isdir(real):
            continue
        try:
            os.mkdir(real, 0o755)
        except OSError as exc:
            raise OutputError(f"cannot create folder {real}: {exc.strerror}") from None
        created.append(host_path)
    return created


@dataclass(frozen=True)
class Record:
    """What install put on the host: uninstall undoes exactly this (state file, JSON)."""

    prefix: str
    bin_dir: str
    cdi_spec: str | None = None
    containerd_config: str | None = None
    drop_in: str | None = None
    runtime_name: str = "nvidia"
    dirs: tuple[str, ...] = field(default=())

    def launchers(self) -> list[str]:
        return [os.path.join(self.bin_dir, name) for name in LAUNCHERS]

    def hook_path(self) -> str:
        return os.path.join(self.bin_dir, "gpuctk-hook")

    def hook_paths(self) -> tuple[str, ...]:
        """What a spec written by this install names: gpuctk-hook or its compiled front."""
        return (self.hook_path(), os.path.join(self.bin_dir, launchers.FRONT))


def read_record(host: str) -> Record | None:
    path = resolve(host, STATE)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        data["dirs"] = tuple(data.get("dirs", ()))
        return Record(**data)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        raise InputError(f"{path}: unreadable install record ({exc}): remove it by hand") from None


def write_record(host: str, record: Record) -> None:
    """Write the record (its folder must exist: makedirs(host, dirname(STATE)))."""
    data = json.dumps(asdict(record), indent=2, sort_keys=True) + "\n"
    atomic_write(resolve(host, STATE), data.encode(), 0o644)


def remove_record(host: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(resolve(host, STATE))


def digest(tree: str) -> str:
    """A hash of a folder: names, kinds, modes, link targets and contents (the marker aside)."""
    h = hashlib.sha256()
    for folder, dirs, files in os.walk(tree):
        dirs.sort()
        rel = os.path.relpath(folder, tree)
        for name in sorted(files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]):
            path = os.path.join(folder, name)
            if rel == "." and name == MARKER:
                continue
            st = os.lstat(path)
            h.update(f"{rel}/{name}\0{st.st_mode:o}\0".encode())
            if os.path.islink(path):
                h.update(os.readlink(path).encode())
            else:
                with open(path, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        h.update(chunk)
            h.update(b"\0")
    return h.hexdigest()


def interpreter_problem(source: str, host: str) -> str | None:
    """Why `source`/bin/python3 would not run once copied to the host (None when it would)."""
    path = os.path.join(source, "bin", "python3")
    if not os.path.lexists(path):
        return f"{source} has no bin/python3: give --source the application's prefix"
    for _ in range(_MAX_LINKS):
        if not os.path.islink(path):
            return None
        target = os.readlink(path)
        target = target if os.path.isabs(target) else os.path.join(os.path.dirname(path), target)
        target = os.path.normpath(target)
        if os.path.commonpath([target, source]) != source:
            if os.path.exists(resolve(host, target)):
                return None
            return (
                f"{source}/bin/python3 is a venv link to {target}, which the host does not have: "
                "use a self-contained Python for the agent (packaging/kubernetes/Containerfile)"
            )
        path = target
    return f"{source}/bin/python3: too many levels of symbolic links"


def is_ours_prefix(real: str) -> bool:
    return os.path.isfile(os.path.join(real, MARKER))


def copy_prefix(source: str, host: str, prefix: str) -> tuple[bool, list[str]]:
    """Copy `source` to host `prefix` unless an identical copy is there: (changed, dirs made).

    The new tree is copied beside the old one and renamed into place, so the shim never starts
    from a half-copied tree; a prefix without gpuctk's marker is refused, not replaced.
    """
    real = resolve(host, prefix)
    wanted = digest(source)
    if os.path.lexists(real):
        if not is_ours_prefix(real):
            raise OutputError(
                f"{real} exists and was not installed by gpuctk (no {MARKER}): refusing to "
                "replace it; remove it or choose another --prefix"
            )
        with open(os.path.join(real, MARKER), encoding="utf-8") as f:
            if json.load(f).get("digest") == wanted:
                return False, []
    created = makedirs(host, os.path.dirname(prefix))
    parent, name = os.path.split(real)
    staging = os.path.join(parent, f".{name}.gpuctk-new-{os.urandom(4).hex()}")
    old = os.path.join(parent, f".{name}.gpuctk-old-{os.urandom(4).hex()}")
    try:
        shutil.copytree(
            source,
            staging,
            symlinks=True,
            ignore=lambda d, names: [n for n in names if n == MARKER],
        )
        atomic_write(
            os.path.join(staging, MARKER),
            (json.dumps({"digest": wanted, "source": source}) + "\n").encode(),
        )
        if os.path.lexists(real):
            os.rename(real, old)
        os.rename(staging, real)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise OutputError(f"cannot copy {source} to {real}: {exc.strerror or exc}") from None
    shutil.rmtree(old, ignore_errors=True)
    return True, created


def foreign_launchers(host: str, bin_dir: str) -> list[str]:
    """Files at the launcher paths that gpuctk did not write (install refuses to replace them)."""
    foreign = []
    for name in LAUNCHERS:
        real = resolve(host, os.path.join(bin_dir, name))
        if not os.path.lexists(real):
            continue
        try:
            with open(real, "rb") as f:
                head = f.read(1 << 20)  # the compiled front carries it in its data
        except OSError:
            head = b""
        if LAUNCHER_MARK not in head:
            foreign.append(real)
    return foreign


def run_in_host(
    host: str, argv: Sequence[str], timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `argv` (host paths) chrooted into `host`, with a fixed, minimal environment, killed
    after `timeout` seconds (None: no limit). InputError when it cannot run or ran too long."""

    def enter() -> None:  # in the child, before exec
        os.chroot(host)
        os.chdir("/")

    same = os.path.realpath(host) == "/"
    try:
        return subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            env=dict(HOST_ENV),
            cwd="/",
            preexec_fn=None if same else enter,  # the CLI is single-threaded
            check=False,
            timeout=timeout,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise InputError(f"cannot run {argv[0]} in {host}: {exc}") from None


def read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None


def link_dev_char(
    host: str, gpuctk: str, dev_root: str | None, timeout: float | None = None
) -> tuple[int, str]:
    """Run `gpuctk system create-dev-char-symlinks` in the host root (the node's /dev, or the
    one under `dev_root`): (links created or replaced, one line saying what happened or what
    failed). Never raises for the command's failure: the spec and the handler work without
    the links, which only matter at the node's next `systemctl daemon-reload`."""
    argv = [gpuctk, "system", "create-dev-char-symlinks", "--format", "json"]
    if dev_root:
        argv += ["--driver-root", dev_root]
    try:
        proc = run_in_host(host, argv, timeout)
    except InputError as exc:
        return 0, f"warning: /dev/char links not made: {exc.message}"
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or ["(no message)"]
        reason = lines[-1].removeprefix("gpuctk: error: ")
        return 0, f"warning: /dev/char links not made: {reason}"
    try:
        links = json.loads(proc.stdout)["links"]
        statuses = [str(link["status"]) for link in links]
    except (ValueError, KeyError, TypeError):
        return 0, "warning: /dev/char links: unreadable answer from create-dev-char-symlinks"
    changed = sum(s in ("created", "replaced") for s in statuses)
    return changed, f"/dev/char: {changed} link(s) made, {len(statuses) - changed} already right"


def generate_argv(record: Record, generate_flags: list[str]) -> list[str]:
    """The copied gpuctk's `cdi generate` for the record's spec (host paths)."""
    gpuctk = os.path.join(record.bin_dir, "gpuctk")
    argv = [gpuctk, "cdi", "generate", "--output", str(record.cdi_spec)]
    return [*argv, "--hook-path", record.hook_path(), *generate_flags]


def refresh(
    host: str, record: Record, generate_flags: list[str], dev_root: str | None
) -> list[str]:
    """One periodic pass of the waiting agent: regenerate the spec (generate leaves the file
    alone when nothing changed) and the /dev/char links. The lines worth a log: what changed,
    or "warning: ..." for what failed; never raises (the next pass tries again)."""
    lines = []
    if record.cdi_spec:
        try:
            proc = run_in_host(host, generate_argv(record, generate_flags), REFRESH_TIMEOUT)
        except InputError as exc:
            proc = subprocess.CompletedProcess([], 1, "", exc.message)
        last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        if proc.returncode != 0:
            lines.append(
                f"warning: CDI spec refresh failed: {last.removeprefix('gpuctk: error: ')}"
            )
        elif last.startswith("gpuctk: wrote "):
            lines.append(last.removeprefix("gpuctk: "))
    gpuctk = os.path.join(record.bin_dir, "gpuctk")
    changed, line = link_dev_char(host, gpuctk, dev_root, REFRESH_TIMEOUT)
    return [*lines, line] if changed or line.startswith("warning:") else lines
