"""gpuctk.cdi.node.driverfiles: driver files under a root (Debian's real packages and synthetic
roots; paths resolved by gpuctk.cdi.node.driverroot), and gpuctk.cdi.node.devnodes: device nodes
made with mknod."""

from __future__ import annotations

import os
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures.devroot import CAPS_MAJOR, UVM_MAJOR, NodeRoots, ci_minor, gi_minor
from fixtures.driver_root import make_elf

from gpuctk.cdi.node import driverfiles as df
from gpuctk.cdi.node.driverroot import resolve_in_root
from gpuctk.cdi.node.machine import Machine
from gpuctk.cdi.node.profile import load_profile
from gpuctk.errors import InputError

V = "535.309.01"
T = "/usr/lib/x86_64-linux-gnu"


# ---------------------------------------------------------------------------------------------
# The Debian driver root


@pytest.fixture(scope="module")
def debian(driver_root: Path, driver_version: str) -> df.DriverFiles:
    return df.discover_driver_files(str(driver_root), driver_version)


def test_debian_every_versioned_library(debian: df.DriverFiles, driver_root: Path,
                                        driver_version: str) -> None:  # fmt: skip
    on_disk = {
        "/" + str(p.relative_to(driver_root))
        for d in (T, f"{T}/nvidia/current")
        for p in (driver_root / d.lstrip("/")).glob(f"*.so.{driver_version}")
        if not p.is_symlink()
    }
    found = {f.container_path for f in debian.libraries}
    assert len(on_disk) >= 25
    assert on_disk <= found
    assert found - on_disk == {f"{T}/libnvidia-egl-gbm.so.1.1.0",
                               f"{T}/libnvidia-egl-wayland.so.1.1.10"}  # fmt: skip
    for f in debian.libraries:
        assert f.kind == "library"
        assert f.host_path == str(driver_root) + f.container_path
        assert stat.S_ISREG(os.lstat(f.host_path).st_mode)


def test_debian_capabilities_and_sonames(debian: df.DriverFiles, driver_version: str) -> None:
    by_name = {os.path.basename(f.container_path): f for f in debian.libraries}
    v = driver_version
    assert by_name[f"libcuda.so.{v}"].soname == "libcuda.so.1"
    assert by_name[f"libnvidia-nvvm.so.{v}"].soname == "libnvidia-nvvm.so.4"
    assert by_name[f"libnvidia-eglcore.so.{v}"].soname == f"libnvidia-eglcore.so.{v}"
    expected = {
        f"libcuda.so.{v}": "compute", f"libnvidia-ml.so.{v}": "utility",
        f"libnvcuvid.so.{v}": "video", f"libGLX_nvidia.so.{v}": "graphics",
        f"libnvidia-ngx.so.{v}": "ngx", f"libnvidia-cfg.so.{v}": "utility",
        f"libvdpau_nvidia.so.{v}": "video",
    }  # fmt: skip
    assert {n: by_name[n].capability for n in expected} == expected
    kinds = {f.capability for group in (debian.libraries, debian.configs) for f in group}
    assert kinds == {"utility", "compute", "video", "graphics", "display", "ngx"}


def test_debian_symlinks_and_folders(debian: df.DriverFiles, driver_version: str) -> None:
    cur = f"{T}/nvidia/current"
    links = set(debian.symlinks)
    assert (f"libcuda.so.{driver_version}", f"{cur}/libcuda.so.1") in links
    assert ("libcuda.so.1", f"{cur}/libcuda.so") in links
    assert (f"libnvidia-ml.so.{driver_version}", f"{cur}/libnvidia-ml.so.1") in links
    assert ("libGLX_nvidia.so.0", f"{cur}/libGLX_indirect.so.0") in links
    assert ("../nvidia/current/libnvidia-allocator.so.1", f"{T}/gbm/nvidia-drm_gbm.so") in links
    assert ("libnvidia-egl-gbm.so.1.1.0", f"{T}/libnvidia-egl-gbm.so.1") in links
    # A library whose SONAME is its own name gets no link.
    assert not any(link.endswith(f"libnvidia-eglcore.so.{driver_version}") for _, link in links)
    assert len({link for _, link in debian.symlinks}) == len(debian.symlinks)
    assert debian.ld_folders == (T, cur)


def test_debian_binaries_through_alternatives(debian: df.DriverFiles, driver_root: Path) -> None:
    got = {f.container_path: f.host_path[len(str(driver_root)) :] for f in debian.binaries}
    # /usr/bin/nvidia-smi -> /etc/alternatives/nvidia--nvidia-smi (absolute, inside the root)
    # -> /usr/lib/nvidia/current/nvidia-smi.
    assert got["/usr/bin/nvidia-smi"] == "/usr/lib/nvidia/current/nvidia-smi"
    assert got["/usr/bin/nvidia-debugdump"] == "/usr/lib/nvidia/current/nvidia-debugdump"
    assert got["/usr/bin/nvidia-persistenced"] == "/usr/bin/nvidia-persistenced"
    assert got["/usr/bin/nvidia-cuda-mps-control"] == "/usr/bin/nvidia-cuda-mps-control"
    assert got["/usr/sbin/nvidia-cuda-mps-server"] == "/usr/sbin/nvidia-cuda-mps-server"
    caps = {f.container_path: f.capability for f in debian.binaries}
    assert caps["/usr/bin/nvidia-smi"] == "utility"
    assert caps["/usr/sbin/nvidia-cuda-mps-server"] == "compute"


def test_debian_firmware_configs_sockets(debian: df.DriverFiles, driver_root: Path,
                                         driver_version: str) -> None:  # fmt: skip
    fw = f"/lib/firmware/nvidia/{driver_version}"
    assert {f.container_path for f in debian.firmware} == {f"{fw}/gsp_ga10x.bin",
                                                           f"{fw}/gsp_tu10x.bin"}  # fmt: skip
    configs = {f.container_path: (f.capability, f.host_path) for f in debian.configs}
    # Debian's Vulkan files, under /usr/share/vulkan on the host, go where NVIDIA's spec puts
    # them (/etc/vulkan: images name VK_ICD_FILENAMES=/etc/vulkan/icd.d/nvidia_icd.json)
    icd = configs["/etc/vulkan/icd.d/nvidia_icd.json"]
    assert icd == ("graphics", f"{driver_root}/usr/share/vulkan/icd.d/nvidia_icd.json")
    layers = configs["/etc/vulkan/implicit_layer.d/nvidia_layers.json"]
    assert layers[1].endswith("/usr/share/vulkan/implicit_layer.d/nvidia_layers.json")
    assert not [p for p in configs if p.startswith("/usr/share/vulkan/")]
    assert configs["/usr/share/glvnd/egl_vendor.d/10_nvidia.json"][0] == "graphics"
    assert configs["/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json"][0] == "graphics"
    assert configs["/etc/OpenCL/vendors/nvidia.icd"][0] == "compute"
    drv = configs["/usr/lib/xorg/modules/drivers/nvidia_drv.so"]
    assert drv == ("display", f"{driver_root}/usr/lib/nvidia/current/nvidia_drv.so")
    assert debian.sockets == ()


def test_debian_ld_cache_is_used_and_agrees(driver_root: Path, driver_version: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    if not (driver_root / "etc/ld.so.cache").is_file():
        pytest.skip("the fixture could not run ldconfig -r (not root)")
    with_cache = df.discover_driver_files(str(driver_root), driver_version)
    seen: list[str] = []
    real = df.read_ld_cache
    monkeypatch.setattr(df, "read_ld_cache", lambda p: seen.append(p) or real(p))
    df.discover_driver_files(str(driver_root), driver_version)
    assert seen == [f"{driver_root}/etc/ld.so.cache"]

    def no_cache(path: str) -> tuple[()]:
        raise OSError("gone")

    monkeypatch.setattr(df, "read_ld_cache", no_cache)
    assert df.discover_driver_files(str(driver_root), driver_version) == with_cache


def test_debian_discovery_is_fast(driver_root: Path, driver_version: str) -> None:
    df.discover_driver_files(str(driver_root), driver_version)
    start = time.perf_counter()
    for _ in range(5):
        df.discover_driver_files(str(driver_root), driver_version)
    assert (time.perf_counter() - start) / 5 < 0.05


# ---------------------------------------------------------------------------------------------
# Synthetic roots


def lib(root: Path, path: str, soname: str | None, elf_class: int = 64) -> Path:
    p = root / path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(make_elf(soname, elf_class=elf_class, machine=62 if elf_class == 64 else 3))
    return p


def link(root: Path, path: str, target: str) -> None:
    p = root / path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.symlink_to(target)


def test_missing_root(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="No such file"):
        df.discover_driver_files(str(tmp_path / "nope"), V)


def test_root_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        df.discover_driver_files(str(tmp_path / "file"), V)


def test_unreadable_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.scandir

    def deny(path: str) -> os._ScandirIterator[str]:  # type: ignore[name-defined]
        if os.fspath(path) == str(tmp_path):
            raise PermissionError(13, "Permission denied")
        return real(path)

    monkeypatch.setattr(os, "scandir", deny)
    with pytest.raises(InputError, match="cannot be read: Permission denied"):
        df.discover_driver_files(str(tmp_path), V)


@pytest.mark.parametrize("version", ["", "../../etc", "5" * 100])
def test_bad_version(tmp_path: Path, version: str) -> None:
    with pytest.raises(InputError):
        df.discover_driver_files(str(tmp_path), version)


def test_empty_root(tmp_path: Path) -> None:
    assert df.discover_driver_files(str(tmp_path), V) == df.DriverFiles()


def test_relative_and_absolute_links_stay_in_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    lib(root, f"/opt/nv/libcuda.so.{V}", "libcuda.so.1")
    # An absolute link is resolved inside the root, not on the host.
    link(root, f"{T}/libcuda.so.{V}", f"/opt/nv/libcuda.so.{V}")
    lib(root, f"/usr/lib64/real/libnvidia-ml.so.{V}", "libnvidia-ml.so.1")
    link(root, f"/usr/lib64/libnvidia-ml.so.{V}", f"real/libnvidia-ml.so.{V}")
    # '..' cannot climb out of the root: this lands on <root>/opt/nv/..., not the host's /opt.
    link(root, f"/lib64/libnvidia-cfg.so.{V}", f"../../../../../../../../opt/nv/libcfg.so.{V}")
    lib(root, f"/opt/nv/libcfg.so.{V}", "libnvidia-cfg.so.1")
    files = df.discover_driver_files(str(root), V)
    got = {f.container_path: f.host_path for f in files.libraries}
    # Container paths are the real files' paths; host paths add the root.
    assert got == {
        f"/opt/nv/libcuda.so.{V}": f"{root}/opt/nv/libcuda.so.{V}",
        f"/usr/lib64/real/libnvidia-ml.so.{V}": f"{root}/usr/lib64/real/libnvidia-ml.so.{V}",
        f"/opt/nv/libcfg.so.{V}": f"{root}/opt/nv/libcfg.so.{V}",
    }
    assert ("libcuda.so.1", "/opt/nv/libcuda.so") in files.symlinks
    assert resolve_in_root(str(root), f"/lib64/libnvidia-cfg.so.{V}") == f"/opt/nv/libcfg.so.{V}"


def test_absolute_link_to_a_host_only_path_is_missing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    host_target = tmp_path / f"host-libcuda.so.{V}"
    host_target.write_bytes(make_elf("libcuda.so.1"))
    link(root, f"{T}/libcuda.so.{V}", str(host_target))  # exists on the host only
    assert resolve_in_root(str(root), f"{T}/libcuda.so.{V}") is None
    assert df.discover_driver_files(str(root), V).libraries == ()


def test_symlink_loop_terminates(tmp_path: Path) -> None:
    root = tmp_path / "root"
    link(root, f"{T}/libcuda.so.{V}", f"libnvidia-ml.so.{V}")
    link(root, f"{T}/libnvidia-ml.so.{V}", f"/{T}/libcuda.so.{V}")
    link(root, "/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi")
    assert resolve_in_root(str(root), f"{T}/libcuda.so.{V}") is None
    assert df.discover_driver_files(str(root), V) == df.DriverFiles()


def test_usrmerge_dedup_compat32_and_order(tmp_path: Path) -> None:
    root = tmp_path / "root"
    lib(root, f"{T}/libcuda.so.{V}", "libcuda.so.1")
    link(root, "/lib", "usr/lib")  # usrmerge: /lib/x86_64-linux-gnu is the same folder
    link(root, "/lib64", "usr/lib64")
    lib(root, f"/usr/lib/i386-linux-gnu/libcuda.so.{V}", "libcuda.so.1", elf_class=32)
    (root / f"{T}/libnvidia-ml.so.{V}").write_text("not an ELF file")
    files = df.discover_driver_files(str(root), V)
    assert [(f.container_path, f.capability) for f in files.libraries] == [
        (f"{T}/libcuda.so.{V}", "compute"),
        (f"/usr/lib/i386-linux-gnu/libcuda.so.{V}", "compat32"),
    ]
    assert files.ld_folders == (T, "/usr/lib/i386-linux-gnu")
    assert (f"libcuda.so.{V}", "/usr/lib/i386-linux-gnu/libcuda.so.1") in files.symlinks


def test_ld_cache_finds_libraries_outside_the_usual_folders(tmp_path: Path) -> None:
    import shutil
    import subprocess

    ldconfig = shutil.which("ldconfig")
    if ldconfig is None or os.geteuid() != 0:
        pytest.skip("needs glibc's ldconfig and root (ldconfig -r chroots)")
    root = tmp_path / "root"
    lib(root, f"/opt/nvidia/lib/libnvidia-ml.so.{V}", "libnvidia-ml.so.1")
    (root / "etc").mkdir()
    (root / "etc/ld.so.conf").write_text("/opt/nvidia/lib\n")
    subprocess.run([ldconfig, "-r", str(root)], check=True, capture_output=True)
    files = df.discover_driver_files(str(root), V)
    assert [f.container_path for f in files.libraries] == [f"/opt/nvidia/lib/libnvidia-ml.so.{V}"]
    assert files.ld_folders == ("/opt/nvidia/lib",)
    (root / "etc/ld.so.cache").write_bytes(b"garbage")  # a broken cache is ignored
    assert df.discover_driver_files(str(root), V).libraries == ()


def test_binaries_firmware_sockets(tmp_path: Path) -> None:
    root = tmp_path / "r"
    for path in ("/usr/lib/nvidia/current/nvidia-smi", "/usr/sbin/nvidia-imex"):
        p = root / path.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(make_elf(None))  # a program counts only as ELF (never a wrapper script)
        p.chmod(0o755)
    (root / "usr/bin").mkdir()
    (root / "usr/bin/nvidia-debugdump").mkdir()  # a folder is not a binary
    link(root, "/lib", "usr/lib")
    fw = root / f"usr/lib/firmware/nvidia/{V}"
    fw.mkdir(parents=True)
    (fw / "gsp_ga10x.bin").write_bytes(b"\0")
    (fw / "other.bin").write_bytes(b"\0")
    (root / "run/nvidia-persistenced").mkdir(parents=True)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(root / "run/nvidia-persistenced/socket"))
    (root / "run/nvidia-fabricmanager").mkdir(parents=True)
    (root / "run/nvidia-fabricmanager/socket").write_text("not a socket")
    (root / "tmp/nvidia-mps").mkdir(parents=True)
    try:
        files = df.discover_driver_files(str(root), V)
    finally:
        sock.close()
    assert [(f.container_path, f.host_path, f.capability) for f in files.binaries] == [
        ("/usr/bin/nvidia-smi", f"{root}/usr/lib/nvidia/current/nvidia-smi", "utility"),
        ("/usr/sbin/nvidia-imex", f"{root}/usr/sbin/nvidia-imex", "compute"),
    ]
    # /lib is /usr/lib: the firmware is listed once, under the first name.
    assert [(f.container_path, f.host_path) for f in files.firmware] == [
        (f"/lib/firmware/nvidia/{V}/gsp_ga10x.bin", f"{fw}/gsp_ga10x.bin")
    ]
    assert [(f.container_path, f.kind, f.capability) for f in files.sockets] == [
        ("/run/nvidia-persistenced/socket", "socket", "utility"),
        ("/tmp/nvidia-mps", "socket", "compute"),
    ]


def test_vulkan_files_go_under_etc_and_optix_data_is_found(tmp_path: Path) -> None:
    """An RPM driver's arch-named ICD and its layers in icd.d, under /usr/share/vulkan on the
    host, are mounted under /etc/vulkan (as NVIDIA's spec does); OptiX's nvoptix.bin at its
    own path, for graphics."""
    root = tmp_path / "r"
    for path in (
        "usr/share/vulkan/icd.d/nvidia_icd.x86_64.json",
        "usr/share/vulkan/icd.d/nvidia_layers.json",
        "usr/share/nvidia/nvoptix.bin",
    ):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("{}")  # fmt: skip
    files = df.discover_driver_files(str(root), V)
    assert sorted((f.container_path, f.host_path, f.capability) for f in files.configs) == [
        ("/etc/vulkan/icd.d/nvidia_icd.x86_64.json",
         f"{root}/usr/share/vulkan/icd.d/nvidia_icd.x86_64.json", "graphics"),
        ("/etc/vulkan/icd.d/nvidia_layers.json",
         f"{root}/usr/share/vulkan/icd.d/nvidia_layers.json", "graphics"),
        ("/usr/share/nvidia/nvoptix.bin", f"{root}/usr/share/nvidia/nvoptix.bin", "graphics"),
    ]  # fmt: skip


@pytest.mark.parametrize("prefix", ["usr/local/nvidia", "home/kubernetes/bin/nvidia", ""])
def test_an_icd_in_the_drivers_own_folder_goes_under_etc(tmp_path: Path, prefix: str) -> None:
    """GKE's layout keeps the ICD in the driver's folder (vulkan/icd.d/, under a prefix or
    the driver root itself, as NVIDIA's generator searches it): /etc/vulkan in the container."""
    icd = tmp_path / "r" / prefix / "vulkan/icd.d/nvidia_icd.json"
    icd.parent.mkdir(parents=True)
    icd.write_text("{}")
    files = df.discover_driver_files(str(tmp_path / "r"), V)
    assert [(f.container_path, f.host_path) for f in files.configs] == [
        ("/etc/vulkan/icd.d/nvidia_icd.json", str(icd))
    ]


def test_loader_and_dev_links(tmp_path: Path) -> None:
    root = tmp_path / "r"
    lib(root, f"{T}/libnvidia-allocator.so.{V}", "libnvidia-allocator.so.1")
    lib(root, f"{T}/vdpau/libvdpau_nvidia.so.{V}", "libvdpau_nvidia.so.1")
    lib(root, f"{T}/libnvidia-opticalflow.so.{V}", "libnvidia-opticalflow.so.1")
    lib(root, f"{T}/libnvidia-ml.so.{V}", "libnvidia-ml.so.1")
    (root / T.lstrip("/") / "libnvidia-ml.so").symlink_to(f"libnvidia-ml.so.{V}")
    lib(root, f"{T}/libnvidia-cfg.so.{V}", "libnvidia-cfg.so.1")
    (root / T.lstrip("/") / "libnvidia-cfg.so").symlink_to("libnvidia-ml.so.1")  # not its own
    # no SONAME: the driver loads it by its development link's name, which NVIDIA's spec makes
    lib(root, f"{T}/libnvidia-vulkan-producer.so.{V}", None)
    files = df.discover_driver_files(str(root), V)
    links = set(files.symlinks)
    assert links == {
        (f"libnvidia-allocator.so.{V}", f"{T}/libnvidia-allocator.so.1"),
        ("../libnvidia-allocator.so.1", f"{T}/gbm/nvidia-drm_gbm.so"),
        (f"libvdpau_nvidia.so.{V}", f"{T}/vdpau/libvdpau_nvidia.so.1"),
        (f"libnvidia-opticalflow.so.{V}", f"{T}/libnvidia-opticalflow.so.1"),
        ("libnvidia-opticalflow.so.1", f"{T}/libnvidia-opticalflow.so"),
        (f"libnvidia-ml.so.{V}", f"{T}/libnvidia-ml.so.1"),
        ("libnvidia-ml.so.1", f"{T}/libnvidia-ml.so"),  # the driver root's development link
        (f"libnvidia-cfg.so.{V}", f"{T}/libnvidia-cfg.so.1"),
        (f"libnvidia-vulkan-producer.so.{V}", f"{T}/libnvidia-vulkan-producer.so"),
    }
    by_name = {os.path.basename(f.container_path): f.links for f in files.libraries}
    assert by_name[f"libnvidia-ml.so.{V}"] == ("libnvidia-ml.so",)
    assert by_name[f"libnvidia-cfg.so.{V}"] == ()  # its libX.so leads elsewhere
    assert by_name[f"libnvidia-vulkan-producer.so.{V}"] == ("libnvidia-vulkan-producer.so",)


# ---------------------------------------------------------------------------------------------
# Device nodes

MakeRoots = Callable[[Machine], NodeRoots]


def test_control_nodes(node_roots: MakeRoots) -> None:
    roots = node_roots(load_profile("l4"))
    nodes = df.control_nodes(str(roots.dev_root))
    assert [(n.path, n.major, n.minor, n.type, n.file_mode) for n in nodes] == [
        ("/dev/nvidiactl", 195, 255, "c", 0o666),
        ("/dev/nvidia-uvm", UVM_MAJOR, 0, "c", 0o666),
        ("/dev/nvidia-uvm-tools", UVM_MAJOR, 1, "c", 0o666),
        ("/dev/nvidia-modeset", 195, 254, "c", 0o666),
    ]
    assert nodes[0].host_path == f"{roots.dev_root}/dev/nvidiactl"
    os.unlink(roots.dev_root / "dev/nvidia-modeset")
    (roots.dev_root / "dev/nvidia-modeset").write_text("regular file, not a node")
    assert [n.path for n in df.control_nodes(roots.dev_root)][-1] == "/dev/nvidia-uvm-tools"


def test_gpu_nodes_from_sysfs(node_roots: MakeRoots) -> None:
    machine = load_profile("h100-8")
    roots = node_roots(machine)
    for pos, gpu in enumerate(machine.gpus):
        nodes = df.gpu_nodes(str(roots.dev_root), str(roots.sys_root), gpu)
        card = pos + 1
        assert [(n.path, n.major, n.minor) for n in nodes] == [
            (f"/dev/nvidia{gpu.minor}", 195, gpu.minor),
            (f"/dev/dri/card{card}", 226, card),
            (f"/dev/dri/renderD{128 + card}", 226, 128 + card),
        ]
        assert nodes[1].file_mode == 0o660
    os.chmod(roots.dev_root / "dev/nvidia0", 0o600)
    assert df.gpu_nodes(roots.dev_root, roots.sys_root, machine.gpus[0])[0].file_mode == 0o600


def test_gpu_node_missing_and_no_drm(node_roots: MakeRoots, tmp_path: Path) -> None:
    machine = load_profile("l4")
    roots = node_roots(machine)
    gpu = machine.gpus[0]
    nodes = df.gpu_nodes(roots.dev_root, tmp_path / "empty-sys", gpu)
    assert [n.path for n in nodes] == ["/dev/nvidia0"]
    os.unlink(roots.dev_root / "dev/nvidia0")
    with pytest.raises(InputError, match="nvidia0 is missing"):
        df.gpu_nodes(roots.dev_root, roots.sys_root, gpu)


def test_sysfs_bus_id() -> None:
    from gpuctk.cdi.node.devnodes import sysfs_bus_id

    assert sysfs_bus_id("00000000:18:00.0") == "0000:18:00.0"
    assert sysfs_bus_id("00000001:AB:00.0") == "0001:ab:00.0"
    assert sysfs_bus_id("0000:18:00.0") == "0000:18:00.0"
    with pytest.raises(InputError):
        sysfs_bus_id("garbage")


def test_mig_nodes(node_roots: MakeRoots) -> None:
    machine = load_profile("a100-mig")
    roots = node_roots(machine)
    checked = 0
    for gpu in machine.gpus:
        for mig in gpu.mig_devices:
            nodes = df.mig_nodes(roots.dev_root, roots.proc_root, gpu.minor, mig.gi, mig.ci)
            gi, ci = gi_minor(gpu.minor, mig.gi), ci_minor(gpu.minor, mig.gi, mig.ci)
            assert [(n.path, n.major, n.minor, n.file_mode) for n in nodes] == [
                (f"/dev/nvidia-caps/nvidia-cap{gi}", CAPS_MAJOR, gi, 0o444),
                (f"/dev/nvidia-caps/nvidia-cap{ci}", CAPS_MAJOR, ci, 0o444),
            ]
            checked += 1
    assert checked == len(machine.mig_devices) > 0
    assert gi_minor(0, 1) == 12 and ci_minor(0, 1, 0) == 13


def test_mig_nodes_errors(node_roots: MakeRoots, tmp_path: Path) -> None:
    machine = load_profile("a100-mig")
    roots = node_roots(machine)
    gpu = next(g for g in machine.gpus if g.mig_devices)
    mig = gpu.mig_devices[0]
    with pytest.raises(InputError, match="no entry gpu99/gi1/access"):
        df.mig_nodes(roots.dev_root, roots.proc_root, 99, 1, 0)
    with pytest.raises(InputError, match="cannot read the MIG capability table"):
        df.mig_nodes(roots.dev_root, tmp_path / "no-proc", gpu.minor, mig.gi, mig.ci)
    os.unlink(roots.dev_root / f"dev/nvidia-caps/nvidia-cap{gi_minor(gpu.minor, mig.gi)}")
    with pytest.raises(InputError, match="is missing"):
        df.mig_nodes(roots.dev_root, roots.proc_root, gpu.minor, mig.gi, mig.ci)


def test_parse_mig_minors() -> None:
    text = (
        "config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\n"
        "gpu0/gi0/ci0/access\n\nnotconfig 99\nconfig notanint\ngpu1/gi2/access 9999999999999\n"
        "gpu1/gi2/access -5\ngpu1/gi3/ci1/access 7 extra\n  gpu2/gi0/access   8  \n\0\xff junk\n"
    )
    assert df.parse_mig_minors(text) == {
        "config": 1, "monitor": 2, "gpu0/gi0/access": 3, "gpu0/gi0/ci0/access": 4,
        "gpu2/gi0/access": 8,
    }  # fmt: skip


def test_mig_minors_size_cap(tmp_path: Path) -> None:
    from gpuctk.cdi.node import devnodes

    path = tmp_path / "proc" / devnodes.MIG_MINORS
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x" * (devnodes.MAX_MIG_MINORS_SIZE + 10))
    with pytest.raises(InputError, match="larger than"):
        devnodes.read_mig_minors(tmp_path / "proc")


# ---------------------------------------------------------------------------------------------
# Mount sources others could swap: left out of the spec with one warning each

OTHER_UID = 54321  # not root (no passwd entry needed)


def _needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("giving files to another uid needs root")


def _sticky_tmp(root: Path) -> Path:
    tmp = root / "tmp"
    tmp.mkdir(parents=True)
    tmp.chmod(0o1777)
    return tmp


def _sockets(root: Path) -> list[str]:
    return [f.host_path for f in df.discover_driver_files(str(root), V).sockets]


def test_a_users_mps_folder_is_left_out_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _needs_root()
    mps = _sticky_tmp(tmp_path / "r") / "nvidia-mps"
    mps.mkdir()
    os.chown(mps, OTHER_UID, OTHER_UID)
    assert _sockets(tmp_path / "r") == []
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert f"left out {mps}: the folder is owned by uid {OTHER_UID}" in lines[0]
    assert "CUDA_MPS_PIPE_DIRECTORY" in lines[0]


def test_a_link_a_user_planted_for_the_mps_folder_is_never_followed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _needs_root()
    mps = _sticky_tmp(tmp_path / "r") / "nvidia-mps"
    mps.symlink_to("/")  # inside the root: its /; either way the user's choice
    os.lchown(mps, OTHER_UID, OTHER_UID)
    assert _sockets(tmp_path / "r") == []
    err = capsys.readouterr().err
    assert f"left out {mps}: " in err and "symlink" in err


def test_a_root_owned_mps_folder_in_a_sticky_tmp_is_kept(tmp_path: Path) -> None:
    mps = _sticky_tmp(tmp_path / "r") / "nvidia-mps"
    mps.mkdir(mode=0o755)  # as nvidia-cuda-mps-control, run as root, makes it
    assert _sockets(tmp_path / "r") == [str(mps)]


def test_a_socket_in_a_folder_another_account_owns_is_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _needs_root()
    folder = tmp_path / "r/run/nvidia-persistenced"
    folder.mkdir(parents=True)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(folder / "socket"))
    try:
        os.chown(folder, OTHER_UID, OTHER_UID)  # a daemon's own account (Debian: nvpd)
        assert _sockets(tmp_path / "r") == []
        err = capsys.readouterr().err
        assert f"left out {folder}/socket: folder {folder} is owned by uid {OTHER_UID}" in err
        assert f"fix: chown root {folder}" in err
        os.chown(folder, 0, 0)
        assert _sockets(tmp_path / "r") == [f"{folder}/socket"]
    finally:
        sock.close()


def test_libraries_binaries_and_configs_others_can_write_are_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _needs_root()
    root = tmp_path / "r"
    lib = root / T.lstrip("/")
    lib.mkdir(parents=True)
    (lib / f"libcuda.so.{V}").write_bytes(make_elf("libcuda.so.1"))
    (lib / f"libnvidia-ml.so.{V}").write_bytes(make_elf("libnvidia-ml.so.1"))
    os.chown(lib / f"libnvidia-ml.so.{V}", OTHER_UID, OTHER_UID)
    smi = root / "usr/bin/nvidia-smi"
    smi.parent.mkdir(parents=True)
    smi.write_text("#!/bin/sh\n")
    smi.chmod(0o777)
    icd = root / "etc/OpenCL/vendors"
    icd.mkdir(parents=True)
    (icd / "nvidia.icd").write_text("libcuda.so.1\n")
    icd.chmod(0o777)
    files = df.discover_driver_files(str(root), V)
    assert [f.container_path for f in files.libraries] == [f"{T}/libcuda.so.{V}"]
    assert files.binaries == () and files.configs == ()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3, lines
    assert all("left out " in line and "; fix: " in line for line in lines)
