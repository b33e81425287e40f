#!/usr/bin/env python3
"""Build gpuctk_<version>_<arch>.deb from the checkout with dpkg-deb (no debhelper needed).

    python3 packaging/deb/build.py                     # -> dist/gpuctk_0.1.0_amd64.deb
    python3 packaging/deb/build.py --out-dir /tmp/out --python /usr/bin/python3
    python3 packaging/deb/build.py venv /tmp/app       # only the application venv (tests use it)

What goes in (see packaging/deb/README in the project README, "Install"):

- /opt/gpuctk: a virtual environment made with the system interpreter (default /usr/bin/python3,
  Debian 12's 3.11), holding gpuctk and its dependencies from PyPI, with .pyc files compiled at
  build time and pip/setuptools removed. The package depends on that interpreter (python3.11):
  the venv's bin/python3 is a link to it. No system Python package is touched.
- /usr/bin/gpuctk, gpuctk-runtime, gpuctk-hook: isolated-mode launchers (`#!/opt/gpuctk/bin/python3
  -I`, install/launchers.py), so PYTHONPATH and friends never reach the shim or the hook.
- /etc/gpuctk/config.toml (conffile), the systemd refresh units (path, timer, oneshot service),
  gpuctk-device-plugin.service (shipped disabled, for nodes without the plugin's DaemonSet; the
  venv holds the `device-plugin` extra, grpcio, for it),
  the udev rules (CDI refresh, /dev/char links), a man page per command (manpages.py, from the
  click tree), docs/*.md in /usr/share/doc/gpuctk (each --help's Details line names them there),
  the maintainer scripts in packaging/deb/. No engine's configuration: no hooks.d file, no
  drop-in (`gpuctk runtime configure` writes those, on the admin's command).

Only the standard library is used here, so any python3 runs it. pip needs PyPI (or a pip cache /
PIP_INDEX_URL mirror). Set GPUCTK_DEB_CACHE to a folder to reuse the dependency venv between
builds (keyed on the dependency list and interpreter): the tests do, under tests/.cache.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PACKAGING = HERE.parent
REPO = PACKAGING.parent
PREFIX = "/opt/gpuctk"
MULTIARCH = {"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}
UNITS = ("gpuctk-cdi-refresh.service", "gpuctk-cdi-refresh.path", "gpuctk-cdi-refresh.timer")
# shipped, never enabled or started by the package: the admin's `systemctl enable --now`
OPTIONAL_UNITS = ("gpuctk-device-plugin.service",)
# the extras the venv holds: `device-plugin` (grpcio) lets the optional unit run
EXTRAS = ("device-plugin",)
# NVIDIA's packages that do what gpuctk does (runtime, spec refresh unit): Conflicts + Replaces
NVIDIA_PACKAGES = "nvidia-container-toolkit, nvidia-container-toolkit-base"
UDEV_RULES = ("71-gpuctk.rules", "71-gpuctk-dev-char.rules")
MANPAGES = HERE / "manpages.py"  # a page per command, from the click tree (run in the venv)


def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"build.py: {' '.join(argv)} failed (exit {proc.returncode})")
    return proc  # type: ignore[no-any-return]


def _pyproject() -> dict[str, Any]:
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def project() -> dict[str, object]:
    data: dict[str, object] = _pyproject()["project"]
    return data


def sources() -> list[str]:
    """What a wheel is built from: pyproject.toml, setup.py (it compiles gpuctk-cdi-hook with
    hook/cbuild.py, the one recipe, and stops the build where it cannot), the
    readme pyproject names, and every package's folder from its [tool.setuptools] package-dir
    (the one map of package to folder)."""
    data = _pyproject()
    folders: dict[str, str] = data["tool"]["setuptools"]["package-dir"]
    readme = str(data["project"]["readme"])
    return ["pyproject.toml", "setup.py", readme, *dict.fromkeys(folders.values())]


def source_copy(dest: Path) -> Path:
    """The files a wheel needs, copied (no build/ or egg-info lands in the shared checkout).
    A gpuctk-cdi-hook found in the checkout is left out: the wheel's build compiles its own
    from hook/cdihook.c, so the package never ships a binary of other sources."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "gpuctk-cdi-hook")
    dest.mkdir(parents=True)
    for name in sources():
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            shutil.copy2(src, dest / name)
    return dest


def dependencies() -> list[str]:
    """What the venv installs from PyPI: the dependencies and those of EXTRAS."""
    meta = project()
    extras: dict[str, list[str]] = meta["optional-dependencies"]  # type: ignore[assignment]
    deps: list[str] = list(meta["dependencies"])  # type: ignore[call-overload]
    for extra in EXTRAS:
        deps += [d for d in extras[extra] if d not in deps]
    return deps


def _deps_key(python: str) -> str:
    version = run([python, "-c", "import sys; print(sys.version)"]).stdout
    deps = json.dumps(dependencies())
    return hashlib.sha256(f"{python}\n{version}\n{deps}".encode()).hexdigest()[:16]


def _make_venv(dest: Path, python: str) -> None:
    run([python, "-m", "venv", str(dest)])
    pip = [
        str(dest / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
    ]
    run([*pip, *dependencies()])


def build_venv(dest: Path, python: str = "/usr/bin/python3") -> Path:
    """A venv at `dest` with gpuctk (not editable) and its dependencies, made relocatable.

    Relocatable the way a venv can be: nothing in it names `dest` (pip and its scripts, which
    do, are removed; pyvenv.cfg keeps only `home`, the interpreter's folder), so it may be
    copied to /opt/gpuctk or /usr/local/gpuctk on any machine with the same interpreter.
    """
    dest = dest.absolute()
    cache = os.environ.get("GPUCTK_DEB_CACHE")
    if cache:
        cached = Path(cache) / f"deps-venv-{_deps_key(python)}"
        if not cached.is_dir():
            Path(cache).mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".deps-venv-", dir=cache))
            _make_venv(tmp / "v", python)
            with contextlib.suppress(OSError):  # another build made it meanwhile: use theirs
                os.rename(tmp / "v", cached)
            shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(cached, dest, symlinks=True)
    else:
        _make_venv(dest, python)
    py = str(dest / "bin" / "python")
    with tempfile.TemporaryDirectory(prefix="gpuctk-src-") as tmp:
        src = source_copy(Path(tmp) / "src")
        run(
            [
                py,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--no-compile",
                "--disable-pip-version-check",
                "--force-reinstall",
                str(src),
            ],
            cwd=tmp,
        )
    _strip(dest)
    return dest


def _strip(venv: Path) -> None:
    site = next((venv / "lib").glob("python3*/site-packages"))
    for pattern in (
        "pip",
        "pip-*",
        "setuptools",
        "setuptools-*",
        "_distutils_hack",
        "distutils-precedence.pth",
        "pkg_resources",
    ):
        for p in site.glob(pattern):
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    for p in (venv / "bin").iterdir():
        if not p.name.startswith("python"):
            p.unlink()  # activate scripts and console scripts name the build folder
    link = venv / "bin" / "python3"
    if link.is_symlink() and os.path.isabs(os.readlink(link)):
        # /usr/bin/python3 belongs to Debian's python3 package; the versioned file to
        # python3.11, which is what the control file depends on (and what site-packages needs)
        real = os.path.realpath(link)
        link.unlink()
        link.symlink_to(real)
    cfg = venv / "pyvenv.cfg"
    kept = [
        line
        for line in cfg.read_text().splitlines()
        if line.split("=")[0].strip() in ("home", "include-system-site-packages", "version")
    ]
    cfg.write_text("\n".join(kept) + "\n")
    for p in venv.rglob("__pycache__"):
        shutil.rmtree(p)
    # A pyc records its source's mtime; dpkg keeps mtimes, so these stay valid once installed.
    run(
        [
            str(venv / "bin" / "python"),
            "-I",
            "-m",
            "compileall",
            "-q",
            "-j",
            "0",
            str(next((venv / "lib").glob("python3*"))),
        ]
    )


def deb_arch() -> str:
    try:
        return run(["dpkg", "--print-architecture"]).stdout.strip()
    except (OSError, SystemExit):
        return {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)


def _render(name: str, arch: str) -> str:
    text = (HERE / name).read_text()
    return text.replace("@MULTIARCH@", MULTIARCH.get(arch, f"{os.uname().machine}-linux-gnu"))


def _put(root: Path, path: str, data: str | bytes, mode: int = 0o644) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data.encode() if isinstance(data, str) else data)
    target.chmod(mode)


def static_files(arch: str) -> dict[str, str]:
    """The package's files taken from the checkout (installed path -> text): the config, the
    refresh units and the device plugin's (disabled), the udev rules, the docs. No engine's
    configuration: no hooks.d file (a hooks.d hook runs for every podman and CRI-O container
    its `when` matches; it is written only by `gpuctk runtime configure --runtime podman|crio
    --mode hook`), no drop-in."""
    # the one text of the defaults, also `gpuctk config default` (keys commented out here)
    files = {"/etc/gpuctk/config.toml": (REPO / "hook" / "config.toml").read_text()}
    for unit in (*UNITS, *OPTIONAL_UNITS):
        files[f"/usr/lib/systemd/system/{unit}"] = _render(unit, arch)
    for rule in UDEV_RULES:
        files[f"/usr/lib/udev/rules.d/{rule}"] = _render(rule, arch)
    files["/usr/share/doc/gpuctk/README.md"] = (REPO / "README.md").read_text()
    for doc in sorted((REPO / "docs").glob("*.md")):  # what each --help's Details line names
        files[f"/usr/share/doc/gpuctk/{doc.name}"] = doc.read_text()
    files["/usr/share/doc/gpuctk/copyright"] = (HERE / "copyright").read_text()
    return files


def control(version: str, arch: str, size_kib: int, python: str) -> str:
    pyver = run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]).stdout
    meta = project()
    return (
        "Package: gpuctk\n"
        f"Version: {version}\n"
        f"Architecture: {arch}\n"
        "Maintainer: gpuctk maintainers <gpuctk@localhost>\n"
        f"Installed-Size: {size_kib}\n"
        f"Depends: python{pyver.strip()}, libc6\n"
        "Recommends: runc | crun\n"
        "Suggests: containerd, podman\n"
        # Both write /var/run/cdi/nvidia.yaml (nvidia-cdi-refresh.service is in -base) and
        # register an `nvidia` runtime: never both. Replaces lets `dpkg -i` remove them.
        f"Conflicts: {NVIDIA_PACKAGES}\n"
        f"Replaces: {NVIDIA_PACKAGES}\n"
        "Section: admin\n"
        "Priority: optional\n"
        "Homepage: https://example.invalid/gpuctk\n"
        f"Description: {meta['description']}\n"
        " gpuctk generates CDI specs for NVIDIA GPUs (gpuctk cdi generate), ships a runc\n"
        " shim (gpuctk-runtime) and an OCI hook (gpuctk-hook), and registers them with\n"
        " containerd, CRI-O, Docker and podman (gpuctk runtime configure). A systemd unit\n"
        " regenerates /var/run/cdi/nvidia.yaml at boot, when the driver changes and each\n"
        " minute (MIG re-partitions); udev links the NVIDIA nodes in /dev/char.\n"
        " gpuctk-device-plugin.service (not enabled) advertises the GPUs to the kubelet.\n"
    )


def build_deb(out_dir: Path, python: str) -> Path:
    version = str(project()["version"])
    arch = deb_arch()
    with tempfile.TemporaryDirectory(prefix="gpuctk-deb-") as tmp:
        root = Path(tmp) / "root"
        build_venv(root / PREFIX.lstrip("/"), python)
        venv_py = root / PREFIX.lstrip("/") / "bin" / "python3"
        bindir = root / "usr" / "bin"
        bindir.mkdir(parents=True)
        run(
            [
                str(venv_py),
                "-I",
                "-m",
                "gpuctk.install.launchers",
                str(bindir),
                "--python",
                f"{PREFIX}/bin/python3",
                "--installed-in",
                "/usr/bin",
            ]
        )
        for path, text in static_files(arch).items():
            _put(root, path, text)
        mandir = root / "usr" / "share" / "man" / "man1"
        env = {"PATH": "/usr/bin:/bin"}
        run([str(venv_py), "-I", str(MANPAGES), str(mandir), version], env=env)
        debian = root / "DEBIAN"
        debian.mkdir()
        for script in ("postinst", "prerm", "postrm"):
            _put(root, f"/DEBIAN/{script}", (HERE / script).read_text(), 0o755)
        _put(root, "/DEBIAN/conffiles", "/etc/gpuctk/config.toml\n")
        size = sum(p.lstat().st_size for p in root.rglob("*") if not p.is_dir()) // 1024
        _put(root, "/DEBIAN/control", control(version, arch, size, python))
        for p in root.rglob("*"):  # root:root, no group/other write, whatever the umask was
            if p.is_dir() and not p.is_symlink():
                p.chmod(0o755)
        out_dir.mkdir(parents=True, exist_ok=True)
        deb = out_dir / f"gpuctk_{version}_{arch}.deb"
        run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)])
    return deb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="?", choices=("deb", "venv"), default="deb")
    parser.add_argument("dest", nargs="?", help="venv: the folder to create")
    parser.add_argument("--out-dir", default=str(REPO / "dist"), help="deb: where to write it")
    parser.add_argument(
        "--python",
        default="/usr/bin/python3",
        help="interpreter the venv is made with (and the package depends on)",
    )
    args = parser.parse_args(argv)
    if not re.fullmatch(r"/\S+", args.python) or not os.access(args.python, os.X_OK):
        parser.error(f"--python {args.python}: not an executable absolute path")
    if args.what == "venv":
        if not args.dest:
            parser.error("venv needs a destination folder")
        print(build_venv(Path(args.dest), args.python))
    else:
        print(build_deb(Path(args.out_dir), args.python))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
