"""`gpuctk runtime configure/unconfigure` for CRI-O, Docker and podman, and `runtimeclass`."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures.containerd import SHIM, gpuctk, snapshot

CRIO_MAIN = """\
# crio.conf
[crio.runtime]
default_runtime = "crun"

[crio.runtime.runtimes.crun]
runtime_path = "/usr/bin/crun"
runtime_type = "oci"
runtime_root = "/run/crun"
monitor_path = "/usr/libexec/crio/conmon"
monitor_cgroup = "system.slice"
monitor_env = ["PATH=/usr/bin"]
allowed_annotations = ["io.containers.trace-syscall"]

[crio.runtime.runtimes.runc]
runtime_path = "/usr/bin/runc"
runtime_root = "/run/runc"
"""
CRIO_SITE_DROP_IN = """\
[crio.runtime.runtimes.crun]
monitor_cgroup = "pod"
"""


def crio(root: Path, verb: str, *extra: str) -> list[str]:
    argv = ["runtime", verb, "--runtime", "crio", "--config", str(root / "crio.conf")]
    argv += ["--drop-in", str(root / "crio.conf.d" / "99-gpuctk.conf")]
    if verb == "configure":
        argv += ["--config-source", "file"]
    return [*argv, *extra]


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(out.get(key), dict) else value
    return out


def test_crio_drop_in_copies_monitor_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "crio.conf").write_text(CRIO_MAIN)
    (tmp_path / "crio.conf.d").mkdir()
    (tmp_path / "crio.conf.d" / "10-site.conf").write_text(CRIO_SITE_DROP_IN)
    code, _, err = gpuctk(capsys, *crio(tmp_path, "configure", "--set-as-default"))
    assert code == 0, err
    assert "default runtime is 'crun'" in err
    drop_in = tomllib.loads((tmp_path / "crio.conf.d" / "99-gpuctk.conf").read_text())
    assert drop_in == {
        "crio": {
            "runtime": {
                "default_runtime": "nvidia",
                "runtimes": {
                    "nvidia": {
                        "runtime_path": SHIM,
                        "runtime_type": "oci",
                        "monitor_path": "/usr/libexec/crio/conmon",
                        "monitor_cgroup": "pod",  # the site drop-in's value
                        "monitor_env": ["PATH=/usr/bin"],
                        "allowed_annotations": ["io.containers.trace-syscall"],
                    }
                },
            }
        }
    }
    # CRI-O reads crio.conf, then crio.conf.d in name order, table by table.
    seen = tomllib.loads(CRIO_MAIN)
    for name in ("10-site.conf", "99-gpuctk.conf"):
        seen = merge(seen, tomllib.loads((tmp_path / "crio.conf.d" / name).read_text()))
    runtimes = seen["crio"]["runtime"]["runtimes"]
    assert set(runtimes) == {"crun", "runc", "nvidia"}
    assert runtimes["runc"] == tomllib.loads(CRIO_MAIN)["crio"]["runtime"]["runtimes"]["runc"]


def test_crio_idempotent_and_unconfigure_exact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "crio.conf").write_text(CRIO_MAIN)
    before = snapshot(tmp_path)
    assert gpuctk(capsys, *crio(tmp_path, "configure"))[0] == 0
    first = snapshot(tmp_path)
    assert "nothing to change" in gpuctk(capsys, *crio(tmp_path, "configure"))[1]
    assert snapshot(tmp_path) == first
    assert set(first) - set(before) == {"crio.conf.d", "crio.conf.d/99-gpuctk.conf"}
    assert gpuctk(capsys, *crio(tmp_path, "unconfigure"))[0] == 0
    assert snapshot(tmp_path) == before  # the folder it created too


def test_crio_command_source_leaves_our_drop_in_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "crio.conf.d").mkdir()
    (tmp_path / "crio.conf.d" / "10-site.conf").write_text(CRIO_SITE_DROP_IN)
    record = tmp_path / "record"
    fake = tmp_path / "crio"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$@" > {record}\n'
        'while [ $# -gt 0 ]; do [ "$1" = --config-dir ] && ls "$2" >> '
        + str(record)
        + "; shift; done\n"
        'printf \'[crio.runtime]\\ndefault_runtime = "runc"\\n'
        '[crio.runtime.runtimes.runc]\\nruntime_path = "/usr/bin/runc"\\n'
        'monitor_path = "/usr/bin/conmon"\\n\'\n'
    )
    fake.chmod(0o755)
    argv = crio(tmp_path, "configure")
    argv[argv.index("file")] = "command"
    assert gpuctk(capsys, *argv, "--executable-path", str(fake))[0] == 0
    assert gpuctk(capsys, *argv, "--executable-path", str(fake))[0] == 0  # ours exists now
    lines = record.read_text().splitlines()
    assert lines[0].endswith(" config") and "--config-dir" in lines[0]
    assert lines[1:] == ["10-site.conf"]  # 99-gpuctk.conf left out
    drop_in = tomllib.loads((tmp_path / "crio.conf.d" / "99-gpuctk.conf").read_text())
    handler = drop_in["crio"]["runtime"]["runtimes"]["nvidia"]
    assert handler == {
        "runtime_path": SHIM,
        "runtime_type": "oci",
        "monitor_path": "/usr/bin/conmon",
    }


def test_crio_hook_mode_writes_a_hooks_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--runtime crio --mode hook`: the hooks.d file (CDI annotations only), no handler; the
    same `unconfigure --mode hook` removes exactly it, a foreign file is never touched."""
    (tmp_path / "hooks.d").mkdir()
    hooks = tmp_path / "hooks.d" / "99-gpuctk.json"
    base = ["runtime", "configure", "--runtime", "crio", "--mode", "hook"]
    argv = [*base, "--config", str(tmp_path / "crio.conf"), "--drop-in", str(hooks)]
    code, _, err = gpuctk(capsys, *argv, "--hook-path", "/opt/gpuctk-hook")
    assert code == 0, err
    assert "hooks_dir" in err  # where CRI-O looks, said once
    doc = json.loads(hooks.read_text())
    assert doc["hook"]["args"] == ["gpuctk-hook", "prestart"]
    assert doc["when"] == {"annotations": {r"^cdi\.k8s\.io/": ".*"}}
    assert snapshot(tmp_path) == {"hooks.d": None, "hooks.d/99-gpuctk.json": hooks.read_bytes()}
    unconfigure = [
        "runtime", "unconfigure", "--runtime", "crio", "--mode", "hook",
        "--config", str(tmp_path / "crio.conf"), "--drop-in", str(hooks),
    ]  # fmt: skip
    assert gpuctk(capsys, *unconfigure)[0] == 0
    assert snapshot(tmp_path) == {"hooks.d": None}
    hooks.write_text('{"hook": {"path": "/x", "args": ["x"]}}')
    assert gpuctk(capsys, *argv)[0] == 5 and gpuctk(capsys, *unconfigure)[0] == 5
    assert hooks.read_text() == '{"hook": {"path": "/x", "args": ["x"]}}'


def test_crio_nvidia_ctk_s_oci_hook_spelling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """nvidia-ctk's `--config-mode oci-hook --oci-hook-path P` writes what gpuctk's
    `--mode hook --drop-in P` writes; a contradiction is a usage error that writes nothing."""
    (tmp_path / "hooks.d").mkdir()
    hooks = tmp_path / "hooks.d" / "99-gpuctk.json"
    conf = ["runtime", "configure", "--runtime", "crio", "--config", str(tmp_path / "crio.conf")]
    theirs = [*conf, "--config-mode", "oci-hook", "--oci-hook-path", str(hooks)]
    assert gpuctk(capsys, *theirs)[0] == 0
    written = hooks.read_bytes()
    hooks.unlink()
    assert gpuctk(capsys, *conf, "--mode", "hook", "--drop-in", str(hooks))[0] == 0
    assert hooks.read_bytes() == written
    hooks.unlink()
    code, _, err = gpuctk(capsys, *conf, "--config-mode", "toml", "--oci-hook-path", str(hooks))
    assert code == 2 and "--config-mode oci-hook" in err
    assert snapshot(tmp_path) == {"hooks.d": None}


def test_crio_hook_mode_default_path() -> None:
    from gpuctk.containerd import options

    opts = options.make("crio", mode="hook")
    assert opts.drop_in == "/usr/share/containers/oci/hooks.d/99-gpuctk.json"
    assert options.make("crio").drop_in == "/etc/crio/crio.conf.d/99-gpuctk.conf"


DAEMON_JSON = """{
  "log-driver": "json-file",
  "runtimes": {"sysbox": {"path": "/usr/bin/sysbox-runc"}},
  "features": {"buildkit": true}
}
"""


def docker(root: Path, verb: str, *extra: str) -> list[str]:
    return ["runtime", verb, "--runtime", "docker", "--config", str(root / "daemon.json"), *extra]


@pytest.mark.parametrize("start", [None, DAEMON_JSON, "{}\n"])
def test_docker_daemon_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], start: str | None
) -> None:
    path = tmp_path / "daemon.json"
    if start is not None:
        path.write_text(start)
    before = snapshot(tmp_path)
    flags = ("--set-as-default", "--cdi-enabled")
    assert gpuctk(capsys, *docker(tmp_path, "configure", *flags))[0] == 0
    data = json.loads(path.read_text())
    original = json.loads(start) if start else {}
    assert data["runtimes"]["nvidia"] == {"path": SHIM}
    assert data["default-runtime"] == "nvidia" and data["features"]["cdi"] is True
    for key, value in original.items():  # every other key kept
        if isinstance(value, dict):
            assert {k: data[key][k] for k in value} == value
        else:
            assert data[key] == value
    first = snapshot(tmp_path)
    assert "nothing to change" in gpuctk(capsys, *docker(tmp_path, "configure", *flags))[1]
    assert snapshot(tmp_path) == first
    assert gpuctk(capsys, *docker(tmp_path, "unconfigure"))[0] == 0
    assert snapshot(tmp_path) == before  # original bytes back, backup gone


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{bad json\n", "not valid JSON"),
        ("[]\n", "must be a JSON object"),
        ('{"runtimes": 1}', "`runtimes`"),
    ],
)
def test_docker_bad_daemon_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, match: str
) -> None:
    (tmp_path / "daemon.json").write_text(text)
    before = snapshot(tmp_path)
    code, _, err = gpuctk(capsys, *docker(tmp_path, "configure"))
    assert code == 7 and match in err and snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("extra", "match"),
    [(("--drop-in", "/x.json"), "no drop-in"), (("--mode", "hook"), "needs a runtime")],
)
def test_docker_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: tuple[str, ...], match: str
) -> None:
    code, _, err = gpuctk(capsys, *docker(tmp_path, "configure", *extra))
    assert code == 2 and match in err and snapshot(tmp_path) == {}


def test_podman_hooks_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hooks = tmp_path / "hooks.d" / "99-gpuctk.json"
    hooks.parent.mkdir()  # podman's own folder (one configure makes goes with unconfigure)
    argv = ["runtime", "configure", "--runtime", "podman", "--drop-in", str(hooks)]
    assert gpuctk(capsys, *argv, "--hook-path", "/opt/gpuctk-hook")[0] == 0
    assert json.loads(hooks.read_text()) == {
        "version": "1.0.0",
        "hook": {
            "path": "/opt/gpuctk-hook",
            "args": ["gpuctk-hook", "prestart"],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        },
        "when": {"annotations": {r"^cdi\.k8s\.io/": ".*"}},
        "stages": ["prestart"],
    }
    unconfigure = ["runtime", "unconfigure", "--runtime", "podman", "--drop-in", str(hooks)]
    assert gpuctk(capsys, *unconfigure)[0] == 0
    assert snapshot(tmp_path) == {"hooks.d": None}  # podman's own hooks folder stays
    (tmp_path / "other.json").write_text('{"hook": {"path": "/x", "args": ["x"]}}')
    other = ["--drop-in", str(tmp_path / "other.json")]
    assert gpuctk(capsys, *argv[:4], *other)[0] == 5
    assert gpuctk(capsys, *unconfigure[:4], *other)[0] == 5
    assert (tmp_path / "other.json").exists()


def test_runtimeclass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = gpuctk(capsys, "runtime", "runtimeclass")
    assert code == 0
    assert yaml.safe_load(out) == {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": "nvidia"},
        "handler": "nvidia",
    }
    argv = ["runtime", "runtimeclass", "--name", "gpu.example", "--handler", "gpuctk"]
    argv += [
        "--gpu-node-selector",
        "--node-selector",
        "pool=a100",
        "--output",
        str(tmp_path / "rc.yaml"),
    ]
    assert gpuctk(capsys, *argv)[0] == 0
    assert yaml.safe_load((tmp_path / "rc.yaml").read_text())["scheduling"] == {
        "nodeSelector": {"nvidia.com/gpu.present": "true", "pool": "a100"}
    }


@pytest.mark.parametrize(
    "extra", [("--handler", "Bad"), ("--name", "-x"), ("--node-selector", "novalue")]
)
def test_runtimeclass_bad_input(capsys: pytest.CaptureFixture[str], extra: tuple[str, ...]) -> None:
    assert gpuctk(capsys, "runtime", "runtimeclass", *extra)[0] == 2
