"""`gpuctk doctor` layer 6: Kubernetes hints, from files only (no API server needed).

- the kubelet's device-plugin socket dir (`<kubelet-root>/device-plugins`, kubelet.sock in it);
- a device plugin (gpuctk's or NVIDIA's) listening and registered there, and the devices it
  hands out named by the CDI specs (gpuctk.doctor.devplugin);
- each RuntimeClass manifest given (`--runtimeclass FILE`) names a handler the engines know.
"""

from __future__ import annotations

import os
import stat

from gpuctk.doctor.context import Context, Findings
from gpuctk.doctor.devplugin import kubelet_root
from gpuctk.doctor.report import Result, failed, ok, skipped, warning


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def check_socket_dir(ctx: Context, found: Findings) -> Result:
    id_, title = "kubernetes.device-plugins", "kubelet device-plugin socket dir"
    root = kubelet_root(ctx)
    if not os.path.isdir(root):
        return skipped(id_, title, f"{root}: absent: no kubelet on this node")
    folder = os.path.join(root, "device-plugins")
    if not os.path.isdir(folder):
        return failed(
            id_,
            title,
            [f"{folder}: missing: no device plugin can register"],
            "systemctl restart kubelet   # it creates the folder",
        )
    sock = os.path.join(folder, "kubelet.sock")
    if not _is_socket(sock):
        return warning(
            id_,
            title,
            [f"{sock}: no socket: the kubelet is not running (or restarting)"],
            "systemctl status kubelet",
        )
    return ok(id_, title, f"{sock}: the kubelet listens")


def _runtime_classes(path: str) -> list[tuple[str, str]]:
    """(name, handler) of every RuntimeClass in a YAML/JSON manifest file."""
    import yaml

    with open(path, encoding="utf-8") as f:
        docs = list(yaml.safe_load_all(f))
    out = []
    for doc in docs:
        items = doc.get("items") if isinstance(doc, dict) and doc.get("kind") == "List" else [doc]
        for item in items or []:
            if isinstance(item, dict) and item.get("kind") == "RuntimeClass":
                name = (item.get("metadata") or {}).get("name", "?")
                out.append((str(name), str(item.get("handler", ""))))
    return out


def check_runtimeclass(ctx: Context, found: Findings) -> Result:
    id_, title = "kubernetes.runtimeclass", "RuntimeClass handler known to the engine"
    if not ctx.runtimeclass_files:
        return skipped(id_, title, "no manifest given (--runtimeclass FILE)")
    known = set().union(*found.handlers.values()) if found.handlers else set()
    bad: list[str] = []
    good: list[str] = []
    import yaml

    for path in ctx.runtimeclass_files:
        try:
            classes = _runtime_classes(path)
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            bad.append(f"{path}: unreadable: {exc}")
            continue
        if not classes:
            bad.append(f"{path}: no RuntimeClass in it")
        for name, handler in classes:
            if handler in known:
                good.append(f"{path}: RuntimeClass {name} -> handler {handler} (configured)")
            elif not found.handlers:
                bad.append(
                    f"{path}: RuntimeClass {name} -> handler {handler}: no engine config "
                    "found to check it against"
                )
            else:
                bad.append(
                    f"{path}: RuntimeClass {name} -> handler {handler!r}, unknown to the engine "
                    f"(handlers: {', '.join(sorted(known))}): its pods fail to start"
                )
    if bad:
        fix = (
            f"gpuctk runtime runtimeclass --handler {ctx.runtime_name} | kubectl apply -f -   "
            f"# or: gpuctk runtime configure --runtime-name <the manifest's handler>"
        )
        return failed(id_, title, [*bad, *good], fix)
    return ok(id_, title, *good)


def k8s_checks(ctx: Context, found: Findings) -> list[Result]:
    from gpuctk.doctor.devplugin import plugin_checks

    return [
        check_socket_dir(ctx, found),
        *plugin_checks(ctx, found),
        check_runtimeclass(ctx, found),
    ]
