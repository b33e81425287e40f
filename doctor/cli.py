"""`gpuctk doctor`: diagnose a GPU node layer by layer, each finding with its evidence and fix.

The layers, in order (each in its own module of gpuctk.doctor): driver (driver), NVML (nvml),
CDI (cdi), runtime (runtime), engine (engine), Kubernetes hints (k8s) and the optional live probe
(probe). Results and output: report; the --debug lines: trace.

Every root and file a check reads comes from an option, so tests and containerised installs can
point the doctor at any tree. Imports are lazy: jsonschema only when the CDI layer validates,
pynvml only when NVML is asked, PyYAML only when a spec or manifest is YAML.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from gpuctk import log
from gpuctk.cdi import cliopts
from gpuctk.doctor.context import Context, Findings
from gpuctk.doctor.report import Result

LAYER_ORDER = ("driver", "nvml", "cdi", "runtime", "engine", "kubernetes", "probe")


def run_checks(ctx: Context) -> list[Result]:
    """Every check, reported in LAYER_ORDER. With --debug, each layer's inputs and each
    check's findings are also traced on stderr (gpuctk.doctor.trace)."""
    from gpuctk.doctor import cdi, devchar, driver, engine, k8s, nvml, policy, probe, runtime

    found = Findings()
    done: dict[str, list[Result]] = {}
    done["driver"] = _guarded("driver", driver.driver_checks, ctx, found, first=True)
    done["driver"] += _guarded("driver", devchar.devchar_checks, ctx, found)
    done["nvml"] = _guarded("nvml", nvml.nvml_checks, ctx, found, first=True)
    done["driver"] += _guarded("driver", driver.persistence_checks, ctx, found)  # NVML's answer
    # The runtime config names the spec dirs the shim reads, so it is read before the CDI layer.
    done["runtime"] = _guarded("runtime", runtime.runtime_checks, ctx, found, first=True)
    done["runtime"] += _guarded("runtime", policy.runtime_policy_checks, ctx, found)
    _spec_dirs(ctx, found)
    done["cdi"] = _guarded("cdi", cdi.cdi_checks, ctx, found, first=True)
    done["cdi"] += _guarded("cdi", policy.cdi_policy_checks, ctx, found)
    done["engine"] = _guarded("engine", engine.engine_checks, ctx, found, first=True)
    done["kubernetes"] = _guarded("kubernetes", k8s.k8s_checks, ctx, found, first=True)
    done["probe"] = _guarded(
        "probe", lambda c, f: [probe.check_probe(c, f)], ctx, found, first=True
    )
    return [result for layer in LAYER_ORDER for result in done[layer]]


def _spec_dirs(ctx: Context, found: Findings) -> None:
    found.spec_dirs = ctx.spec_dirs or (found.settings.spec_dirs if found.settings else ())
    found.spec_dirs = found.spec_dirs or ("/etc/cdi", "/var/run/cdi")


def run_pod_checks(ctx: Context, target: str) -> list[Result]:
    """`--pod`: the runtime and CDI layers read the specs (their results are not shown), then
    the pod's report (gpuctk.doctor.pod)."""
    from gpuctk.doctor import cdi, pod, runtime

    found = Findings()
    _guarded("runtime", runtime.runtime_checks, ctx, found, first=True)
    _spec_dirs(ctx, found)
    _guarded("cdi", cdi.cdi_checks, ctx, found, first=True)
    return _guarded("kubernetes", lambda c, f: pod.pod_checks(c, f, target), ctx, found, first=True)


def _guarded(
    layer: str,
    checks: Callable[[Context, Findings], list[Result]],
    ctx: Context,
    found: Findings,
    *,
    first: bool = False,
) -> list[Result]:
    """The layer's results; a bug in one layer becomes one failed result, not a lost report.
    `first`: the layer's first checks (its inputs are traced before them)."""
    from gpuctk.doctor import trace

    if first:
        trace.inputs(layer, ctx, found)
    try:
        results = checks(ctx, found)
    except Exception as exc:
        from gpuctk.doctor.report import failed

        log.debug(f"doctor: {layer} layer failed: {log.traceback_text(exc)}")
        results = [
            failed(
                f"{layer}.internal",
                f"{layer} checks ran to the end",
                [f"internal error: {type(exc).__name__}: {exc}"],
                "gpuctk --debug doctor   # and report it: this is a gpuctk bug",
            )
        ]
    trace.results(results)
    return results


def _pod_target(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """NAMESPACE/NAME, or a pod UID (read from the kubelet checkpoint alone)."""
    if value is None:
        return None
    ns, slash, name = value.partition("/")
    if not ns or (slash and (not name or "/" in name)):
        raise click.BadParameter(f"{value!r}: give NAMESPACE/NAME (or the pod's UID)")
    return value


@click.command("doctor", context_settings={"help_option_names": ["-h", "--help"]})
@cliopts.table_or_json("json: for scripts.")
@click.option("--verbose", "-v", is_flag=True, help="Show the evidence of passing checks too.")
@click.option(
    "--color/--no-color",
    "colour",
    default=None,
    help="Default: when stdout is a terminal.",
)
@cliopts.driver_root("Root of the driver files.")
@cliopts.dev_root("Root of /dev/nvidia*.")
@click.option("--proc-root", default="/proc", show_default=True, help="Where /proc is.")
@cliopts.sys_root("Where /sys is.")
@click.option(
    "--host-root",
    default="/",
    show_default=True,
    help="Prefix of the host's other files.",
)
@click.option(
    "--spec-dir",
    "spec_dirs",
    multiple=True,
    metavar="DIR",
    help="CDI spec dirs (repeatable, later wins).",
)
@click.option("--kind", default="nvidia.com/gpu", show_default=True, help="GPU kind.")
@cliopts.nvml_library
@cliopts.simulate("A machine profile, not NVML.")
@click.option(
    "--runtime-config",
    metavar="PATH",
    help="gpuctk-runtime's config file.",
)
@click.option(
    "--runtime-name",
    default="nvidia",
    show_default=True,
    help="The engine's handler.",
)
@click.option(
    "--containerd-config",
    metavar="PATH",
    help="containerd's main config.",
)
@click.option("--containerd", "containerd_bin", metavar="PATH", help="The containerd binary.")
@click.option(
    "--config-source",
    type=click.Choice(["auto", "command", "file"]),
    default="auto",
    show_default=True,
    metavar="SOURCE",
    help="command, file or auto.",
)
@click.option("--crio-config", metavar="PATH", help="Default: /etc/crio/crio.conf.")
@click.option("--docker-config", metavar="PATH", help="Default: /etc/docker/daemon.json.")
@click.option("--kubelet-root", metavar="DIR", help="Default: /var/lib/kubelet.")
@click.option(
    "--runtimeclass",
    "runtimeclass_files",
    multiple=True,
    metavar="FILE",
    help="A RuntimeClass to check (repeatable).",
)
@click.option(
    "--pod", metavar="NS/NAME", callback=_pod_target, help="Only why this pod has no GPU."
)
@click.option("--probe", is_flag=True, help="Also run a container with one GPU (root).")
@click.option(
    "--probe-rootfs",
    default="/",
    show_default=True,
    metavar="DIR",
    help="The probe's root (read-only).",
)
@click.option("--probe-device", default="0", show_default=True, help="The probe's CDI device.")
@click.pass_context
def doctor(
    click_ctx: click.Context, /, fmt: str, verbose: bool, colour: bool | None, **options: Any
) -> None:
    """\b
    Diagnose this GPU node layer by layer: driver, nvml, cdi, runtime, engine,
    kubernetes, probe; each finding with its evidence and fix.
    Exit status: 0 every check ok, 1 warnings, 2 a check failed (or a bad option).
    """
    if options["simulate"]:  # an unknown profile is the user's mistake, not an NVML failure
        from gpuctk.cdi.node.profile import load_profile_document

        load_profile_document(str(options["simulate"]))
    ctx = Context(
        driver_root=str(options["driver_root"]),
        dev_root=str(options["dev_root"]),
        proc_root=str(options["proc_root"]),
        sys_root=str(options["sys_root"]),
        host_root=str(options["host_root"]),
        spec_dirs=tuple(options["spec_dirs"]),
        kind=str(options["kind"]),
        nvml_library=_opt(options["nvml_library"]),
        simulate=_opt(options["simulate"]),
        runtime_config=_opt(options["runtime_config"]),
        runtime_name=str(options["runtime_name"]),
        containerd_config=_opt(options["containerd_config"]),
        containerd=_opt(options["containerd_bin"]),
        config_source=str(options["config_source"]),
        crio_config=_opt(options["crio_config"]),
        docker_config=_opt(options["docker_config"]),
        kubelet_root=_opt(options["kubelet_root"]),
        runtimeclass_files=tuple(options["runtimeclass_files"]),
        probe=bool(options["probe"]),
        probe_rootfs=str(options["probe_rootfs"]),
        probe_device=str(options["probe_device"]),
    )
    from gpuctk.doctor import report

    results = run_pod_checks(ctx, options["pod"]) if options["pod"] else run_checks(ctx)
    if fmt == "json":
        click.echo(report.to_json(results), nl=False)
    else:
        use_colour = sys.stdout.isatty() if colour is None else colour
        text = report.to_table(results, colour=use_colour, verbose=verbose)
        click.echo(text, nl=False, color=use_colour)
    click_ctx.exit(report.exit_code(results))


def _opt(value: object) -> str | None:
    return None if value is None or value == "" else str(value)
