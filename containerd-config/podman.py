"""`--runtime podman`: the OCI hooks.d file that runs `gpuctk-hook prestart` for the containers
that ask by CDI annotation (gpuctk.containerd.hooksd), in /etc/containers/oci/hooks.d.

podman needs no hook for `--device nvidia.com/gpu=0`: it applies CDI itself.
"""

from __future__ import annotations

from gpuctk.containerd import hooksd
from gpuctk.containerd.options import Options
from gpuctk.containerd.plan import Plan

WHAT = "podman hooks.d file"


def hooks_json(hook_path: str, config: str | None = None) -> dict[str, object]:
    return hooksd.hooks_json(hook_path, config)


def plan_configure(opts: Options) -> Plan:
    notes = []
    if opts.set_as_default or opts.cdi_enabled:
        notes.append("podman has no runtime handler: --set-as-default and --cdi-enabled ignored")
    return hooksd.plan_configure(opts, WHAT, tuple(notes))


def plan_unconfigure(opts: Options) -> Plan:
    return hooksd.plan_unconfigure(opts, WHAT)
