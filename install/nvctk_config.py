"""nvidia-ctk's config.toml and gpuctk's: the one table of what each NVIDIA setting becomes.

NVIDIA's file (/etc/nvidia-container-runtime/config.toml, as `nvidia-ctk config default`
writes it) holds top-level keys and the tables nvidia-container-cli, nvidia-ctk,
nvidia-container-runtime (with modes.cdi, modes.csv, modes.legacy, modes.jit-cdi),
nvidia-container-runtime-hook and features. Each setting, as a dotted key, either becomes a
gpuctk key (with its value converted where the two differ) or has no equivalent, with why and
what to use instead. A key ending in `.*` covers every key under it that has no row of its
own. `gpuctk migrate` reads this table; docs/commands.md prints it (doc_table, checked by
tests/unit/test_migrate.py).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from gpuctk.hook import config

NO_CLI = "no equivalent: gpuctk runs no nvidia-container-cli"
NO_CSV = "no equivalent: gpuctk has no csv (Jetson/Tegra) mode"
HOOK_PATH = "no equivalent: the CDI spec names gpuctk-hook (`gpuctk cdi generate --hook-path`)"
# logrus' levels (nvidia-container-runtime's log-level) -> gpuctk's
LOG_LEVELS = {
    "trace": "debug",
    "debug": "debug",
    "info": "info",
    "warn": "warning",
    "warning": "warning",
    "error": "error",
    "fatal": "error",
    "panic": "error",
}


class Row(NamedTuple):
    nvidia: str  # dotted key in NVIDIA's file; `table.*` for the rest of a table
    gpuctk: str | None  # the gpuctk key it becomes, None: no equivalent
    note: str  # gpuctk's column in the docs: the conversion, or why not and what instead
    default: Any = None  # NVIDIA's default value (None: none worth noting)


ROWS: tuple[Row, ...] = (
    Row("accept-nvidia-visible-devices-envvar-when-unprivileged", "accept-envvar-unprivileged",
        "the same true/false; gpuctk's default is \"auto\" (not in Kubernetes containers)", True),
    Row("accept-nvidia-visible-devices-as-volume-mounts", "accept-volume-mounts", "the same",
        False),
    Row("disable-require", None, "no equivalent: `NVIDIA_REQUIRE_*` is checked at create; a "
        "container sets `NVIDIA_DISABLE_REQUIRE=true` to skip it", False),
    Row("swarm-resource", None, "no equivalent: name the GPUs in `NVIDIA_VISIBLE_DEVICES`"),
    Row("supported-driver-capabilities", None, "no equivalent: the spec holds the files of the "
        "capabilities it serves (`gpuctk cdi generate --driver-capabilities`)",
        "compat32,compute,display,graphics,ngx,utility,video"),
    Row("nvidia-container-cli.root", None, "no equivalent here: pass `--driver-root` to "
        "`gpuctk cdi generate` (`NVIDIA_DRIVER_ROOT` in /etc/default/gpuctk for the refresh "
        "unit)"),
    Row("nvidia-container-cli.ldconfig", None, "no equivalent here: `gpuctk cdi generate "
        "--ldconfig-path` names the host ldconfig the hook runs; without it gpuctk-hook "
        "builds the ld cache itself", "@/sbin/ldconfig"),
    Row("nvidia-container-cli.ldcache", None, "no equivalent: gpuctk reads the ld cache under "
        "`--driver-root`"),
    Row("nvidia-container-cli.load-kmods", None, "no equivalent: nothing is loaded at create; "
        "`gpuctk system create-device-nodes --load-kernel-modules` loads the modules", True),
    Row("nvidia-container-cli.no-cgroups", None, "no equivalent: the low-level runtime allows "
        "the spec's device nodes in the container's cgroup", False),
    Row("nvidia-container-cli.environment", None, NO_CLI, []),
    Row("nvidia-container-cli.*", None, NO_CLI),
    Row("nvidia-ctk.path", None, HOOK_PATH, "nvidia-ctk"),
    Row("nvidia-container-runtime.debug", "log-file", "the same file; `/dev/null` is \"\" (none)",
        "/dev/null"),
    Row("nvidia-container-runtime.log-level", "log-level", "`trace` is `debug`, `warn` "
        "`warning`, `fatal` and `panic` `error`", "info"),
    Row("nvidia-container-runtime.runtimes", "runtimes", "the same", ["runc", "crun"]),
    Row("nvidia-container-runtime.mode", None, "no equivalent: gpuctk-runtime always applies "
        "the CDI specs (no legacy, csv or jit-cdi mode)", "auto"),
    Row("nvidia-container-runtime.modes.cdi.spec-dirs", "spec-dirs", "the same",
        ["/etc/cdi", "/var/run/cdi"]),
    Row("nvidia-container-runtime.modes.cdi.default-kind", "default-kind", "the same",
        "nvidia.com/gpu"),
    Row("nvidia-container-runtime.modes.cdi.annotation-prefixes", "annotation-prefixes",
        "the same", ["cdi.k8s.io/"]),
    Row("nvidia-container-runtime.modes.csv.*", None, NO_CSV),
    Row("nvidia-container-runtime.modes.legacy.cuda-compat-mode", None, "no equivalent: "
        "gpuctk-hook puts a newer CUDA compat libcuda first; `gpuctk cdi generate "
        "--disable-hook enable-cuda-compat` turns that off", "ldconfig"),
    Row("nvidia-container-runtime.modes.jit-cdi.*", None, "no equivalent: gpuctk-runtime "
        "applies the spec `gpuctk cdi generate` writes (its `--disable-hook` leaves actions "
        "out)"),
    Row("nvidia-container-runtime.*", None, "no equivalent: not a setting gpuctk knows"),
    Row("nvidia-container-runtime-hook.path", None, HOOK_PATH, "nvidia-container-runtime-hook"),
    Row("nvidia-container-runtime-hook.skip-mode-detection", None, "no equivalent: gpuctk-hook "
        "has no modes to detect", False),
    Row("features.allow-cuda-compat-libs-from-container", None, "no equivalent: gpuctk-hook "
        "always lets an image's newer CUDA compat libcuda win the ld cache"),
    Row("features.allow-ldconfig-from-container", None, "no equivalent: gpuctk never runs the "
        "container's ldconfig"),
    Row("features.allow-unknown-oci-spec-fields", None, "no equivalent: gpuctk-runtime keeps "
        "unknown config.json fields as they are"),
    Row("features.disable-cuda-compat-lib-hook", None, "no equivalent here: `gpuctk cdi "
        "generate --disable-hook enable-cuda-compat`"),
    Row("features.disable-imex-channel-creation", None, "no equivalent: gpuctk makes no IMEX "
        "channel nodes; the spec of `gpuctk cdi generate --mode imex` names those there are"),
    Row("features.ignore-imex-channel-requests", None, "no equivalent: `NVIDIA_IMEX_CHANNELS` is "
        "honoured as `NVIDIA_VISIBLE_DEVICES` is (`accept-envvar-unprivileged`), `imex/` "
        "mounts only with `accept-volume-mounts`"),
    Row("features.no-additional-gids-for-device-nodes", None, "no equivalent: gpuctk adds "
        "groups only with `gpuctk cdi generate --additional-gids`"),
    Row("features.*", None, "no equivalent: not a feature gpuctk knows"),
    Row("*", None, "no equivalent: not a setting gpuctk knows"),
)  # fmt: skip
_EXACT = {r.nvidia: r for r in ROWS if not r.nvidia.endswith("*")}
_PREFIXES = sorted((r for r in ROWS if r.nvidia.endswith("*")), key=lambda r: -len(r.nvidia))


def row_of(key: str) -> Row:
    """The row of a dotted NVIDIA key: its own, else the longest `table.*` that holds it."""
    if key in _EXACT:
        return _EXACT[key]
    return next(r for r in _PREFIXES if key.startswith(r.nvidia[:-1]))


def leaves(table: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of every non-table value, in the file's order."""
    out: list[tuple[str, Any]] = []
    for key, value in table.items():
        if isinstance(value, dict):
            out += leaves(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def convert(row: Row, value: Any) -> tuple[Any, str | None]:
    """(gpuctk value, problem) of NVIDIA's `value` for a row with a gpuctk key."""
    if row.gpuctk == "log-file":
        if not isinstance(value, str):
            return None, "must be a string"
        return ("" if value in ("", "/dev/null") else value), None
    if row.gpuctk == "log-level":
        if not isinstance(value, str) or value.lower() not in LOG_LEVELS:
            return None, f"{value!r} is not one of {', '.join(LOG_LEVELS)}"
        return LOG_LEVELS[value.lower()], None
    problems = config.check({str(row.gpuctk): value})
    return (None, problems[0].split(": ", 1)[1]) if problems else (value, None)


class Carried(NamedTuple):
    nvidia: str
    value: Any
    gpuctk: str | None  # the gpuctk key set, None when not carried
    gpuctk_value: Any
    note: str  # why not, or how it was converted
    nvidia_default: bool  # the value is NVIDIA's default


def carry(table: dict[str, Any]) -> tuple[list[Carried], dict[str, Any], list[str]]:
    """(one row per setting in NVIDIA's `table`, the gpuctk keys to set, the problems: values
    gpuctk cannot take, each naming the NVIDIA key)."""
    rows: list[Carried] = []
    updates: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in leaves(table):
        row = row_of(key)
        default = row.default is not None and value == row.default
        if row.gpuctk is None:
            rows.append(Carried(key, value, None, None, row.note, default))
            continue
        new, problem = convert(row, value)
        if problem:
            problems.append(f"{key} = {_show(value)}: {problem} (as gpuctk's {row.gpuctk})")
            continue
        updates[row.gpuctk] = new
        rows.append(Carried(key, value, row.gpuctk, new, row.note, default))
    return rows, updates, problems


def _show(value: Any) -> str:
    import tomlkit

    return str(tomlkit.item(value).as_string())


def text_table(rows: list[Carried]) -> list[str]:
    """The rows as aligned text: NVIDIA key, its value, what it became."""
    cells = [
        (
            r.nvidia,
            _show(r.value) + (" (NVIDIA's default)" if r.nvidia_default else ""),
            f"{r.gpuctk} = {_show(r.gpuctk_value)}" if r.gpuctk else r.note.replace("`", ""),
        )
        for r in rows
    ]
    head = ("nvidia-ctk setting", "value", "gpuctk")
    w0 = max(len(c[0]) for c in [head, *cells])
    w1 = min(max(len(c[1]) for c in [head, *cells]), 40)
    return [f"{a:<{w0}}  {b:<{w1}}  {c}".rstrip() for a, b, c in [head, *cells]]


def doc_table() -> list[str]:
    """The markdown table docs/commands.md shows under `gpuctk migrate`."""
    lines = ["| nvidia-ctk setting | gpuctk |", "| --- | --- |"]
    for r in ROWS:
        what = f"`{r.gpuctk}`: {r.note}" if r.gpuctk else r.note
        lines.append(f"| `{r.nvidia}` | {what} |")
    return lines
