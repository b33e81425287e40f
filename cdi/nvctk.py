"""nvidia-ctk's spellings of `cdi generate`, in one home: the flags, values and NVIDIA_CTK_*
environment variables an operator's scripts carry over from NVIDIA's toolkit.

Where gpuctk means the same, nvidia-ctk's spelling is accepted (a hidden option, so --help stays
gpuctk's own); where it does not, the spelling is refused with exit 2 and one line naming
gpuctk's equivalent, or why there is none. docs/commands.md has the table ("nvidia-ctk's
spellings"). Precedence: a flag given (either spelling), then NVIDIA_CTK_*, then gpuctk's own
variables (NVIDIA_DRIVER_ROOT, ...), then the default. nvidia-ctk takes a list flag's value
whole; here a comma-separated value is split (no name has a comma in it).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import click
from click.core import ParameterSource

from gpuctk import log

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

# gpuctk's parameter -> (nvidia-ctk's other spellings of that flag, its environment variables)
GENERATE_ALIASES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "output": ((), ("NVIDIA_CTK_CDI_OUTPUT_FILE_PATH",)),
    "fmt": ((), ("NVIDIA_CTK_CDI_GENERATE_OUTPUT_FORMAT",)),
    "mode": (("--discovery-mode",), ("NVIDIA_CTK_CDI_GENERATE_MODE",)),
    "dev_root": ((), ("NVIDIA_CTK_DEV_ROOT",)),
    "driver_root": ((), ("NVIDIA_CTK_DRIVER_ROOT",)),
    "strategies": ((), ("NVIDIA_CTK_CDI_GENERATE_DEVICE_NAME_STRATEGIES",)),
    "hook_path": (
        ("--nvidia-cdi-hook-path", "--nvidia-ctk-path"),
        ("NVIDIA_CTK_CDI_HOOK_PATH",),
    ),
    "vendor": (("--cdi-vendor",), ("NVIDIA_CTK_CDI_GENERATE_VENDOR",)),
    "device_class": (("--cdi-class",), ("NVIDIA_CTK_CDI_GENERATE_CLASS",)),
    "disable_hooks": (("--disable-hooks",), ("NVIDIA_CTK_CDI_GENERATE_DISABLED_HOOKS",)),
    "no_all_device": ((), ("NVIDIA_CTK_CDI_GENERATE_NO_ALL_DEVICE",)),
    "device_ids": (
        ("--device-ids", "--device", "--devices"),
        ("NVIDIA_CTK_CDI_GENERATE_DEVICE_IDS",),
    ),
}
# nvidia-ctk's flags with no gpuctk meaning: (its environment variable, gpuctk's answer)
_NO_CSV = "its csv mode (Jetson/Tegra) has no gpuctk equivalent"
GENERATE_REFUSED: dict[str, tuple[str, str]] = {
    "--library-search-path": (
        "NVIDIA_CTK_CDI_GENERATE_LIBRARY_SEARCH_PATHS",
        "gpuctk has no such setting; it finds the driver's libraries through the ld cache and "
        "library folders of --driver-root: point --driver-root at the driver's root",
    ),
    "--config-search-path": (
        "NVIDIA_CTK_CDI_GENERATE_CONFIG_SEARCH_PATHS",
        "gpuctk has no such setting; it finds the driver's config files (Vulkan, EGL, GLX) in "
        "their usual folders under --driver-root",
    ),
    "--csv.file": ("NVIDIA_CTK_CDI_GENERATE_CSV_FILES", _NO_CSV),
    "--csv.ignore-pattern": ("NVIDIA_CTK_CDI_GENERATE_CSV_IGNORE_PATTERNS", _NO_CSV),
    "--csv.compat-container-root": ("NVIDIA_CTK_CDI_GENERATE_CSV_CONTAINER_COMPAT_ROOT", _NO_CSV),
    "--feature-flag": (
        "NVIDIA_CTK_CDI_GENERATE_FEATURE_FLAGS",
        "gpuctk has no feature flags; its behaviour is chosen by flags (see --help)",
    ),
}
REFUSED_MODES = {
    "wsl": "gpuctk does not serve WSL (/dev/dxg)",
    "csv": _NO_CSV,
    "gdrcopy": "gpuctk writes no GDRCopy spec",
    "gds": "gpuctk writes no GPUDirect Storage spec",
    "mofed": "gpuctk's RDMA NIC spec is --nics",
    "nvswitch": "gpuctk writes no NVSwitch spec",
}
SAME_MODES = {"auto": "nvml"}  # gpuctk serves neither WSL nor Tegra: auto is nvml
NVIDIA_ONLY_HOOKS = ("chmod", "update-application-profile")  # gpuctk's spec never has them
NVIDIA_HOOKS = ("nvidia-cdi-hook", "nvidia-ctk")
HOOK_PATH_FLAGS = ("--nvidia-cdi-hook-path", "--nvidia-ctk-path", "NVIDIA_CTK_CDI_HOOK_PATH")


class Choice(click.Choice):  # type: ignore[type-arg]  # click 8.2 made Choice generic
    """click.Choice that also reads nvidia-ctk's values: `same` as another name of one of its
    own, `refused` with gpuctk's answer, `noop` as given (the caller drops them). --help shows
    gpuctk's own choices only."""

    def __init__(
        self,
        choices: tuple[str, ...],
        same: dict[str, str] | None = None,
        refused: dict[str, str] | None = None,
        noop: tuple[str, ...] = (),
    ) -> None:
        super().__init__(choices)
        self.same, self.refused, self.noop = same or {}, refused or {}, noop

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            if value.lower() in self.same:
                return self.same[value.lower()]
            if value.lower() in self.refused:
                self.fail(f"{value!r} is nvidia-ctk's: {self.refused[value.lower()]}", param, ctx)
            if value in self.noop:
                return value
        return super().convert(value, param, ctx)


def _dest(name: str) -> str:
    return "nvctk_" + name.lstrip("-").replace("-", "_").replace(".", "_")


def _refuse(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value in (None, ()):
        return value
    flag = param.opts[0]
    env, answer = GENERATE_REFUSED[flag]
    given = (
        env if ctx.get_parameter_source(param.name or "") == ParameterSource.ENVIRONMENT else flag
    )
    raise click.UsageError(f"{given} is nvidia-ctk's: {answer}")


def _split(values: list[str]) -> list[str]:
    return [v for value in values for v in value.split(",") if v]


def _from_env(names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        value = os.environ.get(name, "")
        if value:
            return name, value
    return None


def _convert(ctx: click.Context, param: click.Parameter, given: str, raw: list[str]) -> Any:
    """nvidia-ctk's value(s) `raw`, spelled `given`, as gpuctk's `param` reads them."""
    try:
        if isinstance(param, click.Option) and param.is_flag:
            return click.BOOL.convert(raw[0], param, ctx)
        if param.multiple:
            return tuple(param.type.convert(v, param, ctx) for v in _split(raw))
        return param.type.convert(raw[-1], param, ctx)
    except click.BadParameter as exc:
        raise click.UsageError(f"{given}: {exc.message}", ctx) from None


def _merge(ctx: click.Context, kw: dict[str, Any], params: dict[str, click.Parameter]) -> None:
    """Each gpuctk parameter of GENERATE_ALIASES from nvidia-ctk's spelling or variable, when
    gpuctk's own flag was not given (list flags: both spellings add up)."""
    for name, (spellings, envs) in GENERATE_ALIASES.items():
        param, own = params[name], ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE
        raw: list[str] = []
        given = ""
        for spelling in spellings:
            value = kw.pop(_dest(spelling))
            values = list(value) if isinstance(value, tuple) else [] if value is None else [value]
            if values:
                raw, given = raw + values, spelling
        if given and name == "hook_path":
            _check_hook(given, raw[-1])
        if given and own and not param.multiple and kw[name] != _convert(ctx, param, given, raw):
            flag = param.opts[0]
            raise click.UsageError(f"{flag} and nvidia-ctk's {given} name different values", ctx)
        if given:
            value = _convert(ctx, param, given, raw)
            kw[name] = (*kw[name], *value) if param.multiple and own else value
            continue
        found = None if own else _from_env(envs)
        if found is not None:
            if name == "hook_path":
                _check_hook(found[0], found[1])
            kw[name] = _convert(ctx, param, found[0], [found[1]])


def _check_hook(given: str, path: str) -> None:
    if os.path.basename(path) in NVIDIA_HOOKS:
        raise click.UsageError(
            f"{given} {path} names NVIDIA's hook, which does not read gpuctk's hook arguments: "
            "leave it out (the spec then names the gpuctk-hook beside gpuctk) or name "
            "gpuctk-hook with --hook-path"
        )


def _hooks(kw: dict[str, Any], ctx: click.Context) -> None:
    """nvidia-ctk's --enable-hook over the disabled ones; its hooks that gpuctk never writes
    dropped from --disable-hook (a note says so)."""
    from gpuctk.cdi.generate import HOOK_ACTIONS

    enabled = _split(list(kw.pop("nvctk_enable_hook")))
    if not enabled and (found := _from_env(("NVIDIA_CTK_CDI_GENERATE_ENABLED_HOOKS",))):
        enabled = _split([found[1]])
    unknown = [n for n in enabled if n not in (*HOOK_ACTIONS, *NVIDIA_ONLY_HOOKS)]
    if unknown:
        raise click.UsageError(
            f"--enable-hook: unknown name {unknown[0]!r} (gpuctk's hook actions: "
            f"{', '.join(HOOK_ACTIONS)}; each is on unless --disable-hook names it)",
            ctx,
        )
    disabled = list(kw["disable_hooks"])
    if "all" in disabled and enabled:
        disabled = [n for n in HOOK_ACTIONS if n not in disabled] + disabled
    disabled = [n for n in disabled if n not in enabled and not (n == "all" and enabled)]
    dropped = [n for n in disabled if n in NVIDIA_ONLY_HOOKS]
    if dropped:
        log.say(f"gpuctk: note: gpuctk's spec has no {', '.join(dropped)} hook: nothing to disable")
    kw["disable_hooks"] = tuple(n for n in disabled if n not in NVIDIA_ONLY_HOOKS)


def _ldconfig(kw: dict[str, Any], ctx: click.Context) -> None:
    """nvidia-ctk's --ldconfig-path: the host ldconfig the spec's hook runs (gpuctk-hook's own
    --ldconfig-path). `@` (host path, nvidia-ctk's config form) is dropped; /sbin/ldconfig is
    Debian's and Ubuntu's ldconfig.real where that exists, as nvidia-ctk takes it."""
    path = kw.pop("nvctk_ldconfig_path")
    found = None if path else _from_env(("NVIDIA_CTK_CDI_GENERATE_LDCONFIG_PATH",))
    path = (found[1] if found else path or "").removeprefix("@")
    if path and not os.path.isabs(path):
        raise click.UsageError(f"--ldconfig-path must be an absolute host path, got {path!r}", ctx)
    if path == "/sbin/ldconfig" and os.path.exists("/sbin/ldconfig.real"):
        path = "/sbin/ldconfig.real"
    kw["ldconfig_path"] = path


def generate_spellings(f: Callable[..., Any]) -> Callable[..., Any]:
    """`cdi generate`'s callback `f` (decorated with its click options, not yet a command) with
    nvidia-ctk's spellings added as hidden options and merged before `f` runs."""
    own = {p.name: p for p in getattr(f, "__click_params__", []) if p.name}

    @functools.wraps(f)
    def wrapper(**kw: Any) -> Any:
        ctx = click.get_current_context()
        _merge(ctx, kw, own)
        _hooks(kw, ctx)
        _ldconfig(kw, ctx)
        if "all" in kw["device_ids"]:  # nvidia-ctk's default: every device, as gpuctk's none
            kw["device_ids"] = ()
        return f(**kw)

    extra: list[click.Parameter] = []
    for name, (spellings, _) in GENERATE_ALIASES.items():
        multiple = own[name].multiple
        extra += [click.Option([s, _dest(s)], hidden=True, multiple=multiple) for s in spellings]
    extra.append(click.Option(["--enable-hook", "--enable-hooks", "nvctk_enable_hook"],
                              hidden=True, multiple=True))  # fmt: skip
    extra.append(click.Option(["--ldconfig-path", "nvctk_ldconfig_path"], hidden=True))
    for flag, (env, _) in GENERATE_REFUSED.items():
        names = [flag, *(["--feature-flags"] if flag == "--feature-flag" else []), _dest(flag)]
        extra.append(click.Option(names, hidden=True, multiple=True, envvar=env,
                                  callback=_refuse, expose_value=False))  # fmt: skip
    wrapper.__click_params__ = [*own.values(), *extra]  # type: ignore[attr-defined]
    return wrapper
