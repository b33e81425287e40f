"""gpuctk-hook prestart without a container: the plan it derives, and its quick exits.

The plan is what the runtime would have done with the shim's config.json: the entries that
gpuctk.cdi.specs.apply added (device nodes with their filled-in owner, cgroup rules, mounts in depth
order, the argv of gpuctk's own createContainer entries, gpuctk-hook's or the folder spec's
compiled front's, with their machine facts), notes for what a prestart hook cannot apply, and
the hook entries it does not run.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuctk.errors import InputError, RequestError
from gpuctk.hook.verbs import hook_main, prestart

HOOK = str(Path(sys.executable).parent / "gpuctk-hook")
LIB = "/usr/lib/x86_64-linux-gnu"


def edits() -> dict[str, Any]:
    return {
        "env": [f"NVIDIA_CTK_LIBCUDA_DIR={LIB}", "NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [
            {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255, "fileMode": 438},
            {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0},
            {
                "path": "/dev/nvidia-caps/nvidia-cap1",
                "type": "c",
                "major": 509,
                "minor": 1,
                "permissions": "r",
            },
        ],
        "mounts": [
            {
                "hostPath": f"/drv{LIB}/libcuda.so.1",
                "containerPath": f"{LIB}/libcuda.so.1",
                "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"],
            },
            {
                "hostPath": "/drv/bin/nvidia-smi",
                "containerPath": "/usr/bin/nvidia-smi",
                "options": ["ro", "rbind"],
            },
            {
                "hostPath": "/run/nvidia-persistenced/socket",
                "containerPath": "/proc",
                "options": ["nosuid", "nodev", "noexec", "rbind"],
            },
        ],
        "hooks": [
            {
                "hookName": "createContainer",
                "path": "/usr/bin/gpuctk-hook",
                "args": ["gpuctk-hook", "createContainer", "--folder", LIB],
            },
            {
                "hookName": "createContainer",
                "path": "/usr/bin/nvidia-ctk",
                "args": ["nvidia-ctk", "hook", "update-ldcache"],
            },
        ],
    }


def config(env: list[str] | None = None) -> dict[str, Any]:
    return {
        "process": {"user": {"uid": 1000, "gid": 100}, "env": env or []},
        "root": {"path": "rootfs"},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        "linux": {"devices": [{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}]},
        "hooks": {"createContainer": [{"path": "/engine-hook"}]},
    }


def test_plan_collects_what_apply_added() -> None:
    doc = config()
    todo = prestart.plan(doc, edits())
    assert [d["path"] for d in todo.devices] == [
        "/dev/nvidiactl",
        "/dev/nvidia0",
        "/dev/nvidia-caps/nvidia-cap1",
    ]
    assert todo.devices[1] == {
        "path": "/dev/nvidia0",
        "type": "c",
        "major": 195,
        "minor": 0,
        "uid": 1000,
        "gid": 100,
    }
    assert todo.rules == [("c", 195, 255, "rwm"), ("c", 195, 0, "rwm"), ("c", 509, 1, "r")]
    # the CDI mount at /proc replaced the OCI one; all sorted by depth like the runtime's list
    assert [m["destination"] for m in todo.mounts] == [
        "/proc",
        "/usr/bin/nvidia-smi",
        f"{LIB}/libcuda.so.1",
    ]
    assert todo.hooks == [["createContainer", "--folder", LIB]]
    assert todo.skipped == [
        "createContainer hook nvidia-ctk hook update-ldcache not run (prestart mode)"
    ]
    # no note for the env every spec carries (NVIDIA_VISIBLE_DEVICES=void, the libcuda folder)
    assert not any("env edits" in n for n in todo.notes)


FRONT_ARGS = [
    "gpuctk-cdi-hook",
    "createContainer",
    "--link-for",
    "compute:/usr/local/nvidia/files/etc/OpenCL/vendors/nvidia.icd::/etc/OpenCL/vendors/nvidia.icd",
    "--link",
    "/usr/local/nvidia/files/lib/firmware/nvidia/535/gsp.bin::/lib/firmware/nvidia/535/gsp.bin",
    "--folder",
    "/usr/local/nvidia/lib64",
    "--disable-hook",
    "enable-cuda-compat",
]


def test_plan_takes_the_folder_specs_compiled_front() -> None:
    """The default spec's entry names gpuctk-cdi-hook: its work is gpuctk-hook's, done here,
    with the machine facts of its env (not its PATH or anything else)."""
    entry: Any = {
        "hookName": "createContainer",
        "path": "/usr/bin/gpuctk-cdi-hook",
        "args": FRONT_ARGS,
        "env": ["PATH=/usr/bin:/bin", "GPUCTK_DRIVER_VERSION=535.309.01", "LD_PRELOAD=/x.so"],
    }
    todo = prestart.plan(config(), {"hooks": [entry]})
    assert todo.hooks == [FRONT_ARGS[1:]]
    assert todo.hook_env == [{"GPUCTK_DRIVER_VERSION": "535.309.01"}]
    assert todo.skipped == [] and todo.notes == []


@pytest.mark.parametrize(
    ("path", "args", "taken"),
    [
        ("/opt/gpuctk/bin/gpuctk-hook", ["gpuctk-hook", "createContainer", "--folder", LIB], True),
        ("/usr/bin/gpuctk-cdi-hook", ["gpuctk-cdi-hook", "disable-device-node-modification"], True),
        ("/usr/bin/gpuctk-hook", ["gpuctk-hook", "update-ldcache", "--folder", LIB], True),
        # named by the path, never by argv[0]: this entry would run another program
        ("/usr/bin/other-hook", ["gpuctk-hook", "createContainer", "--folder", LIB], False),
        ("/usr/bin/gpuctk-cdi-hook.old", ["gpuctk-cdi-hook", "createContainer"], False),
        ("/usr/bin/gpuctk-hook", ["gpuctk-hook", "prestart"], False),  # not an in-root verb
        ("/usr/bin/gpuctk-hook", ["gpuctk-hook"], False),
    ],
)
def test_plan_reads_gpuctks_entries_by_their_path(path: str, args: list[str], taken: bool) -> None:
    entry: Any = {"hookName": "createContainer", "path": path, "args": args}
    todo = prestart.plan(config(), {"hooks": [entry]})
    assert todo.hooks == ([args[1:]] if taken else [])
    assert len(todo.skipped) == (0 if taken else 1)


def test_plan_does_not_run_other_stages() -> None:
    entry: Any = {"hookName": "startContainer", "path": "/usr/bin/gpuctk-hook", "args": FRONT_ARGS}
    todo = prestart.plan(config(), {"hooks": [entry]})
    assert todo.hooks == [] and todo.skipped == [
        f"startContainer hook {' '.join(FRONT_ARGS)[:120]} not run (prestart mode)"
    ]


def test_the_request_is_gpuctk_hooks(tmp_path: Path) -> None:
    """An entry's arguments make the Request `gpuctk-hook createContainer` makes: --link-for and
    --disable-hook included, for the bundle's config.json."""
    spec = str(tmp_path / "config.json")
    req = prestart._hook_request([*FRONT_ARGS[1:], "--container-spec", "/elsewhere"], spec)
    assert req.verb == "createContainer" and req.container_spec == spec
    assert req.links_for == [FRONT_ARGS[3]] and req.links == [FRONT_ARGS[5]]
    assert req.folders == ["/usr/local/nvidia/lib64"] and req.run_ldconfig
    assert req.disabled == frozenset({"enable-cuda-compat"})


def test_facts_are_set_for_the_entry_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUCTK_CUDA_VERSION", "11.0")
    monkeypatch.delenv("GPUCTK_DRIVER_VERSION", raising=False)
    saved = prestart._set_env({"GPUCTK_DRIVER_VERSION": "535.1", "GPUCTK_CUDA_VERSION": "12.2"})
    assert os.environ["GPUCTK_DRIVER_VERSION"] == "535.1"
    assert os.environ["GPUCTK_CUDA_VERSION"] == "12.2"
    prestart._set_env(saved)
    assert "GPUCTK_DRIVER_VERSION" not in os.environ
    assert os.environ["GPUCTK_CUDA_VERSION"] == "11.0"


def test_plan_reports_what_it_cannot_apply() -> None:
    more = {**edits(), "env": ["FOO=1"], "additionalGids": [44]}
    notes = prestart.plan(config(), more).notes
    assert any(n.startswith("env edits cannot be applied") for n in notes)
    assert any(n.startswith("additionalGids edits") for n in notes)


def test_plan_refuses_non_bind_mounts() -> None:
    bad = {"mounts": [{"hostPath": "tmpfs", "containerPath": "/x", "type": "tmpfs"}]}
    with pytest.raises(InputError, match="only bind mounts"):
        prestart.plan(config(), bad)


def _bundle(tmp_path: Path, env: list[str]) -> bytes:
    (tmp_path / "config.json").write_text(json.dumps(config(env)))
    state = {"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 2**22 + 7}
    return json.dumps({**state, "bundle": str(tmp_path)}).encode()


@pytest.mark.parametrize("env", [[], ["NVIDIA_VISIBLE_DEVICES=void"], ["NVIDIA_VISIBLE_DEVICES="]])
def test_nothing_requested_exits_at_once(env: list[str], tmp_path: Path) -> None:
    # a pid that does not exist: the hook must not even look at it
    assert prestart.main("prestart", [], io.BytesIO(_bundle(tmp_path, env))) == 0


def test_unknown_device_fails_before_touching_the_container(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cdi").mkdir()
    toml = tmp_path / "gpuctk.toml"
    toml.write_text(f'spec-dirs = ["{tmp_path / "cdi"}"]\n')
    monkeypatch.setenv("GPUCTK_CONFIG", str(toml))
    state = _bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=3"])
    with pytest.raises(RequestError, match=r"nvidia\.com/gpu=3"):
        prestart.main("createRuntime", [], io.BytesIO(state))


def test_console_script_fast_path(tmp_path: Path) -> None:
    state = _bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=void"])
    env = {"PATH": "/usr/bin:/bin", "GPUCTK_CONFIG": str(tmp_path / "none.toml")}
    (tmp_path / "none.toml").write_text("")
    times = []
    for _ in range(5):
        started = time.monotonic()
        done = subprocess.run(
            [HOOK, "prestart"], input=state, capture_output=True, env=env, timeout=60
        )
        times.append(time.monotonic() - started)
        assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert min(times) < 0.5, times  # a do-nothing run is one Python start-up, not more


def test_dispatch_from_hook_main(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    codes: list[int] = []
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(_bundle(tmp_path, []))))
    hook_main.main(["prestart"], exit=codes.append)
    assert codes == [0]
    assert os.path.exists(tmp_path / "config.json")
