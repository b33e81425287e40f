"""NVIDIA's CDI spec of a bench's simulated node, written by NVIDIA's own `nvidia-ctk`.

The benches compare gpuctk's specs with the NVIDIA Container Toolkit's, side by side. They take
NVIDIA's binaries (`nvidia-ctk`, `nvidia-cdi-hook`) from a folder the person running them names
(`--nvidia-ctk-bin DIR`): this repository neither carries nor builds them.

`nvidia_spec()` runs that `nvidia-ctk cdi generate` over the bench's simulated node: the Debian
535 driver root, the mknod'ed device nodes of a profile, and the tests' fake libnvidia-ml.so.1
serving that profile through go-nvml. nvidia-ctk loads the libnvidia-ml.so.1 it finds in the
driver root and reads DRM nodes from the host's /sys/bus/pci/devices, so it runs in a private
mount namespace with the fake bind-mounted over the driver root's libnvidia-ml and the simulated
sysfs over /sys: the spec it writes names the real driver root's files, as on a node.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from common import CACHE
from fixtures.fake_nvml import build_fake_nvml, write_fake_profile

COMMANDS = ("nvidia-ctk", "nvidia-cdi-hook")


def check_bin(bindir: Path) -> Path:
    """`bindir` when it holds runnable nvidia-ctk and nvidia-cdi-hook; SystemExit saying what
    is missing otherwise."""
    bindir = bindir.resolve()
    missing = [c for c in COMMANDS if not os.access(bindir / c, os.X_OK)]
    if missing:
        raise SystemExit(
            f"--nvidia-ctk-bin {bindir}: no runnable {' or '.join(missing)} there (name the folder "
            "of an NVIDIA Container Toolkit build or install, e.g. /usr/bin)"
        )
    return bindir


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


RUNTIME = "nvidia-container-runtime"


def nvidia_runtime(
    bindir: Path, spec_dir: Path, runc: str, work: Path
) -> tuple[list[str], dict[str, str]] | None:
    """The argv that runs NVIDIA's nvidia-container-runtime of `bindir` in its CDI mode (the
    one that serves a node's CDI spec: `NVIDIA_VISIBLE_DEVICES=0` becomes nvidia.com/gpu=0),
    over the specs in `spec_dir`, exec'ing `runc`: (argv, the environment entries that name its
    config.toml, written into `work`). None when `bindir` has no such runtime."""
    exe = bindir.resolve() / RUNTIME
    if not os.access(exe, os.X_OK):
        return None
    conf = work / "nvidia-container-runtime.toml"
    conf.write_text(
        "[nvidia-container-runtime]\n"
        'mode = "cdi"\n'
        f'runtimes = ["{runc}"]\n'
        'log-level = "info"\n'
        "[nvidia-container-runtime.modes.cdi]\n"
        f'spec-dirs = ["{spec_dir}"]\n'
        'default-kind = "nvidia.com/gpu"\n'
        "[nvidia-ctk]\n"
        f'path = "{bindir.resolve() / "nvidia-ctk"}"\n'
    )
    return [str(exe)], {"NVIDIA_CTK_CONFIG_FILE_PATH": str(conf)}


def nvidia_node_runtime(
    bindir: Path, driver_root: Path, profile: str, runc: str, work: Path
) -> tuple[list[str], dict[str, str]]:
    """nvidia_runtime() on nvidia-ctk's spec of `profile` (a shipped name or a YAML path) over
    `driver_root` and node roots of its own under `work` (with udev's by-path links, which
    nvidia-ctk names); SystemExit when `bindir` has no nvidia-container-runtime."""
    from fixtures.devroot import make_node_roots

    from gpuctk.cdi.node.profile import load_profile

    roots = make_node_roots(work / "nvidia-node", load_profile(profile))
    add_by_path_links(roots.dev_root, roots.sys_root)
    (work / "nvidia-cdi").mkdir(parents=True)
    out = work / "nvidia-cdi" / "nvidia.json"
    nvidia_spec(bindir, driver_root, roots.dev_root, roots.sys_root, profile, out)
    made = nvidia_runtime(bindir, out.parent, runc, work)
    if made is None:
        raise SystemExit(f"--nvidia-ctk-bin {bindir}: no runnable {RUNTIME} there")
    return made
