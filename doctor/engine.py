"""`gpuctk doctor` layer 5: the container engines that must know the gpuctk runtime handler.

containerd: the effective config (`containerd --config X config dump` when the binary is there
and `--config-source` allows, else the files merged as containerd does, by gpuctk.containerd's
own loader) has the handler (`--runtime-name`, default `nvidia`), the handler's BinaryName
(shim mode) or base_runtime_spec (hook mode) exists, and `enable_cdi` is set where the mode
needs it; no config file is newer than containerd reads and every handler has runtime_type
(gpuctk.doctor.containerdfiles); on containerd 1.x no main-config CRI key is shadowed by the
drop-in's copy of the table (gpuctk.doctor.shadowed). CRI-O (crio.conf + crio.conf.d) and
Docker (daemon.json): the same handler with an existing runtime path, checked when the engine
is present.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
from typing import Any

from gpuctk import log
from gpuctk.cdi.node.facts import HOOK_NAME
from gpuctk.doctor import containerdfiles
from gpuctk.doctor.context import Context, Findings
from gpuctk.doctor.daemon import LOADED_TITLE, check_containerd_loaded
from gpuctk.doctor.report import Result, failed, ok, skipped, warning
from gpuctk.doctor.shadowed import SHADOWED, check_shadowed
from gpuctk.errors import GpuctkError

SHIM_NAMES = ("gpuctk-runtime",)


def _configure_fix(
    ctx: Context, engine: str, config: str, restart: str, extra: tuple[str, ...] = ()
) -> str:
    argv = ["gpuctk", "runtime", "configure", "--runtime", engine, "--config", config, *extra]
    if ctx.runtime_name != "nvidia":
        argv += ["--runtime-name", ctx.runtime_name]
    shim = shutil.which("gpuctk-runtime", path=ctx.path)
    if shim and shim != "/usr/bin/gpuctk-runtime":
        argv += ["--runtime-path", shim]
    return f"{shlex.join(argv)} && {restart}"


def _containerd_config(ctx: Context) -> tuple[str | None, str]:
    binary = ctx.containerd or shutil.which("containerd", path=ctx.path)
    config = ctx.containerd_config or ctx.host("/etc/containerd/config.toml")
    return binary, config


def load_containerd(ctx: Context, binary: str | None, config: str) -> tuple[dict[str, Any], str]:
    """The effective containerd config and how it was read."""
    from gpuctk.containerd import engine, imports, tomlfiles

    use_command = binary is not None and ctx.config_source != "file"
    if ctx.config_source == "command" and binary is None:
        raise GpuctkError("containerd not found on PATH (--containerd, or --config-source file)")
    if use_command:
        assert binary is not None
        if os.path.exists(config):
            text = engine.run([binary, "--config", config, "config", "dump"])
        else:
            with tempfile.TemporaryDirectory(prefix="gpuctk-doctor-") as tmp:
                empty = os.path.join(tmp, "config.toml")
                with open(empty, "w", encoding="utf-8") as f:
                    f.write("version = 2\n")
                text = engine.run([binary, "--config", empty, "config", "dump"])
        log.debug(f"doctor: containerd config from `{binary} config dump` of {config}")
        return tomlfiles.parse(text, f"{binary} config dump"), f"`{binary} config dump`"
    version = (tomlfiles.load(config) or {}).get("version")
    merge: imports.MergeMode = "deep" if isinstance(version, int) and version >= 3 else "replace"
    loaded = imports.load(config, merge)
    how = "deep merge" if merge == "deep" else "plugin tables replaced"
    log.debug(f"doctor: containerd config from the files ({how}): {', '.join(loaded.files)}")
    return loaded.data, f"{config} and its imports"


def _handlers(data: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """(config version, CRI plugin table, runtimes table)."""
    from gpuctk.containerd import tomlfiles, versions

    version = data.get("version") if data.get("version") in versions.CRI_PLUGIN else 2
    assert isinstance(version, int)
    cri = tomlfiles.get_table(data, "plugins", versions.CRI_PLUGIN[version]) or {}
    runtimes = tomlfiles.get_table(cri, "containerd", "runtimes") or {}
    return version, cri, runtimes


def check_containerd(ctx: Context, found: Findings) -> list[Result]:
    binary, config = _containerd_config(ctx)
    ids = (
        "engine.containerd",
        "engine.containerd.binary",
        "engine.containerd.cdi",
        "engine.containerd.loaded",
        containerdfiles.VERSIONS[0],
        containerdfiles.RUNTIME_TYPE[0],
        SHADOWED[0],
    )
    titles = (
        f"containerd has the {ctx.runtime_name!r} handler",
        "the handler's runtime binary exists",
        "containerd CDI setting fits the mode",
        LOADED_TITLE,
        containerdfiles.VERSIONS[1],
        containerdfiles.RUNTIME_TYPE[1],
        SHADOWED[1],
    )
    if binary is None and not os.path.exists(config):
        return [
            skipped(i, t, "containerd not installed, no config")
            for i, t in zip(ids, titles, strict=True)
        ]
    restart = "systemctl restart containerd"
    fix = _configure_fix(ctx, "containerd", config, restart)
    # From the files: a file containerd refuses makes `config dump` fail too.
    versions = containerdfiles.check_versions(config, binary, fix)
    try:
        data, source = load_containerd(ctx, binary, config)
    except GpuctkError as exc:
        return [
            failed(ids[0], "containerd config readable", [exc.message], f"fix {config}"),
            *(
                skipped(i, t, "config unreadable")
                for i, t in zip(ids[1:4], titles[1:4], strict=True)
            ),
            versions,
            skipped(ids[5], titles[5], "config unreadable"),
            skipped(ids[6], titles[6], "config unreadable"),
        ]
    _, cri, runtimes = _handlers(data)
    found.handlers["containerd"] = set(runtimes)
    files = [
        versions,
        containerdfiles.check_runtime_types(config, runtimes, source, fix),
        check_shadowed(config, binary, ctx.runtime_name, fix),
    ]
    handler = runtimes.get(ctx.runtime_name)
    if not isinstance(handler, dict):
        known = ", ".join(sorted(runtimes)) or "none"
        evidence = [
            f"{source}: no runtime handler {ctx.runtime_name!r} (handlers: {known})",
            'pods with this RuntimeClass fail: "no runtime for '
            f'{ctx.runtime_name!r} is configured"',
        ]
        return [
            failed(ids[0], titles[0], evidence, fix),
            skipped(ids[1], titles[1], "no handler"),
            skipped(ids[2], titles[2], "no handler"),
            check_containerd_loaded(ctx, config),
            *files,
        ]
    results = [ok(ids[0], titles[0], f"{source}: handler {ctx.runtime_name!r}")]
    options = handler.get("options") if isinstance(handler.get("options"), dict) else {}
    assert isinstance(options, dict)
    binary_name = options.get("BinaryName")
    base_spec = handler.get("base_runtime_spec")
    mode = "shim" if binary_name else "hook" if base_spec else "plain"
    if mode == "shim" and not _is_gpuctk(str(binary_name)):  # whose file sets it, and the fix
        take_over = _configure_fix(ctx, "containerd", config, restart, ("--take-over",))
        results.append(
            containerdfiles.check_handler_owner(
                ids[1], titles[1], config, ctx.runtime_name, str(binary_name), (fix, take_over)
            )
        )
    else:
        results.append(_handler_binary(ids[1], titles[1], mode, binary_name, base_spec, fix))
    results.append(_containerd_cdi(ctx, ids[2], titles[2], mode, cri, binary, config, restart))
    results.append(check_containerd_loaded(ctx, config))
    return [*results, *files]


def _is_gpuctk(path: str) -> bool:
    return os.path.basename(os.path.realpath(path)).startswith(SHIM_NAMES) or os.path.basename(
        path
    ).startswith(SHIM_NAMES)


def _handler_binary(
    id_: str, title: str, mode: str, binary_name: Any, base_spec: Any, fix: str
) -> Result:
    if mode == "shim":
        path = str(binary_name)
        resolved = path if os.path.isabs(path) else shutil.which(path)
        if resolved is None or not os.path.isfile(resolved) or not os.access(resolved, os.X_OK):
            return failed(
                id_,
                title,
                [
                    f"BinaryName = {path!r}: missing or not executable; every container of the "
                    "handler fails to start"
                ],
                fix,
            )
        if not _is_gpuctk(resolved):
            return warning(
                id_,
                title,
                [f"BinaryName = {path!r} is not gpuctk-runtime (another toolkit's runtime?)"],
                fix,
            )
        return ok(id_, title, f"shim mode: BinaryName = {path}")
    if mode == "hook":
        path = str(base_spec)
        if not os.path.isfile(path):
            return failed(id_, title, [f"base_runtime_spec = {path!r}: missing"], fix)
        return _hook_spec(id_, title, path, fix)
    return warning(
        id_,
        title,
        [
            "the handler has neither options.BinaryName (shim) nor base_runtime_spec (hook): "
            "it runs plain runc, which injects no GPU"
        ],
        fix,
    )


def _hook_spec(id_: str, title: str, path: str, fix: str) -> Result:
    import json

    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        hooks = [h for stage in (doc.get("hooks") or {}).values() for h in stage]
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        return failed(id_, title, [f"base_runtime_spec {path}: unreadable: {exc}"], fix)
    paths = [h.get("path") for h in hooks if isinstance(h, dict)]
    ours = [p for p in paths if isinstance(p, str) and HOOK_NAME in os.path.basename(p)]
    if not ours:
        return failed(id_, title, [f"{path}: no gpuctk-hook entry in its hooks"], fix)
    gone = [p for p in ours if not (os.path.isfile(p) and os.access(p, os.X_OK))]
    if gone:
        return failed(
            id_, title, [f"{path}: hook {p} missing or not executable" for p in gone], fix
        )
    return ok(id_, title, f"hook mode: {path} runs {ours[0]}")


def _containerd_cdi(
    ctx: Context,
    id_: str,
    title: str,
    mode: str,
    cri: dict[str, Any],
    binary: str | None,
    config: str,
    restart: str,
) -> Result:
    enabled = cri.get("enable_cdi") is True
    version = None
    if binary is not None:
        from gpuctk.containerd import engine

        try:
            version = engine.version(binary)
        except GpuctkError:
            version = None
    old = version is not None and (version.major, version.minor) < (1, 7)
    setting = f"enable_cdi = {str(enabled).lower()}" + (
        f" (containerd {version.major}.{version.minor})" if version else ""
    )
    if mode == "shim":
        note = "not needed: gpuctk-runtime applies CDI requests (annotations, env) itself"
        if enabled and old:
            note += "; containerd < 1.7 ignores enable_cdi anyway"
        return ok(id_, title, f"{setting}: {note}")
    if mode == "hook":
        if not enabled or old:
            why = "containerd < 1.7 has no CDI" if old else "CDI is off"
            return warning(
                id_,
                title,
                [
                    f"{setting}: hook mode with {why}: device plugins that request GPUs by "
                    "CDI name (cdi.k8s.io annotations, CRI CDIDevices) get nothing"
                ],
                _configure_fix(ctx, "containerd", config, restart)  # shim mode
                if old
                else _configure_fix(
                    ctx, "containerd", config, restart, ("--mode", "hook", "--cdi-enabled")
                ),
            )
        return ok(id_, title, f"{setting}: hook mode; CDI requests handled by containerd")
    return skipped(id_, title, f"{setting}: handler injects nothing")


def check_crio(ctx: Context, found: Findings) -> Result:
    id_, title = "engine.crio", f"CRI-O has the {ctx.runtime_name!r} handler"
    config = ctx.crio_config or ctx.host("/etc/crio/crio.conf")
    binary = shutil.which("crio", path=ctx.path)
    drop_dir = os.path.join(os.path.dirname(config), "crio.conf.d")
    if binary is None and not os.path.exists(config) and not os.path.isdir(drop_dir):
        return skipped(id_, title, "CRI-O not installed, no config")
    from gpuctk.containerd import tomlfiles

    try:
        merged: dict[str, Any] = tomlfiles.load(config) or {}
        names = sorted(os.listdir(drop_dir)) if os.path.isdir(drop_dir) else []
        for name in names:
            path = os.path.join(drop_dir, name)
            if not name.startswith(".") and os.path.isfile(path):
                merged = tomlfiles.deep_merge(merged, tomlfiles.load(path) or {})
    except GpuctkError as exc:
        return failed(id_, title, [exc.message], f"fix {config}")
    runtimes = tomlfiles.get_table(merged, "crio", "runtime", "runtimes") or {}
    found.handlers["crio"] = set(runtimes)
    fix = _configure_fix(ctx, "crio", config, "systemctl restart crio")
    handler = runtimes.get(ctx.runtime_name)
    if not isinstance(handler, dict):
        known = ", ".join(sorted(runtimes)) or "none"
        return failed(
            id_,
            title,
            [f"{config} + {drop_dir}: no {ctx.runtime_name!r} (handlers: {known})"],
            fix,
        )
    target = handler.get("runtime_path")
    if not isinstance(target, str) or not (os.path.isfile(target) and os.access(target, os.X_OK)):
        return failed(id_, title, [f"runtime_path = {target!r}: missing or not executable"], fix)
    return ok(id_, title, f"runtime_path = {target}")


def check_docker(ctx: Context, found: Findings) -> Result:
    id_, title = "engine.docker", f"Docker has the {ctx.runtime_name!r} runtime"
    config = ctx.docker_config or ctx.host("/etc/docker/daemon.json")
    binary = shutil.which("dockerd", path=ctx.path)
    if binary is None and not os.path.exists(config):
        return skipped(id_, title, "Docker not installed, no daemon.json")
    import json

    fix = _configure_fix(ctx, "docker", config, "systemctl restart docker")
    try:
        with open(config, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        data = {}
    except (OSError, ValueError) as exc:
        return failed(id_, title, [f"{config}: {exc}"], f"fix {config} (it must be JSON)")
    runtimes = data.get("runtimes") if isinstance(data, dict) else None
    runtimes = runtimes if isinstance(runtimes, dict) else {}
    found.handlers["docker"] = set(runtimes)
    entry = runtimes.get(ctx.runtime_name)
    if not isinstance(entry, dict):
        return warning(
            id_,
            title,
            [
                f"{config}: no runtimes.{ctx.runtime_name} (docker run --gpus and "
                f"--runtime {ctx.runtime_name} get no GPU)"
            ],
            fix,
        )
    path = entry.get("path")
    resolved = shutil.which(path, path=ctx.path) if isinstance(path, str) else None
    if resolved is None:
        return failed(id_, title, [f"runtimes.{ctx.runtime_name}.path = {path!r}: not found"], fix)
    return ok(id_, title, f"runtimes.{ctx.runtime_name}.path = {path}")


def engine_checks(ctx: Context, found: Findings) -> list[Result]:
    return [*check_containerd(ctx, found), check_crio(ctx, found), check_docker(ctx, found)]
