"""gpuctk-runtime end to end: a temp bundle, a synthetic CDI spec, a fake low-level runtime.

The fake runtime (named in a temp config.toml) records the argv it was exec'd with and the
config.json it saw. Every failure must exit 1 with a clear stderr and leave config.json
byte-identical, and the fake runtime must not have run.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuctk.cdi.node import facts

SHIM = str(Path(sys.executable).parent / "gpuctk-runtime")
LIB = "/usr/lib/x86_64-linux-gnu"
FACTS = facts.Facts(
    "535.309.01",
    "12.2",
    (
        facts.GpuFacts(0, "GPU-aaaa", "9.0", "hopper", ()),
        facts.GpuFacts(1, "GPU-bbbb", "8.0", "ampere", ("MIG-x",)),
    ),
)
FAKE_RUNTIME = """#!/bin/sh
: > "$FAKE_RECORD/argv"
for a in "$0" "$@"; do printf '%s\\n' "$a" >> "$FAKE_RECORD/argv"; done
[ -f "$FAKE_BUNDLE/config.json" ] && cp "$FAKE_BUNDLE/config.json" "$FAKE_RECORD/seen.json"
exit 0
"""


def node(path: str, minor: int, major: int = 195) -> dict[str, Any]:
    return {"path": path, "type": "c", "major": major, "minor": minor, "fileMode": 0o666}


def ro(host: str, container: str) -> dict[str, Any]:
    return {"hostPath": host, "containerPath": container, "options": ["ro", "nosuid", "rbind"]}


def make_spec() -> dict[str, Any]:
    gpu0, gpu1 = node("/dev/nvidia0", 0), node("/dev/nvidia1", 1)
    mig = [gpu1, node("/dev/nvidia-caps/nvidia-cap12", 12, 508)]
    devices = [
        ("0", [gpu0]),
        ("GPU-aaaa", [gpu0]),
        ("1", [gpu1]),
        ("1:0", mig),
        ("MIG-x", mig),
        ("all", [gpu0, gpu1]),
    ]
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": n, "containerEdits": {"deviceNodes": d}} for n, d in devices],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [node("/dev/nvidiactl", 255)],
            "mounts": [
                ro(f"/drv{LIB}/libcuda.so.535.309.01", f"{LIB}/libcuda.so.535.309.01"),
                ro(f"/drv{LIB}/libnvidia-ml.so.535.309.01", f"{LIB}/libnvidia-ml.so.535.309.01"),
                ro("/drv/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi"),
                ro("/drv/lib/firmware/nvidia/535.309.01/gsp.bin", "/lib/firmware/nvidia/gsp.bin"),
            ],
            "hooks": [
                {
                    "hookName": "createContainer",
                    "path": "/usr/bin/gpuctk-hook",
                    "args": [
                        "gpuctk-hook",
                        "createContainer",
                        "--link",
                        f"libcuda.so.535.309.01::{LIB}/libcuda.so.1",
                        "--link",
                        f"libcuda.so.1::{LIB}/libcuda.so",
                        "--link",
                        f"libnvidia-ml.so.535.309.01::{LIB}/libnvidia-ml.so.1",
                        "--folder",
                        LIB,
                    ],
                    "env": ["PATH=/usr/bin:/bin", *facts.encode(FACTS)],
                }
            ],
        },
    }


def base_config(env: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "ociVersion": "1.0.2-dev",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": ["sh"],
            "env": ["PATH=/usr/bin:/bin", "TERM=xterm", *env],
            "cwd": "/",
            "capabilities": {"bounding": ["CAP_CHOWN"]},
        },
        "root": {"path": "rootfs", "readonly": True},
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid"]},
        ],
        "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}], "x-future": [1]},
        **extra,
    }


class Env:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.bundle = tmp / "bundle"
        self.bundle.mkdir()
        self.record = tmp / "record"
        self.record.mkdir()
        self.cdi = tmp / "cdi"
        self.cdi.mkdir()
        (self.cdi / "nvidia.json").write_text(json.dumps(make_spec()))
        self.runtime = tmp / "fake-runc"
        self.runtime.write_text(FAKE_RUNTIME)
        self.runtime.chmod(0o755)
        self.log = tmp / "gpuctk.log"
        self.write_toml(f'runtimes = ["{self.runtime}"]\nspec-dirs = ["{self.cdi}"]\n')

    def write_toml(self, text: str) -> None:
        (self.tmp / "config.toml").write_text(text + f'log-file = "{self.log}"\n')

    def write_config(self, doc: Any, mode: int = 0o640) -> bytes:
        path = self.bundle / "config.json"
        data = doc if isinstance(doc, bytes) else json.dumps(doc, indent=2).encode()
        path.write_bytes(data)
        path.chmod(mode)
        return data

    def environ(self) -> dict[str, str]:
        """The shim's environment: its config, and where the fake runtime records."""
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GPUCTK_CONFIG": str(self.tmp / "config.toml"),
            "FAKE_RECORD": str(self.record),
            "FAKE_BUNDLE": str(self.bundle),
        }

    def run(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SHIM, *args], env=self.environ(), cwd=cwd, capture_output=True, text=True, timeout=60
        )

    def create(self, *extra: str) -> subprocess.CompletedProcess[str]:
        return self.run("--root", "/run/x", "create", "--bundle", str(self.bundle), *extra, "ctr1")

    def argv(self) -> list[str] | None:
        path = self.record / "argv"
        return path.read_text().splitlines() if path.exists() else None

    def seen(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((self.record / "seen.json").read_text())
        return doc


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def device_paths(doc: dict[str, Any]) -> list[str]:
    return [d["path"] for d in doc["linux"].get("devices", [])]


def mounts(doc: dict[str, Any]) -> list[str]:
    return [m["destination"] for m in doc["mounts"]]


def test_one_gpu_injected_and_argv_kept(env: Env) -> None:
    env.write_config(base_config(["NVIDIA_VISIBLE_DEVICES=0"]))
    proc = env.create("--pid-file", "/p")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert env.argv() == [
        str(env.runtime),
        *("--root", "/run/x", "create", "--bundle", str(env.bundle), "--pid-file", "/p", "ctr1"),
    ]
    doc = env.seen()
    assert device_paths(doc) == ["/dev/nvidiactl", "/dev/nvidia0"]
    rules = doc["linux"]["resources"]["devices"]
    assert {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"} in rules
    assert "NVIDIA_VISIBLE_DEVICES=void" in doc["process"]["env"]
    assert f"{LIB}/libcuda.so.535.309.01" in mounts(doc)  # default caps: utility,compute
    (hook,) = doc["hooks"]["createContainer"]
    assert (
        hook["path"] == "/usr/bin/gpuctk-hook" and "GPUCTK_DRIVER_VERSION=535.309.01" in hook["env"]
    )
    assert doc["linux"]["x-future"] == [1] and doc["root"] == {"path": "rootfs", "readonly": True}
    st = (env.bundle / "config.json").stat()
    assert stat.S_IMODE(st.st_mode) == 0o640
    assert "injected nvidia.com/gpu=0" in env.log.read_text()


@pytest.mark.parametrize(
    ("value", "nodes"),
    [
        ("1,0", ["/dev/nvidiactl", "/dev/nvidia1", "/dev/nvidia0"]),
        ("all", ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1"]),
        ("1:0", ["/dev/nvidiactl", "/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap12"]),
        ("MIG-x", ["/dev/nvidiactl", "/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap12"]),
        ("GPU-aaaa,0", ["/dev/nvidiactl", "/dev/nvidia0"]),
        ("none", ["/dev/nvidiactl"]),
    ],
)
def test_visible_devices_forms(env: Env, value: str, nodes: list[str]) -> None:
    env.write_config(base_config([f"NVIDIA_VISIBLE_DEVICES={value}"]))
    proc = env.create()
    assert proc.returncode == 0, proc.stderr
    assert device_paths(env.seen()) == nodes
    assert f"{LIB}/libcuda.so.535.309.01" in mounts(env.seen())


def test_annotation_request(env: Env) -> None:
    env.write_config(base_config([], annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=1"}))
    assert env.create().returncode == 0
    assert device_paths(env.seen()) == ["/dev/nvidiactl", "/dev/nvidia1"]


@pytest.mark.parametrize("value", [None, "", "void"])
def test_no_request_leaves_config_untouched(env: Env, value: str | None) -> None:
    data = env.write_config(
        base_config([] if value is None else [f"NVIDIA_VISIBLE_DEVICES={value}"])
    )
    before = (env.bundle / "config.json").stat()
    proc = env.create()
    assert proc.returncode == 0, proc.stderr
    after = (env.bundle / "config.json").stat()
    assert (env.bundle / "config.json").read_bytes() == data
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)
    assert env.argv() is not None


def test_driver_capabilities_utility_leaves_libcuda_out(env: Env) -> None:
    env.write_config(
        base_config(["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=utility"])
    )
    assert env.create().returncode == 0
    doc = env.seen()
    assert f"{LIB}/libcuda.so.535.309.01" not in mounts(doc)
    assert f"{LIB}/libnvidia-ml.so.535.309.01" in mounts(doc)
    assert "/usr/bin/nvidia-smi" in mounts(doc) and "/lib/firmware/nvidia/gsp.bin" in mounts(doc)
    args = doc["hooks"]["createContainer"][0]["args"]
    assert not any("libcuda" in a for a in args)  # both links of the chain dropped
    assert f"libnvidia-ml.so.535.309.01::{LIB}/libnvidia-ml.so.1" in args


@pytest.mark.parametrize("verb", [["state", "c"], ["delete", "-f", "c"], ["start", "c"],
                                  ["kill", "c", "KILL"], ["features"], ["--version"]])  # fmt: skip
def test_other_verbs_pass_straight_through(env: Env, verb: list[str]) -> None:
    data = env.write_config(b"{broken")
    for spec in env.cdi.iterdir():
        spec.unlink()
    proc = env.run("--root", "/r", *verb)
    assert proc.returncode == 0, proc.stderr
    assert env.argv() == [str(env.runtime), "--root", "/r", *verb]
    assert (env.bundle / "config.json").read_bytes() == data


def without_the_c(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    """gpuctk-runtime ARGS where gpuctk-cdi-hook is not installed (a broken install)."""
    code = ("from gpuctk.hook import compiled\ncompiled.program = lambda: ''\n"
            "from gpuctk.hook.shim import runtime_main\n"
            f"runtime_main.main({list(args)!r})\n")  # fmt: skip
    return subprocess.run([sys.executable, "-c", code], env=env.environ(), capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


def test_a_missing_c_stops_no_cleanup_and_no_gpu_create_goes_unserved(env: Env) -> None:
    """runc's arguments are read by gpuctk-cdi-hook alone: without it, a state, kill or delete
    still reaches the runtime as given; a create fails, naming what to do."""
    proc = without_the_c(env, "--root", "/r", "delete", "-f", "c")
    assert proc.returncode == 0, proc.stderr
    assert env.argv() == [str(env.runtime), "--root", "/r", "delete", "-f", "c"]
    assert "gpuctk-cdi-hook" in proc.stderr and "reinstall" in proc.stderr
    (env.record / "argv").unlink()
    proc = without_the_c(env, "--root", "/r", "create", "--bundle", str(env.bundle), "c")
    assert proc.returncode == 1 and env.argv() is None
    assert proc.stderr.count("\n") == 1 and "reinstall" in proc.stderr


def test_bundle_flag_forms_and_cwd(env: Env) -> None:
    env.write_config(base_config(["NVIDIA_VISIBLE_DEVICES=0"]))
    for args in (["create", f"-b={env.bundle}", "c"], ["create", "c", "-b", str(env.bundle)]):
        (env.record / "seen.json").unlink(missing_ok=True)
        assert env.run(*args).returncode == 0
        assert device_paths(env.seen()) == ["/dev/nvidiactl", "/dev/nvidia0"]
    env.write_config(base_config(["NVIDIA_VISIBLE_DEVICES=1"]))
    assert env.run("create", "c", cwd=env.bundle).returncode == 0
    assert device_paths(env.seen()) == ["/dev/nvidiactl", "/dev/nvidia1"]


def test_crun_config_flag(env: Env) -> None:
    (env.bundle / "other.json").write_text(json.dumps(base_config(["NVIDIA_VISIBLE_DEVICES=0"])))
    data = env.write_config(base_config([]))
    assert env.run("create", "-b", str(env.bundle), "--config", "other.json", "c").returncode == 0
    assert (
        "/dev/nvidia0"
        in json.loads((env.bundle / "other.json").read_text())["linux"]["devices"][1]["path"]
    )
    assert (env.bundle / "config.json").read_bytes() == data


def fails(env: Env, proc: subprocess.CompletedProcess[str], data: bytes, text: str) -> None:
    assert proc.returncode == 1
    assert text in proc.stderr, proc.stderr
    assert proc.stdout == ""
    assert (env.bundle / "config.json").read_bytes() == data
    assert env.argv() is None  # the low-level runtime never ran
    assert sorted(p.name for p in env.bundle.iterdir()) == ["config.json"]  # no temp file left


def test_unknown_device(env: Env) -> None:
    data = env.write_config(base_config(["NVIDIA_VISIBLE_DEVICES=7"]))
    proc = env.create()
    fails(env, proc, data, "unknown CDI device nvidia.com/gpu=7 (known: nvidia.com/gpu=0,")
    assert "nvidia.com/gpu=MIG-x" in proc.stderr


def test_unmet_require(env: Env) -> None:
    doc = base_config(
        ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=550"]
    )
    data = env.write_config(doc)
    fails(env, env.create(), data, "unsatisfied requirement NVIDIA_REQUIRE_CUDA=")
    doc["process"]["env"].append("NVIDIA_DISABLE_REQUIRE=true")
    env.write_config(doc)
    assert env.create().returncode == 0


def test_met_require_and_arch(env: Env) -> None:
    doc = base_config(["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_REQUIRE_ARCH=arch=sm_90"])
    data = env.write_config(doc)
    fails(env, env.create(), data, "arch=sm_90 (GPU 1 has compute capability 8.0)")
    doc["process"]["env"][-2] = "NVIDIA_VISIBLE_DEVICES=0"
    env.write_config(doc)
    assert env.create().returncode == 0


@pytest.mark.parametrize("content", [b"{broken", b"[]", b"\xff\xfe", b'{"a": NaN}', b"{} {}"])
def test_malformed_config_json(env: Env, content: bytes) -> None:
    data = env.write_config(content)
    fails(env, env.create(), data, "malformed OCI config")


def test_unreadable_env_is_no_request(env: Env) -> None:
    """An env that is not a list asks for nothing: runc, not the shim, reports the config."""
    data = env.write_config(b'{"process": {"env": "NVIDIA_VISIBLE_DEVICES=0"}}')
    assert env.create().returncode == 0
    assert (env.bundle / "config.json").read_bytes() == data


def test_missing_spec_dir(env: Env) -> None:
    env.write_toml(f'runtimes = ["{env.runtime}"]\nspec-dirs = ["{env.tmp}/nope"]\n')
    data = env.write_config(base_config(["NVIDIA_VISIBLE_DEVICES=0"]))
    fails(env, env.create(), data, f"no CDI spec found in {env.tmp}/nope: run gpuctk cdi generate")


def test_missing_bundle_and_bad_toml(env: Env) -> None:
    proc = env.run("create", "--bundle", str(env.tmp / "gone"), "c")
    assert proc.returncode == 1 and "cannot open" in proc.stderr and env.argv() is None
    env.write_toml("runtimes = 5\n")
    data = env.write_config(base_config(["NVIDIA_VISIBLE_DEVICES=0"]))
    fails(env, env.create(), data, "runtimes: must be a list of strings")


def test_errors_go_to_the_engine_log_in_its_format(env: Env) -> None:
    data = env.write_config(base_config(["NVIDIA_VISIBLE_DEVICES=9"]))
    log = env.tmp / "log.json"
    proc = env.run("--log", str(log), "--log-format", "json", "create", "-b", str(env.bundle), "c")
    fails(env, proc, data, "gpuctk-runtime: unknown CDI device nvidia.com/gpu=9")
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert lines[-1]["level"] == "error" and "nvidia.com/gpu=9" in lines[-1]["msg"]
    assert proc.stderr.startswith("gpuctk-runtime: unknown CDI device")  # plain, like runc


def test_no_runtime_found(env: Env) -> None:
    env.write_toml(f'runtimes = ["{env.tmp}/no-runc", "no-such-runtime-anywhere"]\n')
    proc = env.run("state", "c")
    assert proc.returncode == 1 and "no low-level runtime found" in proc.stderr


def test_hot_path_imports(env: Env) -> None:
    """The create path never imports click, jsonschema, pynvml or pyroute2."""
    env.write_config(base_config(["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=12"]))
    code = (
        "import sys\n"
        "from gpuctk.hook import config\n"
        "from gpuctk.hook.shim import runtime_main as r\n"
        "from gpuctk.log import RuncLog\n"
        f"inv = r.parse_argv(['create', '-b', {str(env.bundle)!r}, 'c'])\n"
        f"settings = config.load({{'GPUCTK_CONFIG': {str(env.tmp / 'config.toml')!r}}})\n"
        "r.inject(inv, settings, RuncLog())\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(out.stdout.split())
    assert "gpuctk.hook.requests.require" in loaded and "gpuctk.cdi.specs.apply" in loaded
    for banned in ("click", "jsonschema", "pynvml", "pyroute2", "tomllib", "tomlkit"):
        assert banned not in loaded
    for heavy in ("typing", "dataclasses"):  # milliseconds on every GPU create
        assert heavy not in loaded, heavy
    start = subprocess.run(
        [sys.executable, "-c", "import sys, gpuctk.hook.shim.runtime_main; print(*sys.modules)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    for heavy in ("json", "yaml", "typing", "dataclasses", "tempfile", "gpuctk.cdi.specs.registry"):
        assert heavy not in start.stdout.split()


def test_error_lines_name_the_shim_once_and_the_container(env: Env) -> None:
    """The log-file, where every container's lines meet: one `gpuctk-runtime: ` prefix, then
    the container id. The engine's own log (one per container) and stderr: the same plain
    line, as runc writes its own."""
    data = env.write_config(base_config(["NVIDIA_VISIBLE_DEVICES=9"]))
    engine_log = env.tmp / "engine.log"
    proc = env.run("--log", str(engine_log), "create", "-b", str(env.bundle), "ctr9")
    fails(env, proc, data, "gpuctk-runtime: unknown CDI device nvidia.com/gpu=9")
    line = env.log.read_text().splitlines()[-1]
    assert 'level=error msg="gpuctk-runtime: ctr9: unknown CDI device' in line, line
    assert line.count("gpuctk-runtime: ") == 1, line
    line = engine_log.read_text().splitlines()[-1]
    assert 'level=error msg="gpuctk-runtime: unknown CDI device' in line, line
    assert line.count("gpuctk-runtime: ") == 1, line
    assert proc.stderr.startswith("gpuctk-runtime: unknown CDI device")  # plain, like runc
