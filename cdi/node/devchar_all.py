"""The NVIDIA device nodes the loaded driver serves, and making those missing (`--create-all`).

What nvidia-modprobe would make, read from the driver's own files under /proc:

- nvidiactl (195:255) and nvidia-modeset (195:254); nvidia-uvm and nvidia-uvm-tools (:0, :1)
  once /proc/devices has the nvidia-uvm major;
- nvidia<N> for each GPU the driver bound (`Device Minor: N` in driver/nvidia/gpus/*/information;
  without that folder, as the reference toolkit does, one per NVIDIA display-class PCI device,
  numbered from 0);
- nvidia-caps/nvidia-cap<N> for each MIG capability of driver/nvidia-caps/mig-minors that exists
  now (the driver lists it under driver/nvidia/capabilities), with that file's DeviceFileMode.

GPU and control nodes take the driver's DeviceFileUID, DeviceFileGID and DeviceFileMode
(driver/nvidia/params; 0, 0, 0666 without it). With `ModifyDeviceFiles: 0` there the admin asked
that no tool make nodes: nothing is made. A node already there is kept as it is.
"""

from __future__ import annotations

import os
import re

from gpuctk.cdi.node.devchar import read_char_majors
from gpuctk.cdi.node.devnodes import MIG_MINORS, parse_mig_minors
from gpuctk.errors import InputError, OutputError
from gpuctk.fs import open_trusted_dir
from gpuctk.records import record

MAX_PROC_FILE = 1 << 20
_FIELD = re.compile(r"^([A-Za-z][\w ]*?):[ \t]*(-?\d+)[ \t]*$", re.MULTILINE)
_DISPLAY_CLASSES = ("0x0300", "0x0302")  # VGA and 3D controllers (not NVSwitch, 0x0680)


@record
class Wanted:
    """A node to make under dev/ when missing."""

    name: str  # "nvidiactl", "nvidia-caps/nvidia-cap12"
    major: int
    minor: int
    mode: int
    uid: int = 0
    gid: int = 0


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_PROC_FILE).decode("ascii", "replace")
    except OSError:
        return None


def _fields(text: str | None) -> dict[str, int]:
    """`Key: 123` lines (the driver's proc files) as a dict."""
    return {k: int(v) for k, v in _FIELD.findall(text or "")}


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def gpu_minors(proc_root: str, sys_root: str) -> list[int]:
    """The minors of the GPUs the driver bound (see the module docstring)."""
    gpus = os.path.join(proc_root, "driver/nvidia/gpus")
    if os.path.isdir(gpus):
        found = (_fields(_read(os.path.join(gpus, b, "information"))) for b in _listdir(gpus))
        return sorted({f["Device Minor"] for f in found if "Device Minor" in f})
    pci = os.path.join(sys_root, "bus/pci/devices")
    count = 0
    for bdf in _listdir(pci):
        vendor = (_read(os.path.join(pci, bdf, "vendor")) or "").strip()
        klass = (_read(os.path.join(pci, bdf, "class")) or "").strip()
        count += vendor == "0x10de" and klass.startswith(_DISPLAY_CLASSES)
    return list(range(count))


def _cap_proc_path(cap: str) -> str:
    """A mig-minors entry's file under driver/nvidia/capabilities (config -> mig/config,
    gpu0/gi1/access -> gpu0/mig/gi1/access)."""
    gpu, sep, rest = cap.partition("/")
    return f"mig/{cap}" if not sep else f"{gpu}/mig/{rest}"


def wanted_nodes(proc_root: str, sys_root: str, flag: str = "--create-all") -> list[Wanted]:
    """Every node the loaded driver serves now. InputError (its message names `flag`) when no
    nvidia driver is loaded, or when its params forbid making nodes."""
    majors = read_char_majors(proc_root)
    nv = majors.get("nvidia", majors.get("nvidia-frontend"))
    if nv is None:
        raise InputError(
            f"{flag}: {proc_root}/devices names no nvidia driver: load it first "
            f"(modprobe nvidia), or leave out {flag}"
        )
    params = _fields(_read(os.path.join(proc_root, "driver/nvidia/params")))
    if params.get("ModifyDeviceFiles", 1) == 0:
        raise InputError(
            f"{flag}: {proc_root}/driver/nvidia/params says ModifyDeviceFiles: 0 (no "
            f"tool may make device nodes): make them as the admin intends, or leave out {flag}"
        )
    mode = params.get("DeviceFileMode", 0o666) & 0o7777
    owner = {"uid": params.get("DeviceFileUID", 0), "gid": params.get("DeviceFileGID", 0)}
    wanted = [
        Wanted("nvidiactl", nv, 255, mode, **owner),
        Wanted("nvidia-modeset", nv, 254, mode, **owner),
    ]
    uvm = majors.get("nvidia-uvm")
    if uvm is not None:
        wanted += [Wanted("nvidia-uvm", uvm, 0, mode, **owner)]
        wanted += [Wanted("nvidia-uvm-tools", uvm, 1, mode, **owner)]
    wanted += [Wanted(f"nvidia{m}", nv, m, mode, **owner) for m in gpu_minors(proc_root, sys_root)]
    caps = majors.get("nvidia-caps")
    table = _read(os.path.join(proc_root, MIG_MINORS))
    if caps is None or table is None:
        return wanted
    capabilities = os.path.join(proc_root, "driver/nvidia/capabilities")
    for cap, minor in sorted(parse_mig_minors(table).items(), key=lambda kv: kv[1]):
        info = _read(os.path.join(capabilities, _cap_proc_path(cap)))
        if info is None:
            continue  # that GPU or compute instance does not exist now
        cap_mode = _fields(info).get("DeviceFileMode", 0o444) & 0o7777
        wanted.append(Wanted(f"nvidia-caps/nvidia-cap{minor}", caps, minor, cap_mode))
    return wanted


def _open_dir(path: str, create: bool) -> int:
    try:
        return open_trusted_dir(path)
    except FileNotFoundError:
        if not create:
            raise
    parent, base = os.path.split(path)
    pfd = open_trusted_dir(parent)
    try:
        os.mkdir(base, 0o755, dir_fd=pfd)
    except FileExistsError:
        pass
    finally:
        os.close(pfd)
    return open_trusted_dir(path)


def create_missing(
    dev: str, wanted: list[Wanted], dry_run: bool = False
) -> tuple[list[Wanted], list[str]]:
    """Make the `wanted` nodes missing under the folder `dev` (and the nvidia-caps folder, 0755,
    when one goes there): the ones made (with `dry_run`: that would be), and why others could
    not be (one line each: the rest are still made). OutputError when `dev` cannot be opened."""
    made: list[Wanted] = []
    problems: list[str] = []
    fds: dict[str, int] = {}
    old_umask = os.umask(0)  # the driver's modes exactly, as nvidia-modprobe makes them
    try:
        for node in wanted:
            folder, _, name = node.name.rpartition("/")
            where = f"{dev}/{folder}" if folder else dev
            try:
                if where not in fds:
                    fds[where] = _open_dir(where, create=bool(folder) and not dry_run)
            except FileNotFoundError:
                if not folder:
                    raise OutputError(f"the device folder {where} does not exist") from None
                if dry_run:
                    made.append(node)  # its folder would be made too
                else:
                    problems.append(f"cannot make the folder {where}")
                continue
            except OSError as exc:
                if not folder:
                    raise OutputError(f"cannot open {where}: {exc.strerror or exc}") from None
                problems.append(f"cannot open {where}: {exc.strerror or exc}")
                continue
            try:
                os.lstat(name, dir_fd=fds[where])
                continue  # there already: kept as it is
            except FileNotFoundError:
                pass
            problem = None if dry_run else _mknod(fds[where], f"{dev}/{node.name}", name, node)
            if problem:
                problems.append(problem)
            else:
                made.append(node)
    finally:
        os.umask(old_umask)
        for fd in fds.values():
            os.close(fd)
    return made, problems


def _mknod(fd: int, path: str, name: str, node: Wanted) -> str | None:
    """Make one node; None when made (or made meanwhile), else why not."""
    try:
        os.mknod(name, 0o020000 | node.mode, os.makedev(node.major, node.minor), dir_fd=fd)
        if (node.uid, node.gid) != (os.geteuid(), os.getegid()):
            os.chown(name, node.uid, node.gid, dir_fd=fd, follow_symlinks=False)
    except FileExistsError:
        return None
    except OSError as exc:
        why = f"{exc.strerror or exc}"
        return f"cannot make {path} (c {node.major}:{node.minor}): {why} (mknod needs CAP_MKNOD)"
    return None


MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset")  # nvidia-ctk's --load-kernel-modules
MODPROBE = "/sbin/modprobe"


def modprobe_commands(root: str) -> list[list[str]]:
    """The commands that load the NVIDIA kernel modules: the modprobe of `root` (chrooted into
    it when it is not /), one module each, as nvidia-ctk runs them."""
    chroot = ["chroot", root] if os.path.realpath(root) != "/" else []
    return [[*chroot, MODPROBE, module] for module in MODULES]


def load_modules(root: str) -> None:
    """Run modprobe_commands; InputError naming the first module that did not load."""
    import subprocess

    for cmd in modprobe_commands(root):
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise InputError(f"cannot run {' '.join(cmd)}: {exc}") from None
        if done.returncode != 0:
            why = " ".join(done.stderr.split()) or f"exit status {done.returncode}"
            raise InputError(f"{' '.join(cmd)} failed: {why}")
