"""Hostile CDI spec files in the spec dirs, through the real shim (gpuctk-runtime create).

Trust model (gpuctk.cdi.specs.spectrust): a spec dir or file that someone other than root owns or
can
write is refused before it is read, with a warning naming it; the same content written by root
is used. Malformed specs (any owner) are skipped without stopping the others from serving; a
FIFO never hangs the reader; a name defined twice in one dir is a conflict naming both files.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from secworld import assert_safe, run_tool

KIND = "example.com/gpu"
NOBODY = 65534


def spec(name: str = "0", **edits: Any) -> dict[str, Any]:
    return {
        "cdiVersion": "0.5.0",
        "kind": KIND,
        "devices": [{"name": name, "containerEdits": {"env": [f"SEEN={name}"], **edits}}],
    }


HOSTILE_EDITS = {
    "mounts": [{"hostPath": "/etc/shadow", "containerPath": "/shadow", "options": ["bind"]}],
    "deviceNodes": [{"path": "/dev/sda", "type": "b", "major": 8, "minor": 0}],
    "hooks": [{"hookName": "createContainer", "path": "/bin/sh", "args": ["sh", "-c", "id"]}],
}


class Dirs:
    def __init__(self, tmp: Path, bindir: Path) -> None:
        self.tmp, self.bindir = tmp, bindir
        self.etc, self.run = tmp / "etc-cdi", tmp / "run-cdi"
        for d in (self.etc, self.run):
            d.mkdir()
            d.chmod(0o755)
        runtime = tmp / "fake-runc"
        runtime.write_text(f"#!/bin/sh\ntouch {tmp}/runtime-ran\n")
        runtime.chmod(0o755)
        self.log = tmp / "engine.log"
        conf = tmp / "gpuctk.toml"
        conf.write_text(
            f'runtimes = ["{runtime}"]\nspec-dirs = ["{self.etc}", "{self.run}"]\n'
            f'default-kind = "{KIND}"\n'
        )
        self.env = {"GPUCTK_CONFIG": str(conf)}
        self.bundle = tmp / "bundle"
        self.bundle.mkdir()

    def write(self, where: Path, name: str, doc: Any, mode: int = 0o644, uid: int = 0) -> Path:
        path = where / name
        path.write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())
        os.chown(path, uid, 0)
        path.chmod(mode)
        return path

    def create(self, value: str = "0") -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
        config = {
            "root": {"path": "rootfs"},
            "process": {"env": [f"NVIDIA_VISIBLE_DEVICES={value}"]},
        }
        (self.bundle / "config.json").write_text(json.dumps(config))
        args = ["--log", str(self.log), "create", "--bundle", str(self.bundle), "ctr"]
        done = run_tool(self.bindir / "gpuctk-runtime", args, b"", self.env, timeout=60)
        assert_safe(done, "gpuctk-runtime")
        return done, json.loads((self.bundle / "config.json").read_text())


@pytest.fixture
def dirs(tmp_path: Path, bindir: Path) -> Dirs:
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    tmp_path.chmod(0o755)
    return Dirs(tmp_path, bindir)


def test_root_owned_spec_is_used(dirs: Dirs) -> None:
    dirs.write(dirs.etc, "a.json", spec(**HOSTILE_EDITS))
    done, doc = dirs.create()
    assert done.returncode == 0, done.stderr
    assert "SEEN=0" in doc["process"]["env"]
    assert [m["destination"] for m in doc["mounts"]] == ["/shadow"]  # root wrote it: trusted
    assert all(h.get("env") for h in doc["hooks"]["createContainer"])


@pytest.mark.parametrize(
    "mode, uid, why",
    [
        (0o644, NOBODY, f"owned by uid {NOBODY}"),
        (0o664, 0, "group-writable"),
        (0o646, 0, "world-writable"),
        (0o666, 0, "group- and world-writable"),
    ],
)
def test_spec_file_others_can_write_is_refused(dirs: Dirs, mode: int, uid: int, why: str) -> None:
    path = dirs.write(dirs.run, "evil.json", spec(**HOSTILE_EDITS), mode, uid)
    done, doc = dirs.create()
    assert done.returncode == 1
    assert f"{path}: refused: the file is {why}" in done.stderr
    assert "SEEN" not in json.dumps(doc) and "shadow" not in json.dumps(doc)
    assert f"CDI spec {path}: refused" in dirs.log.read_text()  # the warning names the file
    assert not (dirs.tmp / "runtime-ran").exists()


def test_refused_file_is_logged_even_when_the_request_resolves(dirs: Dirs) -> None:
    dirs.write(dirs.etc, "good.json", spec())
    evil = dirs.write(dirs.run, "evil.json", spec("1", **HOSTILE_EDITS), 0o666)
    done, doc = dirs.create()
    assert done.returncode == 0, done.stderr
    assert "SEEN=0" in doc["process"]["env"] and "mounts" not in doc
    assert f"CDI spec {evil}: refused" in dirs.log.read_text()


@pytest.mark.parametrize("mode, uid", [(0o777, 0), (0o1777, 0), (0o775, 0), (0o755, NOBODY)])
def test_spec_dir_others_can_write_is_refused(dirs: Dirs, mode: int, uid: int) -> None:
    dirs.write(dirs.run, "a.json", spec(**HOSTILE_EDITS))
    os.chown(dirs.run, uid, 0)
    dirs.run.chmod(mode)
    done, doc = dirs.create()
    assert done.returncode == 1
    assert f"{dirs.run}: refused: the folder is" in done.stderr
    assert "SEEN" not in json.dumps(doc)


@pytest.mark.parametrize("target_mode, used", [(0o644, True), (0o666, False)])
def test_symlinked_spec_is_judged_by_its_target(dirs: Dirs, target_mode: int, used: bool) -> None:
    target = dirs.write(dirs.tmp, "elsewhere.json", spec(), target_mode)
    (dirs.etc / "link.json").symlink_to(target)
    done, doc = dirs.create()
    assert (done.returncode == 0) == used, done.stderr
    assert ("SEEN=0" in json.dumps(doc)) == used


MALFORMED = {
    "not-utf8.json": b'{"cdiVersion": "0.5.0", "kind": "\xff"}',
    "huge.json": b'{"x": "' + b"a" * (5 << 20) + b'"}',
    "deep.json": b"[" * 100000 + b"]" * 100000,
    "bomb.yaml": b"a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n"
    b"c: &c [*b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n",
    "dupkey.json": b'{"kind": "example.com/gpu", "kind": "other.com/gpu"}',
    "types.json": json.dumps(
        {"cdiVersion": 5, "kind": KIND, "devices": [{"name": "0", "containerEdits": []}]}
    ).encode(),
    "bad-node.json": json.dumps(
        spec(deviceNodes=[{"path": "/dev/x", "type": "c", "major": -1, "minor": 2**70}])
    ).encode(),
    "unknown-keys.json": json.dumps(
        {**spec(), "x-evil": {"hostPath": "/etc/shadow"}, "devices": spec()["devices"]}
    ).encode(),
}


def test_malformed_specs_are_skipped_and_the_rest_serve(dirs: Dirs) -> None:
    for name, data in MALFORMED.items():
        dirs.write(dirs.etc, name, data)
    os.mkfifo(dirs.etc / "fifo.json")
    (dirs.etc / "folder.json").mkdir()
    dirs.write(dirs.run, "good.json", spec("1"))
    done, doc = dirs.create("1")
    assert done.returncode == 0, done.stderr
    assert "SEEN=1" in doc["process"]["env"]
    done, doc = dirs.create("0")  # only in malformed files: an error naming skipped ones
    assert_safe(done, "gpuctk-runtime")


def test_bad_device_node_values_are_a_clear_error(dirs: Dirs) -> None:
    node = {"path": "/dev/x", "type": "c", "major": -1, "minor": 2**70}
    dirs.write(dirs.etc, "a.json", spec(deviceNodes=[node]))
    done, _ = dirs.create()
    assert done.returncode == 1 and "invalid" in done.stderr, done.stderr


def test_duplicate_device_names_across_files(dirs: Dirs) -> None:
    a = dirs.write(dirs.etc, "a.json", spec())
    b = dirs.write(dirs.etc, "b.json", spec(**HOSTILE_EDITS))
    done, doc = dirs.create()
    assert done.returncode == 1
    assert "defined by more than one spec" in done.stderr
    assert str(a) in done.stderr and str(b) in done.stderr
    dirs.write(dirs.run, "c.json", spec())  # a later dir overrides both: the reference's rule
    done, doc = dirs.create()
    assert done.returncode == 0, done.stderr
    assert "mounts" not in doc
