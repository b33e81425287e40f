"""Environment leaks and image binaries: nothing from the container's environment or image runs
on the host.

- The isolated launchers (`#!python -I`) ignore PYTHONPATH, PYTHONHOME, PYTHONSTARTUP,
  PYTHONINSPECT and a planted sitecustomize; pip's console scripts do not (the control run
  proves the planted code would be noticed).
- Every hook entry gpuctk writes (the generator's spec, the containerd base spec, the podman
  hooks.d file, the shim's config.json, even for a spec hook that has none) carries a non-empty
  env: with REAL runc, a spec hook without one still does not see the container's LD_PRELOAD,
  which names a library planted in the image (marker file).
- No binary of the image runs: a fake /sbin/ldconfig (and .real, /usr/sbin, /bin/sh), an
  /etc/ld.so.preload; the host's static ldconfig builds the cache, confined to the root.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fixtures.images import make_bundle, unique_name
from secworld import FOLDER, LIB, World, assert_safe, run_tool

PLANT_SITE = """
import os
open(os.path.join({markers!r}, "python-env-ran-" + str(os.getpid())), "w").close()
"""


def _plant_python(tmp: Path, markers: Path) -> dict[str, str]:
    """A PYTHONPATH folder with sitecustomize.py and a shadow `gpuctk` package, a PYTHONSTARTUP
    file: each writes a marker when Python runs it."""
    evil = tmp / "evil-pythonpath"
    (evil / "gpuctk/hook").mkdir(parents=True)
    code = PLANT_SITE.format(markers=str(markers))
    (evil / "sitecustomize.py").write_text(code)
    (evil / "usercustomize.py").write_text(code)
    (evil / "gpuctk/__init__.py").write_text(code)
    (evil / "gpuctk/hook/__init__.py").write_text(code)
    (evil / "startup.py").write_text(code)
    return {
        "PYTHONPATH": str(evil),
        "PYTHONSTARTUP": str(evil / "startup.py"),
        "PYTHONINSPECT": "1",
        "PYTHONUSERBASE": str(evil),
        "PYTHONSAFEPATH": "",
    }


def test_launchers_ignore_python_variables(world: World, bindir: Path) -> None:
    env = _plant_python(world.tmp, world.markers)
    args = ["createContainer", "--link", f"libfoo.so.1.2.3::{FOLDER}/libfoo.so.1"]
    done = run_tool(bindir / "gpuctk-hook", args, world.state(), {**env, "PYTHONHOME": "/none"})
    assert done.returncode == 0, done.stderr
    assert os.readlink(world.root / FOLDER.lstrip("/") / "libfoo.so.1") == "libfoo.so.1.2.3"
    first = (bindir / "gpuctk-hook").read_text().splitlines()[0]
    assert first.startswith(f"#!{sys.executable} -I"), first
    # the shim's launcher too: `state` passes straight through to the (fake) runtime
    runtime = world.tmp / "fake-runc"
    runtime.write_text(f'#!/bin/sh\necho "$@" > {world.tmp}/runtime-argv\n')
    runtime.chmod(0o755)
    (world.tmp / "config.toml").write_text(f'runtimes = ["{runtime}"]\n')
    shim_env = {**env, "PYTHONHOME": "/none", "GPUCTK_CONFIG": str(world.tmp / "config.toml")}
    done = run_tool(bindir / "gpuctk-runtime", ["state", "ctr"], b"", shim_env)
    assert done.returncode == 0, done.stderr
    assert (world.tmp / "runtime-argv").read_text() == "state ctr\n"
    assert os.listdir(world.markers) == []
    # Control: pip's console script honours the same variables, and the plant is noticed.
    control = run_tool(Path(sys.executable).parent / "gpuctk-hook", ["--version"], b"", env)
    assert any(n.startswith("python-env-ran-") for n in os.listdir(world.markers)), control
    for name in os.listdir(world.markers):
        os.unlink(world.markers / name)


def test_every_hook_entry_gpuctk_writes_has_an_explicit_env(bindir: Path, tmp_path: Path) -> None:
    from gpuctk.containerd import ocispec, podman

    spec_path = tmp_path / "nvidia.json"
    done = subprocess.run(
        [str(bindir / "gpuctk"), "cdi", "generate", "--simulate", "h100-8", "-o", str(spec_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    spec = json.loads(spec_path.read_text())
    hooks = list(spec["containerEdits"].get("hooks", []))
    hooks += [h for d in spec["devices"] for h in d["containerEdits"].get("hooks", [])]
    assert hooks
    written = [
        *hooks,
        ocispec.hook_entry("/usr/bin/gpuctk-hook"),
        podman.hooks_json("/usr/bin/gpuctk-hook")["hook"],
        *(h for hs in ocispec.base_spec("/usr/bin/gpuctk-hook")["hooks"].values() for h in hs),
    ]
    packaged = Path(__file__).parents[2] / "packaging/hooks.d/gpuctk-hook.json"
    written.append(json.loads(packaged.read_text())["hook"])
    for entry in written:
        env = entry.get("env")
        assert env and all("=" in e for e in env), entry
        assert not any(e.startswith(("LD_", "PYTHON")) for e in env), entry


SPEC_HOOK_WITHOUT_ENV = {
    "cdiVersion": "0.5.0",
    "kind": "example.com/gpu",
    "devices": [{"name": "all", "containerEdits": {"env": ["GPU_SEEN=all"]}}],
    "containerEdits": {
        "hooks": [
            {
                "hookName": "createContainer",
                "path": "/bin/sh",
                "args": ["sh", "-c", "env > {out}/hook-env"],
            }
        ]
    },
}


def _shim_world(tmp: Path, runtime: str, out: Path) -> tuple[Path, dict[str, str]]:
    cdi = tmp / "cdi"
    cdi.mkdir()
    spec = json.loads(json.dumps(SPEC_HOOK_WITHOUT_ENV).replace("{out}", str(out)))
    (cdi / "example.json").write_text(json.dumps(spec))
    conf = tmp / "config.toml"
    conf.write_text(
        f'runtimes = ["{runtime}"]\nspec-dirs = ["{cdi}"]\ndefault-kind = "example.com/gpu"\n'
    )
    return conf, {"GPUCTK_CONFIG": str(conf)}


def test_shim_gives_a_spec_hook_without_env_an_explicit_one(bindir: Path, tmp_path: Path) -> None:
    runtime = tmp_path / "fake-runc"
    runtime.write_text(f"#!/bin/sh\ncp config.json {tmp_path}/seen.json\n")
    runtime.chmod(0o755)
    _, env = _shim_world(tmp_path, str(runtime), tmp_path)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    container_env = ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all", "LD_PRELOAD=/x.so"]
    config = {"ociVersion": "1.0.2", "root": {"path": "rootfs"}, "process": {"env": container_env}}
    (bundle / "config.json").write_text(json.dumps(config))
    done = run_tool(
        bindir / "gpuctk-runtime", ["create", "--bundle", str(bundle), "c"], b"", env, bundle
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    entries = seen["hooks"]["createContainer"]  # the spec's, and the node guard's
    assert entries and all(
        e["env"] and not any(v.startswith("LD_") for v in e["env"]) for e in entries
    )


@pytest.mark.integration
def test_container_ld_preload_never_reaches_a_hook_under_runc(
    bindir: Path, tmp_path: Path, fresh_rootfs: Any, libmarker: Any
) -> None:
    """runc 1.1 runs a createContainer hook whose env is empty with the CONTAINER's env, in the
    rootfs as cwd: LD_PRELOAD=lib/libmarker.so would load the image's library into a host
    binary (/bin/sh here). Through the shim the hook entry has an explicit env: no marker."""
    if shutil.which("runc") is None or os.geteuid() != 0:
        pytest.skip("needs root and runc")
    markers = tmp_path / "markers"
    markers.mkdir()
    rootfs = fresh_rootfs("debian")
    shutil.copy(libmarker(markers), rootfs / "lib/libmarker.so")
    _, env = _shim_world(tmp_path, shutil.which("runc") or "runc", markers)
    container_env = [
        "PATH=/bin:/usr/bin",
        "NVIDIA_VISIBLE_DEVICES=all",
        f"LD_PRELOAD=lib/libmarker.so:{rootfs}/lib/libmarker.so",
        "LD_LIBRARY_PATH=lib",
        "PYTHONPATH=/evil",
        "PYTHONSTARTUP=/evil/x.py",
        "SECRET_OF_THE_CONTAINER=1",
    ]
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["/bin/true"], env=container_env)
    name = unique_name("gpuctk-sec-env")
    try:
        args = ["--root", str(tmp_path / "runc-state"), "run", "--bundle", str(bundle), name]
        done = run_tool(bindir / "gpuctk-runtime", args, b"", env, bundle, timeout=120)
    finally:
        subprocess.run(
            ["runc", "--root", str(tmp_path / "runc-state"), "delete", "--force", name],
            capture_output=True,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    hook_env = (markers / "hook-env").read_text()  # the hook ran
    assert "LD_PRELOAD" not in hook_env and "SECRET_OF_THE_CONTAINER" not in hook_env
    assert "PYTHONPATH" not in hook_env
    assert sorted(os.listdir(markers)) == ["hook-env"], "the planted library was loaded"
    assert not (rootfs / "preload-ran-in-cwd").exists()


@pytest.mark.parametrize("ldconfig", [None, "/sbin/ldconfig", "@/sbin/ldconfig"])
def test_image_ldconfig_never_runs_host_one_does(
    world: World, bindir: Path, ldconfig: str | None
) -> None:
    args = ["update-ldcache", "--folder", FOLDER]
    if ldconfig:
        args += ["--ldconfig-path", ldconfig]
    done = run_tool(
        bindir / "gpuctk-hook", args, world.state(), {"LD_PRELOAD": "/lib/libmarker.so"}
    )
    assert done.returncode == 0, done.stderr
    listing = subprocess.run(
        ["/sbin/ldconfig", "-p", "-C", str(world.root / "etc/ld.so.cache")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"libfoo.so.1 (libc6,x86-64) => {FOLDER}/libfoo.so.1" in listing
    # world's teardown: no marker from /sbin/ldconfig*, /usr/sbin/ldconfig, /bin/sh, preload


@pytest.mark.parametrize(
    "ldconfig, expect",
    [
        ("{root}/sbin/ldconfig", "script"),  # the image's, by its host path: a script
        ("{root}/lib/libmarker.so", "not an executable"),
        ("/bin/true", "dynamically linked"),
    ],
)
def test_ldconfig_path_into_the_image_is_refused(
    world: World, bindir: Path, ldconfig: str, expect: str
) -> None:
    path = ldconfig.format(root=world.root)
    args = ["update-ldcache", "--folder", FOLDER, "--ldconfig-path", path]
    done = run_tool(bindir / "gpuctk-hook", args, world.state(), {"GPUCTK_LDCONFIG": path})
    assert done.returncode == 1 and expect in done.stderr, done.stderr
    assert_safe(done)
    assert not (world.root / LIB.lstrip("/")).with_name("libfoo.so.1").exists()
