"""gpuctk-cdi-hook (hook/cdihook.c), the compiled front of gpuctk-hook, run as a runtime runs a
createContainer hook: the OCI state on stdin, a bundle whose config.json names the root.

Each test puts the binary in a folder of its own next to a fake `gpuctk-hook` (a shell script
that records its argv, a few environment variables, its open descriptors and its stdin) and
checks which of the front's outcomes it took: served (exit 0, the fake never runs: the image's
ld cache merged with the stage's, the links made), or the handover, with argv and the OCI state
passed on byte for byte. A served image's cache is compared with what gpuctk-hook writes
(gpuctk.hook.verbs.ldmerge: the same entries in the same order). The image is hostile
(links out of the root, FIFOs, loops, huge or sparse files, huge folders) and so is the JSON;
no case may hang, crash, or read outside the root. The device node guard is tried only as root
and only inside a private mount namespace of its own (`unshare -m --propagation private`).

Each case runs twice: on the build setup.py installs and on one with
-fsanitize=address,undefined -fno-sanitize-recover=all (tests/fixtures/cfront, both from the
checkout's sources by gpuctk.hook.cbuild); a sanitizer report fails the case. CDIHOOK_BIN names
another build to test in place of the first;
CDIHOOK_FUZZ_RUNS sets how many mutated config.json files the fuzz case tries.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fixtures import cfront
from fixtures.images import go_json
from fixtures.nosyscall import without

from gpuctk.cdi.node.ldcache import LdCacheEntry, build_ld_cache, parse_ld_cache

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 20  # seconds: only to catch a hang, never a timed assertion

DRIVER = "535.309.01"
STAGE = "/usr/local/nvidia/lib64"
# the stage's own cache (gpuctk.cdi.stage.CACHE), a host file: written once per session
PART = REPO / "build" / "cdihook-test" / "ld.so.cache"
ARGS = ["createContainer", "--folder", STAGE, "--ld-cache", str(PART)]
X86_64 = 0x0303  # libc6,x86-64
STAGE_ENTRIES = [
    LdCacheEntry("libcuda.so.1", f"{STAGE}/libcuda.so.1", X86_64),
    LdCacheEntry("libnvidia-ml.so.1", f"{STAGE}/libnvidia-ml.so.1", X86_64),
    LdCacheEntry("libcuda.so", f"{STAGE}/libcuda.so", X86_64),
]
IMAGE_ENTRIES = [
    LdCacheEntry("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6", X86_64),
    LdCacheEntry("libm.so.6", "/lib/x86_64-linux-gnu/libm.so.6", X86_64),
]
LOADER = "/lib64/ld-linux-x86-64.so.2"
LOADER_FILE = "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
PARAMS = "proc/driver/nvidia/params"
PARAMS_ON = b"ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\n"
PARAMS_OFF = b"ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 0\n"
ODD_ENV = "a b\tc\u00fc=d"

FAKE_HOOK = r"""#!/bin/sh
d=${0%/*}
ls -l "/proc/$$/fd" >"$d/fds"
printf '%s\0' "$0" "$@" >"$d/argv"
printf '%s' "${GPUCTK_DRIVER_VERSION-<unset>}|${CDIHOOK_TEST_ENV-<unset>}" >"$d/env"
cat >"$d/stdin"
exit 0
"""


# ---- the binary ---------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def stage_part() -> Path:
    """PART: the stage's cache, as gpuctk.cdi.stage writes it (root's, mode 0644)."""
    PART.parent.mkdir(parents=True, exist_ok=True)
    tmp = PART.with_name(f".part-{os.getpid()}")
    tmp.write_bytes(build_ld_cache(STAGE_ENTRIES))
    tmp.chmod(0o644)
    tmp.replace(PART)
    return PART


@pytest.fixture(scope="session", params=["plain", "sanitized"])
def front_binary(request: pytest.FixtureRequest) -> Path:
    """Every case runs on the product's build and on the sanitized one (tests/fixtures/cfront):
    a hostile config, state, argument list or image that makes the C read out of bounds,
    overflow or use freed memory fails the case even where the plain build survives it."""
    built = cfront.binary(request.param)
    if built is None:
        pytest.skip(f"no {request.param} build of gpuctk-cdi-hook here (no gcc, or no libasan)")
    return built


@dataclass
class Front:
    exe: Path
    folder: Path


@pytest.fixture
def front(front_binary: Path, tmp_path: Path) -> Front:
    folder = tmp_path / "bin"
    folder.mkdir()
    exe = folder / "gpuctk-cdi-hook"
    shutil.copyfile(front_binary, exe)
    exe.chmod(0o755)
    hook = folder / "gpuctk-hook"
    hook.write_text(FAKE_HOOK)
    hook.chmod(0o755)
    return Front(exe, folder)


# ---- images and bundles -------------------------------------------------------------------


def put(root: Path, path: str, data: bytes = b"") -> Path:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return target


def link(root: Path, path: str, to: str) -> Path:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(to)
    return target


def served_root(root: Path) -> Path:
    """An image the front serves alone: an x86-64 glibc loader, an ld.so.conf, an ld cache of
    its own (IMAGE_ENTRIES), the stage."""
    put(root, LOADER_FILE, b"\x7fELF\x02\x01\x01")
    link(root, LOADER, LOADER_FILE)
    put(root, "/etc/ld.so.conf", b"include /etc/ld.so.conf.d/*.conf\n")
    put(root, "/etc/ld.so.cache", build_ld_cache(IMAGE_ENTRIES))
    for name in ("libcuda.so.1", f"libcuda.so.{DRIVER}", "libnvidia-ml.so.1", "README"):
        put(root, f"{STAGE}/{name}", b"\x7fELF")
    return root


def cache(*strings: str) -> bytes:
    """No ld cache any reader knows: an old magic and strings."""
    return b"ld.so-1.7.0\0" + b"".join(s.encode() + b"\0" for s in strings)


def expected(image: list[LdCacheEntry], stage: list[LdCacheEntry] = STAGE_ENTRIES) -> list[Any]:
    """The entries gpuctk-hook's merge gives (gpuctk.hook.verbs.ldmerge.write_cache), in order."""
    new = {(e.key, e.flags) for e in stage}
    kept = [e for e in image if (e.key, e.flags) not in new]
    return list(parse_ld_cache(build_ld_cache([*kept, *stage])))


def merged(root: Path, image: list[LdCacheEntry] = IMAGE_ENTRIES) -> None:
    """The root's cache is the merge of `image` and the stage's, and 00-gpuctk.conf names
    the stage's folder."""
    got = list(parse_ld_cache((root / "etc/ld.so.cache").read_bytes()))
    assert got == expected(image), got
    conf = (root / "etc/ld.so.conf.d/00-gpuctk.conf").read_text()
    assert conf.startswith("# written by gpuctk-cdi-hook") and f"\n{STAGE}\n" in conf, conf
    mode = (root / "etc/ld.so.cache").stat().st_mode & 0o7777
    assert mode == 0o644 and not list((root / "etc").glob(".ld.so.cache*"))


@dataclass
class Bundle:
    path: Path
    root: Path

    def config(self, text: str | bytes) -> None:
        data = text.encode() if isinstance(text, str) else text
        (self.path / "config.json").write_bytes(data)


def make_bundle(tmp_path: Path, root_path: str | None = None) -> Bundle:
    bundle = tmp_path / "bundle"
    root = served_root(bundle / "rootfs")
    doc = {
        "ociVersion": "1.0.2",
        "process": {"args": ["sh"], "env": ["PATH=/bin"]},
        "root": {"path": root_path or str(root), "readonly": False},
        "annotations": {"k": "v"},
    }
    b = Bundle(bundle, root)
    b.config(json.dumps(doc, indent=1))
    return b


@pytest.fixture
def bundle(tmp_path: Path) -> Bundle:
    return make_bundle(tmp_path)


def state_for(bundle: Path | str) -> bytes:
    doc = {"ociVersion": "1.0.2", "id": "x", "status": "creating", "pid": 1, "bundle": str(bundle)}
    return json.dumps(doc).encode()


# ---- running it ---------------------------------------------------------------------------


@dataclass
class Outcome:
    rc: int
    stderr: str
    ran: bool
    argv: list[bytes]
    env: str
    stdin: bytes
    fds: dict[int, str]


def run(
    front: Front,
    bundle: Bundle | None,
    args: list[str] | None = None,
    env: dict[str, str | None] | None = None,
    state: bytes | None = None,
    prefix: tuple[str, ...] = (),
) -> Outcome:
    base = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "GPUCTK_DRIVER_VERSION": DRIVER,
        "GPUCTK_HOOK_FRONT_TRACE": "1",
        "CDIHOOK_TEST_ENV": ODD_ENV,
        "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "detect_leaks=0"),
        "UBSAN_OPTIONS": os.environ.get("UBSAN_OPTIONS", "print_stacktrace=1"),
    }
    for key, value in (env or {}).items():
        if value is None:
            base.pop(key, None)
        else:
            base[key] = value
    if state is None:
        assert bundle is not None
        state = state_for(bundle.path)
    done = subprocess.run(
        [*prefix, str(front.exe), *(ARGS if args is None else args)],
        input=state,
        capture_output=True,
        env=base,
        timeout=TIMEOUT,
        check=False,
    )
    err = done.stderr.decode(errors="replace")
    assert done.returncode >= 0, f"killed by signal {-done.returncode}: {err}"
    assert "Sanitizer" not in err and "runtime error" not in err, err
    ran = (front.folder / "stdin").exists()
    out = Outcome(done.returncode, err, ran, [], "", b"", {})
    if ran:
        out.argv = (front.folder / "argv").read_bytes().split(b"\0")[:-1]
        out.env = (front.folder / "env").read_text()
        out.stdin = (front.folder / "stdin").read_bytes()
        for line in (front.folder / "fds").read_text().splitlines():
            if " -> " in line:
                name, _, target = line.partition(" -> ")
                out.fds[int(name.split()[-1])] = target
        for name in ("argv", "env", "stdin", "fds"):
            (front.folder / name).unlink()
    return out


def served(out: Outcome) -> None:
    assert out.rc == 0 and not out.ran, out.stderr
    assert "gpuctk-cdi-hook: gpuctk-hook:" not in out.stderr


def handed(
    out: Outcome, front: Front, why: str, state: bytes, args: list[str] | None = None
) -> None:
    """gpuctk-hook ran, for `why`, with the same arguments, environment and state."""
    assert out.ran, f"not handed over: rc {out.rc}: {out.stderr}"
    assert out.rc == 0, out.stderr
    assert f"gpuctk-cdi-hook: gpuctk-hook: {why}" in out.stderr, out.stderr
    argv = ARGS if args is None else args
    assert out.argv == [str(front.folder / "gpuctk-hook").encode(), *(a.encode() for a in argv)]
    assert out.stdin == state
    assert out.env.endswith(f"|{ODD_ENV}")
    # the state read: on stdin again from a memfd; else stdin is the runtime's, unread
    assert out.fds[0].startswith(("/memfd:oci-state", "pipe:")), out.fds
    script = str(front.folder / "gpuctk-hook")  # the shell's own, and its saved stdout pipe
    for fd, target in out.fds.items():  # no descriptor of the front's is left open
        assert fd <= 2 or target == script or target.startswith("pipe:"), out.fds


def handover(
    front: Front,
    bundle: Bundle,
    why: str,
    args: list[str] | None = None,
    env: dict[str, str | None] | None = None,
    state: bytes | None = None,
) -> Outcome:
    out = run(front, bundle, args, env, state)
    handed(out, front, why, state if state is not None else state_for(bundle.path), args)
    return out


# ---- the common image ---------------------------------------------------------------------


WHY_LOADER = "not an x86-64 glibc image alone"
WHY_CACHE = "the image's ld cache is gpuctk-hook's to write"


def test_served_image_gets_the_stage_in_its_ld_cache(front: Front, bundle: Bundle) -> None:
    served(run(front, bundle))
    merged(bundle.root)


def test_served_twice_is_the_same(front: Front, bundle: Bundle) -> None:
    """A restarted container's root: the stage's entries replace themselves."""
    served(run(front, bundle))
    first = (bundle.root / "etc/ld.so.cache").read_bytes()
    served(run(front, bundle))
    assert (bundle.root / "etc/ld.so.cache").read_bytes() == first
    merged(bundle.root)


def test_served_with_two_folders_and_disabled_hooks(front: Front, bundle: Bundle) -> None:
    put(bundle.root, "/usr/local/nvidia/lib/libcuda.so.1")
    args = [*ARGS, "--folder", "/usr/local/nvidia/lib", "--disable-hook", "create-symlinks"]
    served(run(front, bundle, args))
    merged(bundle.root)
    conf = (bundle.root / "etc/ld.so.conf.d/00-gpuctk.conf").read_text()
    assert conf.splitlines()[1:] == [STAGE, "/usr/local/nvidia/lib"]


def test_relative_root_path_is_the_bundles(front: Front, tmp_path: Path) -> None:
    b = make_bundle(tmp_path, "rootfs")
    served(run(front, b))
    merged(b.root)


def test_relative_root_path_really_read(front: Front, tmp_path: Path) -> None:
    b = make_bundle(tmp_path, "rootfs")
    (b.root / LOADER.lstrip("/")).unlink()
    handover(front, b, WHY_LOADER)


def test_state_is_passed_byte_exact(front: Front, bundle: Bundle) -> None:
    state = b'\n {"ociVersion":"1.0.2", "id":"x","status":"creating","pid":1,'
    state += b'"annotations":{"\\u00e9":"\xc3\xa9 \\"q\\" \\\\"},'
    state += b'"bundle":"' + str(bundle.path).encode() + b'"}  \n\t'
    args = [*ARGS, "--link", "a b\x01\u00fc::/x"]
    handover(front, bundle, "a --link only gpuctk-hook reads", args, state=state)


def test_a_stale_driver_entry_of_the_image_is_replaced(front: Front, bundle: Bundle) -> None:
    """An image that carries a driver copy in its own cache (a stub libcuda.so.1): the
    stage's entry replaces it, as in gpuctk-hook; the image's other flags stay."""
    image = [
        *IMAGE_ENTRIES,
        LdCacheEntry("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", X86_64),
        LdCacheEntry("libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1", 0x0003),
    ]
    put(bundle.root, "/etc/ld.so.cache", build_ld_cache(image))
    served(run(front, bundle))
    merged(bundle.root, image)
    got = [e.value for e in parse_ld_cache((bundle.root / "etc/ld.so.cache").read_bytes())
           if e.key == "libcuda.so.1"]  # fmt: skip
    assert got == [f"{STAGE}/libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1"]


def test_an_old_glibc_loader_is_served(front: Front, bundle: Bundle) -> None:
    """glibc before 2.33 (no glibc-hwcaps): the cache is what its loader reads."""
    put(bundle.root, LOADER_FILE, b"\x7fELF old glibc\0")
    served(run(front, bundle))
    merged(bundle.root)


# ---- each reason to hand over ---------------------------------------------------------------


def test_loader_missing(front: Front, bundle: Bundle) -> None:
    (bundle.root / LOADER.lstrip("/")).unlink()
    handover(front, bundle, WHY_LOADER)


@pytest.mark.parametrize(
    "other", ["/lib/ld-linux.so.2", "/lib/ld-musl-x86_64.so.1", "/lib/ld-musl-i386.so.1"]
)
def test_another_loader(front: Front, bundle: Bundle, other: str) -> None:
    put(bundle.root, other, b"\x7fELF\x01")
    handover(front, bundle, WHY_LOADER)


@pytest.mark.parametrize(
    "setup",
    [
        lambda r: (r / "etc/ld.so.cache").unlink(),
        lambda r: (r / "etc/ld.so.conf").unlink(),
        lambda r: put(r, "/etc/ld.so.cache", cache("libfoo.so.1", "/usr/lib/libfoo.so.1")),
        lambda r: put(r, "/etc/ld.so.cache", b""),
        lambda r: put(r, "/etc/ld.so.conf.d/00-compat-gpuctk.conf", b"/usr/local/cuda/compat\n"),
        lambda r: put(r, "/etc/ld.so.cache", build_ld_cache(IMAGE_ENTRIES)[:60]),
    ],
    ids=["no-cache", "no-ld.so.conf", "not-a-cache", "empty", "compat-conf", "truncated"],
)
def test_cache_gpuctk_hook_writes(front: Front, bundle: Bundle, setup: Any) -> None:
    setup(bundle.root)
    cache_file = bundle.root / "etc/ld.so.cache"
    before = cache_file.read_bytes() if cache_file.exists() else None
    handover(front, bundle, WHY_CACHE)
    assert not (bundle.root / "etc/ld.so.conf.d/00-gpuctk.conf").exists()
    assert (cache_file.read_bytes() if cache_file.exists() else None) == before


@pytest.mark.parametrize(
    ("part", "why"),
    [
        (lambda p: p.unlink(), "absent"),
        (lambda p: p.chmod(0o666), "writable by others"),
        (lambda p: os.chown(p, 1000, 1000), "another user's"),
        (lambda p: p.write_bytes(b"not a cache"), "not a cache"),
        (lambda p: (p.unlink(), p.symlink_to(PART)), "a link"),
        (lambda p: (p.unlink(), os.mkfifo(p)), "a fifo"),
    ],
)
def test_stage_cache_not_usable(
    front: Front, bundle: Bundle, tmp_path: Path, part: Any, why: str
) -> None:
    mine = tmp_path / "stage" / "ld.so.cache"
    mine.parent.mkdir()
    mine.write_bytes(PART.read_bytes())
    mine.chmod(0o644)
    part(mine)
    args = ["createContainer", "--folder", STAGE, "--ld-cache", str(mine)]
    handover(front, bundle, WHY_CACHE, args)
    assert (bundle.root / "etc/ld.so.cache").read_bytes() == build_ld_cache(IMAGE_ENTRIES)


def can_unshare_user() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = ["unshare", "--user", "--map-root-user", "true"]
    return subprocess.run(probe, capture_output=True, check=False, timeout=TIMEOUT).returncode == 0


in_userns = pytest.mark.skipif(not can_unshare_user(), reason="needs root and user namespaces")
NO_MAP = ("unshare", "--user")  # maps no uid, as hostUsers: false maps no host root
ROOT_MAP = ("unshare", "--user", "--map-root-user")  # host root stays uid 0


@in_userns
def test_in_a_user_namespace_roots_stage_cache_is_merged(front: Front, bundle: Bundle) -> None:
    """Run inside a user namespace that maps no host root (Kubernetes' hostUsers: false,
    podman --userns), the entry sees the stage's cache, root's, under the overflow uid: it
    is merged all the same."""
    assert (os.stat(PART).st_uid, os.stat(PART).st_mode & 0o022) == (0, 0)
    served(run(front, bundle, prefix=NO_MAP))
    merged(bundle.root)


@in_userns
def test_in_a_user_namespace_that_maps_root_another_users_cache_is_refused(
    front: Front, bundle: Bundle, tmp_path: Path
) -> None:
    mine = tmp_path / "stage" / "ld.so.cache"
    mine.parent.mkdir()
    mine.write_bytes(PART.read_bytes())
    mine.chmod(0o644)
    os.chown(mine, 1000, 1000)
    args = ["createContainer", "--folder", STAGE, "--ld-cache", str(mine)]
    out = run(front, bundle, args, prefix=ROOT_MAP)
    handed(out, front, WHY_CACHE, state_for(bundle.path), args)
    served(run(front, bundle, prefix=ROOT_MAP))  # root's, as uid 0 there
    merged(bundle.root)


def test_compat_newer(front: Front, bundle: Bundle) -> None:
    put(bundle.root, "/usr/local/cuda/compat/libcuda.so.545.23.08", b"\x7fELF")
    handover(front, bundle, "a newer CUDA compat libcuda")


def test_compat_newer_behind_a_cuda_link(front: Front, bundle: Bundle) -> None:
    put(bundle.root, "/usr/local/cuda-12.3/compat/libcuda.so.545.23.08", b"\x7fELF")
    link(bundle.root, "/usr/local/cuda", "/usr/local/cuda-12.3")
    handover(front, bundle, "a newer CUDA compat libcuda")


@pytest.mark.parametrize("name", ["libcuda.so.530.30.02", f"libcuda.so.{DRIVER}", "libcuda.so.1"])
def test_compat_not_newer(front: Front, bundle: Bundle, name: str) -> None:
    put(bundle.root, f"/usr/local/cuda/compat/{name}", b"\x7fELF")
    put(bundle.root, "/usr/local/cuda/compat/libnvidia-ptxjitcompiler.so.999.1", b"\x7fELF")
    served(run(front, bundle))
    merged(bundle.root)


def test_compat_link_is_ignored(front: Front, bundle: Bundle) -> None:
    put(bundle.root, "/usr/local/cuda/compat/libcuda.so.530.30.02", b"\x7fELF")
    link(bundle.root, "/usr/local/cuda/compat/libcuda.so.999.1", "libcuda.so.530.30.02")
    (bundle.root / "usr/local/cuda/compat/libcuda.so.998.1").mkdir()
    served(run(front, bundle))


def test_compat_disabled(front: Front, bundle: Bundle) -> None:
    put(bundle.root, "/usr/local/cuda/compat/libcuda.so.545.23.08", b"\x7fELF")
    served(run(front, bundle, [*ARGS, "--disable-hook", "enable-cuda-compat"]))


@pytest.mark.parametrize("version", [None, "", "535", "535.x", "535.309.01.1.2", "-1.2"])
def test_no_driver_version(front: Front, bundle: Bundle, version: str | None) -> None:
    handover(front, bundle, "no GPUCTK_DRIVER_VERSION", env={"GPUCTK_DRIVER_VERSION": version})


def test_driver_version_unused_with_compat_disabled(front: Front, bundle: Bundle) -> None:
    args = [*ARGS, "--disable-hook", "enable-cuda-compat"]
    served(run(front, bundle, args, env={"GPUCTK_DRIVER_VERSION": None}))


def test_ldcache_disabled_skips_the_image(front: Front, bundle: Bundle) -> None:
    (bundle.root / LOADER.lstrip("/")).unlink()
    before = (bundle.root / "etc/ld.so.cache").read_bytes()
    served(run(front, bundle, ["createContainer", "--disable-hook", "update-ldcache"]))
    assert (bundle.root / "etc/ld.so.cache").read_bytes() == before


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ([*ARGS, "--link", "a::b"], "a --link only gpuctk-hook reads"),
        ([*ARGS, "--link", "/a:/b"], "a --link only gpuctk-hook reads"),
        ([*ARGS, "--link"], "arguments gpuctk-hook refuses"),
        ([*ARGS, "--link-for", "bogus:/a::/b"], "a --link-for only gpuctk-hook reads"),
        (["disable-device-node-modification", "--link", "/a::/b"], "an argument only"),
        ([*ARGS, "--folder"], "arguments gpuctk-hook refuses"),
        ([*ARGS, "--help"], "an argument only gpuctk-hook reads"),
        ([*ARGS, "--mode", "755"], "an argument only gpuctk-hook reads"),
        ([*ARGS, "--folder=x"], "a --folder only gpuctk-hook reads"),
        (["createContainer", "--folder", "usr/lib"], "a --folder only gpuctk-hook reads"),
        (["createContainer", *["--folder", STAGE] * 17], "a --folder only gpuctk-hook reads"),
        (["disable-device-node-modification", "--folder", STAGE], "an argument only"),
        ([*ARGS, "--disable-hook", "bogus"], "a --disable-hook name only gpuctk-hook knows"),
        ([*ARGS, "--ld-cache", str(PART)], "an --ld-cache only gpuctk-hook reads"),
        (["createContainer", "--ld-cache", "build/x"], "an --ld-cache only gpuctk-hook reads"),
        (["createContainer", "--ld-cache", "/a/../b"], "an --ld-cache only gpuctk-hook reads"),
        (["disable-device-node-modification", "--ld-cache", str(PART)], "an argument only"),
        (["createContainer"], "no --folder or no --ld-cache"),
        (["createContainer", "--folder", STAGE], "no --folder or no --ld-cache"),
        (["createContainer", "--ld-cache", str(PART)], "no --folder or no --ld-cache"),
        (["prestart"], "another verb"),
        (["update-ldcache", "--folder", STAGE], "another verb"),
        (["--version"], "another verb"),
        ([], "no verb"),
    ],
)
def test_arguments(front: Front, bundle: Bundle, args: list[str], why: str) -> None:
    handover(front, bundle, why, args)


def read_args(front: Front, *args: str) -> tuple[int, list[list[str]], str]:
    """`gpuctk-cdi-hook read-args ARGS...`: its exit status, records and stderr."""
    done = subprocess.run([str(front.exe), "read-args", *args], capture_output=True, check=False)
    fields = done.stdout.decode().split("\0")
    return (
        done.returncode,
        [fields[i : i + 8] for i in range(0, len(fields) - 1, 8)],
        done.stderr.decode(),
    )


def test_read_args_is_the_one_reading(front: Front) -> None:
    rc, records, _ = read_args(
        front, "createContainer", "--link=/t::/l", "--debug", "--link-for", "compute:/a::/b::c",
        "--new", "v", "--other=-x", "-z", "--folder", "--debug", "--link-for", "graphics::/x",
    )  # fmt: skip
    assert rc == 0
    assert records == [
        ["l", "0", "1", "link", "/t::/l", "", "/t", "/l"],
        ["l", "2", "4", "link-for", "compute:/a::/b::c", "compute", "/a", "/b::c"],
        ["i", "4", "6", "", "", "", "", ""],  # an unknown option takes its value with it
        ["i", "6", "7", "", "", "", "", ""],
        ["i", "7", "8", "", "", "", "", ""],
        ["o", "8", "10", "folder", "--debug", "", "", ""],  # a value, not the flag
        ["o", "10", "12", "link-for", "graphics::/x", "", "", ""],  # no capability: no split
    ]
    rc, _, err = read_args(front, "createContainer", "--folder", "/x", "--ld-cache")
    assert (rc, err) == (2, "createContainer: --ld-cache needs a value\n")
    assert read_args(front, "chmod", "--link", "/a::/b")[1][0][0] == "i"  # not chmod's option
    for verb in ("createContainer link", "create", ""):
        assert read_args(front, verb, "--link", "/a::/b")[0] == 2


def test_front_off(front: Front, bundle: Bundle) -> None:
    handover(front, bundle, "GPUCTK_HOOK_FRONT=off", env={"GPUCTK_HOOK_FRONT": "off"})
    served(run(front, bundle, env={"GPUCTK_HOOK_FRONT": "on"}))


# ---- a hostile image ----------------------------------------------------------------------


def test_cache_fifo(front: Front, bundle: Bundle) -> None:
    (bundle.root / "etc/ld.so.cache").unlink()
    os.mkfifo(bundle.root / "etc/ld.so.cache")
    handover(front, bundle, WHY_CACHE)


def test_loader_fifo(front: Front, bundle: Bundle) -> None:
    loader = bundle.root / LOADER_FILE.lstrip("/")
    loader.unlink()
    os.mkfifo(loader)
    handover(front, bundle, WHY_LOADER)


def test_cache_directory(front: Front, bundle: Bundle) -> None:
    (bundle.root / "etc/ld.so.cache").unlink()
    (bundle.root / "etc/ld.so.cache").mkdir()
    handover(front, bundle, WHY_CACHE)


def test_cache_link_to_a_host_path_stays_in_the_root(
    front: Front, bundle: Bundle, tmp_path: Path
) -> None:
    host = put(tmp_path, "/host/etc/cache", build_ld_cache(IMAGE_ENTRIES[:1]))
    (bundle.root / "etc/ld.so.cache").unlink()
    link(bundle.root, "/etc/ld.so.cache", str(host))
    handover(front, bundle, WHY_CACHE)  # the root has no such file: no cache
    put(bundle.root, str(host), build_ld_cache(IMAGE_ENTRIES))
    served(run(front, bundle))
    merged(bundle.root)  # the link replaced by the merged file; the host's untouched
    assert host.read_bytes() == build_ld_cache(IMAGE_ENTRIES[:1])


def test_cache_link_out_with_dotdot(front: Front, bundle: Bundle, tmp_path: Path) -> None:
    host = put(tmp_path, "/host/cache", build_ld_cache(IMAGE_ENTRIES))
    (bundle.root / "etc/ld.so.cache").unlink()
    link(bundle.root, "/etc/ld.so.cache", "../" * 40 + str(host).lstrip("/"))
    handover(front, bundle, WHY_CACHE)


def test_cache_link_loop(front: Front, bundle: Bundle) -> None:
    (bundle.root / "etc/ld.so.cache").unlink()
    link(bundle.root, "/etc/ld.so.cache", "/etc/a")
    link(bundle.root, "/etc/a", "/etc/ld.so.cache")
    handover(front, bundle, WHY_CACHE)


def test_cache_magic_link(front: Front, bundle: Bundle) -> None:
    (bundle.root / "etc/ld.so.cache").unlink()
    link(bundle.root, "/etc/ld.so.cache", "/proc/self/fd/0")
    os.symlink("/proc", bundle.root / "proc")  # in the root, /proc is the host's
    handover(front, bundle, WHY_CACHE)  # never the state as a cache; never a hang


def test_loader_link_out_with_dotdot(front: Front, bundle: Bundle, tmp_path: Path) -> None:
    host = put(tmp_path, "/host/ld.so", b"\x7fELF")
    loader = bundle.root / LOADER.lstrip("/")
    loader.unlink()
    loader.symlink_to("../" * 40 + str(host).lstrip("/"))
    handover(front, bundle, WHY_LOADER)


def test_loader_absolute_host_link(front: Front, bundle: Bundle, tmp_path: Path) -> None:
    host = put(tmp_path, "/host/ld.so", b"\x7fELF")
    loader = bundle.root / LOADER.lstrip("/")
    loader.unlink()
    loader.symlink_to(host)
    handover(front, bundle, WHY_LOADER)


def test_huge_sparse_cache_is_not_read(front: Front, bundle: Bundle) -> None:
    path = put(bundle.root, "/etc/ld.so.cache", build_ld_cache(IMAGE_ENTRIES))
    os.truncate(path, (4 << 20) + 1)
    handover(front, bundle, WHY_CACHE)


def test_cache_at_the_limit_is_read(front: Front, bundle: Bundle) -> None:
    path = put(bundle.root, "/etc/ld.so.cache", build_ld_cache(IMAGE_ENTRIES))
    os.truncate(path, 4 << 20)
    served(run(front, bundle))
    merged(bundle.root)


def test_the_loader_is_never_read(front: Front, bundle: Bundle) -> None:
    path = bundle.root / LOADER_FILE.lstrip("/")
    os.truncate(path, 1 << 40)  # sparse: reading it would take minutes
    path.chmod(0)
    served(run(front, bundle))


def test_compat_folder_too_big(front: Front, bundle: Bundle) -> None:
    compat = bundle.root / "usr/local/cuda/compat"
    compat.mkdir(parents=True)
    for i in range(5000):
        (compat / f"f{i}").touch()
    handover(front, bundle, "/usr/local/cuda/compat could not be read")


def test_compat_not_a_folder(front: Front, bundle: Bundle) -> None:
    # no compat folder, as gpuctk.hook.verbs.cudacompat.find reads it (O_DIRECTORY fails)
    put(bundle.root, "/usr/local/cuda/compat", b"not a folder")
    served(run(front, bundle))
    (bundle.root / "usr/local/cuda/compat").unlink()
    os.mkfifo(bundle.root / "usr/local/cuda/compat")
    served(run(front, bundle))
    (bundle.root / "usr/local/cuda/compat").unlink()
    link(bundle.root, "/usr/local/cuda/compat", "compat")
    served(run(front, bundle))  # a loop


def test_compat_newer_fifo_is_not_a_library(front: Front, bundle: Bundle) -> None:
    (bundle.root / "usr/local/cuda/compat").mkdir(parents=True)
    os.mkfifo(bundle.root / "usr/local/cuda/compat/libcuda.so.545.23.08")
    served(run(front, bundle))


def test_root_is_not_a_folder(front: Front, bundle: Bundle, tmp_path: Path) -> None:
    put(tmp_path, "/file")
    bundle.config(json.dumps({"root": {"path": str(tmp_path / "file")}}))
    handover(front, bundle, "the container root could not be opened")


# ---- hostile or odd JSON ------------------------------------------------------------------


def config_text(root: Path, before: str = "", after: str = "", path: str | None = None) -> str:
    p = json.dumps(str(root)) if path is None else path
    return '{"ociVersion":"1.0.2",' + before + '"root":{"path":' + p + "}" + after + "}"


@pytest.mark.parametrize(
    "make",
    [
        lambda r: config_text(r, before='"Root":{"path":"/elsewhere"},'),
        lambda r: config_text(r, after=',"ROOT":1'),
        lambda r: config_text(r).replace('"root"', '"\\u0072oot"'),
        lambda r: config_text(r, before='"r\u00f6\u00f6t":1,'),
        lambda r: config_text(r, before='"\\u00e9":1,'),
        lambda r: config_text(r, after=',"root":{"path":"/elsewhere"}'),
        lambda r: config_text(r).replace('{"path"', '{"Path":"/x","path"'),
        lambda r: config_text(r).replace('{"path"', '{"pat\\u0068":"/x","path"'),
        lambda r: config_text(r).replace("}}", ',"path":"/x"}}'),
        lambda r: config_text(r, path=json.dumps(str(r)).replace("/", "\\/")),
        lambda r: config_text(r, path=json.dumps(str(r) + "\u00e9", ensure_ascii=False)),
        lambda r: config_text(r, path='""'),
        lambda r: config_text(r, path="1"),
        lambda r: config_text(r, path="null"),
        lambda r: config_text(r, before='"a":' + "[" * 100 + "]" * 100 + ","),
        lambda r: config_text(r, before='"a":' + '{"b":' * 100 + "1" + "}" * 100 + ","),
        lambda r: config_text(r)[:-1],
        lambda r: config_text(r)[:-3],
        lambda r: config_text(r) + "}",
        lambda r: config_text(r) + " x",
        lambda r: config_text(r) + "\0",
        lambda r: "\ufeff" + config_text(r),
        lambda r: "[" + config_text(r) + "]",
        lambda r: '{"root":' + json.dumps(str(r)) + "}",
        lambda r: '{"root":{}}',
        lambda r: "{}",
        lambda r: "",
        lambda r: '{"ociVersion":"1.0.2"',
        lambda r: config_text(
            r,
            before='"a":"\\',
        ),
        lambda r: config_text(r, before='"a":"x\ny",'),
        lambda r: config_text(r, before='"a":"\\q",'),
        lambda r: config_text(r, before='"a":"\\u12",'),
        lambda r: config_text(r, before='"a":tru,'),
        lambda r: config_text(r, before='"a":nul,'),
        lambda r: config_text(r, before='"a":--1,'),
        lambda r: config_text(r, before='"a":1e,'),
        lambda r: config_text(r, before='"a":01,'),
        lambda r: config_text(r, before='"a":NaN,'),
        lambda r: config_text(r, before='"a":1\0,'),
        lambda r: config_text(r, before='"a":{"b":1,},'),
        lambda r: config_text(r, before='"a":[1,],'),
        lambda r: config_text(r, before='"a" 1,'),
        lambda r: config_text(r, before="a:1,"),
    ],
)
def test_config_not_plain(front: Front, bundle: Bundle, make: Any) -> None:
    bundle.config(make(bundle.root))
    out = run(front, bundle)
    handed(out, front, "config.json", state_for(bundle.path))


@pytest.mark.parametrize(
    "make",
    [
        lambda r: config_text(r, before='"a":' + "[" * 60 + "]" * 60 + ","),
        lambda r: config_text(
            r, before='"rootfs":1,"roo":2,"paths":3,"x":"\\u00e9\\uD83D\\ude00",'
        ),
        lambda r: config_text(r, before='"a":[true,false,null,-0.5e+3,1E9,0,"\\"\\/\\b"],'),
        lambda r: config_text(r, before='"a":{"Root":1,"r\u00f6ot":{"\\u0072oot":1}},'),
        lambda r: " \n\t\r" + config_text(r).replace(":", " : ").replace(",", " ,\n") + " \n",
        lambda r: config_text(r, before='"a":"\u00e9\U0001f600",'),
    ],
)
def test_config_plain(front: Front, bundle: Bundle, make: Any) -> None:
    bundle.config(make(bundle.root))
    served(run(front, bundle))


def test_config_is_a_fifo(front: Front, bundle: Bundle) -> None:
    (bundle.path / "config.json").unlink()
    os.mkfifo(bundle.path / "config.json")
    handover(front, bundle, "config.json could not be read")


def test_config_is_a_link(front: Front, bundle: Bundle) -> None:
    (bundle.path / "config.json").rename(bundle.path / "real.json")
    (bundle.path / "config.json").symlink_to("real.json")
    handover(front, bundle, "config.json could not be read")


@pytest.mark.parametrize(
    "make",
    [
        lambda b: state_for("bundle"),
        lambda b: state_for(f"{b}/../bundle"),
        lambda b: state_for(b).replace(b'"bundle"', b'"\\u0062undle"'),
        lambda b: state_for(b).replace(b'"bundle"', b'"Bundle":"/x","bundle"'),
        lambda b: state_for(b).replace(b'"bundle"', b'"bundle":"/x","bundle"'),
        lambda b: state_for(b)[:-1],
        lambda b: state_for(b) + b"\0",
        lambda b: b"",
        lambda b: b"\xff" * 100,
        lambda b: state_for("/" + "a" * 5000),
        lambda b: state_for(b).replace(b"}", b',"a":"' + b"x" * (1 << 20) + b'"}'),
        lambda b: state_for(b).replace(b"}", b',"a":"' + b"x" * (3 << 20) + b'"}'),
    ],
)
def test_state_not_plain(front: Front, bundle: Bundle, make: Any) -> None:
    state = make(bundle.path)
    out = run(front, bundle, state=state)
    assert out.ran, out.stderr
    assert "gpuctk-cdi-hook: gpuctk-hook: " in out.stderr
    assert out.stdin == state  # the whole state, however long, as the runtime wrote it


def test_state_of_a_missing_bundle(front: Front, tmp_path: Path) -> None:
    state = state_for(tmp_path / "nothing")
    out = run(front, None, state=state)
    assert out.ran and out.stdin == state
    assert "config.json could not be read" in out.stderr


def test_fuzz_config(front: Front, bundle: Bundle) -> None:
    """Mutated config.json files: never a crash or hang; where the front serves alone, the file
    is strict JSON (no duplicate keys) whose root.path is the root, with no other spelling of
    "root" or "path" beside it."""
    runs = int(os.environ.get("CDIHOOK_FUZZ_RUNS", "150"))
    rnd = random.Random(0x6C6962)
    seed = config_text(
        bundle.root,
        before='"a":[1,-2.5e3,true,false,null,{"x":"\\u00e9\\n"}],"b":{"c":[]},',
        after=',"z":"\u00e9"',
    ).encode()
    alphabet = b'{}[]":,\\ \t\nu0eE+-.1trfalsn\x00\x7f\xc3\xa9Rr'
    for i in range(runs):
        data = bytearray(seed)
        for _ in range(rnd.randint(1, 4)):
            at = rnd.randrange(len(data))
            op = rnd.randrange(4)
            if op == 0:
                data[at] = rnd.choice(alphabet)
            elif op == 1:
                del data[at : at + rnd.randint(1, 3)]
            elif op == 2:
                data[at:at] = bytes([rnd.choice(alphabet)])
            else:
                data[at:at] = data[rnd.randrange(len(data)) :][: rnd.randint(1, 12)]
        bundle.config(bytes(data))
        out = run(front, bundle)
        if out.ran:
            assert out.stdin == state_for(bundle.path)
            continue
        assert out.rc == 0, (i, bytes(data), out.stderr)
        doc = strict_json(bytes(data))
        assert doc is not None, (i, bytes(data))
        assert [k for k in doc if k.lower() == "root"] == ["root"], (i, bytes(data))
        root = doc["root"]
        assert [k for k in root if k.lower() == "path"] == ["path"], (i, bytes(data))
        assert root["path"] == str(bundle.root), (i, bytes(data))


def strict_json(data: bytes) -> Any:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in items]
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate")
        return dict(items)

    def constant(name: str) -> Any:
        raise ValueError(name)

    try:
        text = data.decode("utf-8", errors="surrogateescape")
        return json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except ValueError:
        return None


# ---- the device node guard ----------------------------------------------------------------

GUARD_SCRIPT = r"""
set -u
root=$1 out=$2 mode=$3 py=$4
shift 4
case $mode in  # an image whose /proc or /dev is a link: the runtime mounts through it
linked-proc) { rmdir "$root/proc" && mkdir "$root/p" && ln -s p "$root/proc"; } || exit 92 ;;
linked-dev) { mkdir "$root/devreal" && ln -s devreal "$root/dev"; } || exit 92 ;;
esac
mkdir -p "$root/dev"
if [ "$mode" != plain ]; then
	mount -t tmpfs -o mode=0755 cdihook-test-proc "$root/proc" || exit 90
fi
case $mode in  # a runtime's /dev; one others may write; the host's; "image-dev": the image's
proc) mount -t tmpfs -o mode=0755 cdihook-test-dev "$root/dev" || exit 91 ;;
shared-dev) mount -t tmpfs -o mode=1777 cdihook-test-dev "$root/dev" || exit 91 ;;
host-dev) mount --bind /dev "$root/dev" || exit 91 ;;
linked-dev) mount -t tmpfs -o mode=0755 cdihook-test-dev "$root/devreal" || exit 91 ;;
esac
mkdir -p "$root/proc/driver/nvidia"
cat "$out/params.in" >"$root/proc/driver/nvidia/params"
ls -a /run "$root/dev" | grep '^\.gpuctk-params-' | sort >"$out/run.before"
"$@" <"$out/state" >"$out/stdout" 2>"$out/stderr"
echo $? >"$out/rc"
ls -a /run "$root/dev" | grep '^\.gpuctk-params-' | sort >"$out/run.after"
cat "$root/proc/driver/nvidia/params" >"$out/params.out"
grep -F "/driver/nvidia/params " /proc/self/mountinfo | grep -F " $root/" >"$out/mounts"
"$py" -c '
import errno, os, sys
try:
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
    os.close(fd)
    print("writable")
except OSError as e:
    print(errno.errorcode[e.errno])
' "$root/proc/driver/nvidia/params" >"$out/write"
exit 0
"""


def can_unshare() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = ["unshare", "-m", "--propagation", "private", "true"]
    return subprocess.run(probe, capture_output=True, check=False, timeout=TIMEOUT).returncode == 0


guarded = pytest.mark.skipif(not can_unshare(), reason="needs root and unshare -m")


@dataclass
class Guarded:
    rc: int
    stderr: str
    params: bytes
    mounts: str
    write: str
    leftover: bool
    ran: bool


def guard_run(
    front: Front,
    bundle: Bundle,
    tmp_path: Path,
    args: list[str],
    params: bytes,
    mode: str,
    old_kernel: bool = False,
    seccomp: bool = False,
) -> Guarded:
    out = tmp_path / "guard"
    out.mkdir()
    (out / "params.in").write_bytes(params)
    (out / "state").write_bytes(state_for(bundle.path))
    (bundle.root / "proc").mkdir(exist_ok=True)
    script = out / "guard.sh"
    script.write_text(GUARD_SCRIPT)
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "GPUCTK_DRIVER_VERSION": DRIVER,
        "GPUCTK_HOOK_FRONT_TRACE": "1",
        "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "detect_leaks=0"),
    }
    cmd = ["unshare", "-m", "--propagation", "private", "sh", str(script)]
    cmd += [str(bundle.root), str(out), mode, shutil.which("python3") or "python3"]
    exe = [str(front.exe), *args]
    calls = ("openat2", "open_tree", "mount_setattr", "move_mount", "statx")
    if old_kernel:  # as before 5.2: none of these (statx: no mount id, which fdinfo gives)
        exe = without(calls, exe)
    elif seccomp:  # an engine's seccomp profile that answers them with EPERM
        exe = without(calls, exe, errno.EPERM)
    done = subprocess.run([*cmd, *exe], env=env, capture_output=True, timeout=TIMEOUT, check=False)
    assert done.returncode == 0, done.stderr
    err = (out / "stderr").read_text()
    assert "Sanitizer" not in err and "runtime error" not in err, err
    rc = int((out / "rc").read_text())
    assert rc >= 0 and rc < 128, err
    return Guarded(
        rc=rc,
        stderr=err,
        params=(out / "params.out").read_bytes(),
        mounts=(out / "mounts").read_text(),
        write=(out / "write").read_text().strip(),
        leftover=(out / "run.before").read_text() != (out / "run.after").read_text(),
        ran=(front.folder / "stdin").exists(),
    )


GUARD_ARGS = [["disable-device-node-modification"], ARGS]


@guarded
@pytest.mark.parametrize("mode", ["proc", "shared-dev"])
@pytest.mark.parametrize("args", GUARD_ARGS)
def test_guard_hides_modify_device_files(
    front: Front, bundle: Bundle, tmp_path: Path, args: list[str], mode: str
) -> None:
    """In the runtime's /dev, and in one others may write (an image's 1777 /dev: runc gives
    its tmpfs the image folder's mode), where the copy is mounted from its descriptor."""
    g = guard_run(front, bundle, tmp_path, args, PARAMS_ON, mode)
    assert g.rc == 0 and not g.ran, g.stderr
    assert g.params == PARAMS_OFF
    assert g.write == "EROFS"
    assert g.mounts.count("\n") == 1 and " ro," in g.mounts, g.mounts
    assert not g.leftover


@guarded
@pytest.mark.parametrize(
    ("text", "copy"),
    [
        (b"ModifyDeviceFiles: 1", b"ModifyDeviceFiles: 0\n"),
        (b"A: 1\r\nModifyDeviceFiles: 1\r\n", b"A: 1\nModifyDeviceFiles: 0\n"),
        (b"A: 1\n\nModifyDeviceFiles: 1\rB", b"A: 1\n\nModifyDeviceFiles: 0\nB\n"),
    ],
)
def test_guard_copy_text(
    front: Front, bundle: Bundle, tmp_path: Path, text: bytes, copy: bytes
) -> None:
    """The copy is the text gpuctk.hook.verbs.nodeprotect.modified makes (lines as bytes.splitlines
    reads them)."""
    g = guard_run(front, bundle, tmp_path, GUARD_ARGS[0], text, "proc")
    assert g.rc == 0 and not g.ran, g.stderr
    assert g.params == copy
    assert g.write == "EROFS"


@guarded
@pytest.mark.parametrize(
    "text", [PARAMS_OFF, b"ModifyDeviceFiles: 1\nModifyDeviceFiles: 0\n", b"", b"A: 1\n"]
)
def test_guard_nothing_to_hide(front: Front, bundle: Bundle, tmp_path: Path, text: bytes) -> None:
    g = guard_run(front, bundle, tmp_path, GUARD_ARGS[0], text, "proc")
    assert g.rc == 0 and not g.ran, g.stderr
    assert g.params == text and g.mounts == "" and g.write == "writable"
    assert not g.leftover


@guarded
@pytest.mark.parametrize("args", GUARD_ARGS)
def test_guard_leaves_an_image_folder_alone(
    front: Front, bundle: Bundle, tmp_path: Path, args: list[str]
) -> None:
    g = guard_run(front, bundle, tmp_path, args, PARAMS_ON, "plain")
    assert g.rc == 0 and not g.ran, g.stderr
    assert g.params == PARAMS_ON and g.mounts == "" and g.write == "writable"
    assert not g.leftover


@guarded
def test_guard_disabled(front: Front, bundle: Bundle, tmp_path: Path) -> None:
    args = [*ARGS, "--disable-hook", "disable-device-node-modification"]
    g = guard_run(front, bundle, tmp_path, args, PARAMS_ON, "proc")
    assert g.rc == 0 and not g.ran, g.stderr
    assert g.params == PARAMS_ON and g.mounts == ""


@guarded
@pytest.mark.parametrize("mode", ["image-dev", "host-dev"])
@pytest.mark.parametrize("kernel", ["new", "old"])
def test_guard_without_a_dev_of_the_containers_own(
    front: Front, bundle: Bundle, tmp_path: Path, mode: str, kernel: str
) -> None:
    """The copy is made in the tmpfs the runtime mounts at the container's /dev (a folder of
    the container's own, which a user namespace can write), never in the image's folder or
    the host's /dev: where there is none, on a tmpfs of its own in /run, detached and removed
    once bound. On an old kernel ("old": openat2 and the new mount API fail with ENOSYS, as
    before 5.2) each path is opened part by part and the copy bound through /proc/self/fd,
    then remounted read-only. The C does it all: nothing is handed over."""
    g = guard_run(front, bundle, tmp_path, GUARD_ARGS[0], PARAMS_ON, mode, kernel == "old")
    assert g.rc == 0 and not g.ran, g.stderr
    assert g.params == PARAMS_OFF and g.write == "EROFS"
    assert g.mounts.count("\n") == 1 and " ro," in g.mounts, g.mounts
    assert not g.leftover
    assert not [p for p in os.listdir(bundle.root / "dev") if p.startswith(".gpuctk-params-")]


@guarded
def test_guard_on_an_old_kernel_in_the_containers_dev(
    front: Front, bundle: Bundle, tmp_path: Path
) -> None:
    """The copy still lies in the container's own /dev (the mount ids from fdinfo), as a
    user namespace needs it there."""
    g = guard_run(front, bundle, tmp_path, GUARD_ARGS[0], PARAMS_ON, "proc", old_kernel=True)
    assert g.rc == 0 and not g.ran, g.stderr
    assert g.params == PARAMS_OFF and g.write == "EROFS" and " ro," in g.mounts
    assert " cdihook-test-dev " in g.mounts, g.mounts
    assert not g.leftover


@guarded
@pytest.mark.parametrize("kernel", ["new", "old"])
def test_guard_serves_an_image_whose_dev_is_a_link(
    front: Front, bundle: Bundle, tmp_path: Path, kernel: str
) -> None:
    """An image's /dev that is a link (the runtime mounts its tmpfs through it): the link is
    followed inside the root, and the copy lies on that tmpfs, the container's own, as a user
    namespace needs it. A kernel without openat2 follows no link here: the copy goes to /run."""
    g = guard_run(front, bundle, tmp_path, GUARD_ARGS[0], PARAMS_ON, "linked-dev", kernel == "old")
    assert g.rc == 0 and not g.ran, g.stderr
    assert g.params == PARAMS_OFF and g.write == "EROFS" and not g.leftover
    assert (" cdihook-test-dev " in g.mounts) == (kernel == "new"), g.mounts


@guarded
@pytest.mark.parametrize("kernel", ["new", "old"])
def test_guard_never_takes_a_link_it_cannot_follow_for_no_driver(
    front: Front, bundle: Bundle, tmp_path: Path, kernel: str
) -> None:
    """An image's /proc that is a link to where the runtime mounted procfs: guarded where
    openat2 follows it inside the root; without openat2 an error that stops the container,
    never "no params here" with the container unguarded."""
    g = guard_run(front, bundle, tmp_path, GUARD_ARGS[0], PARAMS_ON, "linked-proc", kernel == "old")
    if kernel == "new":
        assert g.rc == 0 and g.params == PARAMS_OFF and g.write == "EROFS", g.stderr
    else:
        assert g.rc == 1 and "a link on the way to /proc" in g.stderr, g.stderr
        assert g.stderr.count("\n") == 1 and g.mounts == "" and g.write == "writable"
    assert not g.ran and not g.leftover


@guarded
def test_guard_under_a_seccomp_filter_that_answers_eperm(
    front: Front, bundle: Bundle, tmp_path: Path
) -> None:
    """openat2, the mount API and statx refused with EPERM (a seccomp profile's answer): the
    same fallbacks as on a kernel without them, the copy in the container's own /dev."""
    g = guard_run(front, bundle, tmp_path, GUARD_ARGS[0], PARAMS_ON, "proc", seccomp=True)
    assert g.rc == 0 and not g.ran, g.stderr
    assert g.params == PARAMS_OFF and g.write == "EROFS" and " ro," in g.mounts
    assert " cdihook-test-dev " in g.mounts and not g.leftover


@guarded
def test_guard_params_too_big(front: Front, bundle: Bundle, tmp_path: Path) -> None:
    """A params file over the limit is an error of the guard's, not gpuctk-hook's to read."""
    text = PARAMS_ON + b"X" * (64 << 10)
    g = guard_run(front, bundle, tmp_path, GUARD_ARGS[0], text, "proc")
    assert g.rc == 1 and not g.ran
    assert "the device node guard: cannot read /proc/driver/nvidia/params" in g.stderr
    assert g.mounts == "" and not g.leftover


# ---- the spec's links (folder mode's firmware and config files) ---------------------------

FILES = "/usr/local/nvidia/files"
ICD = "/usr/share/vulkan/icd.d/nvidia_icd.json"
OPENCL = "/etc/OpenCL/vendors/nvidia.icd"


def link_args(*paths: str) -> list[str]:
    out = [*ARGS]
    for path in paths:
        out += ["--link", f"{FILES}{path}::{path}"]
    return out


def staged_files(root: Path, *paths: str) -> None:
    for path in paths:
        put(root, FILES + path, b"driver's " + path.encode())


def test_links_made_in_the_root(front: Front, bundle: Bundle) -> None:
    staged_files(bundle.root, ICD, OPENCL)
    (bundle.root / "etc").mkdir(exist_ok=True)
    served(run(front, bundle, link_args(ICD, OPENCL)))
    for path in (ICD, OPENCL):
        made = bundle.root / path.lstrip("/")
        assert os.readlink(made) == FILES + path
        assert (
            bundle.root / (FILES + path).lstrip("/")
        ).read_bytes() == b"driver's " + path.encode()
    for folder in ("usr/share/vulkan", "usr/share/vulkan/icd.d", "etc/OpenCL/vendors"):
        assert (bundle.root / folder).stat().st_mode & 0o7777 == 0o755 & ~current_umask()
    served(run(front, bundle, link_args(ICD, OPENCL)))  # a restart: already made


def test_arguments_in_every_form_gpuctk_hook_reads(front: Front, bundle: Bundle) -> None:
    """--NAME=VALUE, --debug and a --link-for are read as gpuctk-hook reads them: served here."""
    staged_files(bundle.root, ICD, OPENCL)
    (bundle.root / "etc").mkdir(exist_ok=True)
    args = [
        "createContainer",
        f"--folder={STAGE}",
        "--debug",
        f"--ld-cache={PART}",
        f"--link={FILES}{ICD}::{ICD}",
        f"--link-for=compute:{FILES}{OPENCL}::{OPENCL}",
    ]
    served(run(front, bundle, args))
    assert os.readlink(bundle.root / ICD.lstrip("/")) == FILES + ICD
    assert os.readlink(bundle.root / OPENCL.lstrip("/")) == FILES + OPENCL


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_link_to_a_target_not_in_the_root_is_skipped(front: Front, bundle: Bundle) -> None:
    served(run(front, bundle, link_args(ICD)))
    assert not (bundle.root / "usr/share/vulkan").exists()


def test_links_disabled(front: Front, bundle: Bundle) -> None:
    staged_files(bundle.root, ICD)
    served(run(front, bundle, [*link_args(ICD), "--disable-hook", "create-symlinks"]))
    assert not (bundle.root / "usr/share/vulkan").exists()


@pytest.mark.parametrize("kind", ["file", "other link", "folder", "fifo"])
def test_link_over_an_image_entry_is_left_alone(front: Front, bundle: Bundle, kind: str) -> None:
    """An image's own file, folder or node where a link goes (a cudagl image's GLVND file, an
    ICD an image copies to /etc/vulkan) is left alone, the container staying on the C path; a
    link of the image's naming something else is swapped for the entry's, here too (link_at,
    the policy's one home, which gpuctk-hook asks)."""
    staged_files(bundle.root, ICD)
    there = bundle.root / ICD.lstrip("/")
    there.parent.mkdir(parents=True)
    if kind == "file":
        there.write_bytes(b"the image's")
    elif kind == "other link":
        there.symlink_to("/elsewhere")
    elif kind == "folder":
        there.mkdir()
    else:
        os.mkfifo(there)
    before = there.lstat()
    served(run(front, bundle, link_args(ICD)))
    if kind == "other link":
        assert os.readlink(there) == f"{FILES}{ICD}"
        assert sorted(p.name for p in there.parent.iterdir()) == [there.name]  # no temp left
        return
    after = there.lstat()
    assert (after.st_ino, after.st_mode, after.st_mtime_ns) == (
        before.st_ino, before.st_mode, before.st_mtime_ns)  # fmt: skip


def test_link_folders_follow_image_links_inside_the_root(
    front: Front, bundle: Bundle, tmp_path: Path
) -> None:
    """An image's /usr/share that links to a host folder by absolute path: the folders are
    made inside the root, at that path, and the host folder stays empty."""
    host = tmp_path / "host-share"
    host.mkdir()
    staged_files(bundle.root, ICD)
    link(bundle.root, "/usr/share", str(host))
    (bundle.root / str(host).lstrip("/")).mkdir(parents=True)
    served(run(front, bundle, link_args(ICD)))
    assert list(host.iterdir()) == []
    made = bundle.root / str(host).lstrip("/") / "vulkan/icd.d/nvidia_icd.json"
    assert os.readlink(made) == FILES + ICD


@pytest.mark.parametrize("parent", ["a file", "a dangling link", "a link loop"])
def test_link_folder_that_cannot_be_made(front: Front, bundle: Bundle, parent: str) -> None:
    staged_files(bundle.root, ICD)
    where = "/usr/share/vulkan"
    if parent == "a file":
        put(bundle.root, where, b"x")
    elif parent == "a dangling link":
        link(bundle.root, where, "/nowhere/at/all")
    else:
        link(bundle.root, where, where)
    handover(front, bundle, "a --link gpuctk-hook makes", link_args(ICD))
    assert not (bundle.root / "nowhere").exists()


@pytest.mark.parametrize(
    "value",
    [
        f"libx.so::{ICD}",  # a relative target: gpuctk-hook resolves it
        f"{FILES}{ICD}::usr/share/x",
        f"{FILES}/../x::{ICD}",
        f"{FILES}{ICD}::/usr/share/./x",
        f"{FILES}{ICD}::/usr//x",
        f"{FILES}{ICD}::/usr/x/",
        f"{FILES}{ICD}::/",
        f"::{ICD}",
        f"{FILES}{ICD}::",
    ],
)
def test_link_that_is_not_plain(front: Front, bundle: Bundle, value: str) -> None:
    staged_files(bundle.root, ICD)
    handover(front, bundle, "a --link only gpuctk-hook reads", [*ARGS, "--link", value])
    assert not (bundle.root / "usr/share/vulkan").exists()


def test_too_many_links(front: Front, bundle: Bundle) -> None:
    args = [*ARGS]
    for i in range(257):
        args += ["--link", f"{FILES}/x{i}::/x{i}"]
    handover(front, bundle, "a --link only gpuctk-hook reads", args)


LINK_SCRIPT = r"""set -e
root=$1 vol=$2 how=$3; shift 3
if [ "$how" = volume ]; then mount --bind "$vol" "$root/usr/share"; fi
if [ "$how" = read-only ]; then mount --bind "$root" "$root"; mount -o remount,bind,ro "$root"; fi
set +e
"$@"
"""


@guarded
@pytest.mark.parametrize("how", ["volume", "read-only"])
def test_links_never_written_outside_the_roots_own_mount(
    front: Front, bundle: Bundle, tmp_path: Path, how: str
) -> None:
    """A folder on another mount (a volume at /usr/share) or a read-only root: nothing is
    written here; gpuctk-hook gets it (and skips those links with a warning)."""
    staged_files(bundle.root, ICD)
    vol = tmp_path / "volume"
    vol.mkdir()
    (bundle.root / "usr/share").mkdir(exist_ok=True)
    script = tmp_path / "links.sh"
    script.write_text(LINK_SCRIPT)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "GPUCTK_DRIVER_VERSION": DRIVER,
           "GPUCTK_HOOK_FRONT_TRACE": "1",
           "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "detect_leaks=0")}  # fmt: skip
    cmd = ["unshare", "-m", "--propagation", "private", "sh", str(script), str(bundle.root)]
    cmd += [str(vol), how, str(front.exe), *link_args(ICD)]
    done = subprocess.run(cmd, env=env, input=state_for(bundle.path), capture_output=True,
                          timeout=TIMEOUT, check=False)  # fmt: skip
    err = done.stderr.decode(errors="replace")
    assert done.returncode == 0, err
    # a read-only root: its ld cache cannot be written either, which is found first
    why = WHY_CACHE if how == "read-only" else "a --link gpuctk-hook makes"
    assert f"gpuctk-cdi-hook: gpuctk-hook: {why}" in err, err
    assert (front.folder / "stdin").read_bytes() == state_for(bundle.path)
    assert list(vol.iterdir()) == []
    assert not (bundle.root / "usr/share/vulkan").exists()


XORG = "/usr/lib/xorg/modules/drivers/nvidia_drv.so"
LINKS_FOR = {"compute": OPENCL, "graphics": ICD, "display": XORG}


def link_for_args() -> list[str]:
    out = [*ARGS]
    for cap, path in LINKS_FOR.items():
        out += ["--link-for", f"{cap}:{FILES}{path}::{path}"]
    return out


def with_env(b: Bundle, env: list[str] | None, process: str = "process") -> None:
    doc: dict[str, Any] = {"ociVersion": "1.0.2", "root": {"path": str(b.root)}}
    if env is not None:
        doc[process] = {"args": ["sh"], "env": env}
    b.config(json.dumps(doc))


def asked_caps(env: list[str] | None) -> set[str]:
    """The reference runtime's reading of NVIDIA_DRIVER_CAPABILITIES, as these tests expect
    it (the product reads it in C alone, container_caps): the last entry that sets it, its
    comma-separated words trimmed of ASCII blanks; unset or blank the default, `all` every
    one, other words ignored."""
    from gpuctk.cdi.node import capabilities as caps

    value = None
    for entry in env or []:
        name, eq, rest = entry.partition("=")
        if eq and name == CAP_NAME:
            value = rest
    if value is None or not value.strip(caps.BLANKS):
        return set(caps.DEFAULT)
    words = {w.strip(caps.BLANKS) for w in value.split(",")}
    return set(caps.ALL) if caps.EVERY in words else {w for w in words if w in caps.ALL}


@pytest.mark.parametrize(
    ("env", "made"),
    [
        (None, {"compute"}),  # no process at all: the default
        ([], {"compute"}),
        (["PATH=/bin"], {"compute"}),
        (["NVIDIA_DRIVER_CAPABILITIES="], {"compute"}),
        (["NVIDIA_DRIVER_CAPABILITIES=   "], {"compute"}),
        (["NVIDIA_DRIVER_CAPABILITIES= , "], set()),  # not blank: no word known
        (["NVIDIA_DRIVER_CAPABILITIES=bogus"], set()),
        (["NVIDIA_DRIVER_CAPABILITIES=utility"], set()),
        (["NVIDIA_DRIVER_CAPABILITIES= graphics ,display"], {"graphics", "display"}),
        (["NVIDIA_DRIVER_CAPABILITIES=compute,all"], {"compute", "graphics", "display"}),
        (["NVIDIA_DRIVER_CAPABILITIES=all", "NVIDIA_DRIVER_CAPABILITIES=graphics"], {"graphics"}),
        (["NVIDIA_DRIVER_CAPABILITIESX=all"], {"compute"}),
        (["NVIDIA_DRIVER_CAPABILITIES=ALL"], set()),
    ],
)
def test_link_for_follows_nvidia_driver_capabilities(
    front: Front, bundle: Bundle, env: list[str] | None, made: set[str]
) -> None:
    """The last entry that sets it counts (asked_caps)."""
    assert {c for c in LINKS_FOR if c in asked_caps(env)} == made  # the table agrees
    staged_files(bundle.root, *LINKS_FOR.values())
    with_env(bundle, env)
    served(run(front, bundle, link_for_args()))
    got = {c for c, p in LINKS_FOR.items() if (bundle.root / p.lstrip("/")).is_symlink()}
    assert got == made


# what random values of the variable are made of: the words (and near misses), ASCII and other
# blanks, commas, what may stand between them, and what Go's JSON writes as an escape
CAP_PIECES = (
    *("compute", "graphics", "display", "utility", "video", "compat32", "all", "ALL", "Compute"),
    *("bogus", "", " ", "  ", "\t", "\n", "\r", "\v", "\f", "\u00a0", "\u2003", "\u0000"),
    *(",", ",", ",", "=", ":", "x", "<", ">", "&", '"', "\\"),
)
CAP_NAME = "NVIDIA_DRIVER_CAPABILITIES"
CAP_NAMES = (*[CAP_NAME] * 4, f"{CAP_NAME} ", CAP_NAME.lower(), f"{CAP_NAME}\u00a0")


def test_link_for_reads_the_variable_as_the_reference_does(front: Front, bundle: Bundle) -> None:
    """For 400 random env lists (one to three entries of the variable and its near misses,
    values from CAP_PIECES), written as Go writes config.json, the C makes the links
    asked_caps expects, never hands the container over, and tells the Python the same
    capabilities (gpuctk.hook.compiled.capabilities: the shim's and gpuctk-hook's
    reading)."""
    from gpuctk.hook import compiled

    rng = random.Random(37)
    staged_files(bundle.root, *LINKS_FOR.values())
    made = [bundle.root / p.lstrip("/") for p in LINKS_FOR.values()]
    for _ in range(400):
        env = ["PATH=/bin", "NVIDIA_REQUIRE_CUDA=cuda>=12.0 brand=tesla,driver>=470,driver<471"]
        for _ in range(rng.randint(1, 3)):
            value = "".join(rng.choice(CAP_PIECES) for _ in range(rng.randint(0, 8)))
            env.append(f"{rng.choice(CAP_NAMES)}={value}")
        doc = {"ociVersion": "1.0.2", "root": {"path": str(bundle.root)},
               "process": {"args": ["sh"], "env": env}}  # fmt: skip
        bundle.config(go_json(doc))
        asked = asked_caps(env)
        assert compiled.capabilities(doc)[0] == asked, env
        served(run(front, bundle, link_for_args()))
        got = {c for c, path in zip(LINKS_FOR, made, strict=True) if path.is_symlink()}
        assert got == {c for c in LINKS_FOR if c in asked}, env
        for path in made:
            if path.is_symlink():
                path.unlink()


@pytest.mark.parametrize(
    ("entry", "made"),
    [
        ("NVIDIA_DRIVER_CAPABILITIES\\u003dgraphics", {"graphics"}),  # an escape spells it
        ("NVIDIA_DRIVER_CAPABILITIE\\u0053=display", {"display"}),
        ("NVIDIA_DRIVER_CAPABILITIES=\\u0067raphics\\u002cdisplay", {"graphics", "display"}),
        ("NVIDIA_DRIVER_CAPABILITIES=graphics\\u00e9", set()),  # not a word
        ("NVIDIA_DRIVER_CAPABILITIES=\\t\\u0020\\n", {"compute"}),  # blank: the default
        ("NVIDIA_DRIVER_CAPABILITIES=\\u00a0", set()),  # not an ASCII blank: not blank
        ("NVIDIA_DRIVER_CAPABILITIES=\\ud83d\\ude00,graphics", {"graphics"}),
        ("NVIDIA_DRIVER_CAPABILITIES=graphics\\u0000", set()),
        ("caf\u00e9=all", {"compute"}),
    ],
)
def test_link_for_reads_an_escaped_env(
    front: Front, bundle: Bundle, entry: str, made: set[str]
) -> None:
    """Each env entry is read as JSON spells it (Python's json does the same), escapes and
    characters above 127 included: such an entry is read here, not handed to gpuctk-hook."""
    root = json.dumps({"path": str(bundle.root)})
    text = f'{{"ociVersion":"1.0.2","root":{root},"process":{{"env":["{entry}"]}}}}'
    env = json.loads(text)["process"]["env"]
    assert {c for c in LINKS_FOR if c in asked_caps(env)} == made
    staged_files(bundle.root, *LINKS_FOR.values())
    bundle.config(text.encode())
    served(run(front, bundle, link_for_args()))
    got = {c for c, p in LINKS_FOR.items() if (bundle.root / p.lstrip("/")).is_symlink()}
    assert got == made


@pytest.mark.parametrize(
    ("entry", "served_"),
    [
        (b"X=\xf0\x9f\x98\x80 \xe2\x80\xa8 \xc3\xa9", True),  # UTF-8: read, not a word
        (b"X=\xff", False),  # not UTF-8, which Python's reader refuses: gpuctk-hook says so
        (b"X=\xc0\xac", False),  # an overlong ","
        (b"X=\xed\xa0\x80", False),  # an encoded surrogate
        (b"X=\xe2\x82", False),  # cut short
        (b"X=\xf4\x90\x80\x80", False),  # above U+10FFFF
        (b"X=\x80", False),  # a stray continuation byte
    ],
)
def test_link_for_reads_only_utf8(
    front: Front, bundle: Bundle, entry: bytes, served_: bool
) -> None:
    staged_files(bundle.root, *LINKS_FOR.values())
    root = json.dumps({"path": str(bundle.root)}).encode()
    env = b'["NVIDIA_DRIVER_CAPABILITIES=graphics","' + entry + b'"]'
    bundle.config(b'{"ociVersion":"1.0.2","root":' + root + b',"process":{"env":' + env + b"}}")
    if served_:
        served(run(front, bundle, link_for_args()))
        assert (bundle.root / ICD.lstrip("/")).is_symlink()
    else:
        handover(front, bundle, "NVIDIA_DRIVER_CAPABILITIES could not be read", link_for_args())


@pytest.mark.parametrize(
    ("env", "process"),
    [
        (["NVIDIA_DRIVER_CAPABILITIES=all"], "Process"),  # runc folds case
        ([7], "process"),
    ],
)
def test_link_for_with_an_env_it_cannot_read(
    front: Front, bundle: Bundle, env: list[Any], process: str
) -> None:
    staged_files(bundle.root, *LINKS_FOR.values())
    doc = {"ociVersion": "1.0.2", "root": {"path": str(bundle.root)}, process: {"env": env}}
    bundle.config(json.dumps(doc).encode())
    handover(front, bundle, "NVIDIA_DRIVER_CAPABILITIES could not be read", link_for_args())
    assert not (bundle.root / ICD.lstrip("/")).exists()


FOR_ONLY = "a --link-for only gpuctk-hook reads"
LINK_ONLY = "a --link only gpuctk-hook reads"


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (f"{FILES}{ICD}::{ICD}", FOR_ONLY),
        (f"bogus:{FILES}{ICD}::{ICD}", FOR_ONLY),  # a capability of a newer gpuctk
        (f"graphics::{ICD}", FOR_ONLY),
        (f":{FILES}{ICD}::{ICD}", FOR_ONLY),
        (f"graphics:{FILES}{ICD}", FOR_ONLY),
        (f"graphics:libx.so::{ICD}", LINK_ONLY),
    ],
)
def test_link_for_that_is_not_plain(front: Front, bundle: Bundle, value: str, why: str) -> None:
    staged_files(bundle.root, ICD)
    handover(front, bundle, why, [*ARGS, "--link-for", value])
    assert not (bundle.root / ICD.lstrip("/")).exists()


def test_link_for_disabled_with_create_symlinks(front: Front, bundle: Bundle) -> None:
    staged_files(bundle.root, *LINKS_FOR.values())
    with_env(bundle, ["NVIDIA_DRIVER_CAPABILITIES=all"])
    served(run(front, bundle, [*link_for_args(), "--disable-hook", "create-symlinks"]))
    assert not (bundle.root / ICD.lstrip("/")).exists()


@pytest.mark.parametrize("root_path", ["rootfs/evil/..", "rootfs/./", "./rootfs", "{root}/evil/.."])
def test_root_path_with_dots_is_gpuctk_hooks(front: Front, tmp_path: Path, root_path: str) -> None:
    """The kernel would follow the image's link before `..`; runc and Python read `..` as
    text. Such a root.path goes to gpuctk-hook, and nothing is written where the link leads."""
    b = make_bundle(tmp_path)
    staged_files(b.root, ICD)
    victim = tmp_path / "victim"
    (victim / "x").mkdir(parents=True)
    (b.root / "evil").symlink_to("../../victim/x")
    doc = {"ociVersion": "1.0.2", "root": {"path": root_path.format(root=b.root)}}
    b.config(json.dumps(doc))
    handover(front, b, "config.json's root.path is not plain", link_args(ICD))
    assert not list((victim / "x").iterdir()) and list(victim.iterdir()) == [victim / "x"]


def test_link_with_a_control_byte_is_gpuctk_hooks(front: Front, bundle: Bundle) -> None:
    staged_files(bundle.root, ICD)
    handover(front, bundle, "a --link only gpuctk-hook reads",
             [*ARGS, "--link", f"{FILES}{ICD}::/etc/a\nb"])  # fmt: skip
    assert not (bundle.root / "etc/a\nb").exists()


OTHER_MOUNT_SCRIPT = r"""set -e
root=$1 vol=$2; shift 2
mkdir -p "$root/mnt/vol" "$root/proc"
mount --bind "$vol" "$root/mnt/vol"
mount -t proc proc "$root/proc"
set +e
"$@"
"""


@guarded
@pytest.mark.parametrize("target", ["/mnt/vol/cache", "/proc/self/stat", "/proc/version"])
def test_a_cache_on_another_mount_is_never_read(
    front: Front, bundle: Bundle, tmp_path: Path, target: str
) -> None:
    """An image whose /etc/ld.so.cache leads to a volume's file or into the container's own
    procfs (as /proc/kmsg would): host root reads none of it; gpuctk-hook gets the image, and
    the volume's cache, a valid one with an entry of its own, reaches no merged cache."""
    vol = tmp_path / "volume"
    vol.mkdir()
    marker = LdCacheEntry("libvolume.so.1", "/mnt/vol/libvolume.so.1", X86_64)
    (vol / "cache").write_bytes(build_ld_cache([*IMAGE_ENTRIES, marker]))
    (bundle.root / "etc/ld.so.cache").unlink()
    link(bundle.root, "/etc/ld.so.cache", target)
    script = tmp_path / "other.sh"
    script.write_text(OTHER_MOUNT_SCRIPT)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "GPUCTK_DRIVER_VERSION": DRIVER,
           "GPUCTK_HOOK_FRONT_TRACE": "1",
           "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "detect_leaks=0")}  # fmt: skip
    cmd = ["unshare", "-m", "--propagation", "private", "sh", str(script), str(bundle.root),
           str(vol), str(front.exe), *ARGS]  # fmt: skip
    done = subprocess.run(cmd, env=env, input=state_for(bundle.path), capture_output=True,
                          timeout=TIMEOUT, check=False)  # fmt: skip
    err = done.stderr.decode(errors="replace")
    assert done.returncode == 0, err
    assert f"gpuctk-cdi-hook: gpuctk-hook: {WHY_CACHE}" in err, err
    assert (bundle.root / "etc/ld.so.cache").is_symlink()  # nothing written in its place
    assert not (bundle.root / "etc/ld.so.conf.d/00-gpuctk.conf").exists()


# ---- the forms Python asks (gpuctk.hook.compiled) -------------------------------------------


def ask(exe: Path, *args: str, fds: tuple[int, ...] = ()) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(exe), *args], pass_fds=fds, capture_output=True, text=True,
                          env={}, timeout=TIMEOUT, check=False)  # fmt: skip
    assert "Sanitizer" not in done.stderr and "runtime error" not in done.stderr, done.stderr
    return done


def test_driver_capabilities_and_root_seen_as_python_asks(
    front_binary: Path, tmp_path: Path
) -> None:
    """`driver-capabilities --config-fd N` says what container_caps reads, the words that name
    nothing counted; `root-seen` the owner host root's files show under (0 outside a user
    namespace); bad arguments exit 2 with one usage line."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"process": {"env": [f"{CAP_NAME}=video, x,,ALL"]}}))
    with config.open("rb") as f:
        done = ask(front_binary, "driver-capabilities", "--config-fd", str(f.fileno()),
                   fds=(f.fileno(),))  # fmt: skip
    assert (done.returncode, json.loads(done.stdout)) == (0, {"asked": ["video"], "unknown": 2})
    config.write_text('{"Process": {"env": []}}')
    with config.open("rb") as f:
        done = ask(front_binary, "driver-capabilities", "--config-fd", str(f.fileno()),
                   fds=(f.fileno(),))  # fmt: skip
    assert done.returncode == 1 and "cannot be read from this OCI config" in done.stderr
    for bad in ([], ["--config-fd"], ["--config-fd", "x"], ["--config-fd", "99", "more"]):
        done = ask(front_binary, "driver-capabilities", *bad)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, (bad, done.stderr)
    uid_map = Path("/proc/self/uid_map").read_text().split()
    if uid_map[:2] == ["0", "0"]:
        assert ask(front_binary, "root-seen").stdout == "0\n"


def test_make_links_is_the_link_policy(front_binary: Path, tmp_path: Path) -> None:
    """`make-links (--dir-fd N NAME TARGET)...`: a new link made, one that names the target
    kept, an image's link naming something else swapped (no temp name left, a killed run's
    too), an image's own
    file left alone, a name the kernel refuses an `error ERRNO` line while the others go on;
    bad arguments exit 2 and change nothing."""
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "same").symlink_to("t")
    (folder / "other").symlink_to("elsewhere")
    (folder / "file").write_text("the image's")
    (folder / ".other.gpuctk-link").symlink_to("t")  # a killed run's temp name: replaced
    fd = os.open(folder, os.O_PATH | os.O_DIRECTORY)
    try:
        args = []
        for name in ("new", "same", "other", "file", "n" * 300, "last"):
            args += ["--dir-fd", str(fd), name, "t"]
        done = ask(front_binary, "make-links", *args, fds=(fd,))
        for bad in (["--dir-fd", str(fd), "a/b", "t"], ["--dir-fd", str(fd), "a", ""],
                    ["--dir-fd", str(fd), "a"], ["--dir-fd", "x", "a", "t"],
                    ["--dir-fd", f" +{fd}", "a", "t"], ["--dir-fd", "-1", "a", "t"],
                    []):  # fmt: skip
            refused = ask(front_binary, "make-links", *bad, fds=(fd,))
            assert refused.returncode == 2 and refused.stderr.count("\n") == 1, bad
    finally:
        os.close(fd)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "made", "kept", "made", "left", f"error {errno.ENAMETOOLONG}", "made"]  # fmt: skip
    assert sorted(p.name for p in folder.iterdir()) == ["file", "last", "new", "other", "same"]
    assert {n: os.readlink(folder / n) for n in ("new", "same", "other", "last")} == dict.fromkeys(
        ("new", "same", "other", "last"), "t"
    )
    assert (folder / "file").read_text() == "the image's"
