"""nvidia-ctk's spellings (gpuctk.cdi.nvctk, gpuctk.cdi.system_nodes): each accepted one gives
what gpuctk's own flag gives; each refused one exits 2 with one line naming gpuctk's answer."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpuctk.cdi import nvctk
from gpuctk.cdi.node import devchar_all
from gpuctk.errors import InputError

GPUCTK = str(Path(sys.executable).with_name("gpuctk"))
HOOK = "/opt/gpuctk/bin/gpuctk-hook"
SIM = ["--simulate", "l4"]


def gpuctk(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NVIDIA_", "DRY_RUN"))}
    return subprocess.run(
        [GPUCTK, *args], capture_output=True, text=True, env={**clean, **env}, timeout=60
    )


def generate(*args: str, **env: str) -> str:
    done = gpuctk("cdi", "generate", *SIM, *args, **env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def refused(done: subprocess.CompletedProcess[str], *words: str) -> str:
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 2 and lines[0].startswith("gpuctk: error: "), done.stderr
    assert lines[1].startswith("Try 'gpuctk "), done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


SAME = [
    (["--hook-path", HOOK], ["--nvidia-cdi-hook-path", HOOK], {}),
    (["--hook-path", HOOK], ["--nvidia-ctk-path", HOOK], {}),
    (["--hook-path", HOOK], [], {"NVIDIA_CTK_CDI_HOOK_PATH": HOOK}),
    (["--hook-path", HOOK], ["--hook-path", HOOK], {"NVIDIA_CTK_CDI_HOOK_PATH": "/x/gpuctk-hook"}),
    (["--class", "tpu"], ["--cdi-class", "tpu"], {}),
    (["--class", "tpu"], [], {"NVIDIA_CTK_CDI_GENERATE_CLASS": "tpu"}),
    (["--vendor", "example.com"], ["--cdi-vendor", "example.com"], {}),
    (["--vendor", "example.com"], [], {"NVIDIA_CTK_CDI_GENERATE_VENDOR": "example.com"}),
    (["--device-id", "0"], ["--device-ids", "0"], {}),
    (["--device-id", "0"], ["--device", "0"], {}),
    (["--device-id", "0"], ["--devices", "0"], {}),
    (["--device-id", "0"], [], {"NVIDIA_CTK_CDI_GENERATE_DEVICE_IDS": "0"}),
    ([], ["--device-id", "all"], {}),
    (["--mode", "nvml"], ["--mode", "auto"], {}),
    (["--mode", "nvml"], ["--discovery-mode", "auto"], {}),
    (["--mode", "management"], [], {"NVIDIA_CTK_CDI_GENERATE_MODE": "management"}),
    (
        ["--disable-hook", "enable-cuda-compat", "--disable-hook", "update-ldcache"],
        ["--disable-hooks", "enable-cuda-compat,update-ldcache"],
        {},
    ),
    (
        ["--disable-hook", "update-ldcache"],
        [],
        {"NVIDIA_CTK_CDI_GENERATE_DISABLED_HOOKS": "update-ldcache"},
    ),
    ([], ["--disable-hook", "chmod"], {}),
    (
        [
            "--disable-hook",
            "create-symlinks",
            "--disable-hook",
            "enable-cuda-compat",
            "--disable-hook",
            "disable-device-node-modification",
        ],
        ["--disable-hook", "all", "--enable-hook", "update-ldcache"],
        {},
    ),
    (
        ["--device-name-strategy", "uuid"],
        [],
        {"NVIDIA_CTK_CDI_GENERATE_DEVICE_NAME_STRATEGIES": "uuid"},
    ),
    (
        ["--device-name-strategy", "index", "--device-name-strategy", "type-index"],
        [],
        {"NVIDIA_CTK_CDI_GENERATE_DEVICE_NAME_STRATEGIES": "index,type-index"},
    ),
    (["--no-all-device"], [], {"NVIDIA_CTK_CDI_GENERATE_NO_ALL_DEVICE": "true"}),
    (["--format", "json"], [], {"NVIDIA_CTK_CDI_GENERATE_OUTPUT_FORMAT": "json"}),
]


@pytest.mark.parametrize(("own", "theirs", "env"), SAME)
def test_an_accepted_spelling_gives_the_same_spec(
    own: list[str], theirs: list[str], env: dict[str, str]
) -> None:
    assert generate(*theirs, **env) == generate(*own)


def test_the_output_variable_writes_the_same_file(tmp_path: Path) -> None:
    own, theirs = tmp_path / "own.yaml", tmp_path / "theirs.yaml"
    generate("--output", str(own))
    assert generate(NVIDIA_CTK_CDI_OUTPUT_FILE_PATH=str(theirs)) == ""
    assert theirs.read_bytes() == own.read_bytes()


def test_the_roots_variables_are_read() -> None:
    missing = "/nonexistent-dev-root"
    own = gpuctk("cdi", "generate", *SIM, "--dev-root", missing)
    theirs = gpuctk("cdi", "generate", *SIM, NVIDIA_CTK_DEV_ROOT=missing)
    assert own.returncode != 0 and missing in own.stderr
    assert (theirs.returncode, theirs.stderr) == (own.returncode, own.stderr)
    own = gpuctk("cdi", "generate", *SIM, "--driver-root", missing)
    theirs = gpuctk("cdi", "generate", *SIM, NVIDIA_CTK_DRIVER_ROOT=missing)
    assert (theirs.returncode, theirs.stderr) == (own.returncode, own.stderr)


def test_a_disabled_hook_gpuctk_never_writes_is_a_note() -> None:
    done = gpuctk("cdi", "generate", *SIM, "--disable-hooks", "chmod")
    assert done.returncode == 0
    assert "no chmod hook: nothing to disable" in done.stderr


@pytest.mark.parametrize(
    ("args", "env"),
    [(["--ldconfig-path", "/usr/sbin/ldconfig"], {}),
     (["--ldconfig-path", "@/usr/sbin/ldconfig"], {}),
     ([], {"NVIDIA_CTK_CDI_GENERATE_LDCONFIG_PATH": "@/usr/sbin/ldconfig"})],
)  # fmt: skip
def test_ldconfig_path_goes_to_the_hook(args: list[str], env: dict[str, str]) -> None:
    spec = generate("--library-mode", "hook", "--format", "json", *args, **env)
    assert '"--ldconfig-path",\n' in spec and '"/usr/sbin/ldconfig"' in spec
    assert "--ldconfig-path" not in generate("--library-mode", "hook")
    off = generate("--library-mode", "hook", "--disable-hook", "update-ldcache", *args, **env)
    assert "--ldconfig-path" not in off


def test_ldconfig_path_is_refused_where_it_cannot_mean_the_same() -> None:
    mounts = gpuctk("cdi", "generate", *SIM, "--library-mode", "mounts", "--ldconfig-path", "/l")
    refused(mounts, "--ldconfig-path", "--library-mode hook or folder")
    refused(gpuctk("cdi", "generate", *SIM, "--ldconfig-path", "ldconfig"), "absolute")


@pytest.mark.parametrize("flag", [*nvctk.GENERATE_REFUSED, "--feature-flags"])
def test_a_refused_flag_names_gpuctk_s_answer(flag: str) -> None:
    name = flag.removesuffix("s")  # --feature-flags: nvidia-ctk's other name of --feature-flag
    env, answer = nvctk.GENERATE_REFUSED[name if name == "--feature-flag" else flag]
    refused(gpuctk("cdi", "generate", *SIM, flag, "x"), name, "nvidia-ctk's", answer)
    refused(gpuctk("cdi", "generate", *SIM, **{env: "x"}), env, answer)


@pytest.mark.parametrize("mode", sorted(nvctk.REFUSED_MODES))
def test_a_mode_gpuctk_lacks_is_refused(mode: str) -> None:
    answer = nvctk.REFUSED_MODES[mode]
    refused(gpuctk("cdi", "generate", *SIM, "--mode", mode), "--mode", answer)
    refused(gpuctk("cdi", "generate", *SIM, NVIDIA_CTK_CDI_GENERATE_MODE=mode), answer)


@pytest.mark.parametrize(
    ("args", "env", "words"),
    [
        (["--nvidia-cdi-hook-path", "/usr/bin/nvidia-cdi-hook"], {}, "NVIDIA's hook"),
        ([], {"NVIDIA_CTK_CDI_HOOK_PATH": "/usr/local/nvidia/toolkit/nvidia-ctk"}, "--hook-path"),
        (["--hook-path", "/a/gpuctk-hook", "--nvidia-cdi-hook-path", "/b/gpuctk-hook"], {},
         "different values"),
        (["--enable-hook", "update-application-profil"], {}, "unknown name"),
        (["--device-name-strategy", "uuid"], {}, ""),  # control: accepted
    ],
)  # fmt: skip
def test_refused_values(args: list[str], env: dict[str, str], words: str) -> None:
    done = gpuctk("cdi", "generate", *SIM, *args, **env)
    if words:
        refused(done, words)
    else:
        assert done.returncode == 0, done.stderr


def test_help_stays_gpuctk_s() -> None:
    text = gpuctk("cdi", "generate", "--help").stdout
    for word in ("nvidia-cdi-hook", "cdi-class", "ldconfig", "csv", "discovery", "auto|"):
        assert word not in text


# system create-device-nodes, create-dev-char-symlinks


@pytest.fixture
def node_root(tmp_path: Path) -> tuple[Path, Path]:
    proc, root = tmp_path / "proc", tmp_path / "root"
    proc.mkdir()
    (root / "dev").mkdir(parents=True)
    (proc / "devices").write_text(
        "Character devices:\n  1 mem\n195 nvidia-frontend\n508 nvidia-uvm\n\n"
        "Block devices:\n  8 sd\n"
    )
    return proc, root


def _nodes(dev: Path) -> dict[str, tuple[int, int, int]]:
    out = {}
    for p in dev.iterdir():
        st = p.lstat()
        assert stat.S_ISCHR(st.st_mode)
        out[p.name] = (os.major(st.st_rdev), os.minor(st.st_rdev), stat.S_IMODE(st.st_mode))
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs CAP_MKNOD")
def test_create_device_nodes_makes_the_control_nodes_once(node_root: tuple[Path, Path]) -> None:
    proc, root = node_root
    args = ["system", "create-device-nodes", "--control-devices", "--proc-root", str(proc)]
    done = gpuctk(*args, "--dev-root", str(root))
    assert done.returncode == 0, done.stderr
    assert _nodes(root / "dev") == {
        "nvidiactl": (195, 255, 0o666),
        "nvidia-modeset": (195, 254, 0o666),
        "nvidia-uvm": (508, 0, 0o666),
        "nvidia-uvm-tools": (508, 1, 0o666),
    }
    (root / "dev/nvidiactl").chmod(0o600)  # an admin's choice: kept
    again = gpuctk(*args, DEV_ROOT=str(root))
    assert again.returncode == 0 and again.stdout == "", again.stderr
    assert "0 made, 4 there already" in again.stderr
    assert _nodes(root / "dev")["nvidiactl"] == (195, 255, 0o600)


def test_create_device_nodes_dry_run_and_roots(node_root: tuple[Path, Path]) -> None:
    proc, root = node_root
    done = gpuctk("system", "create-device-nodes", "--control-devices", "--load-kernel-modules",
                  "--dry-run", "--driver-root", str(root), "--proc-root", str(proc))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:3] == [
        f"would run chroot {root} /sbin/modprobe {m}" for m in devchar_all.MODULES
    ]
    assert f"would make node {root}/dev/nvidia-uvm c 508:0 0666 0:0" in done.stdout
    assert list((root / "dev").iterdir()) == []
    nothing = gpuctk("system", "create-device-nodes")
    assert nothing.returncode == 0 and "nothing asked" in nothing.stderr


def test_create_device_nodes_without_the_driver(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    done = gpuctk("system", "create-device-nodes", "--control-devices", "--dev-root",
                  str(tmp_path), "--proc-root", str(tmp_path))  # fmt: skip
    assert done.returncode != 0 and "--control-devices:" in done.stderr


def test_load_modules_runs_modprobe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log, fake = tmp_path / "log", tmp_path / "modprobe"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\n[ "$1" != nvidia-modeset ] || exit 3\n')
    fake.chmod(0o755)
    monkeypatch.setattr(devchar_all, "MODPROBE", str(fake))
    with pytest.raises(InputError, match="modprobe nvidia-modeset failed: exit status 3"):
        devchar_all.load_modules("/")
    assert log.read_text().split() == list(devchar_all.MODULES)
    assert devchar_all.modprobe_commands("/r")[0] == ["chroot", "/r", str(fake), "nvidia"]


@pytest.mark.parametrize(("args", "env"), [(["--watch"], {}), ([], {"WATCH": "true"})])
def test_dev_char_watch_is_refused(args: list[str], env: dict[str, str]) -> None:
    done = gpuctk("system", "create-dev-char-symlinks", *args, **env)
    refused(done, "--watch", "udev rule")


def test_dev_char_module_flags_need_create_all(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    done = gpuctk("system", "create-dev-char-symlinks", "--load-kernel-modules",
                  "--create-device-nodes", "--driver-root", str(tmp_path), "--dev-char-path",
                  str(tmp_path / "char"), "--dry-run")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "--load-kernel-modules applies with --create-all only: ignored" in done.stderr
    assert "--create-device-nodes applies with --create-all only: ignored" in done.stderr


@pytest.mark.parametrize(
    ("args", "env"),
    [(["--quiet"], {}), ([], {"NVIDIA_CTK_QUIET": "true"}), (["--quiet", "-d"], {})],
)  # fmt: skip
def test_quiet_leaves_only_errors(args: list[str], env: dict[str, str]) -> None:
    loud = gpuctk("cdi", "generate", *SIM, "--disable-hooks", "chmod")
    done = gpuctk(*args, "cdi", "generate", *SIM, "--disable-hooks", "chmod", **env)
    assert loud.stderr and "nothing to disable" in loud.stderr
    assert (done.returncode, done.stderr, done.stdout) == (0, "", loud.stdout)
    failed = gpuctk(*args, "cdi", "generate", "--driver-root", "/nonexistent", **env)
    assert failed.returncode != 0 and failed.stderr.startswith("gpuctk: error: ")


@pytest.mark.parametrize(("args", "env"), [(["-d"], {}), ([], {"NVIDIA_CTK_DEBUG": "1"})])
def test_the_debug_spellings_give_tracebacks(args: list[str], env: dict[str, str]) -> None:
    # a failed write shows its traceback only with debug
    plain = gpuctk("cdi", "generate", *SIM, "--output", "/proc/version")
    debug = gpuctk(*args, "cdi", "generate", *SIM, "--output", "/proc/version", **env)
    assert plain.returncode == debug.returncode != 0
    assert "Traceback" not in plain.stderr and "Traceback" in debug.stderr, debug.stderr


def test_the_root_config_flag_names_gpuctk_s_file(tmp_path: Path) -> None:
    own = tmp_path / "config.toml"
    own.write_text('log-level = "debug"\n')
    done = gpuctk("--config", str(own), "config", "show", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert '"log-level": "debug"' in done.stdout.replace("\n", " ").replace("  ", " ")
    theirs = tmp_path / "nvidia.toml"
    theirs.write_text('[nvidia-container-runtime]\nlog-level = "info"\n')
    done = gpuctk("--config", str(theirs), "config", "show")
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.strip() == (
        f"gpuctk: error: {theirs} is nvidia-ctk's config; carry it over with: "
        f"gpuctk migrate --from {theirs}"
    )


def test_the_version_and_hook_spellings() -> None:
    assert gpuctk("-v").stdout == gpuctk("--version").stdout == "gpuctk version 0.1.0\n"
    done = gpuctk("hook", "update-ldcache", "--folder", "/usr/lib64")
    line = refused(done, "`hook update-ldcache --folder /usr/lib64`", "gpuctk cdi generate")
    assert "gpuctk-cdi-hook" in line


def test_cdi_list_and_transform_spellings(tmp_path: Path) -> None:
    spec = tmp_path / "specs" / "nvidia.yaml"
    spec.parent.mkdir()
    spec.write_text(generate())
    own = gpuctk("cdi", "list", "--spec-dir", str(spec.parent))
    theirs = gpuctk("cdi", "list", NVIDIA_CTK_CDI_SPEC_DIRS=str(spec.parent))
    assert own.returncode == theirs.returncode == 0 and "nvidia.com/gpu=all" in own.stdout
    assert theirs.stdout == own.stdout
    moved = ("cdi", "transform", "root", "--from", "/", "--to", "/host")
    own = gpuctk(*moved, str(spec))
    theirs = gpuctk(*moved, "--input", str(spec))
    assert own.returncode == theirs.returncode == 0 and theirs.stdout == own.stdout
    refused(gpuctk(*moved, "--input", str(spec), "/other.yaml"), "--input", "give one")
