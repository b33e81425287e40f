"""The driver layouts of real nodes, each beside NVIDIA's spec of the same layout.

The layouts (tests/data/driver_layouts.json, laid out by fixtures.driver_layouts with the Debian
535 driver's real files):

- gke: the H200 node's (GKE, Ubuntu 24.04): the driver whole under /usr/local/nvidia (bin/,
  lib64/, lib -> lib64, firmware/nvidia/<version>/), lib64 in the root's ld cache through
  /etc/ld.so.conf.d, /usr/bin/nvidia-smi a shell wrapper that execs the prefix's program;
  --driver-root is the node's root;
- cos: GKE's Container-Optimized OS, the driver under /home/kubernetes/bin/nvidia, no ld cache
  entry; --driver-root is the prefix itself, as the GPU Operator is set up there;
- operator: the GPU Operator's driver container seen at /run/nvidia/driver: a whole Ubuntu root
  (merged /usr) with the driver in usr/bin, usr/lib/x86_64-linux-gnu and lib/firmware and its
  own ld cache; --driver-root is that folder.

The comparison, tests/data/driver_layouts_nvidia.json, is what NVIDIA's own generator writes for
each layout (its mounts, device nodes and hooks). It was made, and is made again by anyone with
NVIDIA's binaries, with

    .venv/bin/python tests/fixtures/driver_layouts.py --nvidia-ctk-bin DIR

(DIR holding nvidia-ctk and nvidia-cdi-hook, v1.18.2 here): it lays out each layout the same
way, with the fake NVML serving profile l4 as libnvidia-ml, and runs `nvidia-ctk cdi generate
--driver-root ROOT` as bench/nvidiaspec.py does. gpuctk's spec of the same layout must carry
every library, program, firmware file, device node, library link and ld cache folder NVIDIA's
does, the few named in EXCEPTIONS aside.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fixtures.driver_layouts import NAMES, NVIDIA, PROFILE, Layout, build_layout, summary

from gpuctk.cdi import discover
from gpuctk.cdi.node.ldcache import read_ld_cache

GPUCTK = str(Path(sys.executable).with_name("gpuctk"))
ELF = b"\x7fELF"
PROGRAMS = ("nvidia-smi", "nvidia-debugdump", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server",
            "nvidia-persistenced")  # fmt: skip
PREFIX = {"gke": "/usr/local/nvidia", "cos": ""}  # where the driver sits, in --driver-root terms

# What NVIDIA's spec has and gpuctk's has not, or has otherwise: (layout or "*", what) -> why.
EXCEPTIONS = {
    ("gke", "mount /usr/bin/nvidia-smi"): (
        "NVIDIA mounts the wrapper script standing at /usr/bin/nvidia-smi, which execs "
        "/usr/local/nvidia/bin/nvidia-smi, a path a container does not have; gpuctk mounts that "
        "ELF program at /usr/bin/nvidia-smi"
    ),
}


def excepted(layout: str, what: str) -> bool:
    return (layout, what) in EXCEPTIONS or ("*", what) in EXCEPTIONS


@pytest.fixture(scope="module")
def nvidia(driver_version: str) -> dict[str, Any]:
    doc = json.loads(NVIDIA.read_text())
    assert doc["version"] == driver_version, f"{NVIDIA.name} is stale: make it again"
    layouts: dict[str, Any] = doc["layouts"]
    return layouts


@dataclass(frozen=True)
class Node:
    env: dict[str, str]  # a gpuctk that only a driver root can give NVML
    roots: tuple[str, ...]  # its --dev-root, --proc-root and --sys-root options


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, fake_nvml_lib: Path) -> Node:
    """The l4 machine's dev, proc and sys roots, and the environment of a gpuctk whose NVML is
    the fake in the driver root: served by it, and nowhere on the loader's path."""
    from fixtures.devroot import make_node_roots
    from fixtures.fake_nvml import write_fake_profile

    from gpuctk.cdi.node.profile import load_profile

    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has a real libnvidia-ml")
    base = tmp_path_factory.mktemp("node")
    roots = make_node_roots(base, load_profile(PROFILE))
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD", "GPUCTK_NVML_LIBRARY")}  # fmt: skip
    env["FAKE_NVML_PROFILE"] = str(write_fake_profile(PROFILE, base / "profile.txt"))
    return Node(env, ("--dev-root", str(roots.dev_root), "--proc-root", str(roots.proc_root),
                      "--sys-root", str(roots.sys_root)))  # fmt: skip


@pytest.fixture(scope="module")
def made() -> dict[str, tuple[Layout, dict[str, Any]]]:
    return {}


@pytest.fixture
def built(request: pytest.FixtureRequest, made: dict[str, tuple[Layout, dict[str, Any]]],
          tmp_path_factory: pytest.TempPathFactory, driver_root: Path, driver_version: str,
          fake_nvml_lib: Path, node: Node) -> tuple[Layout, dict[str, Any]]:  # fmt: skip
    """(the layout, gpuctk's hook-mode spec of it), made once per layout and module."""
    name: str = request.param
    if name not in made:
        target = tmp_path_factory.mktemp(name)
        layout = build_layout(name, target, driver_root, driver_version, fake_nvml_lib)
        if not layout.cached:
            pytest.skip("ldconfig -r needs root (chroot): the layout's root has no ld cache")
        out = target.parent / f"{name}.json"
        p = subprocess.run(
            [GPUCTK, "cdi", "generate", "--driver-root", str(layout.root), *node.roots,
             "--library-mode", "hook", "-o", str(out)],
            env=node.env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr
        made[name] = (layout, json.loads(out.read_text()))
    return made[name]


def by_layout(*names: str) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("built", names, indirect=True)


def _real(layout: Layout, host: str) -> str:
    return os.path.realpath(host.replace("<node>", str(layout.node)))


def _hook_args(hooks: list[list[str]], flag: str) -> set[str]:
    return {args[i + 1] for args in hooks for i, a in enumerate(args[:-1]) if a == flag}


def _links(hooks: list[list[str]], flag: str) -> set[str]:
    """The paths where the hooks make links (`--link TARGET::LINK`; gpuctk's `--link-for`
    adds a capability: `--link-for CAP:TARGET::LINK`)."""
    return {arg.rpartition("::")[2] for arg in _hook_args(hooks, flag)}


# --- the layouts ---------------------------------------------------------------------------------


@by_layout(*NAMES)
def test_the_layout_is_as_listed(built: tuple[Layout, dict[str, Any]]) -> None:
    layout, _ = built
    cache = layout.root / "etc/ld.so.cache"
    nvml = {e.key: e.value for e in read_ld_cache(str(cache))} if cache.exists() else {}
    if layout.name == "gke":
        assert nvml["libnvidia-ml.so.1"] == "/usr/local/nvidia/lib64/libnvidia-ml.so.1"
        assert not (layout.root / "usr/bin/nvidia-smi").read_bytes().startswith(ELF)
        assert (layout.root / "bin").readlink() == Path("usr/bin")  # the wrapper, twice
    elif layout.name == "cos":
        assert nvml == {} and (layout.root / "lib64/libcuda.so.1").is_symlink()
    else:
        # merged /usr: ldconfig names the library by /lib, as on any Ubuntu
        assert nvml["libnvidia-ml.so.1"] == "/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
        assert (layout.root / "lib").readlink() == Path("usr/lib")


# --- 1. NVML through the driver root's ld cache -------------------------------------------------


@by_layout("gke", "operator")
def test_nvml_is_found_through_the_roots_ld_cache(
    built: tuple[Layout, dict[str, Any]], node: Node, driver_version: str
) -> None:
    layout, spec = built
    found, looked = discover.find_nvml(str(layout.root))
    assert looked == (f"{layout.root}/etc/ld.so.cache",)  # the cache answered
    assert found is not None and found.endswith(f"/libnvidia-ml.so.{driver_version}")
    # the generator's own loader could not have found it: the spec's GPU came through the root's
    own = "import ctypes\ntry: ctypes.CDLL('libnvidia-ml.so.1')\nexcept OSError: print('none')"
    p = subprocess.run([sys.executable, "-c", own], env=node.env,
                       capture_output=True, text=True, check=False)  # fmt: skip
    assert p.stdout.strip() == "none", p.stderr
    assert "0" in {d["name"] for d in spec["devices"]}


# --- 2. the driver's ELF programs and its firmware ----------------------------------------------


@by_layout("gke", "cos")
def test_the_elf_programs_and_the_firmware_under_the_prefix_are_mounted(
    built: tuple[Layout, dict[str, Any]], driver_version: str
) -> None:
    layout, spec = built
    prefix = PREFIX[layout.name]
    mounts = {m["containerPath"]: m["hostPath"]
              for m in spec["containerEdits"]["mounts"]}  # fmt: skip
    where = "/usr/bin" if layout.name == "gke" else "/bin"
    for name in PROGRAMS:
        host = mounts[f"{where}/{name}"]
        assert host == f"{layout.root}{prefix}/bin/{name}"
        assert Path(host).read_bytes()[:4] == ELF
    firmware = f"/lib/firmware/nvidia/{driver_version}"
    for name in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
        want = f"{layout.root}{prefix}/firmware/nvidia/{driver_version}/{name}"
        assert mounts[f"{firmware}/{name}"] == want


# --- beside NVIDIA's spec -------------------------------------------------------------------------


@by_layout(*NAMES)
def test_the_spec_carries_what_nvidias_carries(
    built: tuple[Layout, dict[str, Any]], nvidia: dict[str, Any]
) -> None:
    layout, spec = built
    theirs, ours = nvidia[layout.name], summary(spec, layout)
    mounts = {c: _real(layout, h) for c, h in ours["mounts"]}
    missing = [
        f"mount {c}"
        for c, h in theirs["mounts"]
        if mounts.get(c) != _real(layout, h) and not excepted(layout.name, f"mount {c}")
    ]
    missing += [f"node {n}" for n in theirs["deviceNodes"] if n not in ours["deviceNodes"]]
    # a link is compared by where it is made (targets differ in form: libGLX_indirect.so.0 ->
    # libGLX_nvidia.so.0 here, -> libGLX_nvidia.so.<version> there)
    their_links = _links(theirs["hooks"], "--link")
    our_links = _links(ours["hooks"], "--link") | _links(ours["hooks"], "--link-for")
    missing += [f"link {link}" for link in sorted(their_links - our_links)
                if not excepted(layout.name, f"link {Path(link).name}")]  # fmt: skip
    folders = _hook_args(theirs["hooks"], "--folder") - _hook_args(ours["hooks"], "--folder")
    missing += [f"ld cache folder {f}" for f in sorted(folders)]
    assert missing == []


def test_every_exception_is_still_needed(nvidia: dict[str, Any]) -> None:
    """Each exception names something NVIDIA's recorded spec has."""
    for layout, what in EXCEPTIONS:
        kind, _, name = what.partition(" ")
        specs = nvidia.values() if layout == "*" else [nvidia[layout]]
        if kind == "mount":
            assert any(c == name for s in specs for c, _ in s["mounts"]), what
        else:
            links = set().union(*(_links(s["hooks"], "--link") for s in specs))
            assert any(Path(link).name == name for link in links), what
