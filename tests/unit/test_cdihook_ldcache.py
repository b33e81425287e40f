"""gpuctk-cdi-hook's ld cache (hook/ldcache.c) against gpuctk-hook's (gpuctk.hook.verbs.ldmerge).

The compiled hook writes the image's /etc/ld.so.cache anew with the stage's libraries in it.
Its result must be what gpuctk-hook and the shim write for the same image: the same entries
in the same order (gpuctk.cdi.node.ldcache.build_ld_cache), checked here on caches that real
ldconfig wrote (this host's, and ones made over libraries with awkward names in every format
ldconfig writes: new, and the old+new "compat" of glibc before 2.32, with glibc-hwcaps
extension entries), then read back by glibc's own `ldconfig -p`. A hostile image's cache
(random mutations of real ones) never crashes it or makes it write a cache that gpuctk's
reader rejects; the mutations also run under AddressSanitizer and UBSan when gcc has them.

CDIHOOK_FUZZ_RUNS sets how many mutated caches each binary tries.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures import cfront

from gpuctk.cdi.node.ldcache import LdCacheEntry, build_ld_cache, parse_ld_cache

STAGE = "/usr/local/nvidia/lib64"
X86_64 = 0x0303
STAGE_ENTRIES = [
    LdCacheEntry("libcuda.so.1", f"{STAGE}/libcuda.so.1", X86_64),
    LdCacheEntry("libcuda.so", f"{STAGE}/libcuda.so", X86_64),
    LdCacheEntry("libnvidia-ml.so.1", f"{STAGE}/libnvidia-ml.so.1", X86_64),
    LdCacheEntry("libnvidia-ptxjitcompiler.so.1", f"{STAGE}/libnvidia-ptxjitcompiler.so.1",
                 X86_64),
    LdCacheEntry("libcuda.so.1", "/usr/local/nvidia/lib/libcuda.so.1", 0x0003),
]  # fmt: skip
# SONAMEs whose order needs glibc's comparison (numbers, case, punctuation) and one a stage
# entry replaces
NAMES = [
    "libcuda.so.1", "libfoo.so.9", "libfoo.so.10", "libfoo.so.1.2", "libFoo.so.2",
    "libx2y.so.3", "libx10y.so.3", "lib-a_b+c.so.0", "libz.so.007", "libz.so.7",
    "libnum.so.4294967296", "libnum.so.2147483648", "libnum.so.99999999999",
]  # fmt: skip
TIMEOUT = 20


@pytest.fixture(scope="module")
def binaries() -> dict[str, Path]:
    """The hook as built, and as built with the sanitizers where gcc has them
    (tests/fixtures/cfront)."""
    out = {kind: exe for kind in ("plain", "sanitized") if (exe := cfront.binary(kind))}
    if not out:
        pytest.skip("no C compiler to build gpuctk-cdi-hook")
    return out


@pytest.fixture(scope="module")
def part(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("stage") / "ld.so.cache"
    path.write_bytes(build_ld_cache(STAGE_ENTRIES))
    path.chmod(0o644)
    return path


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of real shared objects named NAMES (each its own SONAME), and one in a
    glibc-hwcaps subfolder (ldconfig gives it an extension entry)."""
    cc = shutil.which("gcc")
    if not cc:
        pytest.skip("needs gcc")
    folder = tmp_path_factory.mktemp("libs")
    src = folder / "x.c"
    src.write_text("int x(void) { return 1; }\n")
    for name in [*NAMES, "glibc-hwcaps/x86-64-v2/libfoo.so.10"]:
        out = folder / name
        out.parent.mkdir(parents=True, exist_ok=True)
        soname = os.path.basename(name)
        subprocess.run([cc, "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(out), str(src)],
                       check=True)  # fmt: skip
    return folder


def ldconfig_cache(root: Path, libs: Path, fmt: str) -> bytes:
    """The cache glibc's ldconfig writes for `libs` (copied into root at /opt/libs) in `fmt`."""
    if not shutil.which("ldconfig"):
        pytest.skip("needs ldconfig")
    shutil.copytree(libs, root / "opt/libs", symlinks=True, dirs_exist_ok=True)
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc/ld.so.conf").write_text("/opt/libs\n")
    done = subprocess.run(["ldconfig", "-X", "-c", fmt, "-r", str(root)], capture_output=True,
                          text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"ldconfig -c {fmt}: {done.stderr.strip()}")
    return (root / "etc/ld.so.cache").read_bytes()


def image(root: Path, cache: bytes) -> Path:
    (root / "lib/x86_64-linux-gnu").mkdir(parents=True, exist_ok=True)
    (root / "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2").write_bytes(b"\x7fELF")
    (root / "lib64").mkdir(exist_ok=True)
    if not (root / "lib64/ld-linux-x86-64.so.2").is_symlink():
        (root / "lib64/ld-linux-x86-64.so.2").symlink_to(
            "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
        )
    (root / "etc").mkdir(exist_ok=True)
    if not (root / "etc/ld.so.conf").exists():
        (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / "etc/ld.so.cache").write_bytes(cache)
    return root


def run_hook(exe: Path, root: Path, part: Path) -> subprocess.CompletedProcess[bytes]:
    """The hook's createContainer over `root`; a handover runs a `gpuctk-hook` that only
    exits 0 (the tests look at what the compiled hook wrote)."""
    bundle = root.parent / "bundle"
    bundle.mkdir(exist_ok=True)
    doc = {"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin"]}, "root": {"path": str(root)}}
    (bundle / "config.json").write_text(json.dumps(doc))
    folder = root.parent / "bin"
    if not folder.exists():
        folder.mkdir()
        shutil.copyfile(exe, folder / "gpuctk-cdi-hook")
        (folder / "gpuctk-cdi-hook").chmod(0o755)
        (folder / "gpuctk-hook").write_text("#!/bin/sh\ncat >/dev/null\nexit 0\n")
        (folder / "gpuctk-hook").chmod(0o755)
    state = json.dumps({"ociVersion": "1.0.2", "id": "x", "status": "creating", "pid": 1,
                        "bundle": str(bundle)}).encode()  # fmt: skip
    args = ["createContainer", "--folder", STAGE, "--ld-cache", str(part)]
    env = {"PATH": "/usr/bin:/bin", "GPUCTK_DRIVER_VERSION": "535.309.01",
           "GPUCTK_HOOK_FRONT_TRACE": "1", "ASAN_OPTIONS": "detect_leaks=0",
           "UBSAN_OPTIONS": "print_stacktrace=1"}  # fmt: skip
    done = subprocess.run([str(folder / "gpuctk-cdi-hook"), *args], input=state, env=env,
                          capture_output=True, timeout=TIMEOUT, check=False)  # fmt: skip
    err = done.stderr.decode(errors="replace")
    assert done.returncode == 0, err
    assert "Sanitizer" not in err and "runtime error" not in err, err
    return done


def expected(image_cache: bytes) -> list[LdCacheEntry]:
    """What gpuctk-hook writes for this image (gpuctk.hook.verbs.ldmerge.write_cache), read back."""
    new = {(e.key, e.flags) for e in STAGE_ENTRIES}
    kept = [e for e in parse_ld_cache(image_cache) if (e.key, e.flags) not in new]
    return list(parse_ld_cache(build_ld_cache([*kept, *STAGE_ENTRIES])))


def served(done: subprocess.CompletedProcess[bytes]) -> bool:
    return b"gpuctk-cdi-hook: gpuctk-hook:" not in done.stderr


def check_merged(root: Path, image_cache: bytes) -> bytes:
    written = (root / "etc/ld.so.cache").read_bytes()
    assert list(parse_ld_cache(written)) == expected(image_cache)
    return written


@pytest.mark.parametrize("fmt", ["new", "compat"])
def test_merge_of_ldconfigs_cache_is_gpuctk_hooks(
    binaries: dict[str, Path], part: Path, libs: Path, tmp_path: Path, fmt: str
) -> None:
    for name, exe in binaries.items():
        root = tmp_path / name / "root"
        root.mkdir(parents=True)
        original = ldconfig_cache(root, libs, fmt)
        assert any(e.hwcap for e in parse_ld_cache(original)) or fmt == "compat"
        image(root, original)
        assert served(run_hook(exe, root, part))
        written = check_merged(root, original)
        # glibc's own reader: every entry there, the driver's where the stage put them
        listed = subprocess.run(["ldconfig", "-p", "-C", str(root / "etc/ld.so.cache")],
                                capture_output=True, text=True, check=True).stdout  # fmt: skip
        assert f"libcuda.so.1 (libc6,x86-64) => {STAGE}/libcuda.so.1" in listed, listed
        assert "libcuda.so.1 (libc6) => /usr/local/nvidia/lib/libcuda.so.1" in listed, listed
        for soname in NAMES[1:]:
            assert f"\t{soname} (libc6,x86-64) => /opt/libs/{soname}\n" in listed, listed
        assert "/opt/libs/libcuda.so.1" not in listed  # replaced by the stage's
        # a restart on the same root: the same bytes, the cache does not grow
        assert served(run_hook(exe, root, part))
        assert (root / "etc/ld.so.cache").read_bytes() == written


def test_merge_of_this_hosts_cache(binaries: dict[str, Path], part: Path, tmp_path: Path) -> None:
    host = Path("/etc/ld.so.cache")
    if not host.is_file():
        pytest.skip("this host has no ld cache")
    original = host.read_bytes()
    for name, exe in binaries.items():
        root = image(tmp_path / name / "root", original)
        assert served(run_hook(exe, root, part))
        check_merged(root, original)


def test_the_loader_finds_the_stage_through_the_merged_cache(
    binaries: dict[str, Path], part: Path, tmp_path: Path
) -> None:
    """glibc's loader (this host's, in a chroot of the host's own libraries) resolves a
    library through the cache the hook wrote: an entry the loader cannot binary-search is an
    entry that does not work."""
    exe = next(iter(binaries.values()))
    root = tmp_path / "root"
    original = Path("/etc/ld.so.cache").read_bytes()
    image(root, original)
    assert served(run_hook(exe, root, part))
    listed = subprocess.run(["ldconfig", "-p", "-C", str(root / "etc/ld.so.cache")],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert listed.splitlines()[0].startswith(f"{len(expected(original))} libs found"), listed
    assert listed.count("=>") == len(expected(original))


def mutations(seed: bytes, rng: random.Random, count: int) -> list[bytes]:
    out = []
    for _ in range(count):
        data = bytearray(seed)
        how = rng.randrange(4)
        if how == 0:  # flip bytes anywhere
            for _ in range(rng.randrange(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif how == 1:  # a count, offset or flags field of the header or an entry
            at = rng.choice([20, 24, 28, *range(48, min(len(data), 48 + 24 * 40), 4)])
            value = rng.choice([0, 1, 0x7FFFFFFF, 0xFFFFFFFF, len(data), len(data) - 1,
                                rng.randrange(1 << 32)])  # fmt: skip
            data[at : at + 4] = value.to_bytes(4, "little")
        elif how == 2:  # truncated
            del data[rng.randrange(len(data)) :]
        else:  # the NULs of the strings made something else
            nuls = [i for i in range(len(data) // 2, len(data)) if data[i] == 0]
            for i in rng.sample(nuls, min(len(nuls), rng.randrange(1, 6))):
                data[i] = ord("/") if rng.random() < 0.3 else ord("7")
        out.append(bytes(data))
    return out


def test_hostile_caches(binaries: dict[str, Path], part: Path, libs: Path, tmp_path: Path) -> None:
    runs = int(os.environ.get("CDIHOOK_FUZZ_RUNS", "120"))
    rng = random.Random(20261204)
    seeds = [ldconfig_cache(tmp_path / f"seed-{f}", libs, f) for f in ("new", "compat")]
    cases = [m for seed in seeds for m in mutations(seed, rng, runs // 2)]
    for name, exe in binaries.items():
        for i, data in enumerate(cases):
            root = image(tmp_path / name / f"case-{i}" / "root", data)
            done = run_hook(exe, root, part)
            written = (root / "etc/ld.so.cache").read_bytes()
            if not served(done):
                assert written == data  # handed over: nothing written
                continue
            entries = parse_ld_cache(written)  # well formed to gpuctk's own reader
            assert {(e.key, e.value) for e in STAGE_ENTRIES} <= {(e.key, e.value) for e in entries}
            assert list(entries) == expected(data)  # served: a cache gpuctk-hook merges too


def raw_cache(entries: list[tuple[int, int, int]], strings: bytes) -> bytes:
    """A new-format cache of (flags, key, value) entries, key and value offsets counted from
    the start of `strings` (the string section right after the entry table)."""
    start = 48 + 24 * len(entries)
    head = b"glibc-ld.so.cache1.1" + len(entries).to_bytes(4, "little")
    head += len(strings).to_bytes(4, "little") + b"\x02" + bytes(19)
    table = b"".join(
        flags.to_bytes(4, "little") + (start + key).to_bytes(4, "little")
        + (start + value).to_bytes(4, "little") + bytes(12)
        for flags, key, value in entries
    )  # fmt: skip
    return head + table + strings


def refused_caches() -> dict[str, bytes]:
    """Well-formed caches past the limits of gpuctk's reader (gpuctk.cdi.node.ldcache
    _string_reader): gpuctk-hook and the shim refuse to merge them."""
    # every entry's path a different tail of one long path: the distinct strings weigh far
    # more than 1.5 times the file
    path = b"/" + b"a" * 3998
    overlap = raw_cache([(X86_64, 0, 10 + i) for i in range(3990)], b"libx.so.1\0" + path + b"\0")
    # names made of runs of digits, more than one run per 16 bytes of file
    strings, entries = b"", []
    for i in range(300):
        name = ("1." * 120 + str(i)).encode()
        key = len(strings)
        strings += name + b"\0"
        entries.append((X86_64, key, len(strings)))
        strings += b"/usr/lib/" + name + b"\0"
    return {"overlap": overlap, "digit-runs": raw_cache(entries, strings)}


@pytest.mark.parametrize("kind", ["overlap", "digit-runs"])
def test_a_cache_gpuctk_hook_refuses_is_handed_over(
    binaries: dict[str, Path], part: Path, tmp_path: Path, kind: str
) -> None:
    """An image is served the same whichever path serves it: a cache that gpuctk.hook.verbs.ldmerge
    refuses (ValueError: gpuctk-hook rebuilds it with ldconfig) is not merged here either,
    and this hook never writes a cache that gpuctk's own reader rejects."""
    data = refused_caches()[kind]
    with pytest.raises(ValueError):
        expected(data)
    for name, exe in binaries.items():
        root = image(tmp_path / name / "root", data)
        done = run_hook(exe, root, part)
        written = (root / "etc/ld.so.cache").read_bytes()
        assert not served(done), f"{name}: served a cache gpuctk-hook refuses"
        assert written == data


HOOK = Path(__import__("sys").executable).with_name("gpuctk-hook")


def python_hook(root: Path, part: Path) -> str:
    """gpuctk-hook's createContainer with the folder spec's arguments over `root` (what the
    compiled hook hands an image to, and what prestart mode runs): its log."""
    bundle = root.parent / "py-bundle"
    bundle.mkdir()
    doc = {"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin"]}, "root": {"path": str(root)}}
    (bundle / "config.json").write_text(json.dumps(doc))
    state = json.dumps({"ociVersion": "1.0.2", "id": "x", "status": "creating", "pid": 1,
                        "bundle": str(bundle)}).encode()  # fmt: skip
    log = root.parent / "hook.log"
    env = {"PATH": "/usr/bin:/bin", "GPUCTK_DRIVER_VERSION": "535.309.01",
           "GPUCTK_HOOK_LOG": str(log), "GPUCTK_HOOK_LOG_LEVEL": "info"}  # fmt: skip
    args = ["createContainer", "--folder", STAGE, "--ld-cache", str(part)]
    done = subprocess.run([str(HOOK), *args], input=state, env=env, capture_output=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return log.read_text() if log.exists() else ""


@pytest.mark.parametrize("seed", ["new", "compat", "host", "stub"])
def test_gpuctk_hook_writes_what_this_hook_writes(
    binaries: dict[str, Path], part: Path, libs: Path, tmp_path: Path, seed: str
) -> None:
    """The same image gets the same ld cache whichever serves it: this hook, or gpuctk-hook
    (the images this hook hands over, prestart mode), both from the stage's own cache."""
    if not HOOK.exists():
        pytest.skip("no gpuctk-hook beside this Python")
    if seed == "host":
        data = Path("/etc/ld.so.cache").read_bytes()
    elif seed == "stub":  # a driver library of the image's own in its cache
        stub = [LdCacheEntry("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", X86_64)]
        data = build_ld_cache([*parse_ld_cache(Path("/etc/ld.so.cache").read_bytes()), *stub])
    else:
        data = ldconfig_cache(tmp_path / "seed", libs, seed)
    exe = next(iter(binaries.values()))
    c_root = image(tmp_path / "c" / "root", data)
    py_root = image(tmp_path / "py" / "root", data)
    for root in (c_root, py_root):
        (root / STAGE.lstrip("/")).mkdir(parents=True)
    assert served(run_hook(exe, c_root, part))
    log = python_hook(py_root, part)
    assert "(no ldconfig)" in log, log
    c_cache = list(parse_ld_cache((c_root / "etc/ld.so.cache").read_bytes()))
    py_cache = list(parse_ld_cache((py_root / "etc/ld.so.cache").read_bytes()))
    assert c_cache == py_cache == expected(data)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root")
def test_gpuctk_hook_takes_roots_host_files_in_a_user_namespace(part: Path, tmp_path: Path) -> None:
    """gpuctk-hook's merge takes the stage's cache by the spec's entry's rule inside a user
    namespace (tests/unit/test_cdihook.py::test_in_a_user_namespace_*): root's cache under the
    overflow uid where no host root is mapped; another user's refused where root is. The
    host's ldconfig, root's, is taken there too."""
    theirs = tmp_path / "theirs.cache"
    shutil.copyfile(part, theirs)
    os.chown(theirs, 1000, 1000)
    code = (
        "import sys\nfrom gpuctk.hook.compiled import root_seen\n"
        "from gpuctk.hook.verbs import ldmerge\n"
        "from gpuctk.cdi.node.ldcache import parse_ld_cache\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n        cache = ldmerge.merged(open(path, 'rb').read(), [], path)\n"
        "        print(root_seen(), len(parse_ld_cache(cache)))\n"
        "    except ValueError:\n        print(root_seen(), 'refused')\n"
        "from gpuctk.hook.verbs import ldconfig\n"
        "print(ldconfig.open_host_ldconfig()[1])\n"
    )
    got = {}
    for name, userns in (("none", ["--user"]), ("root", ["--user", "--map-root-user"])):
        argv = ["unshare", *userns, sys.executable, "-c", code, str(part), str(theirs)]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0 and "unshare" in done.stderr:
            pytest.skip(f"no user namespace here: {done.stderr.strip()}")
        assert done.returncode == 0, done.stderr
        got[name] = done.stdout.splitlines()
    entries = len(parse_ld_cache(part.read_bytes()))
    overflow = int(Path("/proc/sys/kernel/overflowuid").read_text())
    ldconfig = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
    both = [f"{overflow} {entries}", f"{overflow} {entries}", ldconfig]  # both owners unmapped
    assert got["none"] == both, got
    assert got["root"] == [f"0 {entries}", "0 refused", ldconfig], got


@pytest.mark.parametrize("seed", ["new", "compat", "refused"])
def test_the_shims_and_gpuctk_hooks_merge_is_this_readers(
    libs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: str
) -> None:
    """gpuctk.hook.verbs.ldmerge.write_cache (the shim's and gpuctk-hook's merge) parses no
    image cache in Python: gpuctk-cdi-hook's `merge-ld-cache` does, the same reader as the
    folder spec's entry. With Python's reader made to fail, the image's cache and the added
    entries still merge into what the entry writes; a cache the C does not take is a
    ValueError (the caller's ldconfig serves) and nothing is written."""
    from gpuctk import rootfs
    from gpuctk.cdi.node import ldcache
    from gpuctk.hook.verbs import ldmerge

    data = (
        refused_caches()["overlap"]
        if seed == "refused"
        else ldconfig_cache(tmp_path / "seed", libs, seed)
    )
    want = None if seed == "refused" else expected(data)

    def no_python_reader(*_: object, **__: object) -> None:
        raise AssertionError("an image's cache parsed in Python")

    monkeypatch.setattr(ldcache, "parse_ld_cache", no_python_reader)
    root = image(tmp_path / "root", b"old")
    fd = rootfs.open_root(str(root))
    try:
        if want is None:
            with pytest.raises(ValueError, match="is past this reader"):
                ldmerge.write_cache(fd, data, STAGE_ENTRIES)
        else:
            ldmerge.write_cache(fd, data, STAGE_ENTRIES)
    finally:
        os.close(fd)
    monkeypatch.undo()
    written = (root / "etc/ld.so.cache").read_bytes()
    assert written == b"old" if want is None else list(parse_ld_cache(written)) == want


@pytest.mark.parametrize(
    "args",
    [[], ["--image-fd", "0"], ["--image-fd", "x", "--entries-fd", "0"], ["--entries-fd", "0", "1"]],
)
def test_the_merge_form_says_how_it_is_run(args: list[str]) -> None:
    from gpuctk.hook import compiled
    from gpuctk.hook.verbs import ldmerge

    done = subprocess.run([compiled.installed(), ldmerge.MERGE_VERB, *args], capture_output=True,
                          text=True, timeout=TIMEOUT, check=False)  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "usage: merge-ld-cache --image-fd" in done.stderr
