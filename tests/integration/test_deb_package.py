"""The Debian package, end to end: build it, `dpkg -i` it, use it, `dpkg -r`, `dpkg -P`.

packaging/deb/build.py builds gpuctk_<version>_<arch>.deb from this checkout. On this machine:

- installed with no driver: postinst says so and succeeds, no spec; with an NVML that fails
  to load: a warning, still success; with the fake NVML over the Debian 535 driver root and
  mknod'ed nodes (GPUCTK_NVML_LIBRARY, NVIDIA_DRIVER_ROOT, NVIDIA_DEV_ROOT passed through
  dpkg to postinst): /var/run/cdi/nvidia.yaml for the 8 fake GPUs, naming /usr/bin/gpuctk-hook;
- the installed launchers run isolated (a planted `gpuctk` package on PYTHONPATH is ignored);
- the venv holds the `device-plugin` extra: `gpuctk device-plugin` runs from it, as the shipped
  (not enabled) gpuctk-device-plugin.service runs it;
- one container runs through runc via the INSTALLED /usr/bin/gpuctk-runtime, with the shipped
  /etc/gpuctk/config.toml, and the installed hook (ld cache) - nothing from the dev venv;
- `dpkg -r` leaves exactly the conffile (with the admin's edit); `dpkg -P` leaves nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures.appvenv import BUILD, CACHE, build_env, have_system_python
from fixtures.devroot import make_node_roots
from fixtures.fake_nvml import fake_nvml_environ, write_fake_profile
from fixtures.gpucheck import SCRIPT, check_nodes, seen
from fixtures.images import make_bundle, run_container, unique_name

from gpuctk.cdi.node.profile import load_profile

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="dpkg -i needs root"),
    pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="not a Debian system"),
    pytest.mark.skipif(not have_system_python(), reason="no /usr/bin/python3"),
    pytest.mark.skipif(shutil.which("runc") is None, reason="runc is not installed"),
]

STAGES = "/var/lib/gpuctk/driver"
SPEC = Path("/var/run/cdi/nvidia.yaml")
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Everything the package or its scripts may create: (folder, only names containing this)
WATCHED = [
    ("/etc/gpuctk", ""),
    ("/etc/systemd/system", ""),
    ("/etc/default", "gpuctk"),
    ("/opt", "gpuctk"),
    ("/usr/bin", "gpuctk"),
    ("/usr/lib/systemd/system", "gpuctk"),
    ("/usr/lib/udev/rules.d", "gpuctk"),
    ("/usr/share/containers", ""),
    ("/usr/share/man/man1", "gpuctk"),
    ("/usr/share/doc", "gpuctk"),
    ("/var/lib/systemd", ""),
    ("/run/cdi", ""),
    ("/var/lib/gpuctk", ""),
]


def snapshot() -> dict[str, object]:
    out: dict[str, object] = {}
    for top, only in WATCHED:
        if not os.path.isdir(top):
            continue
        for folder, dirs, files in os.walk(top):
            for name in dirs + files:
                path = os.path.join(folder, name)
                if only and only not in path:
                    continue
                if os.path.islink(path):
                    out[path] = ("link", os.readlink(path))
                elif os.path.isdir(path):
                    out[path] = "dir"
                else:
                    with open(path, "rb") as f:
                        out[path] = f.read()
    return out


def dpkg(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["dpkg", *args], capture_output=True, text=True, env=env, check=False, timeout=300
    )


def installed() -> bool:
    proc = dpkg("-s", "gpuctk")
    return proc.returncode == 0 and "Status: install ok installed" in proc.stdout


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("deb")
    proc = subprocess.run(
        [sys.executable, str(BUILD), "--out-dir", str(out)],
        capture_output=True,
        text=True,
        env=build_env() | {"GPUCTK_DEB_CACHE": str(CACHE / "deb")},
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def clean_machine() -> Iterator[None]:
    if installed() or os.path.lexists("/usr/bin/gpuctk"):
        pytest.skip("gpuctk is already installed on this machine: this test would replace it")
    saved = SPEC.read_bytes() if SPEC.exists() else None
    try:
        yield
    finally:
        if dpkg("-s", "gpuctk").returncode == 0:
            dpkg("-P", "gpuctk")
        if saved is not None:
            SPEC.parent.mkdir(parents=True, exist_ok=True)
            SPEC.write_bytes(saved)


def test_contents(deb: Path, tmp_path: Path) -> None:
    assert deb.name.startswith("gpuctk_0.") and deb.name.endswith(".deb")
    fields = subprocess.run(
        ["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True
    ).stdout
    assert "Depends: python3.11" in fields
    for field in ("Conflicts", "Replaces"):  # both write /var/run/cdi/nvidia.yaml
        assert f"{field}: nvidia-container-toolkit, nvidia-container-toolkit-base" in fields
    listing = subprocess.run(
        ["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True
    ).stdout
    for path in (
        "./usr/bin/gpuctk",
        "./usr/bin/gpuctk-runtime",
        "./usr/bin/gpuctk-hook",
        "./usr/bin/gpuctk-cdi-hook",  # the spec hook's compiled front (hook/cdihook.c)
        "./etc/gpuctk/config.toml",
        "./usr/lib/systemd/system/gpuctk-cdi-refresh.service",
        "./usr/lib/systemd/system/gpuctk-cdi-refresh.path",
        "./usr/lib/udev/rules.d/71-gpuctk.rules",
        "./usr/lib/udev/rules.d/71-gpuctk-dev-char.rules",
        "./usr/share/man/man1/gpuctk.1.gz",
        "./opt/gpuctk/bin/python3 -> /usr/bin/python3.11",
    ):
        assert path in listing, path
    units = sorted(
        line.split()[-1] for line in listing.splitlines()
        if "/lib/systemd/system/" in line and not line.endswith("/")
    )  # fmt: skip
    assert units == [  # the refresh oneshot and what starts it; the plugin's, not enabled
        "./usr/lib/systemd/system/gpuctk-cdi-refresh.path",
        "./usr/lib/systemd/system/gpuctk-cdi-refresh.service",
        "./usr/lib/systemd/system/gpuctk-cdi-refresh.timer",
        "./usr/lib/systemd/system/gpuctk-device-plugin.service",
    ]
    assert "./usr/share/man/man1/gpuctk-device-plugin.1.gz" in listing
    # the install configures no engine: no hooks.d file, `always` or otherwise
    assert "hooks.d" not in listing and "/usr/share/containers" not in listing
    assert "site-packages/pip/" not in listing  # pip's scripts would name the build folder
    assert ".cpython-311.pyc" in listing  # compiled at build: nothing written at run time
    conffiles = subprocess.run(
        ["dpkg-deb", "-I", str(deb), "conffiles"], capture_output=True, text=True, check=True
    ).stdout
    assert conffiles.split() == ["/etc/gpuctk/config.toml"]
    tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True)
    front = subprocess.run(
        ["tar", "-xO", "./usr/bin/gpuctk-runtime"], input=tar.stdout, capture_output=True,
        check=True,
    ).stdout.decode()  # fmt: skip
    # the compiled create where the package puts it, not where the build staged it
    assert "exec /usr/bin/gpuctk-cdi-hook runtime-front /opt/gpuctk/bin/python3 " in front
    # the unit's command runs from the package's venv: grpcio is in it (the extra)
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path / "x")], check=True)
    python = str(tmp_path / "x/opt/gpuctk/bin/python3")  # a relocatable venv, run where it lies
    plugin = subprocess.run(
        [python, "-I", "-c", "import grpc, gpuctk.deviceplugin.server; print(grpc.__version__)"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert plugin.returncode == 0, plugin.stderr
    help_ = subprocess.run(
        [python, "-I", "-m", "gpuctk", "device-plugin", "--help"],
        capture_output=True, text=True, check=False, env={"PATH": PATH_ENV.split("=", 1)[1]},
    )  # fmt: skip
    assert help_.returncode == 0 and "--mig-strategy" in help_.stdout, help_.stderr


def _installed_container(
    tmp_path: Path, fresh_rootfs: Callable[[str], Path], env: list[str]
) -> subprocess.CompletedProcess[str]:
    rootfs = fresh_rootfs("debian")
    bundle = make_bundle(
        tmp_path / "bundle", rootfs, ["/bin/sh", "-c", SCRIPT], env=[PATH_ENV, *env]
    )
    clean = {"PATH": PATH_ENV.split("=", 1)[1]}  # no GPUCTK_CONFIG: the shipped config.toml
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(clean)
    try:
        return run_container(["/usr/bin/gpuctk-runtime"], bundle, unique_name("gpuctk-deb"))
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_install_use_remove_purge(
    deb: Path,
    clean_machine: None,
    tmp_path: Path,
    driver_root: Path,
    fake_nvml_lib: Path,
    fresh_rootfs: Callable[[str], Path],
) -> None:
    before = snapshot()
    base_env = {"PATH": PATH_ENV.split("=", 1)[1], "LANG": "C.UTF-8"}

    # 1. no driver on the machine: installs, says so, writes no spec
    first = dpkg("-i", str(deb), env=base_env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert installed()
    assert "no NVIDIA driver loaded" in first.stdout
    assert not SPEC.exists()
    added = {k for k, v in snapshot().items() if before.get(k) != v}
    assert not [p for p in added if "hooks.d" in p or "/containers/" in p]  # no engine touched

    # 2. an NVML that cannot load: still installs (warning), no spec
    broken = dpkg("-i", str(deb), env=base_env | {"GPUCTK_NVML_LIBRARY": "/nonexistent/lib.so"})
    assert broken.returncode == 0, broken.stdout + broken.stderr
    assert "not generated" in broken.stderr and not SPEC.exists()

    # 3. the fake NVML over the Debian driver root and mknod'ed nodes: the spec
    machine = load_profile("h100-8")
    roots = make_node_roots(tmp_path / "node", machine)
    profile = write_fake_profile(machine, tmp_path / "h100-8.profile")
    env = fake_nvml_environ(fake_nvml_lib, profile, base=base_env)
    env |= {
        "GPUCTK_NVML_LIBRARY": str(fake_nvml_lib),
        "NVIDIA_DRIVER_ROOT": str(driver_root),
        "NVIDIA_DEV_ROOT": str(roots.dev_root),
    }
    third = dpkg("-i", str(deb), env=env)
    assert third.returncode == 0, third.stdout + third.stderr
    spec: dict[str, Any] = yaml.safe_load(SPEC.read_text())
    names = {d["name"] for d in spec["devices"]}
    assert {str(i) for i in range(8)} | {"all"} <= names
    # the default: the folder spec, its stage in the default staging dir, the compiled front
    assert [h["path"] for h in spec["containerEdits"]["hooks"]] == ["/usr/bin/gpuctk-cdi-hook"]
    (staged,) = [m for m in spec["containerEdits"]["mounts"]
                 if m["containerPath"] == "/usr/local/nvidia"]  # fmt: skip
    assert staged["hostPath"].startswith(f"{STAGES}/535.309.01-")
    assert (Path(staged["hostPath"]) / "lib64/libcuda.so.1").is_symlink()

    # the installed units are valid systemd units (their ExecStart exists now)
    if shutil.which("systemd-analyze"):
        units = [f"/usr/lib/systemd/system/gpuctk-cdi-refresh.{k}" for k in ("service", "path")]
        units.append("/usr/lib/systemd/system/gpuctk-device-plugin.service")
        verify = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", *units], capture_output=True, text=True
        )
        assert verify.returncode == 0, verify.stdout + verify.stderr

    # the launchers are isolated: a planted gpuctk package on PYTHONPATH never loads
    evil = tmp_path / "evil" / "gpuctk"
    evil.mkdir(parents=True)
    (evil / "__init__.py").write_text("raise SystemExit('planted module ran')\n")
    for name in ("gpuctk", "gpuctk-hook"):
        proc = subprocess.run(
            [f"/usr/bin/{name}", "--help" if name == "gpuctk" else "--version"],
            capture_output=True,
            text=True,
            env=base_env | {"PYTHONPATH": str(evil.parent)},
            check=False,
        )
        assert "planted module ran" not in proc.stdout + proc.stderr
    help_ = subprocess.run(
        ["/usr/bin/gpuctk", "install", "--help"], capture_output=True, text=True, env=base_env
    )
    assert help_.returncode == 0 and "--host-root" in help_.stdout
    # what gpuctk-device-plugin.service runs, from the installed launcher and venv
    listed_plugin = subprocess.run(
        ["/usr/bin/gpuctk", "device-plugin", "--simulate", "h100-8", "--list"],
        capture_output=True, text=True, env=base_env, check=False,
    )  # fmt: skip
    assert listed_plugin.returncode == 0, listed_plugin.stderr
    assert len(yaml.safe_load(listed_plugin.stdout)["resources"]["nvidia.com/gpu"]) == 8
    # the shipped bytecode is valid once installed: those runs wrote nothing under /opt/gpuctk
    listed = set(dpkg("-L", "gpuctk").stdout.splitlines())
    on_disk = {str(p) for p in Path("/opt/gpuctk").rglob("*") if not p.is_dir()}
    assert on_disk - listed == set()

    # one container through runc via the installed shim, shipped config, installed hook
    done = _installed_container(tmp_path, fresh_rootfs, ["NVIDIA_VISIBLE_DEVICES=0"])
    nodes = {n["path"] for n in spec["containerEdits"].get("deviceNodes", [])}
    nodes |= {n["path"] for d in spec["devices"] if d["name"] == "0"
              for n in d["containerEdits"]["deviceNodes"]}  # fmt: skip
    check_nodes(done, nodes)
    assert "/dev/nvidia1" not in seen(done.stdout, "NODE")
    assert "LDCACHE libcuda.so.1" in done.stdout.splitlines()

    # a folder-mode spec written by the admin elsewhere stages the driver in the default dir
    own = tmp_path / "compute.json"
    folder = subprocess.run(
        ["/usr/bin/gpuctk", "cdi", "generate", "--simulate", "l4", "--driver-root",
         str(driver_root), "--library-mode", "folder", "--driver-capabilities",
         "utility,compute", "-o", str(own)],
        capture_output=True, text=True, env=base_env, check=False,
    )  # fmt: skip
    assert folder.returncode == 0, folder.stderr
    stages = list(Path(STAGES).iterdir())  # the default spec's and the compute-only one
    assert len(stages) == 2 and all((s / "lib64/libcuda.so.1").is_symlink() for s in stages)

    # 4. remove: only the conffile and the driver stage stay, with the admin's edit
    config = Path("/etc/gpuctk/config.toml")
    config.write_text(config.read_text() + 'log-level = "debug"\n')
    removed = dpkg("-r", "gpuctk")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert not SPEC.exists()
    left = {k: v for k, v in snapshot().items() if before.get(k) != v}
    assert (stages[0] / "lib64/libcuda.so.1").is_symlink()  # the admin's spec still works
    assert {k for k in left if not k.startswith("/var/lib/gpuctk")} == {
        "/etc/gpuctk/config.toml"
    }, sorted(left)
    assert 'log-level = "debug"' in config.read_text()
    status = dpkg("-s", "gpuctk").stdout
    assert "Status: deinstall ok config-files" in status

    # 5. purge: nothing left
    purged = dpkg("-P", "gpuctk")
    assert purged.returncode == 0, purged.stdout + purged.stderr
    assert snapshot() == before
    assert dpkg("-s", "gpuctk").returncode != 0
