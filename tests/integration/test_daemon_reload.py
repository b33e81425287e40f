"""A GPU container under runc's systemd cgroup driver through `systemctl daemon-reload`, for real.

The most reported failure of GPU nodes: with the systemd cgroup driver (containerd's
`SystemdCgroup = true`, runc `--systemd-cgroup`), runc gives each container a transient scope
whose systemd device policy is `DevicePolicy=strict` plus one `DeviceAllow=` entry per device
rule, and also writes the container's full rule set into its devices cgroup itself. For a rule
on one char node the entry is the path `/dev/char/MAJOR:MINOR`. runc 1.1.3 to 1.1.6 (Debian 12
ships 1.1.5) leaves out every entry whose path and /sys/dev/char/MAJOR:MINOR both fail to stat
in runc's own mount namespace, warning `skipping device /dev/char/195:0 for systemd`; systemd
older than 240 drops such an entry itself (it stats the path; 240 and later parse MAJOR:MINOR out
of it). NVIDIA nodes have neither path: the driver registers no sysfs device and udev makes no
/dev/char link for them. When systemd later re-applies the scope's policy (`systemctl
daemon-reload`, which package installs and upgrades run), it rewrites the devices cgroup from
its own list and the running container loses its GPU. With the link /dev/char/195:0 ->
../nvidia0 in place when the container starts, the entry is there and the GPU stays.

Each test starts a node whose PID 1 is the machine's own systemd (fixtures.systemd: a privileged
podman container running systemd, with this machine's runc), gives it /dev/nvidia0 (195:0) and
/dev/nvidia1 (195:1) as mknod'ed nodes with no driver behind them, and runs in it, with
`runc --systemd-cgroup`, a container (the "debian" image) that has both nodes but is allowed only
195:0. The container opens both nodes each time the test asks and reports each errno: ENXIO means
the devices cgroup let the open through (there is no driver), EPERM that it blocked it. The test
asks three times:

1. after start: nvidia0 ENXIO (allowed), nvidia1 EPERM (not allowed);
2. after the test wrote `c 195:1 rwm` into the scope's devices.allow by hand: nvidia1 ENXIO.
   This rule is in no systemd list, so it is the witness that systemd re-applied its policy;
3. after `systemctl daemon-reload`: nvidia1 EPERM again (the policy was rewritten) and nvidia0
   EPERM without the link, ENXIO with it.

The links are made as the product makes them, by `gpuctk system create-dev-char-symlinks`, run
on the host over a folder holding the same nodes as the node's /dev, into the folder that is
bind-mounted as the node's /dev/char (where runc looks).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures.images import make_bundle
from fixtures.systemd import SystemdNode, missing, systemd_node

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
NVIDIA_MAJOR = 195
NODES = ("/dev/nvidia0", "/dev/nvidia1")
ALLOWED_MINOR, WITNESS_MINOR = 0, 1
ANSWER_TIMEOUT = 15.0
CONTAINER = "probe"
CGROUPS_PATH = f"system.slice:gpuctk:{CONTAINER}"  # the systemd driver's slice:prefix:name
SCOPE = f"gpuctk-{CONTAINER}.scope"
# Answers each request the test writes to /tmp/ask (a number) with /tmp/ans: the number, then
# one line `NODE OK|<shell's open error>` per node, opened afresh each time.
PROBE = r"""
while :; do
  if [ -e /tmp/ask ]; then
    n=$(cat /tmp/ask); rm -f /tmp/ask
    echo "$n" > /tmp/ans.tmp
    for f in NODES; do
      if (: < "$f") 2>/tmp/err; then echo "$f OK"; else echo "$f $(cat /tmp/err)"; fi
    done >> /tmp/ans.tmp
    mv /tmp/ans.tmp /tmp/ans
  fi
  sleep 0.05
done
""".replace("NODES", " ".join(NODES))
ERRNO_NAMES = {
    os.strerror(code): errno.errorcode[code]
    for code in (errno.ENXIO, errno.EPERM, errno.ENOENT, errno.EACCES)
}


@dataclass
class Gpu:
    """The node, the probe container in it and the host folder (work/x) they share."""

    node: SystemdNode
    shared: Path
    asked: int = 0

    def run_probe(self) -> str:
        """Start the probe container under runc's systemd driver; returns runc's output."""
        done = self.node.exec(
            "sh", "-c", 'exec "$@" </dev/null >/x/runc.out 2>&1', "sh",
            "runc", "--systemd-cgroup", "run", "-d", "--bundle", "/x/bundle", CONTAINER,
        )  # fmt: skip
        out = (self.shared / "runc.out").read_text()
        assert done.returncode == 0, f"runc run failed: {done.stderr}\n{out}"
        return out

    def ask(self) -> dict[str, str]:
        """{node: errno name, or OK}, as the running container sees it now."""
        self.asked += 1
        io = self.shared / "io"
        (io / "ans").unlink(missing_ok=True)
        (io / "ask.tmp").write_text(f"{self.asked}\n")
        (io / "ask.tmp").rename(io / "ask")
        deadline = time.monotonic() + ANSWER_TIMEOUT
        while time.monotonic() < deadline:
            if (io / "ans").exists():
                number, *lines = (io / "ans").read_text().splitlines()
                assert number == str(self.asked), (number, lines)
                return dict(_opened(line) for line in lines)
            time.sleep(0.05)
        state = self.node.exec("runc", "state", CONTAINER)
        raise AssertionError(
            f"the container did not answer in {ANSWER_TIMEOUT:.0f} s: {state.stdout}{state.stderr}"
        )

    def show(self, prop: str) -> list[str]:
        """The values of the scope's systemd property `prop`, one per line."""
        done = self.node.exec("systemctl", "show", "-p", prop, SCOPE)
        assert done.returncode == 0, done.stderr
        return [line.removeprefix(f"{prop}=") for line in done.stdout.splitlines()]

    def allow_by_hand(self, minor: int) -> None:
        """Write `c 195:minor rwm` into the scope's v1 devices cgroup, behind systemd's back."""
        path = f"/sys/fs/cgroup/devices{self.show('ControlGroup')[0]}/devices.allow"
        done = self.node.exec("sh", "-c", f'echo "c {NVIDIA_MAJOR}:{minor} rwm" > "{path}"')
        assert done.returncode == 0, f"cannot write {path} in the node: {done.stderr}"

    def daemon_reload(self) -> None:
        done = self.node.exec("systemctl", "daemon-reload")
        assert done.returncode == 0, done.stderr
        # one more request to the manager: its loop dispatches the cgroup realize queue first
        assert self.show("ActiveState") == ["active"]


def _opened(line: str) -> tuple[str, str]:
    path, result = line.split(" ", 1)
    if result == "OK":
        return path, result
    text = result.rsplit(": ", 1)[-1]
    return path, ERRNO_NAMES.get(text, text)


def _bundle(shared: Path) -> None:
    """The probe's bundle at shared/bundle, as the node sees it: /x/bundle, rootfs /img."""
    bundle = make_bundle(
        shared / "bundle", Path("/img"), ["/bin/sh", "-c", PROBE], readonly=True,
        mounts=[{"destination": "/tmp", "type": "bind", "source": "/x/io",
                 "options": ["rbind", "rw"]}],
    )  # fmt: skip
    config = json.loads((bundle / "config.json").read_text())
    linux = config["linux"]
    linux["devices"] = [
        {"path": path, "type": "c", "major": NVIDIA_MAJOR, "minor": minor,
         "fileMode": 0o666, "uid": 0, "gid": 0}
        for minor, path in enumerate(NODES)
    ]  # fmt: skip
    linux["resources"]["devices"].append(
        {"allow": True, "type": "c", "major": NVIDIA_MAJOR, "minor": ALLOWED_MINOR,
         "access": "rwm"}
    )  # fmt: skip
    linux["cgroupsPath"] = CGROUPS_PATH
    (bundle / "config.json").write_text(json.dumps(config, indent=1))


@pytest.fixture
def gpu_node(
    tmp_path: Path, image_rootfs: Callable[[str], Path]
) -> Iterator[Callable[[bool], Gpu]]:
    """Factory: with_link -> a booted systemd node holding the GPU nodes and the probe's
    bundle; with_link first makes the node's /dev/char links with gpuctk."""
    reason = missing()
    if reason:
        pytest.skip(f"no systemd node here: {reason}")
    if not Path("/sys/fs/cgroup/devices/devices.list").exists():
        pytest.skip("the witness rule is written into cgroup v1's devices controller, absent here")
    image = image_rootfs("debian")
    dev, shared = tmp_path / "node/dev", tmp_path / "x"
    (dev / "char").mkdir(parents=True)
    for minor, path in enumerate(NODES):
        os.mknod(dev / Path(path).name, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, minor))
    (shared / "io").mkdir(parents=True)
    _bundle(shared)
    with contextlib.ExitStack() as stack:

        def start(with_link: bool) -> Gpu:
            if with_link:
                make_dev_char_links(dev)
            node = stack.enter_context(
                systemd_node(
                    tmp_path / "sd",
                    volumes=[
                        (shared, "/x", "rw"),
                        (image, "/img", "ro"),
                        (dev / "char", "/dev/char", "rw"),
                    ],
                    char_nodes=[(path, NVIDIA_MAJOR, minor) for minor, path in enumerate(NODES)],
                )
            )
            return Gpu(node, shared)

        yield start


def make_dev_char_links(dev: Path) -> None:
    """`gpuctk system create-dev-char-symlinks` over `dev` (the same nodes as the node's /dev)
    into dev/char, which is the node's /dev/char: 195:0 -> ../nvidia0 (and 195:1)."""
    done = subprocess.run(
        [str(BIN / "gpuctk"), "system", "create-dev-char-symlinks",
         "--dev-char-path", str(dev / "char"), "--driver-root", str(dev.parent)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert os.readlink(dev / "char" / f"{NVIDIA_MAJOR}:{ALLOWED_MINOR}") == "../nvidia0"


def test_daemon_reload_takes_the_gpu_without_dev_char_link(gpu_node: Callable[[bool], Gpu]) -> None:
    gpu = gpu_node(False)
    out = gpu.run_probe()
    skipped = f"skipping device /dev/char/{NVIDIA_MAJOR}:{ALLOWED_MINOR} for systemd"
    assert skipped in out, (
        f"this runc did not leave /dev/char/{NVIDIA_MAJOR}:{ALLOWED_MINOR} out of the scope's "
        f"DeviceAllow (runc 1.1.7 and later with systemd 240 and later keep it): the failure "
        f"does not happen with it. runc said: {out!r}"
    )
    assert not any(e.startswith(f"/dev/char/{NVIDIA_MAJOR}:") for e in gpu.show("DeviceAllow"))
    seen = [gpu.ask()]
    gpu.allow_by_hand(WITNESS_MINOR)
    seen.append(gpu.ask())
    gpu.daemon_reload()
    seen.append(gpu.ask())
    assert seen == [
        {"/dev/nvidia0": "ENXIO", "/dev/nvidia1": "EPERM"},
        {"/dev/nvidia0": "ENXIO", "/dev/nvidia1": "ENXIO"},
        {"/dev/nvidia0": "EPERM", "/dev/nvidia1": "EPERM"},
    ]


def test_daemon_reload_keeps_the_gpu_with_dev_char_link(gpu_node: Callable[[bool], Gpu]) -> None:
    gpu = gpu_node(True)
    out = gpu.run_probe()
    assert "skipping device" not in out, out
    assert f"/dev/char/{NVIDIA_MAJOR}:{ALLOWED_MINOR} rwm" in gpu.show("DeviceAllow")
    seen = [gpu.ask()]
    gpu.allow_by_hand(WITNESS_MINOR)
    seen.append(gpu.ask())
    gpu.daemon_reload()
    seen.append(gpu.ask())
    assert seen == [
        {"/dev/nvidia0": "ENXIO", "/dev/nvidia1": "EPERM"},
        {"/dev/nvidia0": "ENXIO", "/dev/nvidia1": "ENXIO"},
        {"/dev/nvidia0": "ENXIO", "/dev/nvidia1": "EPERM"},
    ]
