"""Switching from nvidia-ctk: NVIDIA's `conf.d/99-nvidia.toml` and gpuctk's drop-in, against
the real containerd's `config dump` (1.6 here, 2.1 from Debian sid).

`nvidia-ctk runtime configure --runtime containerd --drop-in-config` imports
`/etc/containerd/conf.d/*.toml` from the main config and writes `99-nvidia.toml`, which sets
the `nvidia` handler to /usr/bin/nvidia-container-runtime (as a version 2 file for containerd
1.x, version 3 for 2.x, its CRI table holding only that handler). It sorts after
`99-gpuctk.toml`, so containerd lets it win. configure must never report success while it
does: it refuses with one line naming the file and `--take-over`; `--take-over` renames it to
`99-nvidia.toml.gpuctk-disabled` so that the merged config runs gpuctk-runtime (with the main
config's own runc settings back); unconfigure restores it, byte for byte.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest
from fixtures.containerd import SHIM, dump, gpuctk, have_containerd, runtimes
from fixtures.sidengines import require

pytestmark = pytest.mark.integration

CRI2 = "io.containerd.grpc.v1.cri"
CRI3 = "io.containerd.cri.v1.runtime"
NVIDIA_RUNTIME = "/usr/bin/nvidia-container-runtime"

# NVIDIA's drop-in as nvidia-ctk lays it out: only the handler, copied from runc's options
NVIDIA_DROP_IN = """\
version = {version}

[plugins]

  [plugins."{plugin}"]

    [plugins."{plugin}".containerd]

      [plugins."{plugin}".containerd.runtimes]

        [plugins."{plugin}".containerd.runtimes.nvidia]
          privileged_without_host_devices = false
          runtime_engine = ""
          runtime_root = ""
          runtime_type = "io.containerd.runc.v2"

          [plugins."{plugin}".containerd.runtimes.nvidia.options]
            BinaryName = "/usr/bin/nvidia-container-runtime"
            SystemdCgroup = true
"""

MAIN = """\
# the node's own config; nvidia-ctk added the imports line
version = {version}
imports = ["{conf_d}/*.toml"]

[plugins."{plugin}"]
{extra}
  [plugins."{plugin}".containerd]
    default_runtime_name = "runc"
    [plugins."{plugin}".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."{plugin}".containerd.runtimes.runc.options]
        SystemdCgroup = true
"""


def containerd1() -> str:
    if not have_containerd():
        pytest.skip("containerd is not installed")
    return shutil.which("containerd") or "containerd"


def containerd2() -> str:
    return str(require("containerd2") / "usr" / "bin" / "containerd")


@pytest.fixture(params=["containerd-1.6", "containerd-2.1"])
def node(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, object]:
    """A main config and NVIDIA's drop-in, for the real containerd of that major version."""
    v1 = request.param == "containerd-1.6"
    binary = containerd1() if v1 else containerd2()
    version, plugin = (2, CRI2) if v1 else (3, CRI3)
    extra = '  sandbox_image = "registry.example.com/pause:3.9"' if v1 else ""
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    main = tmp_path / "config.toml"
    main.write_text(MAIN.format(version=version, plugin=plugin, conf_d=conf_d, extra=extra))
    nvidia = conf_d / "99-nvidia.toml"
    nvidia.write_text(NVIDIA_DROP_IN.format(version=version, plugin=plugin))
    return {
        "binary": binary,
        "plugin": plugin,
        "main": main,
        "nvidia": nvidia,
        "argv": [
            "--config",
            str(main),
            "--drop-in",
            str(conf_d / "99-gpuctk.toml"),
            "--executable-path",
            binary,
        ],
        "v1": v1,
    }


def merged(node: dict[str, object]) -> dict[str, object]:
    binary, main, plugin = node["binary"], node["main"], node["plugin"]
    assert isinstance(binary, str) and isinstance(main, Path) and isinstance(plugin, str)
    return runtimes(dump(main, binary), plugin)


def args(node: dict[str, object]) -> list[str]:
    argv = node["argv"]
    assert isinstance(argv, list)
    return [str(a) for a in argv]


def binary_name(handlers: dict[str, object], name: str = "nvidia") -> object:
    table = handlers[name]
    assert isinstance(table, dict)
    return table["options"]["BinaryName"]


def test_configure_never_reports_success_while_nvidia_drop_in_wins(
    node: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    assert binary_name(merged(node)) == NVIDIA_RUNTIME  # nvidia-ctk's configuration
    nvidia = node["nvidia"]
    assert isinstance(nvidia, Path)
    before = nvidia.read_bytes()
    code, out, err = gpuctk(capsys, "runtime", "configure", *args(node))
    if code == 0:  # what gpuctk did before: success, and containerd still runs NVIDIA's
        assert binary_name(merged(node)) == SHIM, "configure succeeded but 99-nvidia.toml wins"
    assert code == 7, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gpuctk: error: {nvidia} "), err
    assert "--take-over" in lines[0] and "99-nvidia.toml.gpuctk-disabled" in lines[0]
    assert NVIDIA_RUNTIME in lines[0]
    assert out == "" and nvidia.read_bytes() == before
    assert not (nvidia.parent / "99-gpuctk.toml").exists()


def test_take_over_then_unconfigure_restores(
    node: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    main, nvidia = node["main"], node["nvidia"]
    assert isinstance(main, Path) and isinstance(nvidia, Path)
    main_before, nvidia_before = main.read_bytes(), nvidia.read_bytes()
    code, out, err = gpuctk(capsys, "runtime", "configure", *args(node), "--take-over")
    assert code == 0, err
    disabled = nvidia.with_name("99-nvidia.toml.gpuctk-disabled")
    assert f"removed {nvidia}" in out and f"wrote {disabled}" in out
    assert not nvidia.exists() and disabled.read_bytes() == nvidia_before
    handlers = merged(node)
    assert binary_name(handlers) == SHIM
    runc = handlers["runc"]
    assert isinstance(runc, dict) and runc["options"]["SystemdCgroup"] is True
    if node["v1"]:  # the main config's CRI settings are back (1.x: NVIDIA's table replaced them)
        binary = node["binary"]
        assert isinstance(binary, str)
        cri = dump(main, binary)["plugins"][CRI2]
        assert cri["sandbox_image"] == "registry.example.com/pause:3.9"
    # a re-run without the flag: nothing wins over the drop-in any more
    code, out, err = gpuctk(capsys, "runtime", "configure", *args(node))
    assert code == 0 and out.startswith("nothing to change"), err
    # unconfigure: NVIDIA's file back, byte for byte, and nvidia-ctk's configuration with it
    code, out, err = gpuctk(capsys, "runtime", "unconfigure", *args(node)[:4])
    assert code == 0, err
    assert nvidia.read_bytes() == nvidia_before and not disabled.exists()
    assert main.read_bytes() == main_before
    assert binary_name(merged(node)) == NVIDIA_RUNTIME


def test_a_rival_imported_by_name_is_refused_even_with_take_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    containerd1()
    nvidia = tmp_path / "nvidia.toml"
    nvidia.write_text(NVIDIA_DROP_IN.format(version=2, plugin=CRI2))
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    main = tmp_path / "config.toml"
    imports = [f"{conf_d}/*.toml", str(nvidia)]  # loaded after the drop-in the glob finds
    main.write_text(f"version = 2\nimports = {imports!r}\n".replace("'", '"'))
    drop_in = conf_d / "99-gpuctk.toml"
    argv = ["runtime", "configure", "--config", str(main), "--drop-in", str(drop_in)]
    code, _, err = gpuctk(capsys, *argv)
    assert code == 7 and f"{nvidia} also sets runtime handler 'nvidia'" in err, err
    code, _, err = gpuctk(capsys, *argv, "--take-over")
    assert code == 7, err
    assert f"{main} imports it by name" in err
    assert tomllib.loads(main.read_text())["imports"] == imports
    assert nvidia.exists() and not drop_in.exists()
