"""A create under a config file gpuctk cannot use (an unknown key, invalid TOML, a bad value, a
file someone other than root could write): fail safe, not closed.

Where gpuctk-runtime is the node's default runtime handler every container goes through it, so
refusing every create for one typo would stop the node. Instead:

- a container that asks for no GPU is left as it is: the runtime runs with the arguments as
  they came, and one warning line (the file, the problem, the fix) goes to the engine's log;
- a container that asks for a GPU fails with one line: the file, the first problem (the key,
  with the known key it is likely a typo of), and the fix. It must not start without its GPU.

"Asks for a GPU" is read broadly, since the file's own settings are unknown: CDI annotations
under the default prefix and any prefix the file names validly, `/var/run/nvidia-container-
devices` mounts, NVIDIA_VISIBLE_DEVICES (not `void`), as if every source were accepted; a
malformed request counts as one. The runtime is the one the file's `runtimes` names when that
key is valid on its own (else the defaults), and so are `log-file` and `log-level`.
"""

from __future__ import annotations

from gpuctk.errors import GpuctkError, InputError, ValidationError
from gpuctk.hook import config

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

# keys a broken file may still give, each when valid on its own: where to exec and log
SALVAGED = ("runtimes", "log-file", "log-level", "annotation-prefixes")
FIX = "fix the file (`gpuctk doctor` lists every problem)"


def load(
    environ: Mapping[str, str] | None = None,
) -> tuple[config.Settings, GpuctkError | None]:
    """(settings, None) as gpuctk.hook.config.load gives them; for a file it refuses, (the
    fallback, its error): the defaults, with the SALVAGED keys of a file that was read and
    parsed where each is valid on its own."""
    try:
        return config.load(environ), None
    except GpuctkError as exc:
        error = exc
    if not isinstance(error, ValidationError):  # unread or untrusted: nothing taken from it
        return config.Settings(), error
    try:
        path, text, _ = config.read(environ)
        values = config.parse_table(text or "", path)
    except GpuctkError:
        return config.Settings(), error
    kept = {k: values[k] for k in SALVAGED if k in values and not config.check({k: values[k]})}
    return config.Settings(kept), error


def runtimes_said(settings: config.Settings) -> str:
    """The fallback's runtimes, for a log line."""
    if list(settings.runtimes) == config.DEFAULTS["runtimes"]:
        return "the default runtimes"
    return f"the runtimes it names ({', '.join(settings.runtimes)})"


def gpu_asked(doc: Mapping[str, Any], settings: config.Settings) -> str:
    """Where the OCI config `doc` asks for a GPU, read broadly (see the module docstring);
    "" when it asks for none."""
    from gpuctk.errors import RequestError
    from gpuctk.hook.requests import devices

    prefixes = dict.fromkeys(("cdi.k8s.io/", *settings.annotation_prefixes))
    try:
        req = devices.requested(
            doc,
            annotation_prefixes=prefixes,
            accept_volume_mounts=True,
            accept_envvar_unprivileged=True,
        )
    except RequestError:
        return "a malformed GPU request"
    return req.source if req else ""


def gate(
    doc: Mapping[str, Any],
    settings: config.Settings,
    error: GpuctkError,
    warn: Callable[[str], object],
    who: str,
) -> None:
    """Under the config `error`: InputError (one line) when `doc` asks for a GPU; else one
    warning through `warn` and return (the caller leaves the container as it is). `who`: the
    program and container, as the line starts."""
    asked = gpu_asked(doc, settings)
    if asked:
        raise InputError(
            f"{error.message}; the container asks for a GPU ({asked}): not started; {FIX}"
        )
    warn(f"{who}: {error.message}; the container asks for no GPU: passed on as it is; {FIX}")


def gate_create(
    bundle: str, config_name: str, settings: config.Settings, broken: GpuctkError, log: Any
) -> None:
    """gate() for the shim's create or run: the bundle's config read once, as the shim reads
    it (gpuctk.hook.bundle), nothing written."""
    import os

    from gpuctk.hook.bundle import open_bundle, read_config

    bundle_fd, dir_fd, name = open_bundle(bundle, config_name)
    try:
        doc = read_config(dir_fd, name, os.path.join(bundle, config_name))[0]
    finally:
        if dir_fd != bundle_fd:
            os.close(dir_fd)
        os.close(bundle_fd)
    gate(doc, settings, broken, log.warning, "gpuctk-runtime")
