"""/dev/char/MAJOR:MINOR links for the NVIDIA device nodes (`gpuctk system
create-dev-char-symlinks`).

runc's systemd cgroup driver turns each device rule of a container into
`DeviceAllow=/dev/char/MAJOR:MINOR` on its scope. Where that path does not exist, runc 1.1.3 to
1.1.6 (Debian 12's among them) leaves the rule out, and systemd before 240 drops it itself:
when `systemctl daemon-reload` re-applies the scope's device policy, running GPU containers
lose their GPUs ("Failed to initialize NVML: Unknown Error";
tests/integration/test_daemon_reload.py shows it).
udev makes the links only for nodes the kernel announced; nodes made by nvidia-modprobe or by
hand have none. So each NVIDIA node under DEV gets `MAJOR:MINOR -> ../NODE`, relative, as udev
writes them.

Only character devices with an NVIDIA name whose major /proc/devices gives an nvidia* driver
(195 always) are linked: a node named nvidia0 with another driver's major never takes over that
device's link. Every folder is opened through gpuctk.fs's checked walk; a wrong link is replaced
by renaming a new one over it (it never disappears); links of other devices are never touched.
"""

from __future__ import annotations

import errno
import os
import re
import stat

from gpuctk.errors import InputError, OutputError
from gpuctk.fs import open_trusted_dir
from gpuctk.records import record

DEV_CHAR = "/dev/char"
NVIDIA_MAJOR = 195  # devices.txt: reserved for NVIDIA; the driver names it nvidia(-frontend)
MAX_PROC_DEVICES = 1 << 16
_TOP = re.compile(r"nvidia(?:\d{1,4}|ctl|-modeset|-uvm|-uvm-tools)")
SUBFOLDERS = ("nvidia-caps", "nvidia-caps-imex-channels")  # every char device in them
_ENTRY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@record
class Node:
    """An NVIDIA character device: its name under dev/ and its numbers."""

    name: str  # "nvidia0", "nvidia-caps/nvidia-cap1"
    major: int
    minor: int


@record
class Change:
    """What one link is, or became: status created, replaced, unchanged, not-a-link, or (with
    dry_run) would-create, would-replace."""

    node: Node
    link: str  # "/dev/char/195:0"
    target: str  # "../nvidia0"
    status: str
    was: str = ""  # the target a replaced link had


def link_name(node: Node) -> str:
    return f"{node.major}:{node.minor}"


def parse_char_majors(text: str) -> dict[str, int]:
    """The "Character devices:" section of /proc/devices as name -> major."""
    out: dict[str, int] = {}
    in_char = False
    for line in text.splitlines():
        if line.strip().endswith("devices:"):
            in_char = line.strip().startswith("Character")
            continue
        parts = line.split()
        if in_char and len(parts) == 2 and parts[0].isdigit():
            out.setdefault(parts[1], int(parts[0]))
    return out


def read_char_majors(proc_root: str) -> dict[str, int]:
    """parse_char_majors of <proc_root>/devices; empty when it cannot be read."""
    try:
        with open(os.path.join(proc_root, "devices"), "rb") as f:
            return parse_char_majors(f.read(MAX_PROC_DEVICES).decode("ascii", "replace"))
    except OSError:
        return {}


def nvidia_majors(majors: dict[str, int]) -> frozenset[int]:
    """195 and every major /proc/devices gives a driver named nvidia* (uvm, caps, imex)."""
    return frozenset({NVIDIA_MAJOR, *(m for n, m in majors.items() if n.startswith("nvidia"))})


def _open_listing(path: str, what: str) -> int | None:
    """A readable descriptor of the checked folder `path`; None when it does not exist."""
    try:
        return open_trusted_dir(path, flags=os.O_RDONLY)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise InputError(f"{what} {path} is not a folder (is --driver-root right?)") from None
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def _char_nodes(fd: int, names: list[str], prefix: str, majors: frozenset[int]) -> list[Node]:
    found = []
    for name in names:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue  # removed meanwhile
        if stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) in majors:
            found.append(Node(prefix + name, os.major(st.st_rdev), os.minor(st.st_rdev)))
    return found


def find_nodes(dev: str, majors: frozenset[int]) -> list[Node]:
    """The NVIDIA character devices in the folder `dev` (nvidia<N>, nvidiactl, nvidia-modeset,
    nvidia-uvm, nvidia-uvm-tools) and in its nvidia-caps and nvidia-caps-imex-channels folders,
    with a major in `majors`, one per device number (the first name wins), by number. Symlinks
    are not nodes. InputError when `dev` is missing or a folder on the way is not root's."""
    fd = _open_listing(dev, "the device folder")
    if fd is None:
        raise InputError(f"the device folder {dev} does not exist (is --driver-root right?)")
    try:
        names = sorted(os.listdir(fd))
        nodes = _char_nodes(fd, [n for n in names if _TOP.fullmatch(n)], "", majors)
    finally:
        os.close(fd)
    for sub in SUBFOLDERS:
        if sub not in names:
            continue
        sfd = _open_listing(f"{dev}/{sub}", "the device folder")
        if sfd is None:
            continue
        try:
            entries = sorted(n for n in os.listdir(sfd) if _ENTRY.fullmatch(n))
            nodes += _char_nodes(sfd, entries, f"{sub}/", majors)
        finally:
            os.close(sfd)
    unique: dict[tuple[int, int], Node] = {}
    for node in nodes:
        unique.setdefault((node.major, node.minor), node)
    return [unique[k] for k in sorted(unique)]


def _is_node(path: str, node: Node) -> bool:
    """Whether `path` (links followed) is a character device of the node's numbers."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(node.major, node.minor)


def link_target(dev: str, dev_char: str, node: Node) -> str:
    """The link's text: the node's path relative to the link folder (`../nvidia0` for /dev and
    /dev/char), so that it also resolves where the host root is mounted elsewhere. With a dev
    root other than the link folder's parent (a driver container's /run/nvidia/driver/dev),
    the host's own node of the same numbers beside the link folder is named when there is one
    (the path udev would link), else the dev root's node as the host sees it."""
    real_char = os.path.realpath(dev_char)
    beside = os.path.join(os.path.dirname(real_char), node.name)
    if _is_node(beside, node):
        return os.path.relpath(beside, real_char)
    real_dev = os.path.realpath(dev)
    return os.path.relpath(os.path.join(real_dev, node.name), real_char)


def _open_link_folder(dev_char: str, create: bool) -> int | None:
    """O_PATH descriptor of the checked link folder, made (0755) when missing and `create`."""
    try:
        return open_trusted_dir(dev_char)
    except FileNotFoundError:
        if not create:
            return None
    except OSError as exc:
        raise OutputError(f"cannot open {dev_char}: {exc.strerror or exc}") from None
    parent, base = os.path.split(os.path.normpath(dev_char))
    try:
        pfd = open_trusted_dir(parent or "/")
    except OSError as exc:
        raise OutputError(f"cannot open {parent}: {exc.strerror or exc}") from None
    try:
        os.mkdir(base, 0o755, dir_fd=pfd)
    except FileExistsError:
        pass
    except OSError as exc:
        raise OutputError(f"cannot create {dev_char}: {exc.strerror or exc}") from None
    finally:
        os.close(pfd)
    try:
        return open_trusted_dir(dev_char)
    except OSError as exc:
        raise OutputError(f"cannot open {dev_char}: {exc.strerror or exc}") from None


def _replace_link(fd: int, name: str, target: str) -> None:
    """Point the link `name` at `target` in one rename: a new link under a temporary name is
    renamed over the old one, so the name is never missing."""
    tmp = f".{name}.{os.urandom(6).hex()}.tmp"
    os.symlink(target, tmp, dir_fd=fd)
    try:
        os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except OSError:
        try:  # noqa: SIM105 - same style as gpuctk.writes
            os.unlink(tmp, dir_fd=fd)
        except OSError:
            pass
        raise


def _one(fd: int | None, node: Node, link: str, target: str, dry_run: bool) -> Change:
    name = link_name(node)
    current: str | None = None
    if fd is not None:
        try:
            current = os.readlink(name, dir_fd=fd)
        except FileNotFoundError:
            current = None
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            return Change(node, link, target, "not-a-link")  # a file or folder: left alone
    if current == target:
        return Change(node, link, target, "unchanged")
    if current is not None and fd is not None and _resolves(fd, link, node):
        return Change(node, link, current, "unchanged")  # a correct link (udev's) is kept
    status = "created" if current is None else "replaced"
    if dry_run or fd is None:
        return Change(node, link, target, f"would-{status.removesuffix('d')}", current or "")
    if current is None:
        try:
            os.symlink(target, name, dir_fd=fd)
        except FileExistsError:  # made meanwhile: replace it as any wrong link
            _replace_link(fd, name, target)
    else:
        _replace_link(fd, name, target)
    return Change(node, link, target, status, current or "")


def _resolves(fd: int, link: str, node: Node) -> bool:
    """Whether the link `link` (in the folder `fd`) leads to a char device of the node's
    numbers: what runc's systemd driver needs, whichever path it names."""
    try:
        st = os.stat(os.path.basename(link), dir_fd=fd)
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(node.major, node.minor)


def update_links(dev: str, dev_char: str, nodes: list[Node], dry_run: bool = False) -> list[Change]:
    """Make every `nodes` link in `dev_char` point at its node in `dev` (created, or replaced
    when wrong); with `dry_run`, only say what would change. OutputError on a failed write."""
    if not nodes:
        return []
    fd = _open_link_folder(dev_char, create=not dry_run)
    changes = []
    try:
        for node in nodes:
            link = os.path.join(dev_char, link_name(node))
            target = link_target(dev, dev_char, node)
            try:
                changes.append(_one(fd, node, link, target, dry_run))
            except OSError as exc:
                raise OutputError(
                    f"cannot write the link {link} -> {target}: {exc.strerror or exc}"
                ) from None
    finally:
        if fd is not None:
            os.close(fd)
    return changes


def check_links(dev: str, dev_char: str, nodes: list[Node]) -> list[tuple[Node, str]]:
    """The nodes whose link in `dev_char` is missing or leads elsewhere, each with what is wrong
    (read only: the link is followed, and must reach a char device of the node's numbers)."""
    wrong = []
    for node in nodes:
        link = os.path.join(dev_char, link_name(node))
        try:
            text = os.readlink(link)
        except FileNotFoundError:
            wrong.append((node, f"{link} is missing"))
            continue
        except OSError:
            wrong.append((node, f"{link} is not a symlink"))
            continue
        try:
            st = os.stat(link)
        except OSError:
            wrong.append((node, f"{link} -> {text} leads nowhere"))
            continue
        if not stat.S_ISCHR(st.st_mode) or st.st_rdev != os.makedev(node.major, node.minor):
            wrong.append((node, f"{link} -> {text} is not {node.name}"))
    return wrong
