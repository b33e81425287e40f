"""`gpuctk-hook precreate`: the podman / CRI-O precreate hook (OCI config in, edited config out).

podman (4.x; containers/common pkg/hooks/exec) and CRI-O run a `precreate` hook before they hand
the config to the runtime: the container's config.json on stdin, the (possibly changed) config
expected on stdout. This applies the CDI edits exactly as the shim does
(gpuctk.hook.requests.cdiedits, gpuctk.cdi.specs.apply): device nodes and their cgroup rules,
driver mounts, env, and the spec's createContainer hook entry, which the runtime then runs. A
config that asks for nothing is written back byte for byte. Errors: one line on stderr, exit 1,
nothing on stdout.
"""

from __future__ import annotations

import sys

from gpuctk.errors import GpuctkError, InputError
from gpuctk.hook import oci_state, ocikeys
from gpuctk.log import hook as hooklog

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, BinaryIO

    from gpuctk.hook.config import Settings


def transform(data: bytes, settings: Settings, broken: GpuctkError | None = None) -> bytes:
    """The edited config for the config bytes `data` (`data` itself when nothing is asked).
    `broken`: the config file's error, `settings` the fallback (gpuctk.hook.requests.failsafe)."""
    from gpuctk.hook.requests import cdiedits

    doc: Any = oci_state.parse_json(data, "OCI config on stdin")
    if not isinstance(doc, dict):
        raise InputError("OCI config on stdin is not a JSON object")
    ocikeys.check_keys(doc, "OCI config on stdin")
    if broken is not None:
        from gpuctk.hook.requests import failsafe

        failsafe.gate(doc, settings, broken, hooklog.warning, "precreate")
        return data
    got = cdiedits.resolve(doc, settings, hooklog.warning)
    if got is None:
        hooklog.log("debug", "precreate: no GPU requested; config unchanged", to_stderr=False)
        return data
    from gpuctk.cdi.specs import apply
    from gpuctk.jsonfast import dumps

    req, edits = got
    apply.apply(doc, edits)
    hooklog.info(f"precreate: injected {cdiedits.describe(req)}")
    return dumps(doc)


def main(argv: list[str], stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> int:
    from gpuctk.hook.requests import failsafe

    for arg in argv:
        hooklog.warning(f"precreate: unknown argument {arg!r} ignored")
    data = oci_state.read_bounded(
        stdin or sys.stdin.buffer, oci_state.MAX_CONFIG, "OCI config on stdin"
    )
    out = transform(data, *failsafe.load())
    sink = stdout or sys.stdout.buffer
    sink.write(out)
    sink.flush()
    return 0
