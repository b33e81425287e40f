"""The files packaging/deb ships, checked against the code that reads them.

- config.toml: parses as shipped (every key commented out: the defaults), and with every
  commented key uncommented gives exactly hook/config.py's DEFAULTS, with every key shown;
- the refresh units and the udev rule name the same service, the launcher and the spec path;
- the maintainer scripts are POSIX sh that `sh -n` accepts, and end in `exit 0` (only prerm
  exits 1, to refuse a removal whose engine unconfigure failed: tests/unit/test_deb_prerm.py);
- nothing the package starts stays resident: its units are the refresh oneshot and the path
  unit and timer that start it, the only ones postinst enables and starts, and the device
  plugin's service, shipped for the admin to enable and never enabled or started by a script;
- that service runs `gpuctk device-plugin` with the folder the command serves in as its one
  writable path, NVIDIA's device nodes allowed, after the kubelet, restarted on failure;
- the timer restarts the oneshot within a minute (MIG re-partitions), and the oneshot and a
  udev rule run `gpuctk system create-dev-char-symlinks`, which build.py ships and postinst
  runs when NVIDIA nodes exist.
"""

from __future__ import annotations

import configparser
import importlib.util
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpuctk.hook import config

DEB = Path(__file__).resolve().parents[2] / "packaging" / "deb"
SERVICE = "gpuctk-cdi-refresh.service"
TIMER = "gpuctk-cdi-refresh.timer"
DEV_CHAR_RULE = "71-gpuctk-dev-char.rules"
PLUGIN = "gpuctk-device-plugin.service"
LINKS = "/usr/bin/gpuctk system create-dev-char-symlinks"


def _build() -> Any:
    """packaging/deb/build.py as a module (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("deb_build", DEB / "build.py")
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return build


def test_shipped_config_is_the_defaults() -> None:
    text = _build().static_files("amd64")["/etc/gpuctk/config.toml"]
    assert config.parse(text, "config.toml").source == "config.toml"
    uncommented = re.sub(r"(?m)^#(?=[a-z-]+ = )", "", text)
    settings = config.parse(uncommented, "config.toml")
    keys = re.findall(r"(?m)^#([a-z-]+) = ", text)
    assert sorted(keys) == sorted(config.DEFAULTS)
    for key, value in config.DEFAULTS.items():
        got = getattr(settings, key.replace("-", "_"))
        got = config.AUTO if got is None else got  # accept-envvar-unprivileged = "auto"
        assert (list(got) if isinstance(got, tuple) else got) == value, key


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((DEB / name).read_text())
    return parser


def test_units_and_rule_agree() -> None:
    service = _unit(SERVICE)
    assert service["Service"]["Type"] == "oneshot"
    assert service["Service"]["ExecStart"].startswith(
        "/usr/bin/gpuctk cdi generate --output /var/run/cdi/nvidia.yaml"
    )
    assert service["Unit"]["ConditionPathExists"] == "/proc/driver/nvidia/version"
    path = _unit("gpuctk-cdi-refresh.path")
    assert path["Path"]["Unit"] == SERVICE
    assert "@MULTIARCH@/libnvidia-ml.so.1" in (DEB / "gpuctk-cdi-refresh.path").read_text()
    rule = (DEB / "71-gpuctk.rules").read_text()
    assert f"start {SERVICE}" in rule and 'SUBSYSTEM=="module"' in rule


@pytest.mark.parametrize("script", ["postinst", "prerm", "postrm"])
def test_maintainer_scripts(script: str) -> None:
    path = DEB / script
    assert path.stat().st_mode & 0o111
    text = path.read_text()
    assert text.startswith("#!/bin/sh\n") and text.rstrip().endswith("exit 0")
    subprocess.run(["sh", "-n", str(path)], check=True)


def test_the_package_starts_nothing_resident() -> None:
    kinds = (".service", ".path", ".socket", ".timer")
    units = sorted(p.name for p in DEB.iterdir() if p.suffix in kinds)
    # the oneshot and the two units that start it; the device plugin's, for the admin
    assert units == ["gpuctk-cdi-refresh.path", SERVICE, TIMER, PLUGIN]
    build = _build()
    assert sorted(build.UNITS) == units[:3] and build.OPTIONAL_UNITS == (PLUGIN,)
    shipped = build.static_files("amd64")
    assert [u for u in units if f"/usr/lib/systemd/system/{u}" in shipped] == units
    assert "Restart" not in _unit(SERVICE)["Service"]
    postinst = (DEB / "postinst").read_text()
    assert re.findall(r"systemctl start (\S+)", postinst) == [
        "gpuctk-cdi-refresh.path",
        TIMER,
    ]
    enabled = re.search(r'UNITS="([^"]*)"', postinst)
    assert enabled is not None and sorted(enabled[1].split()) == units[:3]  # what it enables
    # the plugin only restarted onto the new files where the admin runs it
    assert [x.strip() for x in postinst.splitlines() if PLUGIN in x] == [
        f"systemctl try-restart {PLUGIN} >/dev/null 2>&1 || true"
    ]
    for path in (p for p in DEB.iterdir() if p.is_file()):  # an upgrade only stops an old one
        lines = [x for x in path.read_text(errors="replace").splitlines() if "create-server" in x]
        assert all(re.search(r"(stop|purge|is-active) gpuctk-create-server", x) or
                   x.lstrip().startswith("#") for x in lines), (path.name, lines)  # fmt: skip


def test_timer_refreshes_the_spec_each_minute() -> None:
    timer = _unit(TIMER)
    assert timer["Timer"]["Unit"] == SERVICE
    assert timer["Timer"]["OnUnitActiveSec"] == "1min" and timer["Timer"]["OnBootSec"] == "1min"
    assert timer["Install"]["WantedBy"] == "timers.target"
    assert "ConditionPathExists" not in timer["Unit"]  # the service skips itself without a driver
    assert TIMER in _build().UNITS
    for script in ("postinst", "postrm"):  # enabled on install, purged on removal
        units = re.search(r'UNITS="([^"]*)"', (DEB / script).read_text())
        assert units is not None and TIMER in units[1].split()
    assert TIMER in (DEB / "prerm").read_text()


def test_dev_char_links_from_udev_the_refresh_and_postinst() -> None:
    rules = [x for x in (DEB / DEV_CHAR_RULE).read_text().splitlines() if x and x[0] != "#"]
    assert len(rules) == 2
    driver, module = rules
    assert 'ACTION=="add"' in driver and 'DEVPATH=="/bus/pci/drivers/nvidia"' in driver
    assert 'SUBSYSTEM=="module"' in module and "nvidia_uvm" in module
    for rule in rules:  # udev runs an absolute path; --create-all makes the nodes first
        assert rule.endswith(f'RUN+="{LINKS} --create-all"'), rule
    assert DEV_CHAR_RULE in _build().UDEV_RULES
    assert "for rule in UDEV_RULES" in (DEB / "build.py").read_text()  # each one shipped
    pre = [v for k, v in _service_lines() if k == "ExecStartPre"]
    assert f"-{LINKS}" in pre  # "-": the spec is written even when linking fails
    postinst = (DEB / "postinst").read_text()
    block = postinst[postinst.index("for node in /dev/nvidiactl") :]
    assert block.index('if [ -c "$node" ]') < block.index(LINKS) < block.index("done")


def _service_lines() -> list[tuple[str, str]]:
    lines = (DEB / SERVICE).read_text().splitlines()
    return [(k, v) for k, _, v in (x.partition("=") for x in lines if "=" in x and x[0] != "#")]


def test_the_package_configures_no_engine() -> None:
    """Installing the deb changes no engine by itself: no hooks.d file (podman and
    CRI-O would run its hook for every container its `when` matches, `always` for all), no
    drop-in; `gpuctk runtime configure` writes those on the admin's command."""
    files = _build().static_files("amd64")
    assert "/etc/gpuctk/config.toml" in files
    engine_dirs = ("/usr/share/containers/", "/etc/containers/", "/etc/crio/", "/etc/containerd/")
    assert not [p for p in files if "hooks.d" in p or p.startswith(engine_dirs)]
    assert not [p for p, text in files.items() if '"always"' in text]


def test_conflicts_with_every_nvidia_package_that_writes_the_spec() -> None:
    """nvidia-container-toolkit-base ships nvidia-cdi-refresh.service, which writes the same
    /var/run/cdi/nvidia.yaml: the package conflicts with and replaces it, and
    the refresh unit never forces over a spec nvidia-ctk wrote."""
    fields = dict(
        line.split(": ", 1)
        for line in _build().control("0.1.0", "amd64", 1, "/usr/bin/python3").splitlines()
        if ": " in line and not line.startswith(" ")
    )
    for field in ("Conflicts", "Replaces"):
        names = [n.strip() for n in fields[field].split(",")]
        assert "nvidia-container-toolkit" in names and "nvidia-container-toolkit-base" in names
    start = dict(_service_lines())["ExecStart"]
    assert "--force" not in start and "--force" not in (DEB / "postinst").read_text()


def test_the_device_plugin_unit() -> None:
    """For nodes without the plugin's DaemonSet: `gpuctk device-plugin` under systemd, writing
    only the kubelet's folder (the command's default --plugin-dir), with NVML's nodes."""
    from gpuctk.deviceplugin.cli import PLUGIN_DIR

    unit = _unit(PLUGIN)
    service = unit["Service"]
    assert service["ExecStart"].split()[:2] == ["/usr/bin/gpuctk", "device-plugin"]
    assert service["Restart"] == "on-failure"
    assert "kubelet.service" in unit["Unit"]["After"].split()
    assert "kubelet.service" not in unit["Unit"].get("Wants", "")  # ordering, never a pull
    assert service["ProtectSystem"] == "strict" and service["ReadWritePaths"] == PLUGIN_DIR
    assert service["ExecStartPre"] == f"+/usr/bin/mkdir -p {PLUGIN_DIR}"
    assert service["DevicePolicy"] == "closed" and service["DeviceAllow"] == "char-nvidia* rw"
    assert "PrivateDevices" not in service  # it would hide /dev/nvidia*
    assert service["NoNewPrivileges"] == "yes"
    assert service["RestrictAddressFamilies"] == "AF_UNIX"  # gRPC on the kubelet's sockets
    assert unit["Install"]["WantedBy"] == "multi-user.target"  # `systemctl enable` works
    for script in ("postinst", "prerm", "postrm"):  # never enabled or started by a script
        text = (DEB / script).read_text()
        assert not re.search(rf"\b(enable|start|unmask)\s[^\n]*{PLUGIN}", text), script
    assert PLUGIN in re.findall(r"systemctl stop ([^>]*)", (DEB / "prerm").read_text(), re.S)[-1]
    postrm = re.search(r'UNITS="([^"]*)"', (DEB / "postrm").read_text())
    assert postrm is not None and PLUGIN in postrm[1].split()  # an admin's enabling, purged


def test_the_venv_holds_the_device_plugin_extra() -> None:
    build = _build()
    assert "device-plugin" in build.EXTRAS
    extra = build.project()["optional-dependencies"]["device-plugin"]
    assert extra and all(dep in build.dependencies() for dep in extra)
    assert all(dep in build.dependencies() for dep in build.project()["dependencies"])
