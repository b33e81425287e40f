"""A local user cannot steer root's `gpuctk doctor`, shown with real processes.

A real unprivileged user (made with useradd here, removed after) runs a process named
`nvidia-device-plugin` whose `--config-file` is a link they own to a root-only file, or a FIFO;
root's real plugin (a root process from a root-owned executable) uses the default `envvar`
strategy. The doctor's check must not print the root-only file's content, must not hang on the
FIFO, and must never advise `accept-envvar-unprivileged = false`: that takes the GPU away from
every pod of an `envvar` plugin.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctk.doctor.context import Context, Findings
from gpuctk.doctor.plugin import plugin_strategy
from gpuctk.doctor.policy import check_envvar_unprivileged
from gpuctk.doctor.report import Result
from gpuctk.hook.config import Settings

TOKEN = "cdi-annotations,rootonlysecret"
OFF = "set accept-envvar-unprivileged = false"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(map(shutil.which, ("useradd", "userdel", "setpriv", "bash"))),
    reason="needs root, useradd, setpriv and bash",
)


@pytest.fixture
def user() -> Iterator[tuple[int, int]]:
    name = f"gpuctk-t{os.urandom(3).hex()}"
    subprocess.run(["userdel", name], capture_output=True, check=False)
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
    )
    try:
        import pwd

        entry = pwd.getpwnam(name)
        yield entry.pw_uid, entry.pw_gid
    finally:
        subprocess.run(["userdel", name], capture_output=True, check=False)


def _named_process(argv: list[str], uid: int | None = None) -> subprocess.Popen[bytes]:
    """A process whose argv[0] is nvidia-device-plugin (a bash that sleeps, its arguments
    after the script), run as `uid` when given; returned once its exec is done."""
    named = 'exec -a nvidia-device-plugin bash -c "sleep 120; :" "$@"'
    cmd = ["bash", "-c", named, "bash", *argv]
    if uid is not None:
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *cmd]
    env = {"PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"nvidia-device-plugin"):
                return proc
        except OSError:
            pass
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError("the named process did not start")


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        os.killpg(proc.pid, signal.SIGKILL)  # the bash and its sleep
        proc.wait(10)


def _check(tmp_path: Path) -> Result:
    kubelet = tmp_path / "kubelet"
    kubelet.mkdir(exist_ok=True)
    config = tmp_path / "config.toml"
    ctx = Context(kubelet_root=str(kubelet), runtime_config=str(config))
    found = Findings(settings=Settings({"accept-envvar-unprivileged": True}))
    found.settings_source = str(config)
    return check_envvar_unprivileged(ctx, found)


def test_a_users_plugin_and_link_to_a_root_only_file(
    tmp_path: Path, user: tuple[int, int], processes: list[subprocess.Popen[bytes]]
) -> None:
    uid, gid = user
    secret = tmp_path / "secret.yaml"  # root's, mode 0600
    secret.write_text(f'flags:\n  plugin:\n    deviceListStrategy: "{TOKEN}"\n')
    secret.chmod(0o600)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, uid, gid)
    link = theirs / "config.yaml"
    link.symlink_to(secret)
    os.chown(link, uid, gid, follow_symlinks=False)
    # the user's process first, so that it has the lower pid
    processes.append(_named_process([f"--config-file={link}"], uid))
    processes.append(_named_process([]))  # root's real plugin: the default strategy, envvar
    strategies, whence = plugin_strategy(Context())
    assert "rootonlysecret" not in whence
    assert strategies == {"envvar"}, whence
    result = _check(tmp_path)
    shown = "\n".join([*result.evidence, result.fix or ""])
    assert "rootonlysecret" not in shown
    assert result.fix is not None and not result.fix.startswith(OFF), result.fix
    assert result.fix.startswith("set DEVICE_LIST_STRATEGY=cdi-annotations on the NVIDIA")


def test_a_users_plugin_with_a_fifo_for_config(
    tmp_path: Path, user: tuple[int, int], processes: list[subprocess.Popen[bytes]]
) -> None:
    uid, gid = user
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, uid, gid)
    fifo = theirs / "config.yaml"
    os.mkfifo(fifo)
    os.chown(fifo, uid, gid)
    processes.append(_named_process([f"--config-file={fifo}"], uid))
    done: list[Result] = []
    thread = threading.Thread(target=lambda: done.append(_check(tmp_path)), daemon=True)
    thread.start()
    thread.join(20)
    if thread.is_alive():  # hung on the FIFO: let it go, then fail
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        thread.join(10)
        pytest.fail("the doctor hung opening a user's FIFO")
    result = done[0]
    assert result.fix is not None and not result.fix.startswith(OFF), result.fix


def test_roots_plugin_config_is_read_in_its_root_and_typed_first(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    """Root's plugin: its config through a ConfigMap's links is read; a FIFO there is not
    opened (no hang: the strategy is unknown, and the advice switches the plugin first)."""
    data = tmp_path / "..2024_01_01"
    data.mkdir()
    (data / "config.yaml").write_text("flags:\n  plugin:\n    deviceListStrategy: volume-mounts\n")
    (tmp_path / "..data").symlink_to(data.name)
    (tmp_path / "config.yaml").symlink_to("..data/config.yaml")
    processes.append(_named_process([f"--config-file={tmp_path / 'config.yaml'}"]))
    assert plugin_strategy(Context())[0] == {"volume-mounts"}
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    processes.append(_named_process(["--config-file", str(fifo)]))
    done: list[tuple[set[str] | None, str]] = []
    thread = threading.Thread(target=lambda: done.append(plugin_strategy(Context())), daemon=True)
    thread.start()
    thread.join(20)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(10)
        pytest.fail("the doctor hung opening a FIFO")
    strategies, whence = done[0]
    assert strategies is None and f"strategy in {fifo}, unreadable" in whence, whence
    fix = _check(tmp_path).fix
    assert fix is not None and not fix.startswith(OFF), fix


def test_every_plugin_counts_and_envvar_anywhere_keeps_the_setting(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    processes.append(_named_process(["--device-list-strategy=cdi-annotations"]))
    processes.append(_named_process([]))  # envvar, the default
    strategies, _ = plugin_strategy(Context())
    assert strategies == {"cdi-annotations", "envvar"}
    fix = _check(tmp_path).fix
    assert fix is not None and not fix.startswith(OFF), fix
