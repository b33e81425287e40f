"""REAL runc with `gpuctk-hook createRuntime --netdev` in config.json: a veth end moves into the
container's network namespace (this kernel has no `dummy` driver, veth it has).

Each test makes a fresh veth pair on the host, runs a container on a fresh overlay of the debian
image whose config.json has its own `network` namespace and the hook, and checks:

- inside, from the container's own /sys/class/net: the interface is there under the requested
  name, up (IFF_UP), with the host interface's MAC address, so it is the very device moved;
- after the container exits: its network namespace is gone, and with it the veth end and its host
  peer (the kernel deletes virtual interfaces of a dead namespace; physical ones it returns);
- refusals leave the interface on the host untouched: a container sharing the host's network
  namespace, and an interface with an RDMA device while ib_core is in exclusive netns mode (a
  fake sysfs through GPUCTK_SYS_ROOT).

And the whole chain: `gpuctk cdi generate --nics` over a fake sysfs whose RDMA card's netdev is
the veth end writes the NIC spec; gpuctk-runtime in front of runc resolves the CDI annotation
`nvidia.com/nic=gpu0` (the card affine to GPU 0) from it; runc creates the card's
/dev/infiniband nodes and runs the spec's createRuntime hook entry, which moves the interface.

Every veth this module creates is deleted at teardown, whatever happened.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.fakesys import add_nic, add_pci
from fixtures.images import hook_path, make_bundle, run_container, unique_name

pytestmark = pytest.mark.integration

PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SCRIPT = r"""
for d in /sys/class/net/*; do
    echo "IF $(basename "$d") $(cat "$d/flags") $(cat "$d/address")"
done
for f in /dev/infiniband/*; do [ -c "$f" ] && echo "NODE $f"; done
true
"""
_count = 0


def link_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def gone(name: str, within: float = 30.0) -> bool:
    """Whether interface `name` disappears: a dead namespace is cleaned up by a kernel worker,
    after `runc delete` returns, so wait for it (a bound against hanging, not a timing check)."""
    deadline = time.monotonic() + within
    while link_exists(name):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def mac(name: str) -> str:
    return Path(f"/sys/class/net/{name}/address").read_text().strip()


@pytest.fixture
def veth() -> Iterator[tuple[str, str]]:
    """(host end, end to move): a new veth pair; deleted at teardown if still there."""
    if os.geteuid() != 0 or shutil.which("runc") is None or shutil.which("ip") is None:
        pytest.skip("needs root, runc and ip")
    global _count
    _count += 1
    stem = f"gv{os.getpid() % 100000}x{_count}"  # at most 15 bytes with the suffix
    pair = (f"{stem}a", f"{stem}b")
    made = subprocess.run(
        ["ip", "link", "add", pair[0], "type", "veth", "peer", "name", pair[1]],
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot create a veth pair here: {made.stderr.strip()}")
    yield pair
    for name in pair:
        if link_exists(name):
            subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)


@pytest.fixture
def container(
    tmp_path: Path, fresh_rootfs: Callable[[str], Path]
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Factory: (hook args, own_netns=True, hook_env=()) -> the finished `runc run`."""

    def run(
        args: list[str],
        own_netns: bool = True,
        hook_env: tuple[str, ...] = (),
        hooks: int = 1,
        netns_path: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        global _count
        _count += 1
        hook: dict[str, Any] = {
            "path": hook_path(),
            "args": ["gpuctk-hook", "createRuntime", *args],
            "env": [PATH_ENV, f"GPUCTK_HOOK_LOG={tmp_path}/hook.log", *hook_env],
        }
        bundle = make_bundle(
            tmp_path / f"bundle-{_count}",
            fresh_rootfs("debian"),
            ["/bin/sh", "-c", SCRIPT],
            env=[PATH_ENV],
            hooks={
                "createRuntime": [hook] * hooks,
                "poststop": [dict(hook, args=["gpuctk-hook", "poststop", *args])],
            },
        )
        config = json.loads((bundle / "config.json").read_text())
        spaces = config["linux"]["namespaces"]
        if not own_netns:
            config["linux"]["namespaces"] = [n for n in spaces if n["type"] != "network"]
        for ns in spaces:
            if ns["type"] == "network" and netns_path:
                ns["path"] = netns_path  # join a namespace that outlives the container
        (bundle / "config.json").write_text(json.dumps(config))
        return run_container(["runc"], bundle, unique_name("gpuctk-netdev"))

    return run


def interfaces(out: str) -> dict[str, tuple[int, str]]:
    """name -> (flags, MAC) from the container's IF lines."""
    found = {}
    for line in out.splitlines():
        if line.startswith("IF "):
            _, name, flags, address = line.split()
            found[name] = (int(flags, 16), address)
    return found


def test_move_rename_and_up(veth: tuple[str, str], container: Any) -> None:
    host_end, moved = veth
    address = mac(moved)
    done = container(["--netdev", f"{moved}::net0"])
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    seen = interfaces(done.stdout)
    assert set(seen) == {"lo", "net0"}, done.stdout  # only the moved one joined lo
    flags, inside_mac = seen["net0"]
    assert flags & 0x1, f"net0 not up: flags {flags:#x}"
    assert inside_mac == address  # the very interface that was on the host
    # The namespace died with the container: the kernel deleted the veth end and its peer.
    assert gone(moved)
    assert gone(host_end)


@pytest.fixture
def pod_netns() -> Iterator[str]:
    """A named network namespace (as a pod sandbox has); deleted at teardown."""
    global _count
    _count += 1
    name = f"gpuctk-pod-{os.getpid()}-{_count}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot create a network namespace: {made.stderr.strip()}")
    yield name
    subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def test_pod_namespace_gets_it_back_at_poststop(
    veth: tuple[str, str], container: Any, pod_netns: str, tmp_path: Path
) -> None:
    """A namespace that outlives the container: poststop moves the interface back to the host
    under its own name (the kernel would not: the namespace is not destroyed)."""
    host_end, moved = veth
    address = mac(moved)
    done = container(["--netdev", f"{moved}::net0"], netns_path=f"/var/run/netns/{pod_netns}")
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    seen = interfaces(done.stdout)
    assert set(seen) == {"lo", "net0"} and seen["net0"][1] == address
    # Back on the host, under its host name, left down; the pod namespace no longer has it.
    assert link_exists(moved) and mac(moved) == address and link_exists(host_end)
    flags = int(Path(f"/sys/class/net/{moved}/flags").read_text(), 16)
    assert not flags & 0x1
    inside = subprocess.run(
        ["ip", "-n", pod_netns, "-o", "link", "show"], capture_output=True, text=True, check=True
    )
    assert "net0" not in inside.stdout
    assert "-> host as " + moved in (tmp_path / "hook.log").read_text()


def test_move_keeps_name_and_is_idempotent(
    veth: tuple[str, str], container: Any, tmp_path: Path
) -> None:
    _, moved = veth
    address = mac(moved)
    done = container(["--netdev", moved], hooks=2)  # two CDI devices naming one card
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    seen = interfaces(done.stdout)
    assert set(seen) == {"lo", moved}
    assert seen[moved][1] == address and seen[moved][0] & 0x1
    assert gone(moved)
    assert "already in the container" in (tmp_path / "hook.log").read_text()


def test_refuses_without_own_netns(veth: tuple[str, str], container: Any) -> None:
    _, moved = veth
    address = mac(moved)
    done = container(["--netdev", moved], own_netns=False)
    assert done.returncode != 0
    assert "shares the host's network namespace" in done.stderr
    assert link_exists(moved) and mac(moved) == address  # untouched on the host


def test_refuses_in_exclusive_rdma_mode(
    veth: tuple[str, str], container: Any, tmp_path: Path
) -> None:
    _, moved = veth
    sysfs = tmp_path / "sys"
    params = sysfs / "module/ib_core/parameters"
    params.mkdir(parents=True)
    (params / "netns_mode").write_text("N\n")
    (sysfs / f"class/net/{moved}/device/infiniband/mlx5_0").mkdir(parents=True)
    done = container(["--netdev", moved], hook_env=(f"GPUCTK_SYS_ROOT={sysfs}",))
    assert done.returncode != 0
    assert "exclusive network-namespace mode" in done.stderr
    assert "mlx5_0" in done.stderr and "rdma system set netns shared" in done.stderr
    assert link_exists(moved)


def test_missing_interface_is_a_clear_error(container: Any, veth: tuple[str, str]) -> None:
    done = container(["--netdev", "gpuctk-none0"])
    assert done.returncode != 0
    assert "no network interface gpuctk-none0 on the host" in done.stderr


def test_nic_spec_through_the_shim(
    veth: tuple[str, str], tmp_path: Path, fresh_rootfs: Callable[[str], Path]
) -> None:
    host_end, moved = veth
    address = mac(moved)
    sysfs = tmp_path / "sys"
    add_pci(sysfs, "pci0000:00/0000:00:01.0/0000:10:00.0/0000:11:00.0/0000:18:00.0", 0)  # GPU0
    nic_chain = "pci0000:00/0000:00:01.0/0000:10:00.0/0000:11:01.0/0000:19:00.0"  # same switch
    add_nic(sysfs, "mlx5_0", 0, nic_chain, 0, moved, "Ethernet")
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir(mode=0o755)
    generated = subprocess.run(
        [
            str(Path(hook_path()).with_name("gpuctk")), "cdi", "generate", "--simulate", "h100-8",
            "--sys-root", str(sysfs), "--nics", "--hook-path", hook_path(),
            "--output", str(spec_dir / "nvidia.json"),
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert generated.returncode == 0, generated.stderr
    nic_spec = json.loads((spec_dir / "nvidia-nic.json").read_text())
    (gpu0,) = [d for d in nic_spec["devices"] if d["name"] == "gpu0"]
    assert gpu0["containerEdits"]["hooks"][0]["args"][-1] == moved
    toml = tmp_path / "gpuctk.toml"
    toml.write_text(
        f'runtimes = ["{shutil.which("runc")}"]\nspec-dirs = ["{spec_dir}"]\n'
        f'log-file = "{tmp_path}/gpuctk.log"\n'
    )
    bundle = make_bundle(tmp_path / "bundle", fresh_rootfs("debian"), ["/bin/sh", "-c", SCRIPT])
    config = json.loads((bundle / "config.json").read_text())
    config["annotations"] = {"cdi.k8s.io/nic": "nvidia.com/nic=gpu0"}
    (bundle / "config.json").write_text(json.dumps(config))
    shim = str(Path(hook_path()).with_name("gpuctk-runtime"))
    env = dict(os.environ, GPUCTK_CONFIG=str(toml))
    name = unique_name("gpuctk-netdev-shim")
    try:
        done = subprocess.run(
            [shim, "run", "--bundle", str(bundle), name],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env, timeout=120,
            check=False,
        )  # fmt: skip
    finally:
        subprocess.run([shim, "delete", "--force", name], env=env, capture_output=True)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    seen = interfaces(done.stdout)
    assert set(seen) == {"lo", moved}
    assert seen[moved][1] == address and seen[moved][0] & 0x1
    nodes = {line.split()[1] for line in done.stdout.splitlines() if line.startswith("NODE ")}
    assert nodes == {
        "/dev/infiniband/uverbs0", "/dev/infiniband/umad0", "/dev/infiniband/issm0",
    }  # fmt: skip
    assert gone(moved) and gone(host_end)
