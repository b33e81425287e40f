"""gpuctk-hook's verbs on real image roots (fresh overlays), run as the console script with the
OCI state on stdin, the way runc runs it, but without a container: the root is the bundle's.

What must hold: the right links, ld.so.conf.d entry and ld cache; musl images get their path
file and no glibc files; unknown verbs never fail; no binary from the image ever runs (a planted
/sbin/ldconfig and /etc/ld.so.preload leave no marker); nothing outside the root changes; stdout
stays empty; an error is one line on stderr and exit 1.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fixtures.images import hook_path
from fixtures.images import snapshot_tree as snapshot
from fixtures.nosyscall import without

from gpuctk.cdi.node.ldcache import MAGIC_NEW, MAX_CACHE_SIZE

FOLDER = "/usr/lib/x86_64-linux-gnu/nvidia/current"
LINK = f"libfoo.so.1.2.3::{FOLDER}/libfoo.so.1"
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def bundle_for(tmp_path: Path, rootfs: Path, **root: Any) -> Path:
    bundle = tmp_path / "bundle"
    bundle.mkdir(exist_ok=True)
    config = {"ociVersion": "1.0.2", "root": {"path": str(rootfs), **root}, "process": {}}
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle


def state(bundle: Path) -> bytes:
    doc = {"ociVersion": "1.0.2", "id": "t", "status": "creating", "pid": 0, "bundle": str(bundle)}
    return json.dumps(doc).encode()


def hook(
    args: list[str],
    stdin: bytes = b"",
    env: dict[str, str] | None = None,
    missing: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """gpuctk-hook run with `args`; `missing` system calls fail with ENOSYS (an older kernel)."""
    if not os.path.exists(hook_path()):
        pytest.skip("gpuctk-hook console script not installed in the venv")
    done = subprocess.run(
        without(missing, [hook_path(), *args]),
        input=stdin.decode("latin-1"),
        capture_output=True,
        text=True,
        env={**ENV, **(env or {})},
        timeout=60,
        check=False,
    )
    if args and args[0] not in ("--version", "version"):
        assert done.stdout == "", "the hook must never write to stdout"
    return done


def with_lib(rootfs: Path, libfoo: Path) -> Path:
    folder = rootfs / FOLDER.lstrip("/")
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(libfoo, folder / "libfoo.so.1.2.3")
    return folder


def cache_listing(rootfs: Path) -> str:
    return subprocess.run(
        ["/sbin/ldconfig", "-p", "-C", str(rootfs / "etc/ld.so.cache")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@pytest.mark.parametrize("walk", [(), ("openat2",)], ids=["openat2", "walk"])
def test_create_container_on_a_debian_image(
    tmp_path: Path, fresh_rootfs: Any, libfoo: Path, walk: tuple[str, ...]
) -> None:
    rootfs = fresh_rootfs("debian")
    folder = with_lib(rootfs, libfoo)
    args = ["createContainer", "--link", LINK, "--folder", FOLDER]
    done = hook(args, state(bundle_for(tmp_path, rootfs)), missing=walk)
    assert done.returncode == 0, done.stderr
    assert os.readlink(folder / "libfoo.so.1") == "libfoo.so.1.2.3"
    conf = (rootfs / "etc/ld.so.conf.d/00-gpuctk.conf").read_text().splitlines()
    assert FOLDER in conf
    assert f"libfoo.so.1 (libc6,x86-64) => {FOLDER}/libfoo.so.1" in cache_listing(rootfs)
    assert (rootfs / "etc/ld.so.conf").read_text().startswith("include")  # the image's own


def mounted_lib(
    tmp_path: Path, rootfs: Path, libfoo: Path, folder: str = FOLDER, name: str = ""
) -> Path:
    """A bundle whose config.json bind-mounts the host libfoo at folder/`name` (default its
    own), as an engine writes it from the spec; the file is copied there (the mount, without
    a container)."""
    bundle = bundle_for(tmp_path, rootfs)
    config = json.loads((bundle / "config.json").read_text())
    dest = f"{folder}/{name or libfoo.name}"
    config["mounts"] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": dest, "type": "bind", "source": str(libfoo), "options": ["ro", "rbind"]},
    ]
    (bundle / "config.json").write_text(json.dumps(config))
    (rootfs / folder.lstrip("/")).mkdir(parents=True, exist_ok=True)
    shutil.copy(libfoo, rootfs / dest.lstrip("/"))
    return bundle


def test_create_container_merges_the_cache_without_ldconfig(
    tmp_path: Path, fresh_rootfs: Any, libfoo: Path
) -> None:
    # the driver library is a bind mount in config.json: its SONAME link's entry is added to
    # the image's cache in-process (gpuctk.hook.verbs.ldmerge), as gpuctk-runtime does; ldconfig
    # does not run: it would have indexed, and made the SONAME link of, the unmounted copy
    # in the second folder
    rootfs = fresh_rootfs("debian")
    image_cache = [line for line in cache_listing(rootfs).splitlines() if line.startswith("\t")]
    bundle = mounted_lib(tmp_path, rootfs, libfoo)
    other = "/usr/lib/x86_64-linux-gnu/other"
    (rootfs / other.lstrip("/")).mkdir()
    shutil.copy(libfoo, rootfs / other.lstrip("/") / "libfoo.so.1.2.3")
    log = tmp_path / "hook.log"
    args = ["createContainer", "--link", LINK, "--folder", FOLDER, "--folder", other]
    env = {"GPUCTK_HOOK_LOG": str(log), "GPUCTK_HOOK_LOG_LEVEL": "debug"}
    done = hook(args, state(bundle), env=env)
    assert done.returncode == 0, done.stderr
    listing = cache_listing(rootfs)
    assert f"libfoo.so.1 (libc6,x86-64) => {FOLDER}/libfoo.so.1" in listing
    assert f"{other}/" not in listing
    assert not (rootfs / other.lstrip("/") / "libfoo.so.1").exists()
    assert set(image_cache) <= set(listing.splitlines())  # the image's entries kept
    assert "driver libraries (no ldconfig)" in log.read_text()
    conf = (rootfs / "etc/ld.so.conf.d/00-gpuctk.conf").read_text().splitlines()
    assert FOLDER in conf and other in conf  # an image's later ldconfig keeps them


def test_a_library_without_soname_is_cached_by_its_names_as_ldconfig_does(
    tmp_path: Path, fresh_rootfs: Any
) -> None:
    # the driver's libnvidia-vulkan-producer.so.<version> has no SONAME and is dlopened by its
    # development link's name: ldconfig caches such a file under each name it finds it by
    # (run here on a copy of the folder); the merge must list both, without ldconfig, by the
    # names in the container (the host file's own name is another here)
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    lib = tmp_path / "bar-build.out"
    (tmp_path / "bar.c").write_text("int bar(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-nostdlib", "-o", str(lib),
                    str(tmp_path / "bar.c")], check=True)  # fmt: skip
    rootfs = fresh_rootfs("debian")
    bundle = mounted_lib(tmp_path, rootfs, lib, name="libbar.so.1.2.3")
    log = tmp_path / "hook.log"
    args = ["createContainer", "--link", f"libbar.so.1.2.3::{FOLDER}/libbar.so", "--folder", FOLDER]
    env = {"GPUCTK_HOOK_LOG": str(log), "GPUCTK_HOOK_LOG_LEVEL": "debug"}
    done = hook(args, state(bundle), env=env)
    assert done.returncode == 0, done.stderr
    assert "driver libraries (no ldconfig)" in log.read_text()
    ours = {line for line in cache_listing(rootfs).splitlines() if "libbar" in line}
    ref = tmp_path / "ref"
    (ref / "etc").mkdir(parents=True)
    (ref / "etc/ld.so.conf").write_text(FOLDER + "\n")
    shutil.copytree(rootfs / FOLDER.lstrip("/"), ref / FOLDER.lstrip("/"), symlinks=True)
    subprocess.run(["/sbin/ldconfig", "-r", str(ref)], capture_output=True, check=False)
    theirs = {line for line in cache_listing(ref).splitlines() if "libbar" in line}
    want = {
        f"\tlibbar.so.1.2.3 (libc6,x86-64) => {FOLDER}/libbar.so.1.2.3",
        f"\tlibbar.so (libc6,x86-64) => {FOLDER}/libbar.so",
    }
    assert ours == theirs == want


@pytest.mark.parametrize(
    "case",
    ["no ld cache", "a cache over the size cap", "no SONAME link", "a mounted folder",
     "ldconfig named"],
)  # fmt: skip
def test_create_container_leaves_the_cache_to_ldconfig_where_merging_cannot_do(
    tmp_path: Path, fresh_rootfs: Any, libfoo: Path, case: str
) -> None:
    # each of these needs what only ldconfig does: a cache from nothing, the SONAME link it
    # makes, the files of a mounted folder, or the ldconfig the caller named
    rootfs = fresh_rootfs("debian")
    bundle = mounted_lib(tmp_path, rootfs, libfoo)
    args = ["createContainer", "--link", LINK, "--folder", FOLDER]
    env = {}
    if case == "no ld cache":
        (rootfs / "etc/ld.so.cache").unlink()
    elif case == "a cache over the size cap":  # a hostile image's: not read, not merged
        (rootfs / "etc/ld.so.cache").write_bytes(MAGIC_NEW + bytes(MAX_CACHE_SIZE))
    elif case == "no SONAME link":  # a second mounted copy, in a folder with no link to it
        other = "/usr/lib/x86_64-linux-gnu/other"
        config = json.loads((bundle / "config.json").read_text())
        dest = f"{other}/libfoo.so.1.2.3"
        config["mounts"].append(
            {"destination": dest, "type": "bind", "source": str(libfoo), "options": ["rbind"]}
        )
        (bundle / "config.json").write_text(json.dumps(config))
        (rootfs / other.lstrip("/")).mkdir()
        shutil.copy(libfoo, rootfs / dest.lstrip("/"))
        args += ["--folder", other]
    elif case == "a mounted folder":
        config = json.loads((bundle / "config.json").read_text())
        config["mounts"].append(
            {"destination": "/usr/lib/x86_64-linux-gnu/nvidia", "type": "bind",
             "source": str(tmp_path), "options": ["rbind"]}
        )  # fmt: skip
        (bundle / "config.json").write_text(json.dumps(config))
    else:
        env = {"GPUCTK_LDCONFIG": "/sbin/ldconfig"}
    log = tmp_path / "hook.log"
    env |= {"GPUCTK_HOOK_LOG": str(log), "GPUCTK_HOOK_LOG_LEVEL": "debug"}
    done = hook(args, state(bundle), env=env)
    assert done.returncode == 0, done.stderr
    text = log.read_text()
    assert "ld cache rebuilt by /sbin/ldconfig" in text
    why = {
        "no ld cache": "no /etc/ld.so.cache in the image: ldconfig",
        "a cache over the size cap": (
            f"the image's /etc/ld.so.cache is {len(MAGIC_NEW) + MAX_CACHE_SIZE} bytes, over the "
            f"{MAX_CACHE_SIZE}-byte limit: not merged; the host's ldconfig rebuilds the ld cache"
        ),
        "no SONAME link": "other/libfoo.so.1 (the SONAME of",
        "a mounted folder": f"{FOLDER} is in the mounted /usr/lib/x86_64-linux-gnu/nvidia",
        "ldconfig named": "ld cache rebuilt",
    }[case]
    assert why in text
    if case == "a cache over the size cap":  # one line, and the engine's log has it too
        assert done.stderr == f"gpuctk-hook: warning: {why}\n"
    assert f"libfoo.so.1 (libc6,x86-64) => {FOLDER}/libfoo.so.1" in cache_listing(rootfs)
    assert os.readlink(rootfs / FOLDER.lstrip("/") / "libfoo.so.1") == "libfoo.so.1.2.3"


def test_links_only_to_existing_targets_and_never_over_files(
    tmp_path: Path, fresh_rootfs: Any, libfoo: Path
) -> None:
    rootfs = fresh_rootfs("debian")
    folder = with_lib(rootfs, libfoo)
    (folder / "libbar.so.1").write_text("a real file")
    (folder / "libold.so.1").symlink_to("libold.so.1.0")
    (folder / "libold.so.1.2").write_text("x")
    links = [
        LINK,
        f"libmissing.so.9::{FOLDER}/libmissing.so.1",  # target dropped by capabilities
        f"libfoo.so.1.2.3::{FOLDER}/libbar.so.1",  # a real file: left alone
        f"libold.so.1.2::{FOLDER}/libold.so.1",  # a stale link: replaced
        f"{FOLDER}/libfoo.so.1.2.3::/usr/lib/x86_64-linux-gnu/libfoo.so",  # absolute target
    ]
    args = ["create-symlinks"] + [a for link in links for a in ("--link", link)]
    done = hook(args, state(bundle_for(tmp_path, rootfs)))
    assert done.returncode == 0, done.stderr
    assert os.readlink(folder / "libfoo.so.1") == "libfoo.so.1.2.3"
    assert not (folder / "libmissing.so.1").is_symlink()
    assert (folder / "libbar.so.1").read_text() == "a real file"
    assert "libbar.so.1" in done.stderr  # warned
    assert os.readlink(folder / "libold.so.1") == "libold.so.1.2"
    assert os.readlink(rootfs / "usr/lib/x86_64-linux-gnu/libfoo.so") == f"{FOLDER}/libfoo.so.1.2.3"
    assert not (rootfs / "etc/ld.so.conf.d/00-gpuctk.conf").exists()  # no --folder, no ldcache


def test_image_without_ld_so_conf_gets_one(tmp_path: Path, fresh_rootfs: Any, libfoo: Path) -> None:
    rootfs = fresh_rootfs("no-ldsoconf")
    with_lib(rootfs, libfoo)
    done = hook(["update-ldcache", "--folder", FOLDER], state(bundle_for(tmp_path, rootfs)))
    assert done.returncode == 0, done.stderr
    assert (rootfs / "etc/ld.so.conf").read_text() == "include /etc/ld.so.conf.d/*.conf\n"
    assert f"=> {FOLDER}/libfoo.so.1" in cache_listing(rootfs)  # ldconfig made the SONAME link
    # ldconfig, unprivileged, could make neither: the hook installed its cache and link
    assert os.readlink(rootfs / FOLDER.lstrip("/") / "libfoo.so.1") == "libfoo.so.1.2.3"
    cache = (rootfs / "etc/ld.so.cache").stat()
    assert (cache.st_uid, cache.st_gid, stat.S_IMODE(cache.st_mode)) == (0, 0, 0o644)
    assert not [p.name for p in (rootfs / "etc").iterdir() if "gpuctk-ldconfig" in p.name]


@pytest.mark.parametrize("path_file", ["debian's", "none"])
def test_musl_image_gets_a_path_file_and_no_glibc_files(
    tmp_path: Path, fresh_rootfs: Any, libfoo: Path, path_file: str
) -> None:
    rootfs = fresh_rootfs("musl")
    with_lib(rootfs, libfoo)
    musl_path = rootfs / "etc/ld-musl-x86_64.path"
    if path_file == "none":
        musl_path.unlink()
        shutil.rmtree(rootfs / "etc/ld-musl-x86_64.d")
    args = ["createContainer", "--link", LINK, "--folder", FOLDER, "--folder", FOLDER]
    done = hook(args, state(bundle_for(tmp_path, rootfs)))
    assert done.returncode == 0, done.stderr
    entries = musl_path.read_text().split()
    assert entries[0] == FOLDER and entries.count(FOLDER) == 1
    expected = (
        ["/lib", "/usr/local/lib", "/usr/lib"]
        if path_file == "none"
        else ["/lib/x86_64-linux-musl"]
    )
    assert all(e in entries for e in expected)
    for glibc_file in ("etc/ld.so.cache", "etc/ld.so.conf", "etc/ld.so.conf.d"):
        assert not (rootfs / glibc_file).exists()
    assert hook(args, state(bundle_for(tmp_path, rootfs))).returncode == 0
    assert musl_path.read_text().split() == entries  # idempotent


def test_unknown_verb_and_options_are_ignored(tmp_path: Path) -> None:
    done = hook(["prestart-from-the-future", "--flux", "9"], b"")
    assert done.returncode == 0
    assert "unknown verb" in done.stderr
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    done = hook(
        ["chmod", "--mode", "700", "--path", "/etc", "--new-flag", "x", "--other=y"],
        state(bundle_for(tmp_path, root)),
    )
    assert done.returncode == 0, done.stderr
    assert "--new-flag" in done.stderr and "--other=y" in done.stderr
    assert stat.S_IMODE((root / "etc").stat().st_mode) == 0o700


def test_version() -> None:
    done = hook(["--version"])
    assert done.returncode == 0 and done.stdout.startswith("gpuctk-hook ")


def _marker_lib(tmp_path: Path, host_marker: Path) -> Path:
    source = tmp_path / "marker.c"
    source.write_text(
        "#include <stdio.h>\n"
        "__attribute__((constructor)) static void ran(void) {\n"
        f'  FILE *f = fopen("{host_marker}", "w"); if (f) fclose(f);\n'
        '  f = fopen("/preload-ran", "w"); if (f) fclose(f);\n'
        "}\n"
    )
    out = tmp_path / "libmarker.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(source)], check=True)
    return out


def test_image_binaries_and_preloads_never_run(
    tmp_path: Path, fresh_rootfs: Any, libfoo: Path
) -> None:
    rootfs = fresh_rootfs("debian")
    with_lib(rootfs, libfoo)
    host_marker = tmp_path / "host-marker"
    fake = rootfs / "sbin/ldconfig"
    fake.unlink()
    fake.write_text(f"#!/bin/sh\ntouch /ldconfig-ran {host_marker}\nexit 0\n")
    fake.chmod(0o755)
    shutil.copy(_marker_lib(tmp_path, host_marker), rootfs / "lib/libmarker.so")
    (rootfs / "etc/ld.so.preload").write_text("/lib/libmarker.so\n")
    env = {"LD_PRELOAD": "/lib/libmarker.so", "LD_LIBRARY_PATH": "/lib"}  # names in the image
    args = ["createContainer", "--link", LINK, "--folder", FOLDER]
    done = hook(args, state(bundle_for(tmp_path, rootfs)), env=env)
    assert done.returncode == 0, done.stderr
    assert f"=> {FOLDER}/libfoo.so.1" in cache_listing(rootfs)  # the host ldconfig did it
    assert not host_marker.exists()
    assert not (rootfs / "ldconfig-ran").exists()
    assert not (rootfs / "preload-ran").exists()


@pytest.mark.parametrize("which", ["dynamic", "script", "missing"])
def test_unusable_host_ldconfig_is_refused(tmp_path: Path, fresh_rootfs: Any, which: str) -> None:
    rootfs = fresh_rootfs("debian")
    if which == "dynamic":
        ldconfig, expect = "/bin/true", "dynamically linked"
    elif which == "script":
        ldconfig, expect = str(tmp_path / "ldconfig"), "script"
        Path(ldconfig).write_text("#!/bin/sh\ntouch /pwned\n")
        Path(ldconfig).chmod(0o755)
    else:
        ldconfig, expect = "/nonexistent/ldconfig", "no host ldconfig"
    args = ["update-ldcache", "--folder", FOLDER, "--ldconfig-path", ldconfig]
    done = hook(args, state(bundle_for(tmp_path, rootfs)))
    assert done.returncode == 1
    assert expect in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (rootfs / "pwned").exists()


@pytest.mark.parametrize("walk", [(), ("openat2",)], ids=["openat2", "walk"])
@pytest.mark.parametrize("mirror", [False, True], ids=["dangling-in-root", "mirrored-in-root"])
def test_folders_linked_outside_stay_in_root(
    tmp_path: Path, fresh_rootfs: Any, libfoo: Path, mirror: bool, walk: tuple[str, ...]
) -> None:
    """/etc/ld.so.conf.d and the driver folder's parent are links to a host folder (absolute and
    relative): in the root they resolve to <root>/<host path>, which is either missing (a
    clear error) or, when the image has it, where the files go. The host folder never changes."""
    rootfs = fresh_rootfs("debian")
    outside = tmp_path / "outside"
    (outside / "nvidia/current").mkdir(parents=True)
    shutil.copy(libfoo, outside / "nvidia/current/libfoo.so.1.2.3")
    (outside / "ld.so.conf.d").mkdir()
    before = snapshot(outside)
    shutil.rmtree(rootfs / "etc/ld.so.conf.d")
    (rootfs / "etc/ld.so.conf.d").symlink_to(outside / "ld.so.conf.d")
    (rootfs / "usr/lib/x86_64-linux-gnu/nvidia").symlink_to(
        "../../../../../.." + f"{outside}/nvidia"
    )
    if mirror:
        shutil.copytree(outside, rootfs / str(outside).lstrip("/"), symlinks=True)
    lib = f"{FOLDER}/libfoo.so.1.2.3"
    args = ["createContainer", "--link", LINK, "--folder", FOLDER, "--folder", "/lib"]
    bundle = bundle_for(tmp_path, rootfs)
    done = hook(
        # 744: ldconfig runs as an unprivileged host user, and indexes what others may read
        [*args, "--mode", "744", "--path", lib],
        state(bundle),
        missing=walk,
    )
    assert snapshot(outside) == before, "the hook changed something outside the root"
    if not mirror:
        assert done.returncode == 1
        assert done.stderr.strip().splitlines() == [
            "gpuctk-hook: error: cannot open /etc/ld.so.conf.d in the container root: "
            "No such file or directory"
        ]
        return
    assert done.returncode == 0, done.stderr
    inner = rootfs / str(outside).lstrip("/")
    assert os.readlink(inner / "nvidia/current/libfoo.so.1") == "libfoo.so.1.2.3"
    assert stat.S_IMODE((inner / "nvidia/current/libfoo.so.1.2.3").stat().st_mode) == 0o744
    assert FOLDER in (inner / "ld.so.conf.d/00-gpuctk.conf").read_text()
    assert f"=> {FOLDER}/libfoo.so.1" in cache_listing(rootfs)


@pytest.mark.parametrize(
    "bad",
    [
        b"",
        b"\xff\xfe{}",
        b'{"bundle": "/a", "bundle": "/b", "id": "x", "status": "creating", "ociVersion": "1"}',
        b'{"bundle": "/tmp/../etc", "id": "x", "status": "creating", "ociVersion": "1"}',
        b'{"bundle": "relative", "id": "x", "status": "creating", "ociVersion": "1"}',
        b'{"bundle": 5}',
        b'{"bundle": "/nonexistent", "pid": -1}',
        b"[" * 100000 + b"]" * 100000,
        b'{"pad": "' + b"x" * (2 << 20) + b'"}',
        b'{"bundle": "/nonexistent-bundle", "id": "x"}',
    ],
    ids=[
        "empty",
        "utf16",
        "dupkey",
        "dotdot",
        "relative",
        "type",
        "pid",
        "deep",
        "huge",
        "nobundle",
    ],
)
def test_hostile_state_is_one_clear_error(bad: bytes) -> None:
    done = hook(["createContainer", "--folder", FOLDER], bad)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuctk-hook: error: "), done.stderr


def test_log_file_in_runc_format(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    log = tmp_path / "hook.log"
    env = {"GPUCTK_HOOK_LOG": str(log), "GPUCTK_HOOK_LOG_LEVEL": "debug"}
    done = hook(
        ["chmod", "--mode", "750", "--path", "/etc"], state(bundle_for(tmp_path, root)), env
    )
    assert done.returncode == 0, done.stderr
    lines = log.read_text().splitlines()
    assert lines and all(line.startswith('time="') and " level=" in line for line in lines)


PROBE_C = r"""
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/capability.h>
extern char **environ;
int main(void) {
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    syscall(SYS_capget, &h, d);
    unsigned long long bset = 0;
    for (int c = 0; c < 64; c++) if (prctl(PR_CAPBSET_READ, c, 0, 0, 0) == 1) bset |= 1ULL << c;
    int fds = 0;
    for (int fd = 0; fd < 4096; fd++) if (fcntl(fd, F_GETFD) != -1) fds++;
    fprintf(stderr, "eff=%x perm=%x inh=%x bset=%llx nnp=%d uid=%d fds=%d env=%d\n",
            d[0].effective, d[0].permitted, d[0].inheritable, bset,
            prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0), (int)getuid(), fds, environ[0] != NULL);
    fprintf(stderr, "proc1=%d marker=%d pid=%d\n", access("/proc/1", F_OK) == 0,
            access("/image-marker", F_OK) == 0, (int)getpid());
    /* who it is on the host: the owner of a file it makes in the root's world-writable /tmp */
    int made = open("/tmp/probe-made", O_WRONLY | O_CREAT | O_EXCL, 0644);
    fprintf(stderr, "made=%d\n", made >= 0);
    return 0;
}
"""


def test_ldconfig_child_is_confined(tmp_path: Path, fresh_rootfs: Any) -> None:
    """A static probe stands in for ldconfig and reports what it can do: no capability, in a
    user namespace where it is host uid/gid 65534 (what it creates belongs to them), the only
    process of a new pid namespace, chrooted in the image root with its /proc detached."""
    rootfs = fresh_rootfs("debian")
    (rootfs / "image-marker").write_text("")
    (rootfs / "proc").mkdir(exist_ok=True)
    (rootfs / "tmp").mkdir(exist_ok=True)
    (rootfs / "tmp").chmod(0o1777)
    source, probe = tmp_path / "probe.c", tmp_path / "probe"
    source.write_text(PROBE_C)
    built = subprocess.run(["gcc", "-static", "-O2", "-o", str(probe), str(source)], check=False)
    if built.returncode:
        pytest.skip("gcc -static unavailable (libc6-dev's libc.a)")
    cache = (rootfs / "etc/ld.so.cache").read_bytes()
    subprocess.run(["mount", "-t", "proc", "proc", str(rootfs / "proc")], check=True)
    try:
        log = tmp_path / "hook.log"
        env = {"GPUCTK_HOOK_LOG": str(log), "GPUCTK_HOOK_LOG_LEVEL": "debug", "SECRET": "x"}
        args = ["update-ldcache", "--folder", "/lib", "--ldconfig-path", str(probe)]
        done = hook(args, state(bundle_for(tmp_path, rootfs)), env)
    finally:
        subprocess.run(["umount", "-l", str(rootfs / "proc")], check=False)
    assert done.returncode == 0, done.stderr
    text = log.read_text()
    assert "eff=0 perm=0 inh=0 bset=0 nnp=1 uid=0 fds=3 env=0" in text  # uid 0 inside only
    assert "proc1=0 marker=1 pid=1" in text  # chrooted in the image root, /proc detached
    assert "made=1" in text
    made = (rootfs / "tmp/probe-made").stat()
    assert (made.st_uid, made.st_gid) == (65534, 65534), "ldconfig ran as host root"
    # the probe wrote no cache: the image's is left as it was, and no scratch folder stays
    assert "wrote no ld cache" in done.stderr
    assert (rootfs / "etc/ld.so.cache").read_bytes() == cache
    assert not [p.name for p in (rootfs / "etc").iterdir() if "gpuctk-ldconfig" in p.name]


def test_ldconfig_runs_as_host_root_where_user_namespaces_are_refused(
    tmp_path: Path, fresh_rootfs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel that refuses the user namespace (user.max_user_namespaces=0, a seccomp filter:
    here the call made to fail, as such a kernel would) keeps the confinement of before: host
    root with the three DAC capabilities, one debug line saying so, the cache still written."""
    from gpuctk import rootfs as rootfs_mod
    from gpuctk.hook.verbs import ldconfig, ldrebuild, namespaces
    from gpuctk.log import hook as hooklog

    rootfs = fresh_rootfs("debian")
    (rootfs / "tmp").mkdir(exist_ok=True)
    (rootfs / "tmp").chmod(0o1777)
    source, probe = tmp_path / "probe.c", tmp_path / "probe"
    source.write_text(PROBE_C)
    built = subprocess.run(["gcc", "-static", "-O2", "-o", str(probe), str(source)], check=False)
    if built.returncode:
        pytest.skip("gcc -static unavailable (libc6-dev's libc.a)")
    monkeypatch.setattr(namespaces, "new_user_namespace", lambda: errno.EPERM)
    log = tmp_path / "hook.log"
    hooklog.configure({"GPUCTK_HOOK_LOG": str(log), "GPUCTK_HOOK_LOG_LEVEL": "debug"})
    root_fd = rootfs_mod.open_root(str(rootfs))
    try:
        exe_fd, _ = ldconfig.open_host_ldconfig(str(probe))
        try:
            output = ldrebuild.rebuild_cache(root_fd, str(rootfs), exe_fd, ["/lib"])
        finally:
            os.close(exe_fd)
        real_fd, _ = ldconfig.open_host_ldconfig("/sbin/ldconfig")
        try:
            (rootfs / "etc/ld.so.cache").unlink()
            ldrebuild.rebuild_cache(root_fd, str(rootfs), real_fd, ["-f", "/etc/ld.so.conf"])
        finally:
            os.close(real_fd)
    finally:
        os.close(root_fd)
        hooklog.configure({})
    assert "eff=e perm=e inh=0 bset=e nnp=1 uid=0 fds=3 env=0" in output
    assert (rootfs / "tmp/probe-made").stat().st_uid == 0
    assert "no user namespace for the host ldconfig (Operation not permitted)" in log.read_text()
    assert "libc.so.6 (libc6,x86-64)" in cache_listing(rootfs)


def test_skipped_links_are_read_from_the_listing() -> None:
    from gpuctk.hook.verbs.ldrebuild import skipped_links

    listing = (
        b"/usr/lib/x: (from <cmdline>:0)\n"
        b"\tlibfoo.so.1 -> libfoo.so.1.2.3 (SKIPPED)\n"
        b"\tlibok.so.1 -> libok.so.1.0 (changed)\n"
        b"\tlibsame.so.1 -> libsame.so.1.0\n"
        b"/lib:\n"
        b"\tlibold.so.2 -> libold.so.2.0 (SKIPPED)\n"
        b"\tlib/evil.so -> x (SKIPPED)\n"
        b"relative: (from a:1)\n"
        b"\tlibrel.so.1 -> librel.so.1.0 (SKIPPED)\n"
    )
    assert skipped_links(listing) == [
        ("libfoo.so.1.2.3", "/usr/lib/x/libfoo.so.1"),
        ("libold.so.2.0", "/lib/libold.so.2"),
    ]


def test_folders_absent_from_the_image_leave_the_loader_alone(
    tmp_path: Path, fresh_rootfs: Any
) -> None:
    """NVIDIA_DRIVER_CAPABILITIES dropped every library: nothing to link, nothing to cache."""
    rootfs = fresh_rootfs("debian")
    cache = (rootfs / "etc/ld.so.cache").read_bytes()
    done = hook(
        ["createContainer", "--link", LINK, "--folder", FOLDER], state(bundle_for(tmp_path, rootfs))
    )
    assert done.returncode == 0, done.stderr
    assert not (rootfs / "etc/ld.so.conf.d/00-gpuctk.conf").exists()
    assert (rootfs / "etc/ld.so.cache").read_bytes() == cache
    assert not (rootfs / FOLDER.lstrip("/")).exists()


def test_a_bind_mounted_host_folder_is_never_written(
    tmp_path: Path, fresh_rootfs: Any, libfoo: Path
) -> None:
    """The driver folder is a read-WRITE bind mount of a host folder (a CDI spec mounting a
    whole folder, or a volume): neither the hook's links nor ldconfig's SONAME links may land
    in it (ldconfig runs with every mount below the root but the root itself read-only)."""
    rootfs = fresh_rootfs("debian")
    host = tmp_path / "host-driver-folder"
    host.mkdir()
    shutil.copy(libfoo, host / "libfoo.so.1.2.3")
    before = snapshot(host)
    folder = rootfs / FOLDER.lstrip("/")
    folder.mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(host), str(folder)], check=True)
    try:
        args = ["createContainer", "--link", LINK, "--folder", FOLDER]
        done = hook(args, state(bundle_for(tmp_path, rootfs)))
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
    assert done.returncode == 0, done.stderr
    assert "another mount" in done.stderr
    assert snapshot(host) == before, "a host folder bind-mounted into the root was written"
    assert FOLDER in (rootfs / "etc/ld.so.conf.d/00-gpuctk.conf").read_text()


def test_a_truly_read_only_root_is_a_clear_error(
    tmp_path: Path, image_rootfs: Any, libfoo: Path
) -> None:
    """An overlay with no upper layer is read-only at the file-system level: no remount can
    make it writable, and the hook says so in one line (and leaves it read-only)."""
    lower = image_rootfs("debian")
    merged, empty = tmp_path / "ro", tmp_path / "empty"
    merged.mkdir()
    empty.mkdir()
    subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={empty}:{lower}", str(merged)],
        check=True,
    )
    try:
        args = ["createContainer", "--link", LINK, "--folder", "/lib"]
        done = hook(args, state(bundle_for(tmp_path, merged, readonly=True)))
        assert done.returncode == 1
        assert done.stderr.strip().splitlines() == [
            f"gpuctk-hook: error: container root {merged} is on a read-only file system"
        ]
        assert os.statvfs(merged).f_flag & os.ST_RDONLY
    finally:
        subprocess.run(["umount", "-l", str(merged)], check=False)


@pytest.mark.parametrize(
    ("loader", "lib_is_link", "expected"),
    [
        ("ld-musl-x86_64.so.1", False, True),
        ("ld-musl-i386.so.1", False, True),
        ("ld-musl-x86_64.so.1", True, True),  # merged /usr: /lib -> usr/lib
        ("ld-musl-s390x.so.1", False, False),  # a loader this machine cannot run
        ("ld-linux-x86-64.so.2", False, False),
    ],
)
def test_has_runnable_musl_looks_for_this_machines_loaders(
    tmp_path: Path, loader: str, lib_is_link: bool, expected: bool
) -> None:
    from gpuctk import rootfs
    from gpuctk.hook.verbs import inroot

    if os.uname().machine != "x86_64":
        pytest.skip("the cases name x86_64 loaders")
    root = tmp_path / "root"
    lib = root / ("usr/lib" if lib_is_link else "lib")
    lib.mkdir(parents=True)
    if lib_is_link:
        (root / "lib").symlink_to("usr/lib")
    (lib / loader).write_bytes(b"")
    fd = rootfs.open_root(str(root))
    try:
        assert inroot.has_runnable_musl(fd) is expected
        assert bool(inroot.musl_arches(fd)) is loader.startswith("ld-musl-")
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("env", "made"),
    [
        ([], {"compute"}),  # unset: utility,compute
        (["NVIDIA_DRIVER_CAPABILITIES=all"], {"compute", "graphics", "display"}),
        (["NVIDIA_DRIVER_CAPABILITIES=all", "NVIDIA_DRIVER_CAPABILITIES=graphics"], {"graphics"}),
        (["NVIDIA_DRIVER_CAPABILITIES= , "], set()),
        (["NVIDIA_DRIVER_CAPABILITIES="], {"compute"}),
    ],
)
def test_link_for_follows_the_containers_capabilities(
    tmp_path: Path, fresh_rootfs: Any, env: list[str], made: set[str]
) -> None:
    """`--link-for CAP:TARGET::LINK` (a folder spec's config files) is made only when the
    container's NVIDIA_DRIVER_CAPABILITIES asks for CAP, read as the shim reads it."""
    rootfs = fresh_rootfs("debian")
    files = "/usr/local/nvidia/files"
    paths = {"compute": "/etc/OpenCL/vendors/nvidia.icd",
             "graphics": "/usr/share/vulkan/icd.d/nvidia_icd.json",
             "display": "/usr/lib/xorg/modules/drivers/nvidia_drv.so"}  # fmt: skip
    args = ["createContainer"]
    for cap, path in paths.items():
        staged = rootfs / (files + path).lstrip("/")
        staged.parent.mkdir(parents=True, exist_ok=True)
        staged.write_text(cap)
        args += ["--link-for", f"{cap}:{files}{path}::{path}"]
    args += ["--link-for", f"future:{files}/x::/x", "--disable-hook", "update-ldcache"]
    bundle = bundle_for(tmp_path, rootfs)
    config = json.loads((bundle / "config.json").read_text())
    config["process"] = {"env": ["PATH=/bin", *env]}
    (bundle / "config.json").write_text(json.dumps(config))
    done = hook(args, state(bundle))
    assert done.returncode == 0, done.stderr
    got = {cap for cap, path in paths.items() if (rootfs / path.lstrip("/")).is_symlink()}
    assert got == made
    for cap in got:
        assert os.readlink(rootfs / paths[cap].lstrip("/")) == files + paths[cap]
    assert "unknown capability 'future'" in done.stderr
