"""gpuctk.hook.verbs.netdev without netlink: argument parsing, the move logic over a fake `Links`,
the exclusive-RDMA refusal, the poststop rename, and the import rule (pyroute2 only for NICs).
The real move through runc is tests/integration/test_netdev_runc.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.fakesys import make_two_socket

from gpuctk.hook.verbs import netdev
from gpuctk.hook.verbs.netdev import NetdevError

HOST, INNER = -1, 7  # the host's namespace key, and the container namespace's fd in the fake


class World:
    """Interfaces per namespace: name -> (ifindex, up); plus a log of netlink requests."""

    def __init__(self, host: dict[str, int], inner: dict[str, int] | None = None) -> None:
        self.ns: dict[int, dict[str, tuple[int, bool]]] = {
            HOST: {n: (i, False) for n, i in host.items()},
            INNER: {n: (i, False) for n, i in (inner or {}).items()},
        }
        self.calls: list[str] = []
        self.open_count = 0

    def opener(self, fd: int | None) -> FakeLinks:
        self.open_count += 1
        return FakeLinks(self, HOST if fd is None else fd)


class FakeLinks:
    def __init__(self, world: World, ns: int) -> None:
        self.world, self.ns, self.closed = world, ns, False

    def _name(self, index: int) -> str:
        (name,) = [n for n, (i, _) in self.world.ns[self.ns].items() if i == index]
        return name

    def index(self, name: str) -> int | None:
        got = self.world.ns[self.ns].get(name)
        return got[0] if got else None

    def move(self, index: int, netns_fd: int, name: str | None, up: bool = True) -> None:
        old = self._name(index)
        self.world.calls.append(f"move {old} -> {netns_fd} as {name}" + ("" if up else " down"))
        del self.world.ns[self.ns][old]
        self.world.ns.setdefault(netns_fd, {})[name or old] = (index, up)

    def rename(self, index: int, name: str) -> None:
        old = self._name(index)
        self.world.calls.append(f"rename {old} {name}")
        self.world.ns[self.ns][name] = self.world.ns[self.ns].pop(old)

    def set_up(self, index: int) -> None:
        name = self._name(index)
        self.world.calls.append(f"up {name}")
        self.world.ns[self.ns][name] = (index, True)

    def is_up(self, index: int) -> bool:
        return self.world.ns[self.ns][self._name(index)][1]

    def close(self) -> None:
        self.closed = True


def test_parse() -> None:
    assert netdev.parse("createRuntime", ["--netdev", "ens1f0np0", "--netdev=ib0::net1"]) == [
        ("ens1f0np0", None),
        ("ib0", "net1"),
    ]
    assert netdev.parse("createRuntime", ["--netdev", "eth1::eth1"]) == [("eth1", None)]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--netdev"], "needs a value"),
        (["--netdev", "a/b"], "not an interface name"),
        (["--netdev", "x" * 16], "1..15 bytes"),
        (["--netdev", "eth0::"], "not an interface name"),
        (["--netdev", "eth0::a b"], "whitespace"),
    ],
)
def test_parse_refuses(argv: list[str], words: str) -> None:
    with pytest.raises(NetdevError, match=words):
        netdev.parse("createRuntime", argv)


def test_move_rename_and_up() -> None:
    world = World({"eth0": 2, "ens1f0np0": 5})
    done = netdev.move_all([("ens1f0np0", "net0")], INNER, world.opener)
    assert done == ["ens1f0np0 -> net0"]
    assert world.calls == [f"move ens1f0np0 -> {INNER} as net0"]
    assert world.ns[INNER] == {"net0": (5, True)}
    assert "ens1f0np0" not in world.ns[HOST] and "eth0" in world.ns[HOST]


def test_brings_up_when_the_move_did_not() -> None:
    world = World({"ib0": 4})

    class NoUpMove(FakeLinks):
        def move(self, index: int, netns_fd: int, name: str | None, up: bool = True) -> None:
            super().move(index, netns_fd, name, up)
            self.world.ns[netns_fd]["ib0"] = (index, False)

    netdev.move_all([("ib0", None)], INNER, lambda fd: NoUpMove(world, HOST if fd is None else fd))
    assert world.calls[-1] == "up ib0" and world.ns[INNER]["ib0"] == (4, True)


def test_already_moved_is_fine() -> None:
    world = World({}, {"net0": 5})
    assert netdev.move_all([("ens1f0np0", "net0")], INNER, world.opener) == [
        "ens1f0np0 already in the container as net0"
    ]
    assert world.calls == ["up net0"]


def test_missing_interface() -> None:
    world = World({"eth0": 2})
    with pytest.raises(NetdevError, match="no network interface ens9 on the host"):
        netdev.move_all([("ens9", None)], INNER, world.opener)


def test_name_taken_in_container() -> None:
    world = World({"ens1f0np0": 5}, {"net0": 9})
    with pytest.raises(NetdevError, match="already has an interface named net0"):
        netdev.move_all([("ens1f0np0", "net0")], INNER, world.opener)
    assert "ens1f0np0" in world.ns[HOST]  # untouched


def test_netlink_failure_is_a_hook_error() -> None:
    world = World({"ens1f0np0": 5})

    class Failing(FakeLinks):
        def move(self, index: int, netns_fd: int, name: str | None, up: bool = True) -> None:
            raise OSError(95, "Operation not supported")

    with pytest.raises(NetdevError, match=r"cannot move ens1f0np0: .*not supported"):
        netdev.move_all(
            [("ens1f0np0", None)], INNER, lambda fd: Failing(world, HOST if fd is None else fd)
        )


def test_exclusive_rdma_mode_refuses(tmp_path: Path) -> None:
    shared = str(make_two_socket(tmp_path / "shared"))
    exclusive = str(make_two_socket(tmp_path / "excl", netns_mode="N"))
    netdev.check_rdma_mode(shared, ["ens1f0np0"])  # shared: fine
    netdev.check_rdma_mode(exclusive, ["veth0"])  # no RDMA device behind it: fine
    with pytest.raises(NetdevError, match=r"exclusive network-namespace mode.*mlx5_0"):
        netdev.check_rdma_mode(exclusive, ["ens1f0np0"])


def test_poststop_renames_returned_physical_interface(tmp_path: Path) -> None:
    sysfs = make_two_socket(tmp_path / "sys")
    os.rename(sysfs / "class/net/ens1f0np0", sysfs / "class/net/net0")  # back under its new name
    world = World({"net0": 5, "veth1": 6})
    done = netdev.restore_names(
        [("ens1f0np0", "net0"), ("veth0", "veth1"), ("ib0", None)], str(sysfs), world.opener
    )
    assert world.calls == ["rename net0 ens1f0np0"]
    assert done == ["net0 -> ens1f0np0", "veth0 not back (yet) as veth1: nothing renamed"]
    assert netdev.restore_names([("ib0", None)], str(sysfs), world.opener) == []


def test_container_netns_refuses_our_own(tmp_path: Path) -> None:
    with pytest.raises(NetdevError, match="shares the host's network namespace"):
        netdev.ContainerNetns(os.getpid())
    with pytest.raises(NetdevError, match="no container process"):
        netdev.ContainerNetns(0)


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(out.stdout.split())


def test_pyroute2_only_for_a_nic_move(tmp_path: Path) -> None:
    # Importing the module (as the hook does for --netdev) does not load pyroute2 yet.
    assert "pyroute2" not in _modules_after("import gpuctk.hook.verbs.netdev")
    # A createRuntime hook without --netdev (the GPU path) loads neither.
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}, "process": {}}))
    state = json.dumps({"id": "c", "bundle": str(bundle), "pid": 1, "status": "creating"})
    code = (
        "import io, sys\n"
        f"sys.stdin = io.TextIOWrapper(io.BytesIO({state.encode()!r}))\n"
        "from gpuctk.hook.verbs import hook_main\n"
        "assert hook_main._run(['createRuntime']) == 0\n"
    )
    loaded = _modules_after(code)
    assert "gpuctk.hook.verbs.prestart" in loaded  # it did run the GPU path
    assert "pyroute2" not in loaded and "gpuctk.hook.verbs.netdev" not in loaded


def test_netns_path() -> None:
    pod = {"linux": {"namespaces": [{"type": "pid"}, {"type": "network", "path": "/run/netns/p"}]}}
    assert netdev.netns_path(pod) == "/run/netns/p"
    assert netdev.netns_path({"linux": {"namespaces": [{"type": "network"}]}}) is None
    assert netdev.netns_path({"linux": {"namespaces": "junk"}}) is None
    assert netdev.netns_path({}) is None


def test_move_back_from_a_lasting_namespace(tmp_path: Path) -> None:
    # A namespace file that is not ours: a second open of /proc/1/ns/net would be ours when we
    # run in the init namespace, so open a real foreign one only in the integration test; here
    # a plain file stands in (its inode differs from our namespace's).
    path = tmp_path / "netns"
    path.touch()
    opened: list[int] = []
    world = World({"eth0": 2})

    def opener(fd: int | None) -> FakeLinks:
        assert fd is not None  # only the lasting namespace is opened, by descriptor
        opened.append(fd)
        world.ns[fd] = {"net0": (5, True), "ib0": (6, True)}
        return FakeLinks(world, fd)

    done = netdev.move_back(
        [("ens1f0np0", "net0"), ("ib0", None), ("gone0", None)], str(path), opener
    )
    fd = opened[0]
    assert world.calls[0].startswith("move net0 -> ") and world.calls[0].endswith(
        " as ens1f0np0 down"
    )
    assert world.calls[1].endswith(" as None down")
    assert done == [
        "net0 -> host as ens1f0np0",
        "ib0 -> host as ib0",
        "gone0 not in " + str(path) + ": nothing to move back",
    ]
    assert world.ns[fd] == {}


def test_move_back_namespace_gone(tmp_path: Path) -> None:
    def opener(fd: int | None) -> FakeLinks:
        raise AssertionError("no netlink socket for a namespace that is gone")

    (line,) = netdev.move_back([("ib0", None)], str(tmp_path / "none"), opener)
    assert "is gone" in line
