"""REAL runc, `gpuctk-hook prestart` in config.json, NO shim, and the DEFAULT folder spec.

The spec comes from `gpuctk cdi generate --simulate l4 --library-mode folder` over the Debian
535 driver root (a private staging dir): its one hook entry names the compiled front,
`gpuctk-cdi-hook createContainer --link FIRMWARE... --link-for CAP:CONFIG... --folder
/usr/local/nvidia/lib64`. In prestart mode nothing runs that entry (the runtime read
config.json before the hook added it), so the prestart hook must do its work itself, in the
container's mount namespace. A prestart hook placed before
gpuctk's gives the container's /proc a driver params file that says `ModifyDeviceFiles: 1`
(these machines load no driver; this is what the guard reads). Inside:

- the firmware links into the stage (/lib/firmware/nvidia/535.309.01/gsp_*.bin) resolve;
- a config file whose capability NVIDIA_DRIVER_CAPABILITIES asks for is linked (compute:
  OpenCL's ICD file; graphics: Vulkan's), one whose capability it does not ask for is not;
- /proc/driver/nvidia/params reads `ModifyDeviceFiles: 0` (the device node guard's copy),
  and is mounted read-only;
- `ldconfig -p` lists libcuda.so.1 from /usr/local/nvidia/lib64 (the entry's --folder).

config.json is never rewritten, and the host's mount table is what it was before each run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.gpucheck import PARAMS
from fixtures.images import hook_path, make_bundle, run_container, unique_name
from fixtures.podman import generate_spec

pytestmark = pytest.mark.integration

PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FIRMWARE = "/lib/firmware/nvidia/535.309.01"
GSP = ("gsp_ga10x.bin", "gsp_tu10x.bin")  # the driver root's GSP firmware files
OPENCL = "/etc/OpenCL/vendors/nvidia.icd"  # a compute config file
VULKAN = "/etc/vulkan/icd.d/nvidia_icd.json"  # a graphics config file, where NVIDIA puts it
STAGE_LIB = "/usr/local/nvidia/lib64"
SCRIPT = (
    r"""
for f in FIRMWARE/gsp_ga10x.bin FIRMWARE/gsp_tu10x.bin OPENCL VULKAN; do
    [ -L "$f" ] && echo "LINK $f $(readlink "$f")"
    [ -f "$f" ] && echo "FILE $f"
done
sed 's/^/PARAMS /' /proc/driver/nvidia/params 2>&1
awk '$5 == "/proc/driver/nvidia/params" {print "PARAMSOPTS", $6}' /proc/self/mountinfo
ldconfig -p | awk '$1 == "libcuda.so.1" {print "LDCACHE", $NF}'
true
""".replace("FIRMWARE", FIRMWARE)
    .replace("OPENCL", OPENCL)
    .replace("VULKAN", VULKAN)
)


def fake_driver_hook(rootfs: Path) -> dict[str, Any]:
    """A prestart hook (run in the runtime's namespaces, before gpuctk's) that gives the
    container's /proc a driver params file, in the container's mount namespace
    (fixtures.gpucheck.fake_driver_hook does it as a createContainer hook, which runs after
    the prestart ones)."""
    here = f"{rootfs}/proc/driver"
    inner = (
        f"mount -t tmpfs -o size=64k gpuctk-test {here} && mkdir {here}/nvidia && "
        f'printf "$1" > {here}/nvidia/params'
    )
    pid = f"{sys.executable} -c 'import json, sys; print(json.load(sys.stdin)[\"pid\"])'"
    data = PARAMS.replace("\n", "\\n")
    script = f"pid=$({pid}) && exec nsenter --mount=/proc/$pid/ns/mnt sh -c '{inner}' sh '{data}'"
    return {"path": "/bin/sh", "args": ["sh", "-c", script], "env": [PATH_ENV]}


class Node:
    """The folder spec's dir, its gpuctk config file and the spec's hook entry."""

    def __init__(self, work: Path, driver_root: Path) -> None:
        extra = ("--staging-dir", str(work / "staging"))
        self.spec = generate_spec(work, driver_root, "l4", "folder", extra=extra)
        (self.entry,) = self.spec["containerEdits"]["hooks"]
        self.toml = work / "gpuctk.toml"
        self.toml.write_text(f'spec-dirs = ["{work / "folder" / "cdi"}"]\n')


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, driver_root: Path) -> Node:
    if os.geteuid() != 0 or shutil.which("runc") is None or shutil.which("nsenter") is None:
        pytest.skip("needs root, runc and nsenter")
    made = Node(tmp_path_factory.mktemp("prestart-folder"), driver_root)
    args = made.entry["args"]
    # what this file is about: the default spec's entry names the compiled front
    assert os.path.basename(made.entry["path"]) == "gpuctk-cdi-hook", made.entry
    assert args[:2] == ["gpuctk-cdi-hook", "createContainer"]
    assert f"compute:/usr/local/nvidia/files{OPENCL}::{OPENCL}" in args
    assert f"graphics:/usr/local/nvidia/files{VULKAN}::{VULKAN}" in args
    assert f"/usr/local/nvidia/files{FIRMWARE}/{GSP[0]}::{FIRMWARE}/{GSP[0]}" in args
    return made


CHECKOUT = Path(__file__).resolve().parents[2]


def mountinfo(base: Path) -> list[str]:
    """The host's mounts that involve this checkout or this run's pytest folder `base`."""
    ours = (f" {CHECKOUT}/", f" {base}/")
    with open("/proc/self/mountinfo") as f:
        return sorted(line for line in f.read().splitlines() if any(o in line for o in ours))


@pytest.fixture
def prestart(
    node: Node, tmp_path: Path, fresh_rootfs: Callable[[str], Path]
) -> Iterator[Callable[..., subprocess.CompletedProcess[str]]]:
    """Factory: (env, stage="prestart") -> the finished `runc run` of SCRIPT."""
    count = 0

    def run(env: list[str], stage: str = "prestart") -> subprocess.CompletedProcess[str]:
        nonlocal count
        count += 1
        rootfs = fresh_rootfs("debian")
        fake = fake_driver_hook(rootfs)
        hook = {
            "path": hook_path(),
            "args": ["gpuctk-hook", stage],
            "env": [PATH_ENV, f"GPUCTK_CONFIG={node.toml}", f"GPUCTK_HOOK_LOG={tmp_path}/hook.log"],
        }
        bundle = make_bundle(
            tmp_path / f"bundle-{count}",
            rootfs,
            ["/bin/sh", "-c", SCRIPT],
            env=[PATH_ENV, *env],
            hooks={stage: [fake, hook]},
        )
        config_before = (bundle / "config.json").read_bytes()
        before = mountinfo(tmp_path.parent)
        done = run_container(["runc"], bundle, unique_name("gpuctk-prestart-folder"))
        assert mountinfo(tmp_path.parent) == before  # nothing left mounted on the host
        assert (bundle / "config.json").read_bytes() == config_before  # no shim involved
        return done

    yield run


def seen(out: str, tag: str) -> set[str]:
    return {line.split(" ", 1)[1] for line in out.splitlines() if line.startswith(tag + " ")}


def check_common(done: subprocess.CompletedProcess[str]) -> None:
    """Firmware links, the guard's params copy and the ld cache: every GPU container's."""
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    links, files = seen(done.stdout, "LINK"), seen(done.stdout, "FILE")
    for name in GSP:
        path = f"{FIRMWARE}/{name}"
        assert f"{path} /usr/local/nvidia/files{path}" in links, done.stdout
        assert path in files, done.stdout  # the link resolves, into the stage
    params = seen(done.stdout, "PARAMS")
    assert "ModifyDeviceFiles: 0" in params, done.stdout
    assert "ModifyDeviceFiles: 1" not in params
    (opts,) = seen(done.stdout, "PARAMSOPTS")
    assert "ro" in opts.split(","), opts
    assert f"{STAGE_LIB}/libcuda.so.1" in seen(done.stdout, "LDCACHE"), done.stdout


@pytest.mark.parametrize("stage", ["prestart", "createRuntime"])
def test_folder_spec_entry_runs_in_prestart_mode(prestart: Any, stage: str) -> None:
    done = prestart(
        ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"], stage=stage
    )
    check_common(done)
    files = seen(done.stdout, "FILE")
    assert OPENCL in files  # compute asked for: its config file linked
    assert f"{OPENCL} /usr/local/nvidia/files{OPENCL}" in seen(done.stdout, "LINK")
    assert VULKAN not in files and not any(
        line.startswith(VULKAN) for line in seen(done.stdout, "LINK")
    )  # graphics not asked for: not linked


def test_link_for_follows_the_asked_capabilities(prestart: Any) -> None:
    done = prestart(["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=graphics,utility"])
    check_common(done)
    files = seen(done.stdout, "FILE")
    assert VULKAN in files  # graphics asked for
    assert OPENCL not in files and not any(
        line.startswith(OPENCL) for line in seen(done.stdout, "LINK")
    )


def test_nothing_requested_gets_nothing(prestart: Any) -> None:
    done = prestart([])
    assert done.returncode == 0, done.stderr
    assert not seen(done.stdout, "LINK") and not seen(done.stdout, "FILE")
    assert "ModifyDeviceFiles: 1" in seen(done.stdout, "PARAMS")  # the fake, left alone
    assert not seen(done.stdout, "LDCACHE")


def test_the_plan_takes_the_entry_as_gpuctks(node: Node) -> None:
    """The folder spec's entry, read by the prestart plan: gpuctk's work, none left undone."""
    from gpuctk.hook.verbs import prestart as mode

    doc: dict[str, Any] = {"process": {"env": []}, "mounts": [], "linux": {}}
    todo = mode.plan(doc, json.loads(json.dumps(node.spec["containerEdits"])))
    assert todo.hooks == [node.entry["args"][1:]] and todo.skipped == []
    (env,) = todo.hook_env
    assert env["GPUCTK_DRIVER_VERSION"] == "535.309.01"  # its facts, as gpuctk-hook gets them
