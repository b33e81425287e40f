"""gpuctk-runtime's compiled create (hook/shimfront.c, `gpuctk-cdi-hook runtime-front`) and the
front plans it reads (gpuctk.hook.shim.frontplan), through the launchers gpuctk.install.launchers
writes, with /bin/true as the low-level runtime.

A first create of a request goes to Python, which resolves it and writes the front plan; the
next create with the same key is the front's. Its config.json must be exactly what
gpuctk.cdi.specs.apply makes of the same edits on the same document, whatever the document
already holds (same env keys, the same device paths once or twice, the same mount
destinations, uncleaned destinations, missing lists). Anything it does not fully understand,
or may not trust, goes to Python with the reason (GPUCTK_SHIM_FRONT_TRACE), the front having
changed nothing. The specs and the config are left to settle (SETTLE_NS) once per module.

The cases on the module's node run twice: on the build setup.py installs and on one with
-fsanitize=address,undefined -fno-sanitize-recover=all (tests/fixtures/cfront), so that its JSON
reader meets the hostile configs, arguments and plans under the sanitizers too.
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fixtures import cfront
from fixtures.images import go_json

from gpuctk.cdi.specs import apply, speccache
from gpuctk.errors import ValidationError
from gpuctk.hook import bundle as ocibundle
from gpuctk.hook.shim import filechain, frontkey, frontplan
from gpuctk.hook.shim.memo import remember_runtime

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 30  # seconds: only to catch a hang
VISIBLE = "NVIDIA_VISIBLE_DEVICES=0"
CDI = ("cdi.k8s.io/",)  # the default CDI annotation prefixes
SOCKETS: list[socket.socket] = []  # each node's nvidia-persistenced socket, kept listening
BASE_ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", VISIBLE]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the create path runs as root")


def base_doc(root: str) -> dict[str, Any]:
    """A config.json as containerd's runc shim hands it over (trimmed)."""
    return {
        "ociVersion": "1.1.0",
        "process": {
            "user": {"uid": 0, "gid": 0},
            "args": ["/bin/true"],
            "env": list(BASE_ENV),
            "cwd": "/",
            "capabilities": {"bounding": ["CAP_CHOWN", "CAP_KILL"]},
            "noNewPrivileges": True,
        },
        "root": {"path": root},
        "hostname": "front",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts"},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["ro"]},
        ],
        "annotations": {"org.opencontainers.image.stopSignal": "15"},  # not Kubernetes'
        "linux": {
            "resources": {"devices": [{"allow": False, "access": "rwm"}]},
            "namespaces": [{"type": "pid"}, {"type": "mount"}],
            "maskedPaths": ["/proc/kcore"],
        },
    }


@dataclass
class Node:
    bin: Path
    spec_dir: Path
    conf: Path
    state: Path
    work: Path
    hook: Path

    def env(self, **extra: str) -> dict[str, str]:
        return {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "GPUCTK_CONFIG": str(self.conf),
            "GPUCTK_STATE_DIR": str(self.state),
            "GPUCTK_SHIM_FRONT_TRACE": "1",
            **cfront.SANITIZER_ENV,
            **extra,
        }

    def create(
        self, doc: dict[str, Any] | str, *args: str, **extra: str
    ) -> tuple[subprocess.CompletedProcess[str], Path]:
        """`gpuctk-runtime create` of `doc` (a dict, or config.json's text) in a new bundle."""
        bundle = Path(os.path.join(self.work, f"bundle-{time.monotonic_ns()}"))
        bundle.mkdir()
        text = doc if isinstance(doc, str) else json.dumps(doc)
        (bundle / "config.json").write_bytes(text.encode())
        argv = [str(self.bin / "gpuctk-runtime"), *(args or ("create", "--bundle", str(bundle)))]
        if not args:
            argv.append("c1")
        done = subprocess.run(
            argv, env=self.env(**extra), capture_output=True, text=True, timeout=TIMEOUT,
            check=False, cwd=bundle,
        )  # fmt: skip
        return clean(done), bundle / "config.json"


def clean(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    """`done`, which no sanitizer reported on (the sanitized build stops at its first report)."""
    assert "Sanitizer" not in done.stderr and "runtime error" not in done.stderr, done.stderr
    return done


def spec(node_hook: Path, files: Path) -> dict[str, Any]:
    return {
        "cdiVersion": "0.6.0",
        "kind": "nvidia.com/gpu",
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void", "GPUCTK_FRONT_TEST=1"],
            "deviceNodes": [
                {
                    "path": "/dev/nvidiactl",
                    "hostPath": "/dev/null",
                    "type": "c",
                    "major": 1,
                    "minor": 3,
                },
            ],
            "mounts": [
                {
                    "hostPath": str(files / "lib"),
                    "containerPath": "/usr/local/nvidia",
                    "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"],
                },
                {
                    "hostPath": str(files / "icd.json"),
                    "containerPath": "/etc/OpenCL/vendors/x.icd",
                    "options": ["ro", "nosuid", "nodev", "bind"],
                },
                {
                    "hostPath": str(files / "fw.bin"),
                    "containerPath": "/lib/firmware/nvidia/fw.bin",
                    "options": ["ro", "nosuid", "nodev", "bind"],
                },
                {  # what most real nodes' specs mount: nvidia-persistenced's socket
                    "hostPath": str(files / "run" / "socket"),
                    "containerPath": "/run/nvidia-persistenced/socket",
                    "options": ["ro", "nosuid", "nodev", "bind", "noexec"],
                },
            ],
            "hooks": [
                {
                    "hookName": "createContainer",
                    "path": str(node_hook),
                    "args": [
                        "gpuctk-cdi-hook",
                        "createContainer",
                        "--folder",
                        "/usr/local/nvidia/lib64",
                    ],
                    "env": ["PATH=/usr/bin:/bin", "GPUCTK_DRIVER_VERSION=535.309.01"],
                },
            ],
        },
        "devices": [
            {
                "name": "0",
                "containerEdits": {
                    "deviceNodes": [
                        {
                            "path": "/dev/nvidia0",
                            "hostPath": "/dev/zero",
                            "type": "c",
                            "major": 1,
                            "minor": 5,
                        }
                    ]
                },
            },
            {
                "name": "1",
                "containerEdits": {
                    "deviceNodes": [
                        {
                            "path": "/dev/nvidia1",
                            "hostPath": "/dev/full",
                            "type": "c",
                            "major": 1,
                            "minor": 7,
                        }
                    ]
                },
            },
        ],
    }


def make_node(
    work: Path,
    numberless: str = "",
    conf: str = "",
    nodes: bool = True,
    build: str = "plain",
    hooks: bool = True,
) -> Node:
    """Launchers, a spec and a config in `work`, left to settle; `numberless`: a host node
    for a device 2 whose spec entry gives no type or numbers (they come from the host);
    `build`: which build of gpuctk-cdi-hook the launchers' front runs (tests/fixtures/cfront);
    `hooks`: False for a spec with no hook entry (`--disable-hook all`)."""
    built = cfront.binary(build)
    if built is None:
        pytest.skip(f"no {build} build of gpuctk-cdi-hook here (no gcc, or no libasan)")
    work.chmod(0o755)
    bindir = work / "bin"
    bindir.mkdir()
    subprocess.run(
        [sys.executable, "-m", "gpuctk.install.launchers", str(bindir), "--python", sys.executable],
        check=True, capture_output=True,
    )  # fmt: skip
    if not (bindir / "gpuctk-cdi-hook").is_file():  # the sh front names it only where it is
        pytest.skip("this install has no gpuctk-cdi-hook: python -m gpuctk.hook.cbuild "
                    f"{Path(sys.executable).parent}/gpuctk-cdi-hook")  # fmt: skip
    shutil.copyfile(built, bindir / ".front")  # the build under test, in the launchers' place
    (bindir / ".front").chmod(0o755)
    (bindir / ".front").rename(bindir / "gpuctk-cdi-hook")
    files = work / "files"
    (files / "lib").mkdir(parents=True)
    (files / "icd.json").write_text("{}")
    (files / "fw.bin").write_bytes(b"fw")
    (files / "run").mkdir()
    listening = socket.socket(socket.AF_UNIX)  # open for the module: the node's daemon
    listening.bind(str(files / "run" / "socket"))
    listening.listen()
    SOCKETS.append(listening)
    spec_dir = work / "cdi"
    spec_dir.mkdir()
    doc = spec(bindir / "gpuctk-cdi-hook", files)
    if not nodes:  # a spec of env and mounts only: a plan with no device edits
        doc["containerEdits"].pop("deviceNodes")
        for device in doc["devices"]:
            device["containerEdits"] = {"env": [f"GPU={device['name']}"]}
    if not hooks:
        doc["containerEdits"].pop("hooks")
    if numberless:
        node = {"path": "/dev/nvidia2", "hostPath": numberless}
        doc["devices"].append({"name": "2", "containerEdits": {"deviceNodes": [node]}})
    (spec_dir / "nvidia.json").write_text(json.dumps(doc))
    toml = work / "gpuctk.toml"
    toml.write_text(f'runtimes = ["/bin/true"]\nspec-dirs = ["{spec_dir}"]\n{conf}')
    time.sleep(speccache.SETTLE_NS / 1e9 + 0.1)
    return Node(bindir, spec_dir, toml, work / "state", work, bindir / "gpuctk-cdi-hook")


@pytest.fixture(scope="module", params=["plain", "sanitized"])
def node(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Node:
    return make_node(tmp_path_factory.mktemp("shimfront"), build=request.param)


def expected(node: Node, doc: dict[str, Any]) -> dict[str, Any]:
    """What gpuctk.cdi.specs.apply makes of the request's edits on `doc`."""
    from gpuctk.hook import config
    from gpuctk.hook.requests import cdiedits

    settings = config.load({"GPUCTK_CONFIG": str(node.conf)})
    done = cdiedits.resolve(doc, settings, lambda note: None)
    assert done is not None
    out = copy.deepcopy(doc)
    apply.apply(out, done[1])
    return out


def key_of_text(
    node: Node, text: bytes, prefixes: tuple[str, ...] = CDI
) -> frontkey.FrontKey | None:
    """The key the node's compiled create takes config.json's `text` by (as the shim asks)."""
    return frontkey.key_of(str(node.hook), text, prefixes, str(node.state))


def key_of(
    node: Node, doc: dict[str, Any], prefixes: tuple[str, ...] = CDI
) -> frontkey.FrontKey | None:
    return key_of_text(node, json.dumps(doc).encode(), prefixes)


def fronted(node: Node, doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` created twice: the first by Python (it writes the plan), the second by the front,
    whose result is returned."""
    first, _ = node.create(doc)
    assert first.returncode == 0, first.stderr
    done, config = node.create(doc)
    assert done.returncode == 0, done.stderr
    assert "front: plan " in done.stderr, done.stderr
    result: dict[str, Any] = json.loads(config.read_text())
    return result


def test_the_second_create_is_the_fronts_and_equals_apply(node: Node) -> None:
    doc = base_doc("/nonexistent-root")
    first, config = node.create(doc)
    assert first.returncode == 0, first.stderr
    assert "front: python: no memo that holds" in first.stderr  # Python at once
    key = key_of(node, doc)
    mounts = ["/proc", "/dev", "/dev/pts", "/sys"]
    assert key is not None and key.key == [
        VISIBLE, "privileged=0", "uid=0", "gid=0",
        "env=2", "PATH", "NVIDIA_VISIBLE_DEVICES", "mounts=4", *mounts, "device-list=0",
        "devices=0", "markers=0",
    ]  # fmt: skip
    assert (key.env, key.mounts, key.devices) == (["PATH", "NVIDIA_VISIBLE_DEVICES"], mounts, [])
    assert (key.privileged, key.uid, key.gid) == (0, 0, 0)
    plan = node.state / "front" / key.file
    assert plan.is_file()
    assert plan.stat().st_mode & 0o777 == 0o600
    done, config = node.create(doc)
    assert done.returncode == 0, done.stderr
    assert f"front: plan {plan.name.removesuffix('.json')}" in done.stderr
    got = json.loads(config.read_text())
    assert got == expected(node, doc)
    # the spec's gpuctk-cdi-hook entry stays: it serves the image inside runc
    assert [h["path"] for h in got["hooks"]["createContainer"]] == [str(node.hook)]
    assert "NVIDIA_VISIBLE_DEVICES=void" in got["process"]["env"]


def variants(root: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    d = base_doc(root)
    d["process"]["env"] = ["GPUCTK_FRONT_TEST=0", *BASE_ENV, "GPUCTK_FRONT_TEST=2", "A"]
    out["env keys already there (the last one replaced)"] = d
    d = base_doc(root)
    d["linux"]["devices"] = [
        {"path": "/dev/nvidia0", "type": "c", "major": 9, "minor": 9},
        {"path": "/dev/other", "type": "c", "major": 1, "minor": 1},
        {"path": "/dev/nvidia0", "type": "c", "major": 8, "minor": 8},
        {"path": "/dev/nvidiactl", "type": "c", "major": 7, "minor": 7},
    ]
    out["device paths there once and twice"] = d
    d = base_doc(root)
    d["mounts"] += [
        {"destination": "/usr/local/nvidia", "type": "tmpfs", "source": "tmpfs"},
        {"destination": "/a/./b/../c//d/", "type": "tmpfs", "source": "tmpfs"},
        {"destination": "//x", "type": "tmpfs", "source": "tmpfs"},
        {"destination": "rel/p", "type": "tmpfs", "source": "tmpfs"},
        {"destination": "/../../up", "type": "tmpfs", "source": "tmpfs"},
        {"destination": "/", "type": "tmpfs", "source": "tmpfs"},
        {"destination": "", "type": "tmpfs", "source": "tmpfs"},
        {"destination": "../a/../../b", "type": "tmpfs", "source": "tmpfs"},
        {"destination": "./usr/local/nvidia/x", "type": "tmpfs", "source": "tmpfs"},
        {"destination": ".", "type": "tmpfs", "source": "tmpfs"},
    ]
    out["mount destinations there, uncleaned"] = d
    d = base_doc(root)
    del d["linux"]["resources"]
    out["no linux.resources"] = d
    d = base_doc(root)
    d["linux"] = {"resources": {}}
    out["empty resources, no devices"] = d
    d = base_doc(root)
    d["linux"] = {}
    out["an empty linux object"] = d
    d = base_doc(root)
    d["hooks"] = {"createContainer": [{"path": "/bin/true"}], "prestart": []}
    out["hooks there"] = d
    d = base_doc(root)
    d["hooks"] = {"poststop": [{"path": "/bin/true"}]}
    out["hooks there, not the stage"] = d
    d = base_doc(root)
    d["hooks"] = {}
    out["an empty hooks object"] = d
    d = base_doc(root)
    d["process"]["user"] = {"uid": 1000, "gid": 1000, "additionalGids": [5]}
    out["another user: the nodes are its"] = d
    d = base_doc(root)
    d["process"]["capabilities"]["bounding"].append("CAP_SYS_ADMIN")
    out["privileged"] = d
    d = base_doc(root)
    del d["process"]["user"]
    out["no process.user"] = d
    return out


@pytest.mark.parametrize("name", list(variants("/r")))
def test_the_fronts_edits_are_applys(node: Node, name: str) -> None:
    doc = variants("/nonexistent-root")[name]
    assert fronted(node, doc) == expected(node, doc)


def test_the_text_around_the_edits_is_kept(node: Node) -> None:
    doc = base_doc("/nonexistent-root")
    text = json.dumps(doc, indent="\t") + "\n"
    first, _ = node.create(text)
    assert first.returncode == 0, first.stderr
    done, config = node.create(text)
    assert "front: plan " in done.stderr, done.stderr
    out = config.read_text()
    assert json.loads(out) == expected(node, doc)
    assert out.startswith('{"hooks":{"createContainer":[{"path":')  # inserted first
    assert '\n\t"ociVersion": "1.1.0",\n\t"process": {\n\t\t"user"' in out  # the rest as it was
    assert out.endswith('\t\t"maskedPaths": [\n\t\t\t"/proc/kcore"\n\t\t]\n\t}\n}\n')


def test_each_request_has_its_own_plan(node: Node) -> None:
    doc = base_doc("/nonexistent-root")
    doc["process"]["env"] = [*BASE_ENV[:1], "NVIDIA_VISIBLE_DEVICES=1"]
    got = fronted(node, doc)
    assert got == expected(node, doc)
    assert {"path": "/dev/nvidia1", "type": "c", "major": 1, "minor": 7} in got["linux"]["devices"]
    assert not any(d["path"] == "/dev/nvidia0" for d in got["linux"]["devices"])


def test_a_config_with_other_names_takes_its_own_plan(node: Node) -> None:
    """The plan says where each edit lands for the config's names (env entries, mount
    destinations, device paths): a config of the same request with another mount goes to
    Python once, which writes its plan, then is the front's, as apply makes it; the first
    config's plan still serves it."""
    doc = base_doc("/nonexistent-root")
    fronted(node, doc)
    other = copy.deepcopy(doc)
    other["mounts"].insert(1, {"destination": "/data", "type": "bind", "source": "/tmp"})
    first, _ = node.create(other)
    assert first.returncode == 0, first.stderr
    assert "front: python: no front plan for this request" in first.stderr, first.stderr
    assert fronted(node, other) == expected(node, other)
    done, config = node.create(doc)
    assert "front: plan " in done.stderr, done.stderr
    assert json.loads(config.read_text()) == expected(node, doc)


def test_the_front_assembles_the_plans_recipe_as_written(node: Node) -> None:
    """The compiled create knows no merge rule: it puts the config's items where the plan's
    recipe names their index and the plan's own items between them, in the recipe's order."""
    doc = base_doc("/nonexistent-root")
    doc["process"]["env"] = ["A=1", "B=2", VISIBLE]
    key = key_of(node, doc)
    assert key is not None
    fronted(node, doc)
    plan = node.state / "front" / key.file
    written = json.loads(plan.read_text())
    assert written["env"] == [0, 1, "NVIDIA_VISIBLE_DEVICES=void", *written["env"][3:]]
    written["env"] = [2, "Z=9", 0]  # no rule would make this: only the recipe
    plan.write_text(json.dumps(written))
    done, _before, after = direct(node, doc)
    assert "front: plan " in done.stderr, done.stderr
    assert json.loads(after)["process"]["env"] == [VISIBLE, "Z=9", "A=1"]
    for bad in ([3], [0, -1], [0, True], [0, None], [1.5]):  # past the list; not an item
        written["env"] = bad
        plan.write_text(json.dumps(written))
        handed_over(*direct(node, doc), "the env edit")
    plan.unlink()


def test_the_front_marks_the_plans_it_reads_so_they_go_last(node: Node) -> None:
    """A plan per request and shape: the front sets the mtime of each plan it reads, so the
    eviction of the oldest (plans.evict, by mtime) removes those read longest ago."""
    doc = base_doc("/nonexistent-root")
    fronted(node, doc)
    key = key_of(node, doc)
    assert key is not None
    plan = node.state / "front" / key.file
    os.utime(plan, ns=(10**9, 10**9))
    done, _ = node.create(doc)
    assert "front: plan " in done.stderr, done.stderr
    assert plan.stat().st_mtime > time.time() - 60


# ---- what goes to Python, unchanged -------------------------------------------------------

HANDOVER = "import sys; sys.exit(42)"  # the "Python" the front hands over to, in these tests


def front_argv(node: Node) -> list[str]:
    """The compiled front as the sh front runs it, its handover a Python that exits 42."""
    return [str(node.hook), "runtime-front", sys.executable, HANDOVER, str(node.bin / "x")]


def run_front(
    node: Node, args: list[str], cwd: Path | None = None, **extra: str
) -> subprocess.CompletedProcess[str]:
    """The front run as the sh front runs it (front_argv) on `args`, under node.env(**extra)
    (`<unset>` drops a variable), with a memo written for it (where Python would write one)
    that names GPUCTK_FRONT_RUNTIME (default /bin/true; `<unset>`: no memo) and no request
    markers, so that every create reaches the compiled create; the node's own memo put back
    after."""
    env = {k: v for k, v in node.env(**extra).items() if v != "<unset>"}
    runtime = extra.get("GPUCTK_FRONT_RUNTIME", "/bin/true")
    env.pop("GPUCTK_FRONT_RUNTIME", None)
    memo, kept = node.state / "runtime", node.state / "runtime-kept"
    if memo.exists():
        memo.rename(kept)
    if runtime != "<unset>":
        remember_runtime(runtime, env)  # not in a state folder others may write
    try:
        done = subprocess.run(
            [*front_argv(node), *args], env=env, capture_output=True, text=True,
            timeout=TIMEOUT, check=False, cwd=cwd,
        )  # fmt: skip
    finally:
        memo.unlink(missing_ok=True)
        if kept.exists():
            kept.rename(memo)
    return clean(done)


def direct(
    node: Node, doc: dict[str, Any] | str | bytes, *args: str, link: bool = False, **extra: str
) -> tuple[subprocess.CompletedProcess[str], bytes, bytes]:
    """The front run on a new bundle of `doc` (run_front): (the run, config.json before,
    after)."""
    bundle = Path(os.path.join(node.work, f"direct-{time.monotonic_ns()}"))
    bundle.mkdir()
    text = doc if isinstance(doc, str | bytes) else json.dumps(doc)
    target = bundle / ("real.json" if link else "config.json")
    target.write_bytes(text if isinstance(text, bytes) else text.encode())
    if link:
        (bundle / "config.json").symlink_to("real.json")
    before = target.read_bytes()
    done = run_front(node, [*(args or ("create", "--bundle", str(bundle), "c1"))], bundle, **extra)
    return done, before, target.read_bytes()


@pytest.fixture
def planned(node: Node) -> dict[str, Any]:
    """The base request, its front plan written."""
    doc = base_doc("/nonexistent-root")
    fronted(node, doc)
    return doc


def handed_over(
    done: subprocess.CompletedProcess[str], before: bytes, after: bytes, why: str
) -> None:
    assert done.returncode == 42, done.stderr
    assert f"front: python: {why}" in done.stderr, done.stderr
    assert after == before


def test_the_direct_run_takes_the_plan(node: Node, planned: dict[str, Any]) -> None:
    done, _before, after = direct(node, planned)
    assert done.returncode == 0, done.stderr
    assert "front: plan " in done.stderr
    assert json.loads(after) == expected(node, planned)


# bytes that are not UTF-8 as Python's strict decoder reads it
NOT_UTF8 = {
    "a lone continuation byte": b"\x80",
    "a character cut short": b"\xc3",
    "an overlong slash": b"\xc0\xaf",
    "an encoded surrogate": b"\xed\xa0\x80",
    "above U+10FFFF": b"\xf4\x90\x80\x80",
}
UTF8 = "gr\u00fc\u00dfe \u65e5\u672c \U0001f680"  # two, three and four bytes each


def mutated(doc: dict[str, Any], change: str) -> dict[str, Any] | str | bytes:
    d = copy.deepcopy(doc)
    if change in NOT_UTF8:  # in a value the front does not read
        return json.dumps(d).encode().replace(b"/bin/true", b"/bin/" + NOT_UTF8[change])
    if change == "UTF-8 values":  # as Go writes them: as they are
        d["process"]["env"] += [f"GREETING={UTF8}", "NVIDIA_PRODUCT_NAME=CUDA>=12"]
        d["process"]["args"] += [UTF8]
        d["annotations"]["io.kubernetes.pod.description"] = UTF8
        d["mounts"].append({"destination": "/data", "type": "bind", "source": f"/srv/{UTF8}"})
        return go_json(d).decode()
    if change == "long s key":  # runc (Go) reads "proce\u017fs" as "process"
        d["proce\u017fs"] = {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}
        return json.dumps(d, ensure_ascii=False)
    if change == "Kelvin key":  # and "lin\u212ax" as "linux"
        d["lin\u212ax"] = d["linux"]
        return json.dumps(d, ensure_ascii=False)
    if change == "non-ASCII mount key":
        d["mounts"][0]["de\u017ftination"] = "/var/run/nvidia-container-devices/all"
        return json.dumps(d, ensure_ascii=False)
    if change == "non-ASCII annotation key":
        d["annotations"]["cdi.k8s.io/\u00fc"] = "nvidia.com/gpu=1"
        return json.dumps(d, ensure_ascii=False)
    if change == "non-ASCII CDI annotation":
        d["annotations"]["cdi.k8s.io/gpu"] = "nvidia.com/gpu=\u00fc"
        return json.dumps(d, ensure_ascii=False)
    if change == "non-ASCII mount destination":
        d["mounts"].append({"destination": "/d\u00fc", "type": "bind", "source": "/srv"})
        return json.dumps(d, ensure_ascii=False)
    if change == "escaped env":  # decoded: NVIDIA_VISIBLE_DEVICES, the planned request
        return json.dumps(d).replace("NVIDIA_VISIBLE", "NVIDIA\\u005fVISIBLE")
    if change == "Go's escapes":  # as containerd, CRI-O and podman write every CUDA image's
        d["process"]["env"] += ["NVIDIA_PRODUCT_NAME=CUDA>=12 <&>", "PS1=<&>"]
        return go_json(d).decode()
    if change == "escaped value":  # not in the key: a PS1 as images set it
        d["process"]["env"] += ['PS1=\\u@\\h:\\w\\$ "x"\u00fc', "X=\u0000"]
        return json.dumps(d)
    if change == "quote in a name":
        d["process"]["env"].append('X"Y=1')
    if change == "quote in a keyed entry":
        d["process"]["env"].append('NVIDIA_X=a"b')
    if change == "non-ASCII in a keyed entry":
        d["process"]["env"].append("CUDA_VERSION=\u00fc")
    if change == "non-ASCII":
        d["process"]["env"].append("X=\u00fc")
        return json.dumps(d, ensure_ascii=False)
    if change == "annotation":
        d["annotations"]["cdi.k8s.io/gpu"] = "nvidia.com/gpu=1"
    elif change == "escaped annotation":
        d["annotations"]["cdi.k8s.io/gpu"] = "nvidia.com/gpu=1"
        return json.dumps(d).replace("nvidia.com/gpu=1", "nvidia.com\\/gpu=1")
    elif change.startswith("device-list mount"):
        d["mounts"].append({"destination": "/var/run/nvidia-container-devices/1",
                            "source": "/dev/null", "options": ["bind"]})  # fmt: skip
        if change.endswith("no source"):
            del d["mounts"][-1]["source"]
        elif change.endswith("escaped source"):
            return json.dumps(d).replace('"/dev/null"', '"\\/dev/null"')
    elif change == "escaped mount":
        return json.dumps(d).replace('"/proc"', '"\\/proc"')
    elif change == "Process too":
        d["Process"] = d["process"]
    elif change == "Process only":
        d["Process"] = d.pop("process")
    elif change == "Bounding":
        caps = d["process"]["capabilities"]
        caps["Bounding"] = [*caps.pop("bounding"), "CAP_SYS_ADMIN"]
    elif change == "ENV":
        d["process"]["ENV"] = d["process"].pop("env")
    elif change == "duplicate env":
        return json.dumps(d).replace('"env": [', '"env": [], "env": [', 1)
    elif change == "trailing text":
        return json.dumps(d) + " {}"
    elif change == "uid -1":
        d["process"]["user"]["uid"] = -1
    elif change == "uid text":
        d["process"]["user"]["uid"] = "0"
    elif change == "no mounts":
        del d["mounts"]
    elif change == "no linux":
        del d["linux"]
    elif change == "CreateContainer":
        d["hooks"] = {"CreateContainer": [{"path": "/bin/true"}]}
    elif change == "prestart object":
        d["hooks"] = {"prestart": {}}
    elif change == "additionalGids 5":
        d["process"]["user"]["additionalGids"] = 5
    elif change == "netDevices list":
        d["linux"]["netDevices"] = []
    elif change == "4097 annotations":
        d["annotations"] = {f"a{i}": "" for i in range(4097)}
    elif change == "other request":
        d["process"]["env"].append("NVIDIA_DRIVER_CAPABILITIES=compute")
    elif change == "user namespace":
        d["linux"]["namespaces"].append({"type": "user"})
        d["linux"]["uidMappings"] = [{"containerID": 0, "hostID": 100000, "size": 65536}]
    elif change == "namespace without a type":
        d["linux"]["namespaces"].append({"path": "/proc/1/ns/user"})
    return d


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ("quote in a name", "an env entry that is not a plain string"),
        ("quote in a keyed entry", "an env entry that is not a plain string"),
        ("non-ASCII in a keyed entry", "an env entry that is not a plain string"),
        *((change, "config.json is not UTF-8") for change in NOT_UTF8),
        ("long s key", "config.json is not plain JSON"),
        ("Kelvin key", "config.json is not plain JSON"),
        ("non-ASCII mount key", "a mount that is not plain"),
        ("non-ASCII mount destination", "a mount that is not plain"),
        ("non-ASCII annotation key", "annotations that are not plain"),
        ("non-ASCII CDI annotation", "a CDI annotation that is not a plain string"),
        ("escaped annotation", "a CDI annotation that is not a plain string"),
        ("device-list mount, escaped source", "a device-list mount whose source is not a plain"),
        ("device-list mount, no source", "a device-list mount whose source is not a plain"),
        ("escaped mount", "a mount that is not plain"),
        ("Process too", "config.json is not plain JSON"),
        ("Process only", "a key in another case"),
        ("Bounding", "a key in another case"),
        ("ENV", "a key in another case"),
        ("duplicate env", "no process object"),
        ("trailing text", "config.json is not plain JSON"),
        ("uid -1", "process.user.uid is not a plain number"),
        ("uid text", "process.user.uid is not a plain number"),
        ("no mounts", "no mounts list"),
        ("no linux", "no linux object"),
        ("CreateContainer", "a key in another case"),
        ("prestart object", "a field apply refuses"),
        ("additionalGids 5", "a field apply refuses"),
        ("netDevices list", "a field apply refuses"),
        ("4097 annotations", "annotations that are not plain"),
        ("other request", "no front plan for this request"),
    ],
)
def test_a_config_the_front_does_not_read_goes_to_python(
    node: Node, planned: dict[str, Any], change: str, why: str
) -> None:
    handed_over(*direct(node, mutated(planned, change)), why)


@pytest.mark.parametrize(
    "change", ["escaped env", "Go's escapes", "escaped value", "non-ASCII", "UTF-8 values"]
)
def test_escapes_and_utf8_are_served_as_apply(
    node: Node, planned: dict[str, Any], change: str
) -> None:
    """An env entry is read as JSON spells it: Go's encoding/json (containerd, CRI-O, podman)
    writes <, > and & as \\u escapes, so every CUDA image's NVIDIA_REQUIRE_CUDA
    (cuda>=12.0 ...) has them, and a character above 127 as its UTF-8 bytes (an argument, a
    value, a volume's host path in any language). Such a config takes its request's plan (its
    env patched as text: the escapes and the characters stay as they were)."""
    text = mutated(planned, change)
    assert isinstance(text, str) and ("\\u00" in text or not text.isascii())
    first, _ = node.create(text)  # a request not seen before: Python, which writes its plan
    assert first.returncode == 0, first.stderr
    done, config = node.create(text)
    assert done.returncode == 0 and "front: plan " in done.stderr, done.stderr
    after = config.read_bytes()
    assert json.loads(after) == expected(node, json.loads(text))
    if change == "Go's escapes":
        assert b"CUDA\\u003e=12 \\u003c\\u0026\\u003e" in after
    if change == "UTF-8 values":  # each as it stood, the env's patched as text
        assert after.count(UTF8.encode()) == 4 and b"CUDA\\u003e=12" in after


@pytest.mark.parametrize("change", ["user namespace", "namespace without a type"])
def test_a_user_namespaced_config_is_served_as_apply(
    node: Node, planned: dict[str, Any], change: str
) -> None:
    """A container in a user namespace (Kubernetes' hostUsers: false, podman --userns) takes
    the plan of its request: the spec's entry, kept, serves it inside the namespace as on
    Python's create (tests/integration/test_default_spec_images.py)."""
    doc = mutated(planned, change)
    done, _before, after = direct(node, doc)
    assert done.returncode == 0 and "front: plan " in done.stderr, done.stderr
    assert json.loads(after) == expected(node, doc)


def test_mutated_configs_are_served_as_apply_or_go_to_python(
    node: Node, planned: dict[str, Any]
) -> None:
    """Random byte mutations of a planned config.json (SHIMFRONT_FUZZ_RUNS, default 60): the
    front never crashes or hangs; it either serves the create, with apply's result on that
    document, or hands it to Python with config.json untouched."""
    rnd = random.Random(0x73686D)
    seed = json.dumps(planned).encode()
    alphabet = b'{}[]":,\\ \t\nu0eE+-.1trfalsn\x00\x7f\xc3\xa9Rr'
    for _ in range(int(os.environ.get("SHIMFRONT_FUZZ_RUNS", "60"))):
        data = bytearray(seed)
        for _ in range(rnd.randint(1, 3)):
            at = rnd.randrange(len(data))
            if rnd.randrange(3) == 0:
                del data[at : at + rnd.randint(1, 3)]
            else:
                data[at : at + rnd.randrange(2)] = bytes([rnd.choice(alphabet)])
        done, before, after = direct(node, data.decode("latin-1"))
        assert done.returncode in (0, 42), done.stderr
        if done.returncode == 42:
            assert after == before and "front: python: " in done.stderr, done.stderr
        else:
            assert json.loads(after) == expected(node, json.loads(before)), data


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (("--debug", "create", "--bundle", "B", "c1"), "arguments only the shim reads"),
        (("create", "-bB", "c1"), "arguments only the shim reads"),
        (("create", "--bundle", "B", "--bundle", "B", "c1"), "arguments only the shim reads"),
        (("create", "-b", "B", "--bundle=B", "c1"), "arguments only the shim reads"),
        (("create", "c1", "--bundle", "B"), "arguments only the shim reads"),
        (("create", "--config", "x.json", "--bundle", "B", "c1"), "arguments only the shim reads"),
        (("create", "--bundle", "B", "c1", "c2"), "arguments only the shim reads"),
        (("create", "--no-pivot=true", "--bundle", "B", "c1"), "arguments only the shim reads"),
        (("---root", "x", "create", "--bundle", "B", "c1"), "arguments only the shim reads"),
        (("run", "--bundle", "B", "c1"), "a run"),
        (("create", "--bundle", "/nonexistent/b", "c1"), "the bundle could not be opened"),
    ],
)
def test_arguments_the_front_does_not_read_go_to_python(
    node: Node, planned: dict[str, Any], args: tuple[str, ...], why: str
) -> None:
    handed_over(*_with_args(node, planned, args), why)


def test_the_front_reads_the_flags_runcargs_names(
    node: Node, planned: dict[str, Any], tmp_path: Path
) -> None:
    """The flags the compiled create takes are gpuctk.hook.shim.runcargs's tables (generated
    into its header): each, with a value where runc's takes one, and the create is the
    front's; a verb value flag of runc's it leaves out is Python's."""
    from gpuctk.hook.shim import runcargs

    value = {"log": str(tmp_path / "log"), "log-format": "text"}
    before = [(f"--{f}", value.get(f, "x")) for f in sorted(runcargs.GLOBAL_VALUE_FLAGS)]
    before += [(f"--{f}",) for f in sorted(runcargs.FRONT_GLOBAL_BOOL_FLAGS)]
    after = [(f"--{f}", "x") for f in sorted(runcargs.FRONT_VERB_VALUE_FLAGS)
             if f not in (runcargs.BUNDLE, runcargs.BUNDLE_SHORT)]  # fmt: skip
    after += [(f"--{f}",) for f in sorted(runcargs.FRONT_VERB_BOOL_FLAGS)]
    cases = [(b, ()) for b in before] + [((), ())] + [((), a) for a in after]
    for ahead, behind in cases:
        args = (*ahead, "create", *behind, "--bundle", "B", "c1")
        done, _, after_text = _with_args(node, planned, args)
        assert done.returncode == 0 and "front: plan " in done.stderr, (args, done.stderr)
        assert json.loads(after_text) == expected(node, planned)
    left = sorted(runcargs.VERB_VALUE_FLAGS - runcargs.FRONT_VERB_VALUE_FLAGS)
    assert left
    for flag in left:
        args = ("create", f"--{flag}", "config.json", "--bundle", "B", "c1")
        handed_over(*_with_args(node, planned, args), "arguments only the shim reads")


def _with_args(
    node: Node, doc: dict[str, Any], args: tuple[str, ...]
) -> tuple[subprocess.CompletedProcess[str], bytes, bytes]:
    bundle = Path(os.path.join(node.work, f"args-{time.monotonic_ns()}"))
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(doc))
    before = (bundle / "config.json").read_bytes()
    argv = [str(bundle) if a == "B" else ("-b" + str(bundle) if a == "-bB" else a) for a in args]
    done = run_front(node, [a.replace("--bundle=B", f"--bundle={bundle}") for a in argv])
    return done, before, (bundle / "config.json").read_bytes()


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"GPUCTK_SHIM_FRONT": "off"}, "GPUCTK_SHIM_FRONT=off"),
        ({"GPUCTK_SPEC_CACHE": "0"}, "GPUCTK_SPEC_CACHE=0"),
        ({"GPUCTK_FRONT_RUNTIME": "<unset>"}, "no memo that holds"),
        ({"GPUCTK_FRONT_RUNTIME": "true"}, "no memo that holds"),
        (
            {"GPUCTK_CONFIG": "/etc/gpuctk/other.toml"},
            "the front prefixes are another config file's",
        ),
    ],
)
def test_the_environment_can_send_it_to_python(
    node: Node, planned: dict[str, Any], extra: dict[str, str], why: str
) -> None:
    handed_over(*direct(node, planned, **extra), why)


def test_a_config_json_link_goes_to_python(node: Node, planned: dict[str, Any]) -> None:
    handed_over(*direct(node, planned, link=True), "config.json is not a regular file")


# ---- trust ----------------------------------------------------------------------------------


def plan_of(node: Node, doc: dict[str, Any]) -> Path:
    key = key_of(node, doc)
    assert key is not None
    return node.state / "front" / key.file


CRI = {"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-id": "x"}
CRIO = {"io.kubernetes.cri-o.ContainerType": "container", "io.container.manager": "cri-o"}
MANAGER = "io.container.manager"  # the marker whose value the key holds too


def test_a_podman_pods_plan_is_not_a_cri_o_containers(tmp_path: Path) -> None:
    """podman marks its own pods' containers as CRI-O does, with the manager `libpod`: not a
    Kubernetes container, so its env request is honoured and its plan serves the next one.
    A CRI-O container with the same env differs only in the manager's value, which the key
    holds: it never takes that plan, and gets nothing."""
    own = make_node(tmp_path)
    podman = base_doc("/nonexistent-root")
    podman["annotations"].update({**CRIO, MANAGER: "libpod"})
    assert "/dev/nvidia0" in {d["path"] for d in fronted(own, podman)["linux"]["devices"]}
    crio = copy.deepcopy(podman)
    crio["annotations"][MANAGER] = "cri-o"
    assert key_of(own, crio) != key_of(own, podman)
    handed_over(*direct(own, crio), "no front plan for this request")
    done, config = own.create(crio)
    assert done.returncode == 0 and json.loads(config.read_text()) == crio, done.stderr


@pytest.mark.parametrize("markers", [CRI, CRIO], ids=["containerd", "cri-o"])
def test_a_kubernetes_container_never_takes_a_plain_containers_plan(
    node: Node, planned: dict[str, Any], markers: dict[str, str]
) -> None:
    """The same env, unprivileged, in a Kubernetes container: the env is no grant there
    (accept-envvar-unprivileged auto), so the front must not replay the plan a plain
    container's create wrote. The key holds the markers: it finds none, and the shim injects
    nothing."""
    doc = copy.deepcopy(planned)
    doc["annotations"].update(markers)
    key = key_of(node, doc)
    assert key is not None and key != key_of(node, planned)
    words = [w for k, v in markers.items() for w in ((k, v) if k == MANAGER else (k,))]
    at = key.key.index(f"markers={len(markers)}")
    assert key.key[at + 1 : at + 1 + len(words)] == words
    handed_over(*direct(node, doc), "no front plan for this request")
    done, config = node.create(doc)
    assert done.returncode == 0, done.stderr
    assert json.loads(config.read_text()) == doc  # left as it is: no GPU
    assert "ignoring NVIDIA_VISIBLE_DEVICES=0 in an unprivileged Kubernetes container" in (
        done.stderr
    )


CHANNEL = "/dev/nvidia-caps-imex-channels/channel0"


def volume_mounts_node(tmp_path: Path) -> Node:
    """A node that accepts device-list mounts, with a spec of IMEX channel 0 (at CHANNEL)."""
    own = make_node(tmp_path, conf="accept-volume-mounts = true\n")
    node = {"path": CHANNEL, "hostPath": "/dev/urandom", "type": "c", "major": 1, "minor": 9}
    imex = {"cdiVersion": "0.6.0", "kind": "nvidia.com/imex-channel",
            "devices": [{"name": "0", "containerEdits": {"deviceNodes": [node]}}]}  # fmt: skip
    (own.spec_dir / "imex.json").write_text(json.dumps(imex))
    time.sleep(speccache.SETTLE_NS / 1e9 + 0.2)
    return own


def test_a_kubernetes_container_never_takes_a_plain_containers_imex_channels(
    tmp_path: Path,
) -> None:
    """A device-list request (volume-mounts) carries the IMEX channels NVIDIA_IMEX_CHANNELS
    asks for where the env is honoured: in a plain container, not in an unprivileged
    Kubernetes one (accept-envvar-unprivileged auto). The key holds the markers, so the pod
    never takes the plain container's plan: Python grants it GPU 1 alone."""
    own = volume_mounts_node(tmp_path)
    plain = base_doc("/nonexistent-root")
    plain["process"]["env"] = ["PATH=/bin", "NVIDIA_IMEX_CHANNELS=0"]
    plain["mounts"].append({"destination": "/var/run/nvidia-container-devices/1",
                            "source": "/dev/null", "options": ["bind"]})  # fmt: skip
    assert CHANNEL in {d["path"] for d in fronted(own, plain)["linux"]["devices"]}
    pod = copy.deepcopy(plain)
    pod["annotations"].update(CRI)
    assert key_of(own, pod) != key_of(own, plain)
    handed_over(*direct(own, pod), "no front plan for this request")
    done, config = own.create(pod)
    assert done.returncode == 0, done.stderr
    paths = {d["path"] for d in json.loads(config.read_text())["linux"]["devices"]}
    assert "/dev/nvidia1" in paths and CHANNEL not in paths, done.stderr
    assert "ignoring NVIDIA_IMEX_CHANNELS=0" in done.stderr


def test_a_plan_honoured_everywhere_is_replayed_for_kubernetes(tmp_path: Path) -> None:
    """A privileged request, or any under an explicit accept-envvar-unprivileged = true, is
    honoured in a Kubernetes container too: its plan does not send those to Python."""
    doc = base_doc("/nonexistent-root")
    doc["annotations"].update(CRI)
    doc["process"]["capabilities"]["bounding"].append("CAP_SYS_ADMIN")
    (tmp_path / "auto").mkdir()
    (tmp_path / "on").mkdir()
    auto = make_node(tmp_path / "auto")
    assert fronted(auto, doc) == expected(auto, doc)
    own = make_node(tmp_path / "on", conf="accept-envvar-unprivileged = true\n")
    doc["process"]["capabilities"]["bounding"].remove("CAP_SYS_ADMIN")
    assert fronted(own, doc) == expected(own, doc)


@pytest.mark.parametrize("kubernetes", [False, True], ids=["plain", "kubernetes"])
def test_a_cdi_annotation_request_is_the_fronts_the_second_time(
    tmp_path: Path, kubernetes: bool
) -> None:
    """What the device plugin's cdi-annotations strategy hands over, in a Kubernetes container
    too (where an unprivileged env would be no grant): the second create is the front's and
    equals apply; an annotation naming another device is another key, Python's again."""
    own = make_node(tmp_path)
    doc = base_doc("/nonexistent-root")
    doc["process"]["env"] = [BASE_ENV[0], "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]
    doc["annotations"]["cdi.k8s.io/gpuctk-device-plugin"] = "nvidia.com/gpu=1"
    if kubernetes:
        doc["annotations"].update(CRI)
    got = fronted(own, doc)
    assert got == expected(own, doc)
    assert {d["path"] for d in got["linux"]["devices"]} == {"/dev/nvidiactl", "/dev/nvidia1"}
    other = copy.deepcopy(doc)
    other["annotations"]["cdi.k8s.io/gpuctk-device-plugin"] = "nvidia.com/gpu=0"
    done, config = own.create(other)
    assert done.returncode == 0 and "front: plan " not in done.stderr, done.stderr
    assert "/dev/nvidia0" in {d["path"] for d in json.loads(config.read_text())["linux"]["devices"]}


def test_a_device_list_mount_is_served_by_its_destination_and_source(tmp_path: Path) -> None:
    """Under accept-volume-mounts (the device plugin's volume-mounts strategy), a request read
    from `/dev/null` mounts under /var/run/nvidia-container-devices (GPU 1, an IMEX channel)
    takes its plan from the second create on; the key holds each such mount's source beside
    its destination, so a container with the same destinations from another source (no
    request: only a `/dev/null` mount asks) or without the channel's mount never takes it."""
    own = volume_mounts_node(tmp_path)

    def asking(source: str = "/dev/null", channel_mount: bool = True) -> dict[str, Any]:
        doc = base_doc("/nonexistent-root")
        doc["process"]["env"].remove(VISIBLE)
        for name in ("1", "imex/0")[: 1 + channel_mount]:
            doc["mounts"].append({"destination": f"/var/run/nvidia-container-devices/{name}",
                                  "source": source, "options": ["bind"]})  # fmt: skip
        return doc

    def devices(config: Path) -> set[str]:
        return {d["path"] for d in json.loads(config.read_text())["linux"].get("devices", [])}

    key = key_of(own, asking())
    assert key is not None and "device-list=2" in key.key, key
    at = key.key.index("device-list=2")
    assert key.key[at - 2 : at + 4] == [
        *(m["destination"] for m in asking()["mounts"][-2:]),
        "device-list=2",
        "/dev/null",
        "/dev/null",
        "devices=0",
    ]
    assert fronted(own, asking()) == expected(own, asking())
    done, config = own.create(asking())
    assert done.returncode == 0 and "front: plan " in done.stderr, done.stderr
    assert devices(config) == {"/dev/nvidiactl", "/dev/nvidia1", CHANNEL}
    for other in (asking(source="/srv/data"), asking(channel_mount=False)):
        assert key_of(own, other) != key
        done, config = own.create(other)
        assert done.returncode == 0 and "front: plan " not in done.stderr, done.stderr
        assert CHANNEL not in devices(config), done.stderr
    assert devices(config) == {"/dev/nvidiactl", "/dev/nvidia1"}  # the mount's GPU alone
    done, config = own.create(asking(source="/srv/data"))  # its own plan: no GPU
    assert done.returncode == 0, done.stderr
    assert not devices(config) & {"/dev/nvidia1", CHANNEL}, done.stderr


def test_a_keyed_on_file_of_another_config_is_written_again(tmp_path: Path) -> None:
    """Two configs sharing one state folder: a plan still current is no reason to leave
    keyed-on naming the other's prefixes (every create would then go to Python)."""
    own = make_node(tmp_path)
    doc = base_doc("/nonexistent-root")
    fronted(own, doc)
    keyed_on = own.state / frontplan.FOLDER_NAME / frontplan.PREFIXES_NAME
    mine = keyed_on.read_text()
    other = json.loads(mine)
    other.update(config="/etc/gpuctk/other.toml", prefixes=["x/"])
    keyed_on.write_text(json.dumps(other))
    first, _ = own.create(doc)
    assert "front: python: the front prefixes are another config file's" in first.stderr
    assert json.loads(keyed_on.read_text()) == json.loads(mine)  # Python wrote it again
    again, _ = own.create(doc)
    assert "front: plan " in again.stderr, again.stderr


def test_the_prefixes_the_key_holds_are_the_configs(tmp_path: Path) -> None:
    """Under annotation-prefixes = ["gpu.example/"], a cdi.k8s.io/ annotation asks for nothing
    and is no part of the key: the env request's plan serves it; a gpu.example/ one is."""
    own = make_node(tmp_path, conf='annotation-prefixes = ["gpu.example/"]\n')
    doc = base_doc("/nonexistent-root")
    fronted(own, doc)
    ignored = copy.deepcopy(doc)
    ignored["annotations"]["cdi.k8s.io/x"] = "nvidia.com/gpu=1"
    assert key_of(own, ignored, ("gpu.example/",)) == key_of(own, doc, ("gpu.example/",))
    done, config = own.create(ignored)
    assert "front: plan " in done.stderr, done.stderr
    assert json.loads(config.read_text()) == expected(own, ignored)
    asked = copy.deepcopy(doc)
    asked["annotations"]["gpu.example/x"] = "nvidia.com/gpu=1"
    got = fronted(own, asked)
    assert got == expected(own, asked)
    assert "/dev/nvidia1" in {d["path"] for d in got["linux"]["devices"]}


@pytest.mark.parametrize(
    "how", ["plan 0660", "plan of uid 1000", "plan a link", "front 0777", "state 0770"]
)
def test_a_plan_others_could_write_is_not_read(
    node: Node, planned: dict[str, Any], how: str
) -> None:
    plan = plan_of(node, planned)
    target = {"plan": plan, "front": plan.parent, "state": node.state}[how.split()[0]]
    mode = target.stat().st_mode & 0o7777
    kept = plan.with_name("kept")
    try:
        if how == "plan of uid 1000":
            os.chown(plan, 1000, -1)
        elif how == "plan a link":
            plan.rename(kept)
            plan.symlink_to(kept.name)
        else:
            target.chmod(int(how.split()[1], 8))
        why = "no memo that holds" if how == "state 0770" else "no front plan for this request"
        handed_over(*direct(node, planned), why)
    finally:
        if how == "plan a link":
            plan.unlink()
            kept.rename(plan)
        os.chown(plan, 0, -1)
        target.chmod(mode)
    done, _, _ = direct(node, planned)
    assert "front: plan " in done.stderr, done.stderr


def test_another_requests_plan_under_this_name_is_not_used(
    node: Node, planned: dict[str, Any]
) -> None:
    other = copy.deepcopy(planned)
    other["process"]["env"][-1] = "NVIDIA_VISIBLE_DEVICES=1"
    fronted(node, other)
    plan, saved = plan_of(node, planned), plan_of(node, planned).read_bytes()
    try:
        shutil.copyfile(plan_of(node, other), plan)
        handed_over(*direct(node, planned), "the front plan is another request's")
    finally:
        plan.write_bytes(saved)


CHANGED = "a file the front plan names changed since"


@pytest.mark.parametrize(
    ("path", "mode"),
    [
        ("bin/gpuctk-cdi-hook", 0o775),
        ("files/icd.json", 0o666),
        ("files/lib", 0o777),
        ("files", 0o775),
        ("files/run", 0o1777),
    ],
)
def test_a_host_path_others_could_write_goes_to_python(
    node: Node, planned: dict[str, Any], path: str, mode: int
) -> None:
    target = node.work / path
    kept = target.stat().st_mode & 0o7777
    try:
        target.chmod(mode)
        handed_over(*direct(node, planned), CHANGED)
    finally:
        target.chmod(kept)


@pytest.mark.parametrize("path", ["files/icd.json", "files/run/socket", "files/lib"])
def test_a_host_path_swapped_for_a_like_one_goes_to_python(tmp_path: Path, path: str) -> None:
    """Same name, type, mode and owner, another inode: not what Python checked."""
    own = make_node(tmp_path)
    doc = base_doc("/nonexistent-root")
    fronted(own, doc)
    target = own.work / path
    kept = target.with_name(target.name + ".old")
    target.rename(kept)
    if path.endswith("socket"):
        listening = socket.socket(socket.AF_UNIX)
        listening.bind(str(target))
        SOCKETS.append(listening)
    elif path.endswith("lib"):
        target.mkdir()
    else:
        shutil.copy2(kept, target)
    target.chmod(kept.stat().st_mode & 0o7777)
    done, _ = own.create(doc)
    assert done.returncode == 0, done.stderr
    assert f"front: python: {CHANGED}" in done.stderr, done.stderr
    again, _ = own.create(doc)  # the Python create wrote the plan again: the front's
    assert "front: plan " in again.stderr, again.stderr


def test_a_runtime_other_than_the_plans_goes_to_python(node: Node, planned: dict[str, Any]) -> None:
    folder = node.work / "other-runtime"
    folder.mkdir(exist_ok=True)
    shutil.copyfile("/bin/true", folder / "true")
    (folder / "true").chmod(0o755)
    runtime = str(folder / "true")
    handed_over(
        *direct(node, planned, GPUCTK_FRONT_RUNTIME=runtime), "the runtime is not the front plan's"
    )


def test_chain_of_takes_each_step_the_kernel_takes(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f").write_text("")
    (tmp_path / "rel").symlink_to("a/./b")
    (tmp_path / "a" / "up").symlink_to("../a/b/f")
    (tmp_path / "abs").symlink_to(tmp_path / "a")
    steps = filechain.chain_of([f"{tmp_path}/rel/f", f"{tmp_path}/abs/up"])
    assert steps is not None
    here = [str(tmp_path / p) for p in ("rel", "a", "a/b", "a/b/f", "abs", "a/up")]
    assert set(here) <= set(steps)
    assert all(not os.path.islink(p) for p in steps if p not in (here[0], here[4], here[5]))
    for path, ident in steps.items():
        st = os.lstat(path)
        assert ident == [st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_gid]
    assert filechain.chain_of([f"{tmp_path}/missing"]) is None
    assert filechain.chain_of(["relative/path"]) is None
    (tmp_path / "loop").symlink_to("loop")
    assert filechain.chain_of([f"{tmp_path}/loop"]) is None


@pytest.mark.parametrize("what", ["spec", "config", "new spec"])
def test_a_changed_world_goes_to_python(tmp_path: Path, what: str) -> None:
    own = make_node(tmp_path)
    doc = base_doc("/nonexistent-root")
    fronted(own, doc)
    if what == "spec":
        os.utime(own.spec_dir / "nvidia.json")
    elif what == "config":
        own.conf.write_text(own.conf.read_text() + "\n")
    else:
        (own.spec_dir / "other.json").write_text("{}")
    why = "the config, the specs or gpuctk changed since the front plan"
    handed_over(*direct(own, doc), why)


@pytest.mark.parametrize(
    ("change", "ineligible"),
    [
        ("NVIDIA_DRIVER_CAPABILITIES=bogus", "a note (an unknown capability)"),
        ("NVIDIA_REQUIRE_CUDA=cuda>=99.0", "an unmet requirement: an error"),
    ],
)
def test_a_request_with_a_note_or_an_error_gets_no_plan(
    node: Node, change: str, ineligible: str
) -> None:
    doc = base_doc("/nonexistent-root")
    doc["process"]["env"].append(change)
    for _ in range(2):
        node.create(doc)
    assert not plan_of(node, doc).exists(), ineligible


@pytest.mark.parametrize("guard", ["on", "off"])
def test_a_spec_with_no_entry_keeps_the_guard_on_the_compiled_create(
    tmp_path: Path, guard: str
) -> None:
    """A spec with no hook entry (`--disable-hook all`): the Python create adds the device
    node guard's entry, and the plan carries the same compiled gpuctk-cdi-hook entry, which
    reads the container's params at each start, so the compiled create guards too. With
    `disable-device-node-modification = false` neither adds one."""
    conf = "disable-device-node-modification = false\n" if guard == "off" else ""
    own = make_node(tmp_path, conf=conf, hooks=False)
    doc = base_doc("/nonexistent-root")
    for _ in range(2):
        done, _ = own.create(doc)
        assert done.returncode == 0, done.stderr
    assert plan_of(own, doc).exists()
    done, config = own.create(doc)
    assert done.returncode == 0 and "front: plan " in done.stderr, done.stderr
    hooks = json.loads(config.read_text()).get("hooks", {})
    entries = [(h["path"], h["args"]) for h in hooks.get("createContainer", [])]
    want = [(str(own.hook), ["gpuctk-cdi-hook", "disable-device-node-modification"])]
    assert entries == (want if guard == "on" else []), entries


def test_a_node_whose_numbers_come_from_the_host_is_checked_again(tmp_path: Path) -> None:
    gpu = tmp_path / "gpu2"
    os.mknod(gpu, 0o600 | stat.S_IFCHR, os.makedev(1, 5))
    (tmp_path / "node").mkdir()
    own = make_node(tmp_path / "node", numberless=str(gpu))
    doc = base_doc("/nonexistent-root")
    doc["process"]["env"][-1] = "NVIDIA_VISIBLE_DEVICES=2"
    got = fronted(own, doc)
    assert {"path": "/dev/nvidia2", "type": "c", "major": 1, "minor": 5} in got["linux"]["devices"]
    gpu.unlink()  # the module reloaded: the node made again, with other numbers
    os.mknod(gpu, 0o600 | stat.S_IFCHR, os.makedev(1, 7))
    why = "the config, the specs or gpuctk changed since the front plan"
    handed_over(*direct(own, doc), why)
    done, config = own.create(doc)
    assert done.returncode == 0, done.stderr
    devices = json.loads(config.read_text())["linux"]["devices"]
    assert {"path": "/dev/nvidia2", "type": "c", "major": 1, "minor": 7} in devices


def test_the_key_is_the_compiled_creates_to_say(node: Node) -> None:
    """`gpuctk-cdi-hook front-key` (the key's one home) says the fields the key holds and
    their order; a config the compiled create would hand over has no key, and no plan."""
    doc = base_doc("/nonexistent-root")
    doc["process"]["user"] = {"uid": 7, "gid": 8}
    doc["process"]["capabilities"]["bounding"].append("CAP_SYS_ADMIN")
    doc["process"]["env"].append("CUDA_VERSION=12.4")
    doc["process"]["env"].append("NO_VALUE")
    doc["annotations"].update({"cdi.k8s.io/a": "nvidia.com/gpu=1", "other/b": "x"})
    doc["linux"]["devices"] = [{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}]
    listed = "/var/run/nvidia-container-devices/GPU-1"  # the device plugin's volume-mounts
    doc["mounts"].append({"destination": listed, "type": "bind", "source": "/dev/null"})
    key = key_of(node, doc)
    assert key is not None
    env = ["PATH", "NVIDIA_VISIBLE_DEVICES", "CUDA_VERSION", "NO_VALUE"]
    mounts = ["/proc", "/dev", "/dev/pts", "/sys", listed]
    assert key.key == [VISIBLE, "CUDA_VERSION=12.4", "privileged=1", "uid=7", "gid=8",
                       "env=4", *env, "mounts=5", *mounts, "device-list=1", "/dev/null",
                       "devices=1", "/dev/fuse", "markers=0", "cdi.k8s.io/a",
                       "nvidia.com/gpu=1"]  # fmt: skip
    assert (key.env, key.mounts, key.devices) == (env, mounts, ["/dev/fuse"])
    assert (key.privileged, key.uid, key.gid) == (1, 7, 8)
    assert key_of(node, doc, ("other/",)) != key  # the prefixes are the caller's
    escaped = copy.deepcopy(doc)
    escaped["annotations"]["cdi.k8s.io/a"] = 'nvidia.com/gpu="1"'
    unicode = copy.deepcopy(doc)
    unicode["process"]["env"].append("NVIDIA_DRIVER_CAPABILITIES=\u00e9")
    userns = copy.deepcopy(doc)
    userns["linux"]["namespaces"].append({"type": "user"})
    assert key_of(node, userns) == key  # the same request, in a user namespace
    for refused in (escaped, unicode):
        assert key_of(node, refused) is None
    assert key_of(node, doc, ('cdi"',)) is None
    assert key_of(node, doc, ("",)) is None
    assert key_of_text(node, b"{not json") is None
    elsewhere = copy.copy(key)
    elsewhere.file = "../x.json"
    assert not frontkey._key_shape(elsewhere)  # a name in the front folder only
    text = json.dumps(doc).encode()
    limit = ocibundle.MAX_CONFIG  # what the shim reads, and the compiled create
    assert key_of_text(node, text + b" " * (limit - len(text))) == key
    assert key_of_text(node, text + b" " * (limit + 1 - len(text))) is None
    missing = str(node.bin / "missing")
    assert frontkey.key_of(missing, json.dumps(doc).encode(), CDI, str(node.state)) is None


def test_a_shim_no_compiled_create_started_writes_no_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pip's console script (Python all the way): no front reads plans, none is written;
    the same create that names the compiled create writes one."""
    from gpuctk.hook.shim import runtime_main

    own = make_node(tmp_path)
    for key, value in own.env().items():
        monkeypatch.setenv(key, value)
    doc = base_doc("/nonexistent-root")
    for n, compiled in enumerate(("", str(own.hook))):
        bundle = tmp_path / f"b{n}"
        bundle.mkdir()
        (bundle / "config.json").write_text(json.dumps(doc))
        args = ["create", "--bundle", str(bundle), f"c{n}"]
        assert runtime_main.prepare(args, compiled=compiled)[0] == 0
        assert plan_of(own, doc).exists() == bool(compiled)


def test_a_config_changed_during_the_resolution_is_not_taken_for_the_one_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The settings are read, the config file changes while the request resolves (and
    settles): the plan must not name the new file for the old settings' edits."""
    from gpuctk.hook.requests import cdiedits
    from gpuctk.hook.shim import runtime_main

    own = make_node(tmp_path)
    doc = base_doc("/nonexistent-root")  # unprivileged: the change below ignores its env
    for key, value in own.env().items():
        monkeypatch.setenv(key, value)
    real = cdiedits.edits_for

    def slow(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        own.conf.write_text(own.conf.read_text() + "accept-envvar-unprivileged = false\n")
        time.sleep(speccache.SETTLE_NS / 1e9 + 0.1)
        return out

    monkeypatch.setattr(cdiedits, "edits_for", slow)
    bundle = tmp_path / "race"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(doc))
    args = ["create", "--bundle", str(bundle), "c1"]
    assert runtime_main.prepare(args, compiled=str(own.hook))[0] == 0
    why = "the config, the specs or gpuctk changed since the front plan"
    assert plan_of(own, doc).exists()  # for the config as it was read
    handed_over(*direct(own, doc), why)


def test_a_stale_plan_is_written_again(tmp_path: Path) -> None:
    own = make_node(tmp_path)
    doc = base_doc("/nonexistent-root")
    fronted(own, doc)
    own.conf.write_text(own.conf.read_text() + "\n")  # a config edit: the world changed
    time.sleep(speccache.SETTLE_NS / 1e9 + 0.1)
    done, _ = own.create(doc)
    assert "front: python: no memo that holds" in done.stderr  # older than the config
    done, _ = own.create(doc)  # that create found the front plan stale and wrote it again
    assert "front: plan " in done.stderr, done.stderr


def shim_run(
    node: Node, doc: dict[str, Any], *flags: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """gpuctk-runtime GLOBAL-FLAGS create --bundle B c1, through the launchers (`env`: more
    of its environment)."""
    bundle = Path(os.path.join(node.work, f"log-{time.monotonic_ns()}"))
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(doc))
    argv = [str(node.bin / "gpuctk-runtime"), *flags, "create", "--bundle", str(bundle), "c1"]
    return clean(
        subprocess.run(
            argv, env=node.env(**env), capture_output=True, text=True, timeout=TIMEOUT, check=False
        )
    )


def test_the_fronts_time_is_in_the_zone_python_spells(tmp_path: Path) -> None:
    """The plan's lines carry the zone Python spells for the local offset (gpuctk.log); under
    another offset (the clocks changed) the front hands the create to Python, which writes
    the line in the new zone and a plan for it, which the front then serves."""
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o755)
    (tmp_path / "n").mkdir()
    own = make_node(tmp_path / "n", conf=f'log-file = "{logs}/gpuctk.log"\n')
    doc = base_doc("/nonexistent-root")
    zones = ("UTC0", "UTC0", "UTC0", "XST-5:30", "XST-5:30", "YST+24:59:59", "YST+24:59:59")
    runs = [shim_run(own, doc, TZ=tz) for tz in zones]
    assert all(r.returncode == 0 for r in runs), runs
    served = ["front: plan " in r.stderr for r in runs]
    assert served == [False, True, True, False, True, False, True], [r.stderr for r in runs]
    assert "offset changed" in runs[3].stderr, runs[3].stderr
    stamps = [line.partition(" ")[0] for line in (logs / "gpuctk.log").read_text().splitlines()]
    assert len(stamps) == 7 and all(
        len(s) == len('time="2026-01-01T00:00:00Z"') for s in stamps[:3]
    )
    assert [s[-2:] for s in stamps[:3]] == ['Z"'] * 3, stamps
    assert [s[-7:] for s in stamps[3:5]] == ['+05:30"'] * 2, stamps
    assert [s[-7:] for s in stamps[5:]] == ['-24:59"'] * 2, stamps  # the most POSIX TZ allows


@pytest.mark.parametrize("fmt", ["text", "json", "other"])  # other: runc writes text
def test_the_front_logs_what_the_shim_logs(tmp_path: Path, fmt: str) -> None:
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o755)
    (tmp_path / "n").mkdir()
    own = make_node(tmp_path / "n", conf=f'log-file = "{logs}/gpuctk.log"\n')
    doc = base_doc("/nonexistent-root")
    engine = tmp_path / "engine.log"
    lines = []
    for _ in range(3):
        done = shim_run(own, doc, "--log", str(engine), "--log-format", fmt)
        assert done.returncode == 0, done.stderr
        lines.append(done.stderr)
    assert "front: plan " in lines[-1], lines
    said = "c1: injected nvidia.com/gpu=0 (from NVIDIA_VISIBLE_DEVICES)"
    engine_lines = [line for line in engine.read_text().splitlines() if "injected" in line]
    file_lines = (logs / "gpuctk.log").read_text().splitlines()
    assert len(engine_lines) == 3  # two by Python, the last by the front
    if fmt == "json":
        assert [json.loads(line)["msg"] for line in engine_lines] == [said] * 3
        assert {json.loads(line)["level"] for line in engine_lines} == {"info"}
    else:
        assert all(line.endswith(f'level=info msg="{said}"') for line in engine_lines)
    assert [line.partition(" level=")[2] for line in file_lines] == [
        f'info msg="gpuctk-runtime: {said}"'
    ] * 3
    stamps = {line.partition(" ")[0] for line in file_lines}
    assert all(s.startswith('time="') and s.endswith('"') and len(s) >= 27 for s in stamps)


def test_a_level_above_info_logs_no_injected_line_either_way(tmp_path: Path) -> None:
    """log-level = "warning": Python writes no info line, nor does the front, which serves."""
    (tmp_path / "logs").mkdir(mode=0o755)
    (tmp_path / "n").mkdir()
    own = make_node(
        tmp_path / "n", conf=f'log-level = "warning"\nlog-file = "{tmp_path}/logs/g.log"\n'
    )
    engine = tmp_path / "engine.log"
    runs = [shim_run(own, base_doc("/nonexistent-root"), "--log", str(engine)) for _ in range(3)]
    assert all(r.returncode == 0 for r in runs) and "front: plan " in runs[-1].stderr, runs
    assert not engine.exists() or "injected" not in engine.read_text()
    assert (
        not (tmp_path / "logs" / "g.log").exists() or not (tmp_path / "logs" / "g.log").read_text()
    )


@pytest.mark.parametrize(
    "spelling", ["logs//gpuctk.log", "via/gpuctk.log", "logs/../logs/gpuctk.log"]
)
def test_a_log_file_spelled_another_way_is_the_fronts_too(tmp_path: Path, spelling: str) -> None:
    """A doubled slash, a link among its folders (as /var/run -> /run), a `..`: the plan
    names the file the kernel reaches, and no create fails for the spelling."""
    (tmp_path / "logs").mkdir(mode=0o755)
    (tmp_path / "via").symlink_to("logs")
    (tmp_path / "n").mkdir()
    own = make_node(tmp_path / "n", conf=f'log-file = "{tmp_path}/{spelling}"\n')
    doc = base_doc("/nonexistent-root")
    runs = [shim_run(own, doc) for _ in range(3)]
    assert all(done.returncode == 0 for done in runs), runs[-1].stderr
    assert "front: plan " in runs[-1].stderr, runs[-1].stderr
    lines = (tmp_path / "logs" / "gpuctk.log").read_text().splitlines()
    assert sum("injected" in line for line in lines) == 3


def test_the_chain_holds_typed_device_nodes_and_nothing_on_procfs(tmp_path: Path) -> None:
    edits: Any = {"deviceNodes": [{"path": "/dev/null", "type": "c", "major": 1, "minor": 3}]}
    made = filechain.trusted_chain(edits, "/bin/true", "")
    assert made is not None and "/dev/null" in made[0], made  # runc in a userns mounts it
    assert made[1] == []
    proc_edits: Any = {
        "mounts": [{"hostPath": "/proc/self/cwd", "containerPath": "/x", "options": ["bind"]}]
    }
    assert filechain.trusted_chain(proc_edits, "/bin/true", "") is None
    for path in ("/proc/self/cwd", "/proc/1/root/etc", "/dev/fd/0"):
        assert filechain.chain_of([path]) is None, path  # links that keep their identity


@pytest.mark.parametrize(
    "conf",
    [
        'log-level = "debug"\n',  # the shim logs more there: no plan
        'log-file = "{open}/gpuctk.log"\n',  # Python refuses it: no plan at all
    ],
)
def test_a_log_the_front_cannot_write_as_python_would_goes_to_python(
    tmp_path: Path, conf: str
) -> None:
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    (tmp_path / "n").mkdir()
    own = make_node(tmp_path / "n", conf=conf.format(open=folder))
    doc = base_doc("/nonexistent-root")
    for _ in range(2):
        shim_run(own, doc)
    done = shim_run(own, doc)
    assert "front: plan" not in done.stderr, done.stderr
    assert "log-file" in done.stderr or "debug" in conf, done.stderr
    assert not list((own.state / frontplan.FOLDER_NAME).glob("*.json"))


@pytest.mark.parametrize(
    "field", ["linux.devices", "linux.resources", "linux.resources.devices", "process.user"]
)
def test_a_field_apply_refuses_goes_to_python_whatever_the_plan_edits(
    tmp_path: Path, field: str
) -> None:
    own = make_node(tmp_path, nodes=False)
    doc = base_doc("/nonexistent-root")
    fronted(own, doc)
    bad = copy.deepcopy(doc)
    if field == "linux.devices":
        bad["linux"]["devices"] = "x"
    elif field == "linux.resources":
        bad["linux"]["resources"] = "x"
    elif field == "linux.resources.devices":
        bad["linux"]["resources"]["devices"] = 7
    else:
        bad["process"]["user"] = []
    why = "process.user is not an object" if field == "process.user" else "a field apply refuses"
    handed_over(*direct(own, bad), why)
    with pytest.raises(ValidationError):
        expected(own, bad)  # apply refuses it too


def test_a_plan_for_another_spelling_of_the_config_is_written_again(tmp_path: Path) -> None:
    own = make_node(tmp_path)
    doc = base_doc("/nonexistent-root")
    fronted(own, doc)
    other = str(own.conf).replace("/gpuctk.toml", "//gpuctk.toml")  # the same file
    done, _ = own.create(doc, GPUCTK_CONFIG=other)  # the memo names the other: Python
    assert done.returncode == 0, done.stderr
    done, _ = own.create(doc, GPUCTK_CONFIG=other)
    assert "front: plan " in done.stderr, done.stderr


def test_a_front_folder_that_is_a_link_is_not_read(node: Node, planned: dict[str, Any]) -> None:
    front = node.state / "front"
    real = node.state / "front-real"
    front.rename(real)
    front.symlink_to(real.name)
    try:
        handed_over(*direct(node, planned), "no front plan for this request")
    finally:
        front.unlink()
        real.rename(front)


def test_a_state_folder_the_front_does_not_read_gets_no_plan_and_says_so(
    node: Node, tmp_path: Path
) -> None:
    """GPUCTK_STATE_DIR reached through a symlink: Python's caches follow a root-owned link
    above their folder, the compiled create takes none. Python asks it (front-key, the rule's
    one home) before writing a front plan: none is written, and the shim says why and what to
    set, rather than writing plans nobody reads."""
    doc = base_doc("/nonexistent-root")
    key = key_of(node, doc)
    assert key is not None and key.folder == 1
    (tmp_path / "real").mkdir(mode=0o700)
    linked = tmp_path / "linked"
    linked.symlink_to("real")
    state = str(linked / "gpuctk")
    for _ in range(2):
        done, config = node.create(doc, GPUCTK_STATE_DIR=state)
        assert done.returncode == 0, done.stderr
        assert "front: plan " not in done.stderr
        assert json.loads(config.read_text()) == expected(node, doc)
    assert (tmp_path / "real" / "gpuctk" / "plans").is_dir()  # Python's own caches: used
    assert not list((tmp_path / "real" / "gpuctk" / "front").iterdir())
    assert f"the compiled create reads no plan from {state}/front" in done.stderr, done.stderr
    assert "set GPUCTK_STATE_DIR to the real path" in done.stderr
    direct_key = frontkey.key_of(str(node.hook), json.dumps(doc).encode(), CDI, state)
    assert direct_key is not None and direct_key.folder == 0
