"""A hostile local user: files outside the container root that gpuctk trusts as root.

A real unprivileged account (useradd, once per session; each test acts as it through
`setpriv --reuid --regid --clear-groups`) plants what it can write: a config file, a runtime
binary, a CDI hook, a `runc` early on PATH, the folders above a spec dir or the state folder.
The create path (gpuctk-runtime and what it reads) must take none of it: every such file is
opened through a folder whose whole chain only root can change (gpuctk.fs.open_trusted_dir),
and a refusal is one line naming the file, the component at fault and the fix.

Every binary the user writes drops a marker when it runs: the marker must stay absent.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from secworld import assert_safe, run_tool

from gpuctk.hook import bundle as ocibundle
from gpuctk.hook.shim import memo as runtime_memo
from gpuctk.hook.shim import runtime_main

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
GPU_SPEC = {
    "cdiVersion": "0.5.0",
    "kind": "nvidia.com/gpu",
    "devices": [{"name": "0", "containerEdits": {"env": ["GPU_EDITED=0"]}}],
}


class User:
    """The unprivileged account the tests act as."""

    def __init__(self, name: str) -> None:
        entry = pwd.getpwnam(name)
        self.name, self.uid, self.gid = name, entry.pw_uid, entry.pw_gid

    def run(self, *argv: str) -> None:
        as_user = ["setpriv", "--reuid", str(self.uid), "--regid", str(self.gid)]
        subprocess.run([*as_user, "--clear-groups", *argv], check=True, timeout=60)

    def write(self, path: Path, text: str, mode: int = 0o755) -> Path:
        """`text` in a file the user creates (so the user owns it)."""
        script = 'umask 022 && printf "%s" "$1" > "$2" && chmod "$3" "$2"'
        self.run("/bin/sh", "-c", script, "sh", text, str(path), f"{mode:o}")
        return path

    def mkdir(self, path: Path) -> Path:
        self.run("/bin/mkdir", "-m", "755", str(path))
        return path


@pytest.fixture(scope="session")
def local_user() -> Iterator[User]:
    if os.geteuid() != 0:
        pytest.skip("making a local user needs root")
    if shutil.which("useradd") is None or shutil.which("setpriv") is None:
        pytest.skip("useradd and setpriv needed")
    name = f"gpuctk-sec{os.getpid()}"
    try:
        pwd.getpwnam(name)
        subprocess.run(["userdel", name], check=True)  # left by a run that was killed
    except KeyError:
        pass
    account = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin"]
    subprocess.run([*account, name], check=True)
    try:
        yield User(name)
    finally:
        subprocess.run(["userdel", name], check=False)


class Node:
    """A node's files under a root-owned folder in /tmp (pytest's own tmp folders are 0700:
    the user could not reach them): `root/` holds root's config, runtime and spec dir; `user/`
    belongs to the user; `markers/` is where planted binaries, run as root, leave a mark."""

    def __init__(self, user: User, bindir: Path) -> None:
        self.user, self.bindir = user, bindir
        self.area = Path(tempfile.mkdtemp(prefix="gpuctk-local-user-", dir="/tmp"))
        self.area.chmod(0o755)
        self.root, self.markers = self.area / "root", self.area / "markers"
        for d in (self.root, self.markers):
            d.mkdir(mode=0o755)
        self.home = self.area / "user"
        self.home.mkdir(mode=0o755)
        os.chown(self.home, user.uid, user.gid)
        self.state = self.root / "state"
        self.runtime = self.root / "runc-ok"  # root's own runtime: records that it ran
        self.runtime.write_text(f'#!/bin/sh\necho "$@" > {self.markers}/ok-ran\n')
        self.runtime.chmod(0o755)
        self.cdi = self.root / "cdi"
        self.cdi.mkdir(mode=0o755)
        (self.cdi / "gpu.json").write_text(json.dumps(GPU_SPEC))
        self.config = self.root / "config.toml"
        self.write_config()
        self.bundle = self.root / "bundle"
        self.bundle.mkdir()
        self.env = {"GPUCTK_CONFIG": str(self.config), "GPUCTK_STATE_DIR": str(self.state)}

    def write_config(self, runtimes: list[str] | None = None, cdi: Path | None = None) -> None:
        names = ", ".join(f'"{r}"' for r in runtimes or [str(self.runtime)])
        self.config.write_text(f'runtimes = [{names}]\nspec-dirs = ["{cdi or self.cdi}"]\n')

    def planted(self, path: Path, name: str = "planted-ran") -> Path:
        """A binary the user writes at `path`; run as root, it leaves `name` in markers/."""
        return self.user.write(path, f"#!/bin/sh\ntouch {self.markers}/{name}\n")

    def marks(self) -> list[str]:
        return sorted(os.listdir(self.markers))

    def shim(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """gpuctk-runtime; its outcome is safe unless it ran the real runc (its own errors)."""
        done = run_tool(self.bindir / "gpuctk-runtime", list(args), env={**self.env, **env})
        if 'level=error msg="container does not exist"' not in done.stderr:
            assert_safe(done, "gpuctk-runtime")
        return done

    def create(
        self, env: list[str] | None = None, **extra: str
    ) -> subprocess.CompletedProcess[str]:
        doc = {"ociVersion": "1.0.2", "process": {"env": env or ["NVIDIA_VISIBLE_DEVICES=0"]}}
        (self.bundle / "config.json").write_text(json.dumps(doc))
        return self.shim("create", "--bundle", str(self.bundle), "c1", **extra)

    def config_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((self.bundle / "config.json").read_text())
        return doc

    def close(self) -> None:
        shutil.rmtree(self.area, ignore_errors=True)


@pytest.fixture
def node(local_user: User, bindir: Path) -> Iterator[Node]:
    n = Node(local_user, bindir)
    try:
        yield n
    finally:
        n.close()


def test_root_owned_files_in_root_owned_folders_are_used(node: Node) -> None:
    """The control: the same set-up, all written by root, creates with the GPU."""
    done = node.create()
    assert done.returncode == 0, done.stderr
    assert "GPU_EDITED=0" in node.config_json()["process"]["env"]
    assert node.marks() == ["ok-ran"]


# --- the gpuctk config ---------------------------------------------------------------------


def _config_written_by_user(node: Node) -> Path:
    path = node.home / "config.toml"
    evil = node.planted(node.home / "evil-runc")
    return node.user.write(path, f'runtimes = ["{evil}"]\nspec-dirs = ["{node.cdi}"]\n', 0o644)


def _config_chowned_to_user(node: Node) -> Path:
    os.chown(node.config, node.user.uid, node.user.gid)
    return node.config


def _config_world_writable(node: Node) -> Path:
    node.config.chmod(0o646)
    return node.config


def _config_below_a_user_folder(node: Node) -> Path:
    """Root's own file, mode 0644, in a root-owned 0755 folder: but that folder sits in the
    user's, who can rename it aside and put another in its place."""
    etc = node.home / "etc"
    etc.mkdir(mode=0o755)
    path = etc / "config.toml"
    path.write_text(node.config.read_text())
    return path


@pytest.mark.parametrize(
    "plant, why",
    [
        (_config_written_by_user, "owned by uid"),
        (_config_chowned_to_user, "the file is owned by uid"),
        (_config_world_writable, "the file is world-writable (mode 0646); fix: chmod go-w"),
        (_config_below_a_user_folder, "folder {home} is owned by uid"),
    ],
)
def test_a_config_others_can_write_is_refused(node: Node, plant: Any, why: str) -> None:
    path = plant(node)
    done = node.create(GPUCTK_CONFIG=str(path))
    assert done.returncode == 1
    before = node.config_json()
    assert f"{path}: refused: " in done.stderr and why.format(home=node.home) in done.stderr
    assert node.config_json() == before and "GPU_EDITED=0" not in json.dumps(before)
    assert node.marks() == []  # neither its runtime nor root's ran
    # another verb: the default runtimes, with a warning; the config's runtime never runs
    done = node.shim("state", "c1", GPUCTK_CONFIG=str(path))
    assert "refused" in done.stderr and "using the default runtimes" in done.stderr
    assert node.marks() == []


# --- the runtimes the config names ---------------------------------------------------------


def _runtime_written_by_user(node: Node) -> Path:
    return node.planted(node.home / "runc")


def _runtime_in_a_user_folder(node: Node) -> Path:
    folder = node.user.mkdir(node.home / "bin")
    path = folder / "runc"  # root's file, but the user can swap it: the folder is theirs
    path.write_text(f"#!/bin/sh\ntouch {node.markers}/planted-ran\n")
    path.chmod(0o755)
    return path


def _runtime_world_writable(node: Node) -> Path:
    path = node.root / "runc-shared"
    path.write_text(f"#!/bin/sh\ntouch {node.markers}/planted-ran\n")
    path.chmod(0o777)
    return path


@pytest.mark.parametrize(
    "plant", [_runtime_written_by_user, _runtime_in_a_user_folder, _runtime_world_writable]
)
def test_a_runtime_others_can_write_is_never_executed(node: Node, plant: Any) -> None:
    path = plant(node)
    node.write_config([str(path)])
    for verb in (["state", "c1"], ["create", "--bundle", str(node.bundle), "c1"]):
        (node.bundle / "config.json").write_text('{"ociVersion": "1.0.2", "process": {}}')
        done = node.shim(*verb)
        assert done.returncode == 1
        assert "no low-level runtime found" in done.stderr
        assert f"refused: {path} (" in done.stderr  # which one, and why
        assert node.marks() == []
    node.write_config([str(path), str(node.runtime)])  # the next trusted one serves
    assert node.shim("state", "c1").returncode == 0
    assert node.marks() == ["ok-ran"]


def test_a_bare_runtime_name_is_not_found_through_the_engines_path(node: Node) -> None:
    """containerd puts its own folder first on the PATH it hands over; a user-writable one
    there must not decide which `runc` root runs."""
    runc = shutil.which("runc", path=SYSTEM_PATH)
    if runc is None:
        pytest.skip("runc not installed")
    folder = node.user.mkdir(node.home / "bin")
    node.planted(folder / "runc")
    node.write_config(["runc"])
    done = node.shim("state", "no-such-container", PATH=f"{folder}:{SYSTEM_PATH}")
    assert node.marks() == []
    assert done.returncode == 1  # the real runc ran: it knows no such container
    memo = (node.state / "runtime").read_text().splitlines()
    assert runtime_main.DEFAULT_PATH == SYSTEM_PATH and runc in memo


# --- executables a CDI spec names ----------------------------------------------------------


def _spec_with_hook(node: Node, path: str) -> None:
    doc = json.loads(json.dumps(GPU_SPEC))
    doc["containerEdits"] = {"hooks": [{"hookName": "createContainer", "path": path}]}
    (node.cdi / "gpu.json").write_text(json.dumps(doc))


def _hook_in_tmp_by_user(node: Node) -> str:
    fd, name = tempfile.mkstemp(prefix="gpuctk-hook-", dir="/tmp")
    os.close(fd)
    os.unlink(name)  # the user makes it: theirs, in world-writable (sticky) /tmp
    node.planted(Path(name))
    return name


def _hook_in_user_folder(node: Node) -> str:
    return str(node.planted(node.home / "hook"))


def _hook_root_owned_in_user_folder(node: Node) -> str:
    folder = node.user.mkdir(node.home / "hooks")
    path = folder / "hook"
    path.write_text(f"#!/bin/sh\ntouch {node.markers}/planted-ran\n")
    path.chmod(0o755)
    return str(path)


def _hook_world_writable(node: Node) -> str:
    path = node.root / "hook"
    path.write_text(f"#!/bin/sh\ntouch {node.markers}/planted-ran\n")
    path.chmod(0o757)
    return str(path)


@pytest.mark.parametrize(
    "plant",
    [_hook_in_tmp_by_user, _hook_in_user_folder, _hook_root_owned_in_user_folder,
     _hook_world_writable],
)  # fmt: skip
def test_a_spec_hook_others_can_write_is_refused(node: Node, plant: Any) -> None:
    hook = plant(node)
    try:
        _spec_with_hook(node, hook)
        done = node.create()
        assert done.returncode == 1
        assert f"CDI hook {hook}: refused: " in done.stderr and "; fix: " in done.stderr
        assert "hooks" not in node.config_json() and node.marks() == []
    finally:
        if hook.startswith("/tmp/gpuctk-hook-"):
            os.unlink(hook)


def test_a_root_owned_hook_directly_in_tmp_is_used(node: Node) -> None:
    """Sticky /tmp: nobody but root can rename or remove root's file there."""
    fd, hook = tempfile.mkstemp(prefix="gpuctk-hook-", dir="/tmp")
    os.close(fd)
    try:
        os.chmod(hook, 0o755)
        _spec_with_hook(node, hook)
        done = node.create()
        assert done.returncode == 0, done.stderr
        assert node.config_json()["hooks"]["createContainer"][0]["path"] == hook
    finally:
        os.unlink(hook)


def test_a_relative_hook_path_is_refused(node: Node) -> None:
    _spec_with_hook(node, "hook.sh")  # runc would look for it in its own working folder
    done = node.create()
    assert done.returncode == 1
    assert "hook.sh" in done.stderr and "absolute" in done.stderr
    assert "hooks" not in node.config_json()


def test_a_spec_dir_below_a_user_folder_is_refused(node: Node) -> None:
    cdi = node.user.mkdir(node.home / "cdi-parent") / "cdi"
    os.mkdir(cdi, 0o755)  # root's, 0755: the user can still rename it and plant another
    os.chown(cdi, 0, 0)
    (cdi / "gpu.json").write_text(json.dumps(GPU_SPEC))
    node.write_config(cdi=cdi)
    done = node.create()
    assert done.returncode == 1
    assert f"{cdi}: refused: folder {node.home} is owned by uid {node.user.uid}" in done.stderr
    assert "GPU_EDITED" not in json.dumps(node.config_json())


# --- the state folder: runtime memo, spec cache, plans -------------------------------------


def test_the_state_folder_is_not_used_below_a_user_folder(node: Node) -> None:
    state = node.home / "state"
    state.mkdir(mode=0o700)  # root's, 0700, but in a folder the user can write
    done = node.shim("state", "c1", GPUCTK_STATE_DIR=str(state))
    assert done.returncode == 0, done.stderr
    done = node.create(GPUCTK_STATE_DIR=str(state))
    assert done.returncode == 0, done.stderr
    assert list(state.iterdir()) == []  # no memo, no spec cache, no plans
    env = {**node.env, "PATH": SYSTEM_PATH, "GPUCTK_STATE_DIR": str(state)}
    assert not runtime_memo.remember_runtime(str(node.runtime), env)


def test_the_front_never_runs_a_memo_runtime_others_can_write(node: Node) -> None:
    """A memo root wrote (so it is root's) that names a runtime the user can write: the front
    must not exec it for a non-create verb, and Python must not take it from the front."""
    evil = node.planted(node.home / "runc")
    env = {**node.env, "PATH": SYSTEM_PATH}
    assert runtime_memo.remember_runtime(str(evil), env)
    for verb in (["state", "c1"], ["create", "--bundle", str(node.bundle), "c1"]):
        (node.bundle / "config.json").write_text('{"ociVersion": "1.0.2", "process": {}}')
        done = node.shim(*verb)
        assert done.returncode == 0, done.stderr
        assert node.marks() == ["ok-ran"]  # the config's own runtime, resolved again
        (node.markers / "ok-ran").unlink()
    # Python itself checks a runtime handed over by the front (GPUCTK_FRONT_RUNTIME)
    code = "from gpuctk.hook.shim.runtime_main import main; main()"
    (node.bundle / "config.json").write_text('{"ociVersion": "1.0.2", "process": {}}')
    done = subprocess.run(
        [sys.executable, "-c", code, "create", "--bundle", str(node.bundle), "c1"],
        env={**env, "GPUCTK_FRONT_RUNTIME": str(evil)}, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert node.marks() == ["ok-ran"]


# --- config.json: the owner set before the rename -------------------------------------------


def test_a_bundle_owned_by_the_user_keeps_its_owner(node: Node) -> None:
    bundle = node.user.mkdir(node.home / "bundle")
    asks = '{"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]}}'
    node.user.write(bundle / "config.json", asks, 0o640)
    done = node.shim("create", "--bundle", str(bundle), "c1")
    assert done.returncode == 0, done.stderr
    st = (bundle / "config.json").stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (node.user.uid, node.user.gid, 0o640)
    assert "GPU_EDITED=0" in (bundle / "config.json").read_text()


def test_a_link_swapped_in_after_the_rename_is_never_chowned(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bundle's owner replaces config.json with a link to a root-only file the moment the
    edited file is renamed into place: root must not then chown through that link."""
    bundle = node.user.mkdir(node.home / "bundle")
    config = node.user.write(bundle / "config.json", '{"process": {}}', 0o644)
    secret = node.root / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    owners_before_rename: list[int] = []

    def then_swap(real: Any) -> Any:
        def rename(src: Any, dst: Any, **kw: Any) -> None:
            owners_before_rename.append(os.stat(src, dir_fd=kw.get("src_dir_fd")).st_uid)
            real(src, dst, **kw)
            os.unlink(dst, dir_fd=kw.get("dst_dir_fd"))  # the user, racing the shim
            os.symlink(str(secret), dst, dir_fd=kw.get("dst_dir_fd"))

        return rename

    monkeypatch.setattr(os, "rename", then_swap(os.rename))
    monkeypatch.setattr(os, "replace", then_swap(os.replace))
    fd = os.open(bundle, os.O_PATH | os.O_DIRECTORY)
    try:
        doc, st, name, _ = ocibundle.read_config(fd, "config.json", str(config))
        assert name == "config.json"
        ocibundle.write_config(fd, name, str(config), {**doc, "edited": True}, st)
    finally:
        os.close(fd)
    monkeypatch.undo()
    assert owners_before_rename == [node.user.uid]  # the temp file was the user's already
    assert secret.stat().st_uid == 0 and secret.stat().st_gid == 0
    assert config.is_symlink()


# --- the bundle path: one folder, opened once ------------------------------------------------


def test_a_bundle_path_flipped_to_a_root_folder_is_never_written(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--bundle` names a link in the user's folder; the user flips it from their bundle to
    a root-only folder between the read of config.json and its write: root must write the
    folder it read from, never the one the path names by then."""
    real = node.user.mkdir(node.home / "real")
    node.user.write(real / "config.json", '{"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]}}')
    victim = node.root / "victim"
    victim.mkdir(mode=0o700)
    link = node.home / "b"
    node.user.run("/bin/ln", "-s", str(real), str(link))
    read = ocibundle.read_config

    def read_then_flip(*args: Any, **kw: Any) -> Any:
        out = read(*args, **kw)
        node.user.run("/bin/ln", "-sfn", str(victim), str(link))  # the user, racing
        return out

    monkeypatch.setattr(ocibundle, "read_config", read_then_flip)
    for key, value in node.env.items():
        monkeypatch.setenv(key, value)
    status, _, _ = runtime_main.prepare(["create", "--bundle", str(link), "c1"])
    assert status == 0
    assert list(victim.iterdir()) == []
    st = (real / "config.json").stat()
    assert (st.st_uid, st.st_gid) == (node.user.uid, node.user.gid)
    assert "GPU_EDITED=0" in (real / "config.json").read_text()


def test_a_relative_root_path_is_found_from_the_bundle_descriptor(node: Node) -> None:
    """The in-root work opens a relative root.path from the bundle the shim opened, not by
    joining the bundle path again (which may name another folder by then)."""
    from gpuctk.hook.shim import rootcache

    mine, other = node.root / "mine", node.root / "other"
    for bundle in (mine, other):
        (bundle / "rootfs").mkdir(parents=True)
    fd = os.open(mine, os.O_PATH | os.O_DIRECTORY)
    try:
        root_fd = rootcache.open_glibc_root({"root": {"path": "rootfs"}}, str(other), fd)
    finally:
        os.close(fd)
    try:
        st, want = os.fstat(root_fd), (mine / "rootfs").stat()
        assert (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino)
    finally:
        os.close(root_fd)


def test_a_config_json_linked_out_of_the_bundle_is_not_edited(node: Node) -> None:
    """runc follows a config.json symlink; the shim edits only a file in the bundle folder:
    a link to a plain name in it is followed there, any other is refused for a GPU request
    (and passed through untouched when no GPU is asked for)."""
    bundle = node.user.mkdir(node.home / "bundle")
    asks = '{"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]}}'
    node.user.write(bundle / "real.json", asks, 0o644)
    node.user.run("/bin/ln", "-s", "real.json", str(bundle / "config.json"))
    done = node.shim("create", "--bundle", str(bundle), "c1")
    assert done.returncode == 0, done.stderr
    assert (bundle / "config.json").is_symlink()
    assert "GPU_EDITED=0" in (bundle / "real.json").read_text()
    assert (bundle / "real.json").stat().st_uid == node.user.uid
    outside = node.user.mkdir(node.home / "elsewhere")
    node.user.write(outside / "config.json", asks, 0o644)
    node.user.run("/bin/ln", "-sfn", str(outside / "config.json"), str(bundle / "config.json"))
    (node.markers / "ok-ran").unlink()
    done = node.shim("create", "--bundle", str(bundle), "c1")
    assert done.returncode == 1
    assert "is a symlink out of its folder: not edited for a GPU request" in done.stderr
    assert (outside / "config.json").read_text() == asks and node.marks() == []
    node.user.write(outside / "config.json", '{"process": {"env": []}}', 0o644)
    done = node.shim("create", "--bundle", str(bundle), "c1")
    assert done.returncode == 0, done.stderr
    assert node.marks() == ["ok-ran"]


def test_the_front_never_runs_a_memo_runtime_rewritten_by_others(node: Node) -> None:
    """The memo is written while root's runtime is trusted; the runtime is later made
    world-writable and the user rewrites it: neither the front (delete, a create that asks
    for no GPU) nor Python may run it."""
    assert node.shim("state", "c1").returncode == 0  # Python checks the runtime, writes the memo
    assert (node.state / "runtime").read_text().splitlines()[3] == str(node.runtime)
    then = os.stat(node.state / "runtime").st_mtime - 10
    os.utime(node.config, (then - 10, then - 10))
    os.utime(node.state / "runtime", (then, then))  # the memo was written a while ago
    node.runtime.chmod(0o777)  # a mode mistake, a package with bad modes
    script = f"#!/bin/sh\ntouch {node.markers}/planted-ran\n"
    node.user.run("/bin/sh", "-c", 'printf "%s" "$1" > "$2"', "sh", script, str(node.runtime))
    (node.markers / "ok-ran").unlink()
    node.shim("delete", "c1")
    (node.bundle / "config.json").write_text('{"ociVersion": "1.0.2", "process": {}}')
    node.shim("create", "--bundle", str(node.bundle), "c1")
    done = node.create()  # a GPU request: Python refuses the runtime
    assert done.returncode == 1 and f"refused: {node.runtime} (" in done.stderr
    assert node.marks() == []
    assert not (node.state / "runtime").exists()  # forgotten: no verb runs it from the memo


# --- GPUCTK_HOOK_LOG -------------------------------------------------------------------------


def test_the_hook_log_in_a_user_folder_is_never_opened_through_a_link(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuctk.log import hook as hooklog

    secret = node.root / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    log = node.home / "hook.log"
    node.user.run("/bin/ln", "-s", str(secret), str(log))
    fifo = node.root / "hook.fifo"  # in a root folder: opened, never waited on
    os.mkfifo(fifo, 0o600)
    try:
        for path, why in ((log, "refused: "), (fifo, "cannot open: ")):
            hooklog.configure({"GPUCTK_HOOK_LOG": str(path), "GPUCTK_HOOK_LOG_LEVEL": "debug"})
            hooklog.info("one")
            hooklog.info("two")
            err = capsys.readouterr().err
            assert err.count("gpuctk-hook: warning: log file") == 1, err
            assert f"log file {path}: {why}" in err
        assert secret.read_text() == "root only\n" and log.is_symlink()
        hooklog.configure({"GPUCTK_HOOK_LOG": str(node.root / "hook.log")})
        hooklog.info("written")
        assert "written" in (node.root / "hook.log").read_text()
        assert capsys.readouterr().err == ""
    finally:
        hooklog.configure({})


# --- the configured log file -----------------------------------------------------------------


def test_a_log_file_in_a_user_folder_is_never_opened_through_a_link(node: Node) -> None:
    """`log-file` names a file in a folder the user can write: the user points the name at a
    root-only file; root must append neither there nor anywhere in that folder, and says so."""
    secret = node.root / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    log = node.home / "gpuctk.log"
    node.user.run("/bin/ln", "-s", str(secret), str(log))
    node.config.write_text(
        f'runtimes = ["{node.runtime}"]\nspec-dirs = ["{node.cdi}"]\nlog-file = "{log}"\n'
        'log-level = "debug"\n'
    )
    done = node.create()
    assert done.returncode == 0, done.stderr
    assert secret.read_text() == "root only\n"
    assert f"log-file {log}: refused" in done.stderr
    assert os.path.islink(log)


def test_a_log_file_in_a_root_folder_is_written(node: Node) -> None:
    log = node.root / "gpuctk.log"
    node.config.write_text(
        f'runtimes = ["{node.runtime}"]\nspec-dirs = ["{node.cdi}"]\nlog-file = "{log}"\n'
    )
    done = node.create()
    assert done.returncode == 0, done.stderr
    assert "injected" in log.read_text()
