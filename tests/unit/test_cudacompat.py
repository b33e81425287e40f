"""CUDA forward compatibility (hook/verbs/cudacompat.py): the version rule and the cache order, on
plain folders standing in for a container root (no mounts, no root needed)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.driver_root import make_elf

from gpuctk.cdi.node.ldcache import LdCacheEntry, build_ld_cache, read_ld_cache
from gpuctk.hook.shim import rootcache
from gpuctk.hook.verbs import actions, cudacompat, ldmerge

HOST = "535.309.01"
NEWER = "550.54.15"
OLDER = "470.256.02"
LIBDIR = "/usr/lib/x86_64-linux-gnu"
COMPAT = cudacompat.COMPAT_DIR


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("535.309.01", (535, 309, 1)),
        ("550.54", (550, 54)),
        ("1", None),
        ("1.2.3.4.5", None),
        ("535..1", None),
        ("535.x.1", None),
        ("\uff15\uff13\uff15.1", None),  # non-ASCII digits
        ("1234567890.1", None),
        ("", None),
    ],
)
def test_parse_version(text: str, want: tuple[int, ...] | None) -> None:
    assert cudacompat.parse_version(text) == want


def test_host_version_from_the_injected_libcuda() -> None:
    paths = [f"{LIBDIR}/libcuda.so.1", f"{LIBDIR}/libcuda.so.{HOST}", "/host/libcuda.so.535.309.01"]
    assert cudacompat.host_version(paths) == (535, 309, 1)
    assert cudacompat.host_version([f"{LIBDIR}/libnvidia-ml.so.{HOST}"]) is None
    assert cudacompat.host_version(["/a/libcuda.so.535.1.1", "/b/libcuda.so.550.1.1"]) is None


@pytest.mark.parametrize(
    ("compat", "host", "want"),
    [
        ((550, 54, 15), (535, 309, 1), True),
        ((535, 400, 1), (535, 309, 1), False),  # same branch: the driver's own
        ((535, 309, 1), (535, 309, 1), False),
        ((470, 256, 2), (535, 309, 1), False),
        (None, (535, 309, 1), False),
        ((550, 54, 15), None, False),
    ],
)
def test_use_compat_only_for_a_newer_major_version(
    compat: tuple[int, ...] | None, host: tuple[int, ...] | None, want: bool
) -> None:
    assert cudacompat.use_compat(compat, host) is want


def compat_image(root: Path, version: str) -> Path:
    """A root whose /usr/local/cuda (a link, as in CUDA images) holds a cuda-compat folder."""
    real = root / "usr/local/cuda-12.4/compat"
    real.mkdir(parents=True)
    (root / "usr/local/cuda").symlink_to("cuda-12.4")
    for lib in ("libcuda.so.1", "libnvidia-ptxjitcompiler.so.1", "libnvidia-nvvm.so.4"):
        stem = lib.rsplit(".so.", 1)[0]
        (real / f"{stem}.so.{version}").write_bytes(make_elf(lib))
        (real / lib).symlink_to(f"{stem}.so.{version}")
    (real / "libcuda.so").symlink_to("libcuda.so.1")
    (root / "etc").mkdir(exist_ok=True)
    return real


@pytest.fixture
def root_fd(tmp_path: Path) -> Iterator[int]:
    (tmp_path / "root").mkdir()
    fd = os.open(tmp_path / "root", os.O_PATH | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def test_a_newer_compat_folder_is_found_with_its_sonames(tmp_path: Path, root_fd: int) -> None:
    real = compat_image(tmp_path / "root", NEWER)
    (real / "libnoname.so.2.0").write_bytes(make_elf(None))  # no SONAME: known by its name
    (real / "libnoname.so").symlink_to("libnoname.so.2.0")
    found = cudacompat.find(root_fd, (535, 309, 1))
    assert found is not None and found.version == (550, 54, 15)
    assert sorted((e.key, e.value, e.flags) for e in found.entries) == [
        ("libcuda.so", f"{COMPAT}/libcuda.so", 0x0303),  # the development link, as ldconfig
        ("libcuda.so.1", f"{COMPAT}/libcuda.so.1", 0x0303),
        ("libnoname.so", f"{COMPAT}/libnoname.so", 0x0303),  # as ldconfig lists them
        ("libnoname.so.2.0", f"{COMPAT}/libnoname.so.2.0", 0x0303),
        ("libnvidia-nvvm.so.4", f"{COMPAT}/libnvidia-nvvm.so.4", 0x0303),
        ("libnvidia-ptxjitcompiler.so.1", f"{COMPAT}/libnvidia-ptxjitcompiler.so.1", 0x0303),
    ]


@pytest.mark.parametrize("version", [OLDER, HOST, "535.400.01", "libcuda"])
def test_an_older_or_same_branch_compat_folder_is_ignored(
    tmp_path: Path, root_fd: int, version: str
) -> None:
    compat_image(tmp_path / "root", version)
    assert cudacompat.find(root_fd, (535, 309, 1)) is None
    assert cudacompat.find(root_fd, None) is None


def test_hostile_compat_folders(tmp_path: Path, root_fd: int) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / f"libcuda.so.{NEWER}").write_bytes(make_elf("libcuda.so.1"))
    (outside / "libcuda.so.1").symlink_to(f"libcuda.so.{NEWER}")
    root = tmp_path / "root"
    (root / "usr/local/cuda").mkdir(parents=True)
    (root / "usr/local/cuda/compat").symlink_to(outside)  # resolved in the root: not there
    assert cudacompat.find(root_fd, (535, 309, 1)) is None
    (root / "usr/local/cuda/compat").unlink()
    real = compat_image(tmp_path / "other", NEWER)
    os.rename(real, root / "usr/local/cuda/compat")
    os.unlink(root / "usr/local/cuda/compat/libnvidia-nvvm.so.4")
    (root / "usr/local/cuda/compat/libnvidia-nvvm.so.4").symlink_to(outside / "libcuda.so.1")
    os.mkfifo(root / "usr/local/cuda/compat/libfifo.so.1")
    found = cudacompat.find(root_fd, (535, 309, 1))
    assert found is not None
    assert {e.key for e in found.entries} == {
        "libcuda.so.1", "libcuda.so", "libnvidia-ptxjitcompiler.so.1"
    }  # fmt: skip
    for i in range(cudacompat.MAX_ENTRIES):
        (root / f"usr/local/cuda/compat/x{i}").touch()
    assert cudacompat.find(root_fd, (535, 309, 1)) is None  # more names than a compat folder


def test_two_compat_libcudas_are_ignored(tmp_path: Path, root_fd: int) -> None:
    real = compat_image(tmp_path / "root", NEWER)
    (real / "libcuda.so.560.1.1").write_bytes(make_elf("libcuda.so.1"))
    assert cudacompat.find(root_fd, (535, 309, 1)) is None


def driver(tmp_path: Path) -> list[tuple[str, str]]:
    host = tmp_path / "host"
    host.mkdir()
    files = []
    for lib in ("libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1"):
        stem = lib.rsplit(".so.", 1)[0]
        (host / f"{stem}.so.{HOST}").write_bytes(make_elf(lib))
        files.append((f"{LIBDIR}/{lib}", str(host / f"{stem}.so.{HOST}")))
        files.append((f"{LIBDIR}/{stem}.so.{HOST}", str(host / f"{stem}.so.{HOST}")))
    return files


def image_cache(root: Path) -> None:
    old = [LdCacheEntry("libcuda.so.1", f"{COMPAT}/libcuda.so.1", 0x0303)]  # the image's own
    old.append(LdCacheEntry("libc.so.6", f"{LIBDIR}/libc.so.6", 0x0303))
    (root / "etc/ld.so.cache").write_bytes(build_ld_cache(old))


def merge(root_fd: int, files: list[tuple[str, str]]) -> None:
    """The shim's cache of a mounts spec's `files` (hook/shim/shimroot.py _work)."""
    entries = ldmerge.library_entries(files, [LIBDIR], {})
    rootcache.merge_cache(root_fd, entries, [LIBDIR], cudacompat.parse_version(HOST))


def first(cache: Path, key: str) -> str:
    return next(e.value for e in read_ld_cache(str(cache)) if e.key == key)


@pytest.mark.parametrize(("version", "wins"), [(NEWER, COMPAT), (OLDER, LIBDIR)])
def test_shim_cache_puts_a_newer_compat_folder_first(
    tmp_path: Path, root_fd: int, version: str, wins: str
) -> None:
    root = tmp_path / "root"
    compat_image(root, version)
    image_cache(root)
    merge(root_fd, driver(tmp_path))
    cache = root / "etc/ld.so.cache"
    assert first(cache, "libcuda.so.1") == f"{wins}/libcuda.so.1"
    assert first(cache, "libnvidia-ptxjitcompiler.so.1").startswith(wins + "/")
    assert first(cache, "libnvidia-ml.so.1") == f"{LIBDIR}/libnvidia-ml.so.1"
    assert first(cache, "libc.so.6") == f"{LIBDIR}/libc.so.6"
    conf = root / cudacompat.COMPAT_CONF.lstrip("/")
    if wins == COMPAT:
        assert COMPAT in conf.read_text().splitlines()
        assert sorted(os.listdir(conf.parent))[0] == conf.name  # before 00-gpuctk.conf
        values = [e.value for e in read_ld_cache(str(cache)) if e.key == "libcuda.so.1"]
        assert values == [f"{COMPAT}/libcuda.so.1", f"{LIBDIR}/libcuda.so.1"]  # as ldconfig
        # dlopen("libcuda.so") (numba's first name) gets the same libcuda as libcuda.so.1
        assert first(cache, "libcuda.so") == f"{COMPAT}/libcuda.so"
    else:
        assert not conf.exists()


def test_a_stale_compat_conf_is_emptied(tmp_path: Path, root_fd: int) -> None:
    root = tmp_path / "root"
    compat_image(root, OLDER)
    image_cache(root)
    conf = root / cudacompat.COMPAT_CONF.lstrip("/")
    conf.parent.mkdir(parents=True)
    conf.write_text(f"{COMPAT}\n")
    merge(root_fd, driver(tmp_path))
    assert COMPAT not in conf.read_text().splitlines()


@pytest.mark.parametrize("ldconfig", [False, True], ids=["merged", "ldconfig"])
@pytest.mark.parametrize(("version", "wins"), [(NEWER, COMPAT), (OLDER, LIBDIR)])
def test_hook_puts_a_newer_compat_folder_first(
    tmp_path: Path, root_fd: int, version: str, wins: str, ldconfig: bool
) -> None:
    root = tmp_path / "root"
    compat_image(root, version)
    image_cache(root)
    (root / LIBDIR.lstrip("/")).mkdir(parents=True)
    binds = dict(driver(tmp_path))
    for dest, host in binds.items():  # what the bind mounts show in the root
        (root / dest.lstrip("/")).write_bytes(Path(host).read_bytes())
    if ldconfig and not os.path.exists("/sbin/ldconfig"):
        pytest.skip("no host ldconfig")
    done = actions.update_loader(root_fd, str(root), [LIBDIR], None, ldconfig, (binds, {}))
    assert ("no ldconfig" in done) is not ldconfig
    assert (COMPAT in done) is (wins == COMPAT and not ldconfig)
    assert first(root / "etc/ld.so.cache", "libcuda.so.1") == f"{wins}/libcuda.so.1"
