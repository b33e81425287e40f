"""podman 4.3.1 with gpuctk's hooks.d file and no CDI support involved.

podman reads the hook from a private `--hooks-dir` holding packaging/hooks.d/gpuctk-hook.json,
with only the hook's path (the venv's gpuctk-hook) and its env (GPUCTK_CONFIG naming a temp spec
dir) changed; the container asks with `--annotation cdi.k8s.io/gpu=nvidia.com/gpu=0`, not
`--device`: the file's `when` matches CDI annotations only. runc runs the hook at prestart. The
same file with the `precreate` verb and stage is checked too: podman hands the hook config.json
and runs what it prints (the CDI edits applied, as the shim would).

hooks.d cannot match the environment, so an image's NVIDIA_VISIBLE_DEVICES=all alone (as uid
65534) runs no hook and gets no GPU: with `when: always` such a container gets every GPU.

Inside: exactly /dev/nvidia0 and the control nodes; /dev/nvidia0 opens with ENXIO (allowed by the
device cgroup) while a GPU node bind-mounted with -v gives EPERM; libcuda.so.535.309.01 mounted;
`ldconfig -p` lists libcuda.so.1; NVIDIA_DRIVER_CAPABILITIES=utility leaves libcuda out; no
annotation: nothing. The host's mount table is unchanged by each run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.devroot import make_node_roots
from fixtures.images import hook_path
from fixtures.podman import private_podman

from gpuctk.cdi.node.profile import load_profile

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
HOOKS_JSON = REPO / "packaging/hooks.d/gpuctk-hook.json"
BIN = Path(sys.executable).parent
IMAGE = "localhost/gpuctk-hooksd-debian:latest"
LIBDIR = "/usr/lib/x86_64-linux-gnu/nvidia/current"
CONTROL = {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}
SCRIPT = r"""
for f in /dev/nvidia* /dev/nvidia-caps/*; do [ -c "$f" ] && echo "NODE $f"; done
for f in /dev/nvidia[0-9]* /dev/blocked-gpu; do
    [ -c "$f" ] && (: < "$f") 2>&1 | sed "s|^|OPEN $f |"
done
ls LIBDIR 2>/dev/null | sed 's/^/LIB /'
ldconfig -p | grep -q 'libcuda.so.1 ' && echo LDCACHE libcuda.so.1
true
""".replace("LIBDIR", LIBDIR)


class Podman:
    def __init__(self, base: list[str], blocked: Path, hooks: dict[str, Path], log: Path) -> None:
        self.base, self.blocked, self.hooks, self.log = base, blocked, hooks, log

    def run(
        self, stage: str, env: list[str], extra: tuple[str, ...] = ()
    ) -> subprocess.CompletedProcess[str]:
        flags = [f for e in env for f in ("-e", e)] + list(extra)
        argv = [
            *self.base, "--hooks-dir", str(self.hooks[stage]), "run", "--rm",
            "--network", "none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
            "-v", f"{self.blocked}:/dev/blocked-gpu", *flags, IMAGE, "/bin/sh", "-c", SCRIPT,
        ]  # fmt: skip
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def hooks_dir(folder: Path, stage: str, toml: Path, log: Path) -> Path:
    """packaging's hooks.d file, pointed at the venv's hook and the test's config."""
    doc: dict[str, Any] = json.loads(HOOKS_JSON.read_text())
    doc["hook"]["path"] = hook_path()
    doc["hook"]["env"] += [f"GPUCTK_CONFIG={toml}", f"GPUCTK_HOOK_LOG={log}"]
    if stage == "precreate":
        doc["hook"]["args"] = ["gpuctk-hook", "precreate"]
        doc["stages"] = ["precreate"]
    folder.mkdir()
    (folder / "gpuctk-hook.json").write_text(json.dumps(doc, indent=2))
    return folder


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory, driver_root: Path) -> Iterator[Podman]:
    if os.geteuid() != 0 or shutil.which("podman") is None or shutil.which("runc") is None:
        pytest.skip("needs root, podman and runc")
    work = tmp_path_factory.mktemp("hooksd")
    roots = make_node_roots(work / "node", load_profile("h100-8"))
    spec_dir = work / "cdi"
    spec_dir.mkdir()
    gen = subprocess.run(
        [
            str(BIN / "gpuctk"), "cdi", "generate", "--simulate", "h100-8",
            "--driver-root", str(driver_root), "--dev-root", str(roots.dev_root),
            "--proc-root", str(roots.proc_root), "--sys-root", str(roots.sys_root),
            "--hook-path", hook_path(), "--output", str(spec_dir / "nvidia.json"),
            "--library-mode", "hook",
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert gen.returncode == 0, gen.stderr
    toml = work / "gpuctk.toml"
    toml.write_text(f'spec-dirs = ["{spec_dir}"]\n')
    hooks = {
        s: hooks_dir(work / f"hooks-{s}", s, toml, work / "hook.log")
        for s in ("prestart", "precreate")
    }
    with private_podman(work, IMAGE) as base:
        pm = Podman(base, roots.dev_root / "dev/nvidia7", hooks, work / "hook.log")
        warm = pm.run("prestart", [])  # podman's own first-run mounts happen here
        assert warm.returncode == 0, warm.stderr
        yield pm


CHECKOUT = Path(__file__).resolve().parents[2]


def mountinfo(base: Path) -> list[str]:
    """The host's mounts that involve this checkout or this run's pytest folder `base` (a
    leaked bind shows there, by its source or its target; podman's own storage is there
    too); other processes may mount elsewhere meanwhile."""
    ours = (f" {CHECKOUT}/", f" {base}/")
    with open("/proc/self/mountinfo") as f:
        return sorted(line for line in f.read().splitlines() if any(o in line for o in ours))


def run(
    podman: Podman, stage: str, env: list[str], extra: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    base = podman.log.parent.parent  # the work folder's parent: this run's pytest folder
    before = mountinfo(base)
    done = podman.run(stage, env, extra)
    assert mountinfo(base) == before
    return done


def seen(out: str, tag: str) -> set[str]:
    return {line.split(" ", 1)[1] for line in out.splitlines() if line.startswith(tag + " ")}


def opened(out: str, path: str) -> str:
    lines = [ln for ln in out.splitlines() if ln.startswith(f"OPEN {path} ")]
    assert len(lines) == 1, out
    return lines[0]


STAGES = ["prestart", "precreate"]


def ask(device: str) -> tuple[str, ...]:
    """The podman flags that ask for `device` by CDI annotation."""
    return ("--annotation", f"cdi.k8s.io/gpu=nvidia.com/gpu={device}")


@pytest.mark.parametrize("stage", STAGES)
def test_one_gpu(podman: Podman, stage: str) -> None:
    done = run(podman, stage, [], ask("0"))
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert seen(done.stdout, "NODE") == CONTROL | {"/dev/nvidia0"}
    assert "No such device or address" in opened(done.stdout, "/dev/nvidia0")
    assert "Operation not permitted" in opened(done.stdout, "/dev/blocked-gpu")
    assert "libcuda.so.535.309.01" in seen(done.stdout, "LIB")
    assert "LDCACHE libcuda.so.1" in done.stdout.splitlines()


@pytest.mark.parametrize("stage", STAGES)
def test_driver_capabilities_utility(podman: Podman, stage: str) -> None:
    done = run(podman, stage, ["NVIDIA_DRIVER_CAPABILITIES=utility"], ask("0"))
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    libs = seen(done.stdout, "LIB")
    assert "libnvidia-ml.so.535.309.01" in libs
    assert not any(lib.startswith("libcuda.so") for lib in libs)
    assert "LDCACHE" not in done.stdout
    assert "No such device or address" in opened(done.stdout, "/dev/nvidia0")


@pytest.mark.parametrize("stage", STAGES)
def test_nothing_requested(podman: Podman, stage: str) -> None:
    done = run(podman, stage, [])
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert seen(done.stdout, "NODE") == set() and not seen(done.stdout, "LIB")
    assert "Operation not permitted" in opened(done.stdout, "/dev/blocked-gpu")


@pytest.mark.parametrize("stage", STAGES)
def test_an_image_env_alone_runs_no_hook(podman: Podman, stage: str) -> None:
    """NVIDIA_VISIBLE_DEVICES=all, as the image's env would set it, in a uid 65534 container:
    no CDI annotation, so the hook does not run and no GPU node appears."""
    podman.log.write_text("")
    done = run(podman, stage, ["NVIDIA_VISIBLE_DEVICES=all"], ("--user", "65534:65534"))
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert seen(done.stdout, "NODE") == set() and not seen(done.stdout, "LIB")
    assert "Operation not permitted" in opened(done.stdout, "/dev/blocked-gpu")
    assert podman.log.read_text() == ""  # the hook never ran


@pytest.mark.parametrize("stage", STAGES)
def test_unknown_device_fails(podman: Podman, stage: str) -> None:
    done = run(podman, stage, [], ask("9"))
    assert done.returncode != 0
    if stage == "prestart":
        assert "nvidia.com/gpu=9" in done.stderr  # runc passes the hook's stderr on
    else:  # podman 4.3 shows only the precreate hook's exit status: the hook log has it
        assert "precreate" in done.stderr
        assert "unknown CDI device nvidia.com/gpu=9" in podman.log.read_text()
