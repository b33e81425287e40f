"""`gpuctk doctor --probe` (layer 7): one throwaway container through gpuctk-runtime, one GPU.

The container runs on a fresh overlay of `--probe-rootfs` (default `/`: the host's own root
filesystem, read-only below a tmpfs upper layer, so nothing it writes reaches the host), asks for
the `--probe-device` of the active spec's kind by CDI annotation (as an orchestrator does:
accepted whatever `accept-envvar-unprivileged` says; `NVIDIA_VISIBLE_DEVICES` where the shim
reads no annotation prefix) and reports what it sees: the GPU device nodes, the
result of opening each /dev/nvidiaN, whether the ld cache lists libcuda.so.1 and
libnvidia-ml.so.1 (the gpuctk-hook entry ran) or, failing that, whether they sit in one of
the loader's system folders, where a `--library-mode mounts` spec puts them and the loader
finds them without a cache entry, and `nvidia-smi -L` when the image has it.
The verdict compares that with the active CDI spec's nodes for the device.

Clean-up always runs: `gpuctk-runtime delete --force`, lazy unmounts of the overlay and its
tmpfs, and removal of the bundle folder; a mount that will not go away is reported, never
removed recursively.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
from typing import Any

from gpuctk.doctor.context import Context, Findings
from gpuctk.doctor.report import Result, failed, ok, skipped, warning
from gpuctk.errors import GpuctkError

TIMEOUT_S = 60
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SCRIPT = r"""
for f in /dev/nvidia* /dev/nvidia-caps/* /dev/dri/*; do [ -c "$f" ] && echo "NODE $f"; done
for f in /dev/nvidia[0-9]*; do
  [ -c "$f" ] || continue
  if err=$( (: < "$f") 2>&1 ); then echo "OPEN $f ok"; else echo "OPEN $f $err"; fi
done
for l in libcuda.so.1 libnvidia-ml.so.1; do
  if ldconfig -p 2>/dev/null | grep -qE "^[[:space:]]+$l "; then echo "LDCACHE $l"; continue; fi
  for d in /lib/*-linux-gnu /usr/lib/*-linux-gnu /lib64 /usr/lib64; do
    if [ -e "$d/$l" ]; then echo "SYSDIR $l $d"; break; fi
  done
done
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi -L 2>&1 | head -n 4 | sed 's/^/SMI /'
fi
true
"""
ENXIO_TEXT = "No such device or address"
EPERM_TEXT = "Operation not permitted"
ID = "probe.container"
TITLE = "a throwaway container through gpuctk-runtime gets one GPU"


def _tagged(out: str, tag: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith(tag + " ")]


def expected_nodes(doc: dict[str, Any], device: str) -> set[str] | None:
    """The container paths of the nodes a request for `device` injects (None: no such device)."""
    paths = {n["path"] for n in (doc.get("containerEdits") or {}).get("deviceNodes") or []}
    for d in doc.get("devices") or []:
        if isinstance(d, dict) and d.get("name") == device:
            edits = d.get("containerEdits") or {}
            return paths | {n["path"] for n in edits.get("deviceNodes") or []}
    return None


def request_for(kind: str, device: str, prefixes: tuple[str, ...]) -> tuple[str, str, str]:
    """(annotation key, its value, the request in words) asking for `device` of `kind`; with
    no annotation prefix the shim would read, ("", "", "NVIDIA_VISIBLE_DEVICES=...")."""
    if not prefixes:
        return "", "", f"NVIDIA_VISIBLE_DEVICES={device}"
    key, value = f"{prefixes[0]}gpuctk-doctor-probe", f"{kind}={device}"
    return key, value, f"{key}: {value}"


def _bundle(runtime: str, folder: str, rootfs: str, device: str, key: str, value: str) -> str:
    """A bundle from `<runtime> spec`, running SCRIPT in `rootfs` with one GPU requested: by
    the annotation `key` (its `value`), or by NVIDIA_VISIBLE_DEVICES without one."""
    bundle = os.path.join(folder, "bundle")
    os.mkdir(bundle)
    subprocess.run(
        [runtime, "spec", "--bundle", bundle],
        check=True,
        capture_output=True,
        timeout=TIMEOUT_S,
    )
    path = os.path.join(bundle, "config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    env = [PATH_ENV] if key else [PATH_ENV, f"NVIDIA_VISIBLE_DEVICES={device}"]
    config["process"].update(terminal=False, args=["/bin/sh", "-c", SCRIPT], env=env)
    if key:
        config["annotations"] = {key: value}
    config["root"] = {"path": rootfs, "readonly": False}
    config["hostname"] = "gpuctk-doctor-probe"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f)
    return bundle


def _mount_overlay(lower: str, folder: str) -> tuple[str, str]:
    """A tmpfs for the upper layer (never inside `lower`), and the overlay over `lower`."""
    scratch, merged = os.path.join(folder, "scratch"), os.path.join(folder, "rootfs")
    os.mkdir(scratch)
    os.mkdir(merged)
    _mount(["-t", "tmpfs", "-o", "mode=0755,size=256m", "gpuctk-probe", scratch])
    for d in ("upper", "work"):
        os.mkdir(os.path.join(scratch, d))
    opts = f"lowerdir={lower},upperdir={scratch}/upper,workdir={scratch}/work"
    _mount(["-t", "overlay", "-o", opts, "gpuctk-probe", merged])
    return scratch, merged


def _mount(args: list[str]) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise GpuctkError(f"mount {' '.join(args)}: {done.stderr.strip()}")


def _cleanup(shim: str, name: str, folder: str, env: dict[str, str]) -> list[str]:
    """Delete the container and undo the mounts; what could not be undone."""
    left: list[str] = []
    subprocess.run(
        [shim, "delete", "--force", name],
        capture_output=True,
        timeout=TIMEOUT_S,
        check=False,
        env=env,
    )
    for sub in ("rootfs", "scratch"):
        path = os.path.join(folder, sub)
        if os.path.ismount(path):
            subprocess.run(["umount", "-l", path], capture_output=True, check=False)
        if os.path.ismount(path):
            left.append(f"{path} is still mounted (umount -l {path})")
    if not left:
        shutil.rmtree(os.path.join(folder, "bundle"), ignore_errors=True)
        for sub in ("rootfs", "scratch"):
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(folder, sub))
        try:
            os.rmdir(folder)
        except OSError as exc:
            left.append(f"{folder}: {exc.strerror}")
    return left


def _shim_env(ctx: Context) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = ctx.path
    if ctx.runtime_config:
        env["GPUCTK_CONFIG"] = ctx.runtime_config
    return env


def _open_text(line: str) -> str:
    """ "/dev/nvidia0 /bin/sh: 1: cannot open /dev/nvidia0: No such device or address" ->
    "open /dev/nvidia0: ENXIO (No such device or address)"."""
    path, _, result = line.partition(" ")
    for name, text in (("ENXIO", ENXIO_TEXT), ("EPERM", EPERM_TEXT)):
        if text in result:
            return f"open {path}: {name} ({text})"
    if result == "ok":
        return f"open {path}: ok"
    return f"open {path}: {result.rsplit(': ', 1)[-1]}"


def _verdict(out: str, expected: set[str], asked: str) -> Result:
    nodes = set(_tagged(out, "NODE"))
    opened = _tagged(out, "OPEN")
    ldcache = set(_tagged(out, "LDCACHE"))
    sysdir = dict(line.split(" ", 1) for line in _tagged(out, "SYSDIR") if " " in line)
    smi = _tagged(out, "SMI")
    evidence = [f"{asked}: {len(nodes)} GPU device node(s) in the container"]
    if nodes != expected:
        extra, gone = sorted(nodes - expected), sorted(expected - nodes)
        if gone:
            evidence.append(f"missing in the container: {', '.join(gone)}")
        if extra:
            evidence.append(f"unexpected in the container: {', '.join(extra)}")
        return failed(ID, TITLE, evidence, "gpuctk doctor   # fix the CDI and runtime layers first")
    blocked = [o for o in opened if EPERM_TEXT in o]
    no_driver = [o for o in opened if ENXIO_TEXT in o]
    evidence += [_open_text(o) for o in opened]
    evidence += [f"nvidia-smi: {line}" for line in smi]
    if blocked:
        return failed(
            ID,
            TITLE,
            evidence,
            "the device cgroup blocks the GPU: check the engine's cgroup driver (SystemdCgroup) "
            "and `systemctl daemon-reload` side effects; then restart the container",
        )
    evidence += [
        f"{lib}: in {folder}, a loader system folder (a --library-mode mounts spec)"
        for lib, folder in sorted(sysdir.items())
        if lib not in ldcache
    ]
    missing_libs = sorted({"libcuda.so.1", "libnvidia-ml.so.1"} - ldcache - set(sysdir))
    if missing_libs:
        evidence.append(
            f"ld cache and loader system folders lack {', '.join(missing_libs)}"
            " (the gpuctk-hook entry ran?)"
        )
    if no_driver or missing_libs:
        evidence.append(
            "the node answers ENXIO: no driver behind it (driver not loaded, or a test node)"
            if no_driver
            else "driver libraries not in the container's ld cache"
        )
        return warning(
            ID,
            TITLE,
            evidence,
            "modprobe nvidia && nvidia-smi"
            if no_driver
            else "gpuctk-hook --version; check the spec's hook path (gpuctk doctor, CDI layer)",
        )
    return ok(ID, TITLE, *evidence)


def check_probe(ctx: Context, found: Findings) -> Result:
    if not ctx.probe:
        return skipped(ID, TITLE, "not asked (--probe)")
    if os.geteuid() != 0:
        return skipped(ID, TITLE, "needs root (mounts and a container)")
    spec = found.active_spec
    if spec is None:
        return failed(ID, TITLE, ["no CDI spec to probe with"], "see the CDI layer's fix")
    expected = expected_nodes(spec, ctx.probe_device)
    if expected is None:
        return failed(
            ID,
            TITLE,
            [f"the CDI spec has no device {ctx.probe_device!r}"],
            "gpuctk doctor --probe --probe-device <a device of `gpuctk cdi list`>",
        )
    shim = shutil.which("gpuctk-runtime", path=ctx.path)
    if shim is None:
        return failed(ID, TITLE, ["gpuctk-runtime not on PATH"], "see the runtime layer")
    if found.settings is None:
        return skipped(ID, TITLE, "runtime settings unknown")
    from gpuctk.hook.shim.runtime_main import find_runtime

    try:
        runtime = find_runtime(found.settings.runtimes)
    except GpuctkError as exc:
        return failed(ID, TITLE, [exc.message], "see the runtime layer")
    kind = str(spec.get("kind") or found.settings.default_kind)
    key, value, asked = request_for(kind, ctx.probe_device, found.settings.annotation_prefixes)
    env = _shim_env(ctx)
    name = f"gpuctk-doctor-probe-{os.getpid()}-{secrets.token_hex(3)}"
    folder = tempfile.mkdtemp(prefix="gpuctk-doctor-probe-")
    left: list[str] = []
    try:
        try:
            _, merged = _mount_overlay(os.path.abspath(ctx.probe_rootfs), folder)
            bundle = _bundle(runtime, folder, merged, ctx.probe_device, key, value)
        except (GpuctkError, OSError, subprocess.SubprocessError) as exc:
            return failed(
                ID,
                TITLE,
                [f"cannot prepare the container: {exc}"],
                "run as root with overlayfs and tmpfs available",
            )
        try:
            done = subprocess.run(
                [shim, "run", "--bundle", bundle, name],
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                timeout=TIMEOUT_S,
                check=False,
                env=env,
            )
        except subprocess.TimeoutExpired:
            return failed(ID, TITLE, [f"{shim} run: no exit in {TIMEOUT_S}s"], "journalctl -k")
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["(no message)"])[-3:]
            return failed(
                ID,
                TITLE,
                [f"{shim} run exited {done.returncode}", *tail],
                "gpuctk doctor   # the layer that fails above names the fix",
            )
        result = _verdict(done.stdout, expected, asked)
    finally:
        left = _cleanup(shim, name, folder, env)
    if left:
        return failed(ID, TITLE, [*result.evidence, *left], "umount -l the paths named above")
    return result
