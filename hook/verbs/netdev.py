"""`gpuctk-hook createRuntime --netdev IF[::NAME]`: move a network interface into the container.

The NIC spec's hook entry (gpuctk.cdi.nicspec, `--nic-mode hook`) runs this as an OCI
createRuntime hook: in the runtime's namespaces, after the container's namespaces exist and
before its process runs. For each `--netdev HOST[::NAME]`:

1. refuse when the RDMA subsystem is in exclusive network-namespace mode
   (`/sys/module/ib_core/parameters/netns_mode` is N, `rdma system` says "netns exclusive") and
   the interface has an RDMA device: that device would have to move with it, which gpuctk does
   not do (`rdma system set netns shared` is the default and what this needs);
2. pin the container's init (pidfd), open its network namespace BY DESCRIPTOR
   (/proc/<pid>/ns/net), check the pid is still that process and that the namespace is not ours
   (a container without its own network namespace gets nothing moved: an error);
3. one RTM_NEWLINK request on a host netlink socket moves the interface into that namespace,
   renamed to NAME when given, and brings it up; a netlink socket opened inside the namespace
   (setns to the descriptor, open, setns back: this thread only) checks it arrived and is up.

An interface already in the container under its target name counts as moved (two CDI devices
naming the same card, e.g. `mlx5_0` and `gpu0`, give two identical entries).

When the container ends, `gpuctk-hook poststop --netdev ...` (the spec's second entry):

- a network namespace that outlives the container (config.json names its `path`: a pod's
  namespace, made by the engine and CNI): the interfaces are moved back from it (opened by
  descriptor, never created) to the host, under their host names, left down;
- a namespace of the container's own: it is destroyed with the container, and the kernel moves
  physical interfaces back to the host's initial namespace itself (under the name they had
  inside, or `dev<N>` when that name is taken) and deletes virtual ones (veth, dummy). A
  renamed physical interface is renamed back to its host name, best effort: the kernel returns
  it asynchronously, so it may not be back yet (logged). Without renames nothing is done and
  pyroute2 is not even imported.

poststop problems are logged, never fatal (runtimes only log them anyway).

pyroute2 is imported only here, and this module only when `--netdev` is given: container
starts without NICs pay nothing. The netlink adapter is `Links` (a Protocol) so tests can drive
the logic without netlink.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any, BinaryIO, Protocol

from gpuctk.errors import GpuctkError
from gpuctk.hook import oci_state
from gpuctk.log import hook as hooklog

IFNAMSIZ = 16


class NetdevError(GpuctkError):
    """A network interface cannot be moved into the container."""


class Links(Protocol):
    """A netlink route socket, bound to the network namespace it was opened in."""

    def index(self, name: str) -> int | None:
        """The ifindex of interface `name`, None if there is none."""

    def move(self, index: int, netns_fd: int, name: str | None, up: bool = True) -> None:
        """Move interface `index` into the namespace `netns_fd`, renamed to `name`, and up
        (when `up`). Netlink errors are raised as OSError (by every method)."""

    def rename(self, index: int, name: str) -> None: ...

    def set_up(self, index: int) -> None: ...

    def is_up(self, index: int) -> bool: ...

    def close(self) -> None: ...


Opener = Callable[[int | None], Links]  # netns descriptor (None: this thread's) -> Links


class Pyroute2Links:
    """`Links` over pyroute2's IPRoute. Never given a namespace name or path: pyroute2 would
    create a missing one (its default flags are O_CREAT); only descriptors are passed."""

    def __init__(self, netns_fd: int | None = None) -> None:
        from pyroute2 import IPRoute
        from pyroute2 import netns as pr_netns

        if netns_fd is None:
            self._ipr = IPRoute()
            return
        saved = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            pr_netns.setns(netns_fd, flags=0)  # an int: used as is, nothing created
            try:
                self._ipr = IPRoute()  # its socket belongs to the namespace it is made in
            finally:
                pr_netns.setns(saved, flags=0)
        finally:
            os.close(saved)

    def index(self, name: str) -> int | None:
        found = self._ipr.link_lookup(ifname=name)
        return int(found[0]) if found else None

    def _set(self, **request: object) -> None:
        from pyroute2.netlink.exceptions import NetlinkError

        try:
            self._ipr.link("set", **request)
        except NetlinkError as exc:  # not an OSError: make it one (the Protocol's contract)
            code = exc.code if isinstance(exc.code, int) else 0
            raise OSError(code, os.strerror(code) if code else str(exc)) from exc

    def move(self, index: int, netns_fd: int, name: str | None, up: bool = True) -> None:
        extra: dict[str, object] = {"ifname": name} if name else {}
        if up:
            extra["state"] = "up"
        self._set(index=index, net_ns_fd=netns_fd, **extra)

    def rename(self, index: int, name: str) -> None:
        self._set(index=index, ifname=name)

    def set_up(self, index: int) -> None:
        self._set(index=index, state="up")

    def is_up(self, index: int) -> bool:
        links = self._ipr.get_links(index)
        return bool(links and links[0]["flags"] & 1)  # IFF_UP

    def close(self) -> None:
        self._ipr.close()


def parse(verb: str, argv: list[str]) -> list[tuple[str, str | None]]:
    """`--netdev HOST[::NAME]` options as (HOST, NAME or None); others are warned about."""
    pairs: list[tuple[str, str | None]] = []
    i = 0
    while i < len(argv):
        arg, i = argv[i], i + 1
        if arg == "--netdev" or arg.startswith("--netdev="):
            if "=" in arg:
                value = arg.partition("=")[2]
            elif i < len(argv):
                value, i = argv[i], i + 1
            else:
                raise NetdevError(f"{verb}: --netdev needs a value (HOST or HOST::NAME)")
            host, sep, name = value.partition("::")
            for what in (host, name) if sep else (host,):
                problem = ifname_problem(what)
                if problem:
                    raise NetdevError(f"{verb}: --netdev {value!r}: {problem}")
            pairs.append((host, name if sep and name != host else None))
        elif arg != "--debug":
            hooklog.warning(f"{verb}: unknown argument {arg!r} ignored")
    return pairs


def ifname_problem(name: str) -> str | None:
    if not name or len(name.encode()) >= IFNAMSIZ or name in (".", ".."):
        return f"{name!r} is not an interface name (1..15 bytes, not . or ..)"
    if any(c.isspace() or c in "/:\0" for c in name):
        return f"{name!r} is not an interface name (no '/', ':' or whitespace)"
    return None


def check_rdma_mode(sys_root: str, hosts: list[str]) -> None:
    """Refuse in exclusive RDMA netns mode for interfaces that have an RDMA device."""
    from gpuctk.cdi.node import nics

    if not nics.exclusive_netns_mode(sys_root):
        return
    for host in hosts:
        rdma = nics.rdma_devices_of_netdev(sys_root, host)
        if rdma:
            raise NetdevError(
                f"cannot move {host}: the RDMA subsystem is in exclusive network-namespace mode "
                f"(ib_core netns_mode=N) and {host} carries RDMA device {', '.join(rdma)}, "
                "which would have to move with it; gpuctk does not move RDMA devices: run "
                "`rdma system set netns shared` (or load ib_core with netns_mode=1)"
            )


class ContainerNetns:
    """The container's network namespace, opened by descriptor from its pinned init pid."""

    def __init__(self, pid: int) -> None:
        if pid <= 0:
            raise NetdevError(f"the OCI state gives no container process (pid {pid})")
        self.fd = -1
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as exc:
            raise NetdevError(f"container process {pid} is gone: {exc.strerror}") from exc
        try:
            self.fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            signal.pidfd_send_signal(pidfd, 0)  # still the process we pinned: no pid reuse
        except OSError as exc:
            self.close()
            raise NetdevError(f"cannot open the network namespace of pid {pid}: {exc}") from exc
        finally:
            os.close(pidfd)
        if os.fstat(self.fd).st_ino == os.stat("/proc/thread-self/ns/net").st_ino:
            self.close()
            raise NetdevError(
                "the container shares the host's network namespace (no `network` namespace in "
                "config.json, or --network host): its network interface cannot be moved"
            )

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def move_all(
    pairs: list[tuple[str, str | None]], netns_fd: int, opener: Opener = Pyroute2Links
) -> list[str]:
    """Move each (HOST, NAME) into `netns_fd` and bring it up; returns what was done."""
    done: list[str] = []
    host = opener(None)
    try:
        inner = opener(netns_fd)
        try:
            for host_name, name in pairs:
                target = name or host_name
                index = host.index(host_name)
                if index is None:
                    if inner.index(target) is None:
                        raise NetdevError(
                            f"no network interface {host_name} on the host (moved elsewhere, or "
                            "renamed? `ip link` lists them)"
                        )
                    done.append(f"{host_name} already in the container as {target}")
                else:
                    if inner.index(target) is not None:
                        raise NetdevError(
                            f"cannot move {host_name}: the container already has an interface "
                            f"named {target} (rename it: --netdev {host_name}::NAME)"
                        )
                    try:
                        host.move(index, netns_fd, name)
                    except OSError as exc:
                        raise NetdevError(f"cannot move {host_name}: {exc}") from exc
                    done.append(f"{host_name} -> {target}" if name else host_name)
                inside = inner.index(target)
                if inside is None:
                    raise NetdevError(f"{host_name} was moved but is not in the container")
                if not inner.is_up(inside):
                    inner.set_up(inside)
        finally:
            inner.close()
    finally:
        host.close()
    return done


def restore_names(
    pairs: list[tuple[str, str | None]], sys_root: str = "/sys", opener: Opener = Pyroute2Links
) -> list[str]:
    """poststop: rename interfaces the kernel returned under their container name back."""
    renamed = [(h, n) for h, n in pairs if n]
    if not renamed:
        return []
    done: list[str] = []
    links = opener(None)
    try:
        for host_name, name in renamed:
            assert name is not None
            index = links.index(name)
            physical = os.path.exists(os.path.join(sys_root, "class", "net", name, "device"))
            if links.index(host_name) is not None:
                done.append(f"{host_name} already back")
            elif index is None or not physical:
                done.append(f"{host_name} not back (yet) as {name}: nothing renamed")
            else:
                links.rename(index, host_name)
                done.append(f"{name} -> {host_name}")
    finally:
        links.close()
    return done


def netns_path(config: dict[str, Any]) -> str | None:
    """The `path` of config.json's network namespace entry: a namespace that outlives the
    container (a pod's, made by the engine and CNI); None for a namespace of its own."""
    linux = config.get("linux")
    spaces = linux.get("namespaces") if isinstance(linux, dict) else None
    for ns in spaces if isinstance(spaces, list) else ():
        if isinstance(ns, dict) and ns.get("type") == "network":
            path = ns.get("path")
            return path if isinstance(path, str) and path.startswith("/") else None
    return None


def move_back(
    pairs: list[tuple[str, str | None]], path: str, opener: Opener = Pyroute2Links
) -> list[str]:
    """poststop for a namespace that outlives the container: move each interface from the
    namespace at `path` (opened by descriptor, never created) back to ours, under its host name,
    left down. Returns what was done; a namespace already gone is not an error."""
    try:
        # O_NONBLOCK: a FIFO planted at the path must not hang the hook; setns() (pyroute2's,
        # in the adapter) refuses anything that is not a network namespace.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        return [f"network namespace {path} is gone ({exc.strerror}): nothing to move back"]
    ours = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    done: list[str] = []
    try:
        if os.fstat(fd).st_ino == os.fstat(ours).st_ino:
            return ["the container used the host's network namespace: nothing to move back"]
        inner = opener(fd)
        try:
            for host_name, name in pairs:
                index = inner.index(name or host_name)
                if index is None:
                    done.append(f"{name or host_name} not in {path}: nothing to move back")
                    continue
                inner.move(index, ours, host_name if name else None, up=False)
                done.append(f"{name or host_name} -> host as {host_name}")
        finally:
            inner.close()
    finally:
        os.close(fd)
        os.close(ours)
    return done


def poststop(pairs: list[tuple[str, str | None]], stdin: BinaryIO | None, sys_root: str) -> None:
    """Container end: move interfaces back from a namespace that outlives the container, or
    (its own namespace is gone, the kernel returned them) restore renamed ones' names."""
    state = oci_state.read_state(stdin)
    path = netns_path(oci_state.read_config(os.path.join(state.bundle, "config.json")))
    try:
        lines = move_back(pairs, path) if path else restore_names(pairs, sys_root)
    except (OSError, GpuctkError) as exc:  # runc only logs poststop failures: say it clearly
        hooklog.warning(f"poststop {state.id}: cannot move interfaces back: {exc}")
        return
    for line in lines:
        hooklog.log("info", f"poststop {state.id}: {line}", to_stderr=False)


def main(verb: str, argv: list[str], stdin: BinaryIO | None = None) -> int:
    """`createRuntime --netdev ...` or `poststop --netdev ...`; returns the exit status."""
    import time

    started = time.monotonic()
    pairs = parse(verb, argv)
    sys_root = os.environ.get("GPUCTK_SYS_ROOT") or "/sys"
    if verb == "poststop":
        poststop(pairs, stdin, sys_root)
        return 0
    state = oci_state.read_state(stdin)
    check_rdma_mode(sys_root, [h for h, _ in pairs])
    netns = ContainerNetns(state.pid)
    try:
        done = move_all(pairs, netns.fd)
    finally:
        netns.close()
    ms = (time.monotonic() - started) * 1000
    hooklog.info(f"{verb} {state.id}: moved {', '.join(done) or 'nothing'} ({ms:.0f} ms)")
    return 0
