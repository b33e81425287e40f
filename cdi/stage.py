"""`--library-mode folder`: the driver's libraries and binaries staged in one host folder.

An engine that applies CDI itself (podman, containerd 1.7+, CRI-O) pays for every mount of a
spec at every container start (docs/benchmarks.md, podman). The
SONAME mounts of `--library-mode mounts` are one mount per library and loader folder (19 for
a compute-only L4 spec in one loader family). Folder mode stages the selected libraries, their
SONAME and development links and the binaries in one folder on the host, once per driver, and
the spec mounts that folder at /usr/local/nvidia, read-only (and its lib64/ twice more, below):

    /usr/local/nvidia/lib64/   64-bit libraries (versioned files, SONAME links, development
                               links: libcuda.so and each libX.so the driver root holds)
    /usr/local/nvidia/lib/     32-bit libraries (compat32)
    /usr/local/nvidia/bin/     nvidia-smi, nvidia-debugdump, the MPS binaries, ...
    /usr/local/nvidia/files/   the firmware and config files, each at its container path
                               (files/etc/vulkan/icd.d/nvidia_icd.json, ...)
    /usr/local/nvidia/ld.so.cache  the stage's own ld cache (cache_of): each library under
                               its SONAME and development links at its path here, as
                               ldconfig would list it

That is the layout GKE mounts and that nvidia-docker 1.0's volume had, and the one every
nvidia/cuda and NGC image still searches: their image config sets
LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64 and puts /usr/local/nvidia/bin
on PATH. A CDI spec cannot add to an image's variable, only replace it (which would break
images that set their own), so every other image gets the driver the way the reference gives
it, through the spec's one hook entry (gpuctk-cdi-hook, hook/cdihook.c): the stage's ld.so.cache
merged into the image's /etc/ld.so.cache (`ldconfig -p` lists libcuda.so.1, which Triton and
torch.compile need, whatever the image's glibc), and each binary linked at its usual path
(/usr/bin/nvidia-smi -> /usr/local/nvidia/bin/nvidia-smi: found by name on any PATH). The
stage's lib64/ is also mounted where glibc 2.33+ looks when its ld cache has no entry, the
glibc-hwcaps level folder of each loader family, /usr/lib/<triplet>/glibc-hwcaps/x86-64-v2 and
/usr/lib64/glibc-hwcaps/x86-64-v2 (gpuctk.cdi.libmounts.hwcaps_dirs; `--loader-folders`
chooses the families): a dlopen still works in an image whose cache the hook could not write.
Three mounts in all. The firmware and config files (the OpenCL, Vulkan, EGL and GLVND files,
the application profiles, the Xorg modules, the GSP firmware: 13 on an L4 of the 535 driver)
are not mounted one by one: the hook entry makes each a symlink into files/ (`--link
/usr/local/nvidia/files/PATH::PATH`), which costs an engine next to nothing per file, where
each mount costs it a few milliseconds (docs/benchmarks.md). runc and crun run
createContainer hooks before they make a root read-only, so a read-only container gets them
too. With `--disable-hook create-symlinks` (or `all`) they are mounted as in the other modes.

Staging (host side, as root):

- The stage is `<staging dir>/<driver version>-<digest>`: the digest covers the layout and
  each source file's identity (device, inode, size, mtime; not ctime: hard-linking the file
  changes its ctime), so a driver upgrade, a
  changed capability selection or a replaced file gives a new folder, and a rerun on an
  unchanged node reuses the existing one without writing anything.
- Files are hard-linked from the driver (no copy, no disk) when the staging dir is on the same
  filesystem, else copied with their modes. A hard link pins the file's content: a driver
  upgrade that replaces the file by rename (every package manager does) leaves the stage as it
  was until the spec is generated again.
- The stage is built in a temporary folder beside it and renamed into place: a reader (a
  container start) sees no stage or a whole one. Two concurrent runs build their own and one
  rename wins.
- The staging dir must be a real folder owned by root that nobody else can write (it is made,
  mode 0755, if missing); anything else is refused. Older stages are left in place (a spec
  written earlier, or one generated with other options, may still name them) unless
  `--prune-stages` is given: then those that no CDI spec in /etc/cdi, /var/run/cdi, the
  output's folder or a `--keep-spec-dir` names, and that no running container mounts, are
  removed (prune_stages). A container's bind mount keeps the stage's folder but not its
  files, so a mounted stage is never removed: it goes at a later prune, once its containers
  are gone. Mounts are found in every mount namespace's /proc/<pid>/mountinfo, matched by
  filesystem and path inside it (gpuctk.cdi.stagemounts says why not by host path).
- Disk: across filesystems a stage holds a copy of the plan's files (the libraries,
  binaries, firmware and configs the spec can mount, nothing else; the one line stage_driver
  reports gives the MiB copied). A file an older stage already copied from the same source
  (the same identity as in the digest) is hard-linked from that stage instead, so a new stage
  (a changed capability selection, one replaced file) copies only what changed. What each
  stage copied, from where, is recorded beside it in `.<stage name>.sources` (outside the
  stage: containers mount the stage, and the host paths are not theirs to read).
  What a prune keeps is the current stage, every stage a spec
  names and every stage a container mounts; none of those can go without breaking a spec or
  a container, so no count is enforced on them: more than KEEP_OTHERS besides the current
  one gets a warning line naming each and why it stays.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import posixpath
import re
import shutil
import stat
import tempfile
from collections.abc import Callable

from gpuctk.cdi.libmounts import names_of
from gpuctk.cdi.node import capabilities as caps
from gpuctk.cdi.node.driverfiles import DriverFile, DriverFiles
from gpuctk.errors import InputError, OutputError
from gpuctk.fs import private_folder, stat_identity
from gpuctk.writes import atomic_write

LAYOUT = "gpuctk-stage-4"  # bump when the layout below changes

MOUNT = "/usr/local/nvidia"  # where a folder spec mounts the stage in containers
FILES = "files"  # the stage's folder of firmware and config files, at their container paths
CACHE = "ld.so.cache"  # the stage's own ld cache: its libraries at their container paths


def linked_files(files: DriverFiles) -> tuple[DriverFile, ...]:
    """The files a folder spec links into the container from the stage's files/ folder."""
    return (*files.firmware, *files.configs)


def plan(files: DriverFiles) -> tuple[dict[str, str], dict[str, str]]:
    """(copies, links) of a stage: {stage-relative path: host file} and {stage-relative link:
    its relative target}. Libraries go to lib64/ (lib/ for compat32) under their own file
    names, with each of their names (gpuctk.cdi.libmounts.names_of: SONAME, libcuda.so, the
    gbm/vdpau backends) as a link; binaries to bin/ under their container names; firmware and
    configs to files/ at their container paths. The first library to claim a name keeps it,
    as in the other modes."""
    copies: dict[str, str] = {}
    links: dict[str, str] = {}
    for lib in files.libraries:
        folder = "lib" if lib.capability == caps.COMPAT32 else "lib64"
        own = posixpath.basename(lib.container_path)
        path = f"{folder}/{own}"
        if path in copies or path in links:
            continue
        copies[path] = lib.host_path
        for name in names_of(lib):
            link = f"{folder}/{name}"
            if link not in copies and link not in links:
                links[link] = posixpath.relpath(path, posixpath.dirname(link))
    for binary in files.binaries:
        copies.setdefault(f"bin/{posixpath.basename(binary.container_path)}", binary.host_path)
    for f in linked_files(files):
        copies.setdefault(FILES + posixpath.normpath(f.container_path), f.host_path)
    return copies, links


def cache_of(files: DriverFiles) -> bytes:
    """The stage's own ld cache (CACHE): one entry per staged library under its SONAME, at
    the container path MOUNT/lib64/SONAME (lib/ for compat32), and one under each of its
    development links (libcuda.so, ...) as ldconfig makes them, with the flags ldconfig gives
    its ELF class and machine, in ldconfig's order and format. gpuctk-cdi-hook merges it into
    each image's cache (hook/ldcache.c) without reading an ELF header or running ldconfig; the
    names are those plan() links (the first library to claim a name keeps it)."""
    from gpuctk.cdi.node.elf import MACHINES
    from gpuctk.cdi.node.ldcache import CACHE_FLAGS, LdCacheEntry, build_ld_cache, cached_name

    by_arch = {MACHINES.get(machine): flags for (_c, machine), flags in CACHE_FLAGS.items()}
    copies, links = plan(files)
    entries: dict[tuple[str, int], LdCacheEntry] = {}
    for lib in files.libraries:
        folder = "lib" if lib.capability == caps.COMPAT32 else "lib64"
        own = f"{folder}/{posixpath.basename(lib.container_path)}"
        flags = by_arch.get(lib.arch or "")
        if flags is None or copies.get(own) != lib.host_path:
            continue
        # its SONAME, and each development link (libX.so), as ldconfig caches them
        file = posixpath.basename(own)
        for key in (n for n in names_of(lib) if cached_name(n, lib.soname, file)):
            name = f"{folder}/{key}"
            if name == own or links.get(name) == file:
                entries.setdefault((key, flags), LdCacheEntry(key, f"{MOUNT}/{name}", flags))
    return build_ld_cache(list(entries.values()))


def stage_name(version: str, copies: dict[str, str], links: dict[str, str], cache: bytes) -> str:
    """`<version>-<digest>`: the digest of the layout, the links, the stage's ld cache
    (cache_of: a new rule for its entries makes a new stage, not a reused one without them)
    and the identity of every source file (InputError if one cannot be read)."""
    digest = hashlib.sha256(LAYOUT.encode())
    digest.update(b"\0c\0" + cache)
    for path, host in sorted(copies.items()):
        try:
            identity = stat_identity(os.stat(host))[:4]
        except OSError as exc:
            raise InputError(f"cannot stage {host}: {exc.strerror}") from None
        digest.update(f"\0f\0{path}\0{host}\0{identity}".encode())
    for link, target in sorted(links.items()):
        digest.update(f"\0l\0{link}\0{target}".encode())
    return f"{version}-{digest.hexdigest()[:16]}"


def _check_staging_dir(staging_dir: str) -> None:
    try:
        os.makedirs(staging_dir, 0o755, exist_ok=True)
    except OSError as exc:
        raise OutputError(
            f"cannot create the staging dir {staging_dir}: {exc.strerror} (choose another "
            "with --staging-dir)"
        ) from None
    if not private_folder(staging_dir):
        raise OutputError(
            f"refusing to stage the driver in {staging_dir}: it must be a folder (not a "
            "symlink) owned by this user that nobody else can write (the stage it holds is "
            "mounted into every GPU container)"
        )


SOURCES_MAX = 4 << 20  # a `.<stage>.sources` record larger than this is not read


def _sources_path(stage: str) -> str:
    return os.path.join(os.path.dirname(stage), f".{os.path.basename(stage)}.sources")


def _identity(host: str) -> list[int]:
    return list(stat_identity(os.stat(host))[:4])


def sources_records(staging_dir: str) -> list[tuple[str, str]]:
    """(stage folder, its record) for every `.<stage name>.sources` in `staging_dir`."""
    out = []
    for entry in os.scandir(staging_dir):
        match = SOURCES_NAME.fullmatch(entry.name)
        if match:
            out.append((os.path.join(staging_dir, match.group(1)), entry.path))
    return out


def _copied_before(staging_dir: str) -> dict[tuple[str, str], str]:
    """{(stage-relative path, identity of its source as JSON): the file in an older stage}
    for every file an older stage copied, read from the stages' `.sources` records (written
    by this module into a folder root alone can write); a record that cannot be read, or
    whose stage is gone, offers nothing."""
    found: dict[tuple[str, str], str] = {}
    for stage, source in sources_records(staging_dir):
        if not os.path.isdir(stage):
            continue
        try:
            with open(source, "rb") as f:
                record = json.loads(f.read(SOURCES_MAX + 1)[:SOURCES_MAX])
            for path, (host, identity) in record.items():
                if posixpath.normpath(path) == path and not path.startswith(("/", "..")):
                    found[(path, json.dumps([host, identity]))] = os.path.join(stage, path)
        except (OSError, ValueError, TypeError, AttributeError):
            continue
    return found


def _place(host: str, dest: str, older_of: Callable[[str], str | None]) -> int:
    """Hard-link `host` at `dest`; across filesystems, hard-link the copy an older stage made
    of the same source (`older_of(host)`), else copy it (contents and mode): the bytes copied
    (0 for a link, -1 for a link to an older stage's copy)."""
    try:
        os.link(host, dest)
        return 0
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
    older = older_of(host)
    if older is not None:
        try:  # only a regular file of the source's size, never a link's target
            st = os.lstat(older)
            if stat.S_ISREG(st.st_mode) and st.st_size == os.path.getsize(host):
                os.link(older, dest, follow_symlinks=False)
                return -1
        except OSError:
            pass  # that stage went meanwhile: copy
    shutil.copy2(host, dest, follow_symlinks=False)
    return os.path.getsize(dest)


def stage_path_of(files: DriverFiles, version: str, staging_dir: str) -> str:
    """The folder stage_driver gives `files` (nothing is written; InputError for a driver
    file that cannot be read): a spec can be built, and its errors found, before the copy."""
    copies, links = plan(files)
    name = stage_name(version, copies, links, cache_of(files))
    return os.path.join(os.path.abspath(staging_dir), name)


def stage_driver(
    files: DriverFiles,
    version: str,
    staging_dir: str,
    report: Callable[[str], None] | None = None,
) -> str:
    """The stage folder of `files` under `staging_dir`, built if missing (the module's
    docstring); `report` gets one line on what was done. InputError for an unreadable driver
    file, OutputError for a staging dir that cannot be used or written."""
    copies, links = plan(files)
    cache = cache_of(files)
    staging_dir = os.path.abspath(staging_dir)
    name = stage_name(version, copies, links, cache)
    _check_staging_dir(staging_dir)
    final = os.path.join(staging_dir, name)
    if os.path.isdir(final) and not os.path.islink(final):
        if report:
            report(f"driver stage {final} is current (reused)")
        return final
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=staging_dir)
    copied = linked = shared = size = 0
    record: dict[str, tuple[str, list[int]]] = {}
    before: list[dict[tuple[str, str], str]] = []  # read at the first file to copy

    def older_of(path: str, host: str) -> str | None:
        if not before:
            before.append(_copied_before(staging_dir))
        return before[0].get((path, json.dumps([host, _identity(host)])))

    try:
        os.chmod(tmp, 0o755)
        for path, host in sorted(copies.items()):
            dest = os.path.join(tmp, path)
            os.makedirs(os.path.dirname(dest), 0o755, exist_ok=True)
            n = _place(host, dest, functools.partial(older_of, path))
            if n:
                record[path] = (host, _identity(host))
            copied, shared = copied + (n > 0), shared + (n < 0)
            linked, size = linked + (n == 0), size + max(n, 0)
        for link, target in sorted(links.items()):
            dest = os.path.join(tmp, link)
            os.makedirs(os.path.dirname(dest), 0o755, exist_ok=True)
            os.symlink(target, dest)
        with open(os.path.join(tmp, CACHE), "xb") as f:
            f.write(cache)
        os.chmod(os.path.join(tmp, CACHE), 0o644)
        try:
            os.rename(tmp, final)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY) or not os.path.isdir(final):
                raise
            shutil.rmtree(tmp)  # a concurrent run placed the same stage first
        if record:
            atomic_write(_sources_path(final), json.dumps(record).encode(), 0o600)
        if report:
            how = (
                f"{linked} hard-linked"
                + (f", {shared} shared with an older stage" if shared else "")
                + (
                    f", {copied} copied ({size / 2**20:.0f} MiB: another filesystem)"
                    if copied
                    else ""
                )
            )
            report(f"driver staged in {final}: {how}, {len(links)} links")
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OutputError(
            f"cannot stage the driver in {staging_dir}: {exc.strerror or exc} "
            f"({getattr(exc, 'filename', None) or ''}); nothing was changed"
        ) from None
    return final


STAGE_NAME = re.compile(r"(\d+(?:\.\d+)+)-[0-9a-f]{16}")  # group 1: the driver version
SOURCES_NAME = re.compile(rf"\.({STAGE_NAME.pattern})\.sources")  # group 1: the stage's name
STALE_TMP_S = 3600  # a `.tmp-` folder this old is a run that died halfway
DEFAULT_STAGING_DIR = "/var/lib/gpuctk/driver"  # --staging-dir's default (gpuctk.cdi.cli)
