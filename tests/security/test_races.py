"""Races: image paths swapped for symlinks while the hook works, mount targets replaced while
binds happen, and 20 containers created through the shim while the generator rewrites the spec.

A helper thread flips a folder of the image between the real folder and a symlink to the host
sentinel (renameat2 RENAME_EXCHANGE: the swap is atomic, so every lookup sees one or the
other) as fast as it can while the real hook runs again and again. Any run may fail (one clear
line) or succeed; the sentinel must never change (the `world` fixture's snapshot).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from fixtures.privmounts import in_private_mounts
from secworld import FOLDER, LIB, LIBDIR, World, assert_safe, run_tool

from gpuctk import rootfs
from gpuctk.hook.verbs import nsmount

_libc = ctypes.CDLL(None, use_errno=True)
RUNS = 12
ARGS = [
    "createContainer",
    "--link",
    f"libfoo.so.1.2.3::{FOLDER}/libfoo.so.1",
    "--folder",
    FOLDER,
    "--mode",
    "755",
    "--path",
    LIB,
]


def exchange(a: Path, b: Path) -> None:
    if _libc.renameat2(-100, bytes(a), -100, bytes(b), 2) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@contextmanager
def flipping(real: Path, link_target: str) -> Iterator[list[int]]:
    """Flip `real` between itself and a symlink to `link_target` until the block ends."""
    evil = real.with_name(real.name + ".evil")
    evil.symlink_to(link_target)
    stop = threading.Event()
    flips = [0]

    def loop() -> None:
        while not stop.is_set():
            exchange(real, evil)
            flips[0] += 1

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield flips
    finally:
        stop.set()
        thread.join()
        if real.is_symlink():  # put the real folder back in place
            exchange(real, evil)


@pytest.mark.parametrize("form", ["absolute", "relative"])
@pytest.mark.parametrize("target", [LIBDIR, FOLDER, "/etc/ld.so.conf.d", "/etc"])
def test_folder_flipped_to_a_symlink_while_the_hook_runs(
    world: World, bindir: Path, target: str, form: str
) -> None:
    outside = str(world.host) + target
    link = outside if form == "absolute" else "../" * 30 + outside.lstrip("/")
    outcomes = []
    with flipping(world.root / target.lstrip("/"), link) as flips:
        for _ in range(RUNS):
            done = run_tool(bindir / "gpuctk-hook", ARGS, world.state())
            assert done.stdout == ""
            assert_safe(done)
            outcomes.append(done.returncode)
    assert flips[0] > RUNS  # it really flipped while the hook ran


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as info:
        return [line.split()[4] for line in info]


@pytest.mark.parametrize("new_api", [True, False], ids=["open_tree", "fallback"])
@pytest.mark.parametrize("form", ["absolute", "relative", "dotdot"])
def test_mount_target_replaced_while_binding(
    world: World, tmp_path: Path, new_api: bool, form: str
) -> None:
    """The prestart mode's bind mounts land on a descriptor resolved inside the root: a thread
    flipping the target's folder to a symlink to the host never gets a mount outside the root."""
    source_file = tmp_path / "driver-lib"
    source_file.write_bytes(b"\x7fELF driver")
    real = world.root / FOLDER.lstrip("/")
    outside = str(world.host) + FOLDER
    link = {"absolute": outside, "relative": "../" * 30 + outside.lstrip("/"), "dotdot": "../.."}

    def body() -> None:
        nsmount._new_api = new_api  # the probe's answer on an older kernel, or this one's
        before = set(_mount_points())
        root_fd = rootfs.open_root(str(world.root))
        source = nsmount.Source(str(source_file), ["ro", "nosuid", "nodev", "rbind"])
        errors = attempts = 0
        try:
            with flipping(real, link[form]):
                # 40 binds, and more (up to 400) while none went through: on a loaded machine
                # the flipping thread can win 40 times in a row
                while attempts < 40 or (errors == attempts and attempts < 400):
                    attempts += 1
                    try:
                        nsmount.bind(root_fd, source, f"{FOLDER}/libcuda.so.{attempts}")
                    except (nsmount.NamespaceError, rootfs.InRootError, OSError):
                        errors += 1
        finally:
            source.close()
            os.close(root_fd)
        prefix = str(world.root) + "/"
        escaped = [p for p in set(_mount_points()) - before if not p.startswith(prefix)]
        assert not escaped, f"mounts outside the root: {escaped}"
        assert errors < attempts or form == "dotdot", "no bind went through at all"

    in_private_mounts(body)


@pytest.mark.integration
def test_twenty_creates_while_the_generator_rewrites_the_spec(bindir: Path, tmp_path: Path) -> None:
    """Every create sees a complete spec (the old or the new one), never a half-written file:
    the generator writes atomically (temp file, fsync, rename) and the shim reads one file
    descriptor to its end."""
    if os.geteuid() != 0:
        pytest.skip("runs as root")
    tmp_path.chmod(0o755)
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    spec = cdi / "nvidia.yaml"
    runtime = tmp_path / "fake-runc"
    runtime.write_text("#!/bin/sh\ncp config.json seen.json\n")
    runtime.chmod(0o755)
    conf = tmp_path / "gpuctk.toml"
    conf.write_text(f'runtimes = ["{runtime}"]\nspec-dirs = ["{cdi}"]\n')
    env = {"GPUCTK_CONFIG": str(conf)}

    def generate(profile: str) -> subprocess.Popen[bytes]:
        argv = [str(bindir / "gpuctk"), "cdi", "generate", "--simulate", profile, "-o", str(spec)]
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    assert generate("l4").wait() == 0
    stop = threading.Event()
    generations = [0]

    def rewrite() -> None:
        profiles = ["h100-8", "l4"]
        while not stop.is_set():
            proc = generate(profiles[generations[0] % 2])
            _, err = proc.communicate()
            assert proc.returncode == 0, err
            generations[0] += 1

    writer = threading.Thread(target=rewrite, daemon=True)
    writer.start()
    try:
        for round_ in range(3):
            procs = []
            for i in range(20):
                bundle = tmp_path / f"b{round_}-{i}"
                bundle.mkdir()
                config = {
                    "root": {"path": "rootfs"},
                    "process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]},
                }
                (bundle / "config.json").write_text(json.dumps(config))
                argv = [str(bindir / "gpuctk-runtime"), "create", "--bundle", str(bundle), f"c{i}"]
                procs.append(
                    (
                        bundle,
                        subprocess.Popen(
                            argv,
                            cwd=bundle,
                            env={"PATH": "/usr/bin:/bin", **env},
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            text=True,
                        ),
                    )
                )
            for bundle, proc in procs:
                _, err = proc.communicate(timeout=120)
                assert proc.returncode == 0, err
                seen = json.loads((bundle / "seen.json").read_text())
                nodes = {d["path"] for d in seen["linux"]["devices"]}
                assert {"/dev/nvidia0", "/dev/nvidiactl"} <= nodes, nodes
                (hook,) = seen["hooks"]["createContainer"]
                gpus = [e for e in hook["env"] if e.startswith("GPUCTK_GPUS=")]
                assert len(gpus) == 1, hook["env"]  # a whole facts block from one spec
    finally:
        stop.set()
        writer.join()
    assert generations[0] >= 1
