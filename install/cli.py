"""`gpuctk install` / `gpuctk uninstall`: put gpuctk onto a node (the DaemonSet entrypoint).

    gpuctk install --host-root /host --restart --uninstall-on-exit     # in the DaemonSet
    gpuctk install                                                      # on the node itself
    gpuctk uninstall --host-root /host --restart

install, in order, each step skipped when its result is already in place:

1. copies the application (this interpreter's prefix, or --source: a self-contained Python with
   gpuctk in it) to PREFIX on the host (default /usr/local/gpuctk), beside the old copy and
   renamed into place;
2. writes the isolated-mode launchers gpuctk, gpuctk-runtime, gpuctk-hook into BIN_DIR (default
   /usr/local/bin), naming PREFIX/bin/python3;
3. generates the CDI spec (/var/run/cdi/nvidia.yaml) with the copied gpuctk, chrooted into the
   host root, so that the spec names host paths and NVML is the host's, and links each NVIDIA
   device node in the node's /dev/char (`gpuctk system create-dev-char-symlinks`: runc's systemd
   cgroup driver allows devices through those links);
4. registers the runtime handler with containerd (`gpuctk runtime configure`, chrooted: the
   drop-in, the imports entry, backups, idempotence are that command's);
5. restarts containerd only with --restart, and only when its configuration changed.

What it did is recorded in /var/lib/gpuctk/install.json; uninstall undoes exactly that (the
/dev/char links stay: they name the driver's nodes, not gpuctk). While it waits (--wait,
--uninstall-on-exit) it regenerates the spec and the links every --refresh-interval seconds, so
a MIG re-partition reaches the spec within a minute; the spec is rewritten only when it changed.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import click

from gpuctk import log
from gpuctk.clitypes import NORMAL_PATH, Checked
from gpuctk.containerd.options import runtime_name_problem
from gpuctk.containerd.plan import restart_service
from gpuctk.errors import GpuctkError, InputError, OutputError
from gpuctk.install import host as host_mod
from gpuctk.install.host import Record, resolve, run_in_host

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_PREFIX = "/usr/local/gpuctk"
DEFAULT_BIN_DIR = "/usr/local/bin"
DEFAULT_SPEC = "/var/run/cdi/nvidia.yaml"
DEFAULT_CONFIG = "/etc/containerd/config.toml"
DEFAULT_DROP_IN = "/etc/containerd/conf.d/99-gpuctk.toml"


def _host_dir(host_root: str) -> str:
    if not os.path.isdir(host_root):
        raise InputError(f"--host-root {host_root}: not a folder (mount the node's / there)")
    return os.path.abspath(host_root)


def _checked(host: str, argv: list[str], what: str) -> subprocess.CompletedProcess[str]:
    """Run the copied gpuctk in the host root; its own error line and exit code on failure."""
    proc = run_in_host(host, argv)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or ["(no message)"]
        msg = lines[-1].removeprefix("gpuctk: error: ")
        raise GpuctkError(f"{what} failed: {msg}", exit_code=proc.returncode)
    return proc


def _on_node(host: str, argv: list[str]) -> list[str]:
    """`argv` run in the node's mount namespace: as it is on the node itself, through nsenter
    into PID 1's from a container (systemctl refuses to act from a chroot; needs hostPID)."""
    if os.path.realpath(host) == "/":
        return argv
    return ["nsenter", "--target", "1", "--mount", "--", *argv]


def _restart(host: str, command: str | None) -> None:
    if command:
        argv = shlex.split(command)
    else:
        argv = _on_node(host, ["systemctl", "restart", "containerd"])
    ran = restart_service(argv, "configuration written")
    click.echo(f"restarted containerd ({ran})")


def _containerd_files(host: str, record: Record) -> tuple[bytes | None, ...]:
    paths = [p for p in (record.containerd_config, record.drop_in) if p]
    return tuple(host_mod.read_bytes(resolve(host, p)) for p in paths)


def do_install(
    host: str,
    source: str,
    record: Record,
    generate_flags: list[str],
    configure_flags: list[str],
    restart: bool,
    restart_command: str | None,
    dev_root: str | None = None,
) -> None:
    """Steps 1-5 of the module docstring; raises GpuctkError with nothing further done."""
    problem = host_mod.interpreter_problem(source, host)
    if problem:
        raise InputError(problem)
    foreign = host_mod.foreign_launchers(host, record.bin_dir)
    if foreign:
        raise OutputError(
            f"{', '.join(foreign)} exist and were not written by gpuctk: refusing to replace "
            "them; remove them or choose another --bin-dir"
        )
    previous = host_mod.read_record(host)
    dirs = list(previous.dirs) if previous else []
    changed, made = host_mod.copy_prefix(source, host, record.prefix)
    dirs += made
    click.echo(f"{'copied' if changed else 'unchanged'} {source} -> {record.prefix}")
    dirs += host_mod.makedirs(host, record.bin_dir)
    if record.cdi_spec:
        dirs += host_mod.makedirs(host, os.path.dirname(record.cdi_spec))
    dirs += host_mod.makedirs(host, os.path.dirname(host_mod.STATE))
    record = replace(record, dirs=tuple(dict.fromkeys(dirs)))
    host_mod.write_record(host, record)  # before anything else: uninstall can clean up

    python = os.path.join(record.prefix, "bin", "python3")
    _checked(
        host,
        [python, "-I", "-m", "gpuctk.install.launchers", record.bin_dir, "--python", python],
        "writing the launchers",
    )
    click.echo(f"wrote launchers {', '.join(record.launchers())}")
    gpuctk = os.path.join(record.bin_dir, "gpuctk")
    if record.cdi_spec:
        proc = _checked(host, host_mod.generate_argv(record, generate_flags), "CDI spec generation")
        click.echo(proc.stderr.strip().splitlines()[-1].removeprefix("gpuctk: "))
    click.echo(host_mod.link_dev_char(host, gpuctk, dev_root)[1])
    if record.containerd_config and record.drop_in:
        before = _containerd_files(host, record)
        argv = [gpuctk, "runtime", "configure", "--runtime", "containerd"]
        argv += ["--config", record.containerd_config, "--drop-in", record.drop_in]
        argv += ["--runtime-name", record.runtime_name]
        argv += ["--runtime-path", os.path.join(record.bin_dir, "gpuctk-runtime")]
        argv += ["--hook-path", record.hook_path(), *configure_flags]
        proc = _checked(host, argv, "containerd configuration")
        changed = _containerd_files(host, record) != before
        click.echo("containerd: " + ("configured" if changed else "already configured"))
        if changed and restart:
            _restart(host, restart_command)
        elif changed:
            click.echo("restart containerd to apply (or pass --restart)")


def do_uninstall(host: str, restart: bool, restart_command: str | None) -> bool:
    """Undo what the install record lists; False when there is no record (nothing to do)."""
    record = host_mod.read_record(host)
    if record is None:
        return False
    gpuctk = os.path.join(record.bin_dir, "gpuctk")
    if record.containerd_config and record.drop_in:
        if not os.path.exists(resolve(host, gpuctk)):
            raise InputError(
                f"{gpuctk} is gone, so containerd's configuration cannot be undone: run "
                "`gpuctk install` again first, or `gpuctk runtime unconfigure` on the node"
            )
        before = _containerd_files(host, record)
        argv = [gpuctk, "runtime", "unconfigure", "--runtime", "containerd"]
        argv += ["--config", record.containerd_config, "--drop-in", record.drop_in]
        argv += ["--runtime-name", record.runtime_name]
        _checked(host, argv, "containerd unconfiguration")
        changed = _containerd_files(host, record) != before
        click.echo("containerd: " + ("unconfigured" if changed else "was not configured"))
        if changed and restart:
            _restart(host, restart_command)
    if record.cdi_spec:
        spec = resolve(host, record.cdi_spec)
        data = host_mod.read_bytes(spec)
        if data is not None and any(p.encode() in data for p in record.hook_paths()):
            os.unlink(spec)
            click.echo(f"removed {record.cdi_spec}")
        elif data is not None:
            click.echo(f"kept {record.cdi_spec}: it does not name {record.hook_path()}")
    foreign = host_mod.foreign_launchers(host, record.bin_dir)
    for launcher in record.launchers():
        real = resolve(host, launcher)
        if os.path.lexists(real) and real not in foreign:
            os.unlink(real)
    click.echo(f"removed launchers {', '.join(record.launchers())}")
    real = resolve(host, record.prefix)
    if host_mod.is_ours_prefix(real):
        shutil.rmtree(real)
        click.echo(f"removed {record.prefix}")
    host_mod.remove_record(host)
    for directory in sorted(record.dirs, key=len, reverse=True):
        with contextlib.suppress(OSError):  # not empty (someone else's files): keep it
            os.rmdir(resolve(host, directory))
    return True


STOPS = {signal.SIGTERM, signal.SIGINT}


def _wait_for_signal(every: float, tick: Callable[[], None]) -> int:
    """Block until SIGTERM or SIGINT (they were blocked before install, so none is lost),
    calling `tick` each `every` seconds meanwhile (never when `every` is 0)."""
    also = f" (refreshing every {every:g} s)" if every > 0 else ""
    log.say(f"gpuctk: installed; waiting for SIGTERM{also}")
    while True:
        sys.stderr.flush()
        sys.stdout.flush()
        if every <= 0:
            return signal.sigwait(STOPS)
        info = signal.sigtimedwait(STOPS, every)
        if info is not None:
            return info.si_signo
        tick()


_HOST_ROOT = click.option(
    "--host-root",
    default="/",
    show_default=True,
    metavar="DIR",
    help="Where the node's root is mounted.",
)
_RESTART = click.option("--restart", is_flag=True, help="Restart containerd after a change.")
_RESTART_COMMAND = click.option(
    "--restart-command",
    metavar="COMMAND",
    help="How to restart containerd.",
)


def _path_option(name: str, default: str, help_: str, metavar: str = "PATH") -> Callable[[F], F]:
    return click.option(
        name, type=NORMAL_PATH, default=default, show_default=True, metavar=metavar, help=help_
    )


@click.command("install", context_settings={"help_option_names": ["-h", "--help"]})
@_HOST_ROOT
@click.option(
    "--source",
    metavar="DIR",
    help="The Python prefix to copy. Default: this one.",
)
@_path_option("--prefix", DEFAULT_PREFIX, "Host path of the copy.")
@_path_option("--bin-dir", DEFAULT_BIN_DIR, "Host folder for the launchers.", "DIR")
@_path_option("--cdi-output", DEFAULT_SPEC, "Host path of the CDI spec.")
@click.option("--no-cdi", is_flag=True, help="Do not generate a CDI spec.")
@click.option("--driver-root", metavar="DIR", help="Host path of the driver root (generate).")
@click.option("--dev-root", metavar="DIR", help="Host path of the /dev root (generate).")
@click.option("--nvml-library", metavar="PATH", help="Host path of libnvidia-ml.so.1 (generate).")
@click.option("--simulate", metavar="PROFILE", help="Generate for a machine profile (no GPU).")
@_path_option("--containerd-config", DEFAULT_CONFIG, "Host path of containerd's main config.")
@_path_option("--drop-in", DEFAULT_DROP_IN, "Host path of the drop-in gpuctk owns.")
@click.option("--no-containerd", is_flag=True, help="Do not configure containerd.")
@click.option(
    "--runtime-name",
    type=Checked(runtime_name_problem),
    default="nvidia",
    show_default=True,
    metavar="NAME",
    help="Handler name.",
)
@click.option("--set-as-default", is_flag=True, help="Make it containerd's default runtime.")
@click.option(
    "--config-source",
    type=click.Choice(["auto", "file", "command"]),
    default="auto",
    show_default=True,
    metavar="SOURCE",
    help="auto, file or command.",
)
@_RESTART
@_RESTART_COMMAND
@click.option("--wait", is_flag=True, help="Then wait for SIGTERM.")
@click.option(
    "--uninstall-on-exit",
    is_flag=True,
    help="Then wait for SIGTERM, and uninstall.",
)
@click.option(
    "--refresh-interval",
    type=click.FloatRange(min=0),
    default=60,
    show_default=True,
    metavar="SECONDS",
    help="While waiting: refresh the spec this often.",
)
def install(
    host_root: str,
    source: str | None,
    prefix: str,
    bin_dir: str,
    cdi_output: str,
    no_cdi: bool,
    driver_root: str | None,
    dev_root: str | None,
    nvml_library: str | None,
    simulate: str | None,
    containerd_config: str,
    drop_in: str,
    no_containerd: bool,
    runtime_name: str,
    set_as_default: bool,
    config_source: str,
    restart: bool,
    restart_command: str | None,
    wait: bool,
    uninstall_on_exit: bool,
    refresh_interval: float,
) -> None:
    """Install gpuctk onto a node: copy, launchers, CDI spec, containerd handler.

    \b
    Paths are as the node sees them. In a DaemonSet (node's / at /host):
      gpuctk install --host-root /host --restart --uninstall-on-exit
    """
    if wait or uninstall_on_exit:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    host = _host_dir(host_root)
    src = os.path.abspath(source or sys.prefix)
    record = Record(
        prefix=prefix,
        bin_dir=bin_dir,
        cdi_spec=None if no_cdi else cdi_output,
        containerd_config=None if no_containerd else containerd_config,
        drop_in=None if no_containerd else drop_in,
        runtime_name=runtime_name,
    )
    generate_flags: list[str] = []
    for flag, value in (
        ("--driver-root", driver_root),
        ("--dev-root", dev_root),
        ("--nvml-library", nvml_library),
        ("--simulate", simulate),
    ):
        if value:
            generate_flags += [flag, value]
    configure_flags = ["--config-source", config_source]
    if set_as_default:
        configure_flags.append("--set-as-default")
    do_install(
        host, src, record, generate_flags, configure_flags, restart, restart_command, dev_root
    )
    if not (wait or uninstall_on_exit):
        return

    def tick() -> None:
        for line in host_mod.refresh(host, record, generate_flags, dev_root):
            click.echo(f"gpuctk: {line}", err=line.startswith("warning:"))

    sig = _wait_for_signal(refresh_interval, tick)
    log.say(f"gpuctk: {signal.Signals(sig).name} received")
    if uninstall_on_exit:
        do_uninstall(host, restart, restart_command)


@click.command("uninstall", context_settings={"help_option_names": ["-h", "--help"]})
@_HOST_ROOT
@_RESTART
@_RESTART_COMMAND
def uninstall(host_root: str, restart: bool, restart_command: str | None) -> None:
    """Undo `gpuctk install`: containerd handler, CDI spec, launchers, the copy.

    Reads what install did from /var/lib/gpuctk/install.json under the host root; files that
    are not gpuctk's are left alone. Without a record there is nothing to do (exit 0).
    """
    host = _host_dir(host_root)
    if not do_uninstall(host, restart, restart_command):
        click.echo(f"nothing to uninstall: no {host_mod.STATE} under {host}")
