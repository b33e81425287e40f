"""`gpuctk doctor` on whole fake nodes: a healthy one passes, each broken one is named and fixed.

Every node is built by fixtures.doctornode (mknod'ed device nodes, the Debian 535 driver root,
a generated spec, the fake NVML, a containerd config from `gpuctk runtime configure`, kubelet
sockets) and then broken on purpose. The doctor runs as a user runs it (the real CLI, JSON out).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.devroot import CAPS_MAJOR, UVM_MAJOR
from fixtures.doctornode import BIN, DoctorNode, build_node, generate_spec, listen

from gpuctk.cdi.node.machine import Machine
from gpuctk.cdi.node.profile import load_profile
from gpuctk.records import replace

NodeFactory = Callable[..., DoctorNode]

# What a healthy node must show as ok (not merely "not failed"): each check really ran.
HEALTHY_OK = {
    "driver.module", "driver.libraries", "driver.device-nodes", "driver.persistence",
    "driver.dev-char",
    "nvml.load", "nvml.gpus", "nvml.mig", "nvml.device-nodes",
    "cdi.spec", "cdi.valid", "cdi.driver-version", "cdi.layout", "cdi.conflicts",
    "cdi.version-readers",
    "runtime.shim", "runtime.hook", "runtime.config", "runtime.low-level",
    "runtime.envvar-unprivileged",
    "engine.containerd", "engine.containerd.binary", "engine.containerd.cdi",
    "engine.containerd.versions", "engine.containerd.runtime-type", "engine.containerd.shadowed",
    "kubernetes.device-plugins", "kubernetes.device-plugin", "kubernetes.runtimeclass",
}  # fmt: skip


@pytest.fixture
def make_node(
    tmp_path: Path, driver_root: Path, fake_nvml_env: Callable[..., dict[str, str]]
) -> Iterator[NodeFactory]:
    if os.geteuid() != 0:
        pytest.skip("device nodes need mknod (root)")
    nodes: list[DoctorNode] = []

    def make(profile: str = "l4", nvml: Machine | None = None) -> DoctorNode:
        node = build_node(tmp_path / f"n{len(nodes)}", driver_root, profile, fake_nvml_env, nvml)
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.close()


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["status"] for c in report["checks"]}


def bad(report: dict[str, Any]) -> dict[str, str]:
    return {i: s for i, s in statuses(report).items() if s in ("warning", "failed")}


def text(check: dict[str, Any]) -> str:
    return "\n".join(check["evidence"])


@pytest.mark.parametrize("profile", ["l4", "a100-mig"])
def test_healthy_node_passes_with_exit_0(make_node: NodeFactory, profile: str) -> None:
    node = make_node(profile)
    code, report, stderr = node.doctor()
    assert code == 0, (bad(report), stderr)
    assert report["exitCode"] == 0 and report["version"] == 1
    ok = {i for i, s in statuses(report).items() if s == "ok"}
    assert ok == HEALTHY_OK
    assert statuses(report)["probe.container"] == "skipped"
    assert {i for i in statuses(report) if i.startswith("runtime.")} == {
        "runtime.shim", "runtime.hook", "runtime.config", "runtime.low-level",
        "runtime.envvar-unprivileged",
    }  # fmt: skip
    if profile == "a100-mig":
        mig = node.check(report, "nvml.mig")
        assert "GPU 3: MIG on, 3 device(s): 1c.3g.20gb, 2c.3g.20gb, 3g.20gb" in mig["evidence"]
        assert "13 MIG device(s)" in text(node.check(report, "cdi.layout"))


def test_table_is_plain_off_a_terminal_and_coloured_on_request(make_node: NodeFactory) -> None:
    node = make_node()
    code, table, _ = node.doctor(fmt="table")
    assert code == 0
    assert "\x1b[" not in table
    assert "  ok    cdi.layout" in table and table.rstrip().endswith("(exit 0)")
    os.unlink(node.roots.dev_root / "dev/nvidia-uvm")
    code, table, _ = node.doctor("--color", fmt="table")
    assert code == 2
    assert "\x1b[31m\x1b[1mFAIL\x1b[0m  driver.device-nodes" in table
    assert "fix: \x1b[31m\x1b[1mnvidia-modprobe -u -c=0" in table


def test_missing_control_node(make_node: NodeFactory) -> None:
    node = make_node()
    uvm = node.roots.dev_root / "dev/nvidia-uvm"
    os.unlink(uvm)
    code, report, _ = node.doctor()
    assert code == 2
    check = node.check(report, "driver.device-nodes")
    assert check["status"] == "failed"
    assert f"{uvm}: missing or not a character device" in check["evidence"]
    assert check["fix"] == "nvidia-modprobe -u -c=0"


def test_missing_gpu_node(make_node: NodeFactory) -> None:
    node = make_node()
    gpu = node.roots.dev_root / "dev/nvidia0"
    os.unlink(gpu)
    code, report, _ = node.doctor()
    assert code == 2
    check = node.check(report, "nvml.device-nodes")
    assert check["status"] == "failed"
    assert f"{gpu} missing, expected 195:0" in text(check)
    assert check["fix"] == "nvidia-modprobe -c=0"
    layout = node.check(report, "cdi.layout")  # the spec names a node that is gone
    assert layout["status"] == "failed" and f"device node {gpu}" in text(layout)


def test_wrong_major(make_node: NodeFactory) -> None:
    node = make_node()
    uvm = node.roots.dev_root / "dev/nvidia-uvm"
    os.unlink(uvm)
    os.mknod(uvm, stat.S_IFCHR | 0o666, os.makedev(UVM_MAJOR + 7, 0))
    code, report, _ = node.doctor()
    assert code == 2
    check = node.check(report, "driver.device-nodes")
    assert check["status"] == "failed"
    assert f"{uvm}: is {UVM_MAJOR + 7}:0, the driver says {UVM_MAJOR}:0" in check["evidence"]
    assert check["fix"] == f"rm -f {uvm} && mknod -m 666 {uvm} c {UVM_MAJOR} 0"


def test_missing_mig_capability_node(make_node: NodeFactory) -> None:
    node = make_node("a100-mig")
    caps = node.roots.dev_root / "dev/nvidia-caps"
    gpu1 = load_profile("a100-mig").gpus[1]
    first = gpu1.mig_devices[0]
    minor = 3 + gpu1.minor * 135 + first.gi * 9  # the GI's access minor (fixtures.devroot)
    os.unlink(caps / f"nvidia-cap{minor}")
    code, report, _ = node.doctor()
    assert code == 2
    check = node.check(report, "nvml.device-nodes")
    assert check["status"] == "failed"
    assert f"MIG {first.name} (gpu{gpu1.minor}/gi{first.gi}/access)" in text(check)
    path = caps / f"nvidia-cap{minor}"
    assert f"mknod -m 444 {path} c {CAPS_MAJOR} {minor}" in check["fix"]


def test_module_not_loaded(make_node: NodeFactory) -> None:
    node = make_node()
    os.unlink(node.roots.proc_root / "driver/nvidia/version")
    code, report, _ = node.doctor()
    assert code == 2
    check = node.check(report, "driver.module")
    assert check["status"] == "failed"
    assert check["fix"].startswith("modprobe nvidia")
    assert statuses(report)["driver.libraries"] == "skipped"


def test_missing_driver_root_is_its_own_finding(make_node: NodeFactory, tmp_path: Path) -> None:
    node = make_node()
    missing = tmp_path / "nonexistent"
    env = {k: v for k, v in node.env.items() if k != "GPUCTK_NVML_LIBRARY"}
    code, report, _ = node.doctor("--driver-root", str(missing), env=env)
    assert code == 2
    check = node.check(report, "driver.root")
    assert check["status"] == "failed"
    assert check["evidence"] == [f"driver root {missing} is not a directory"]
    assert check["fix"].startswith("pass the driver's folder as --driver-root")
    assert report["checks"][0]["id"] == "driver.root"
    assert statuses(report)["driver.libraries"] == "skipped"
    nvml = node.check(report, "nvml.load")
    if nvml["status"] == "failed":  # no system-wide NVML here: its finding names no given flag
        assert "use --driver-root" not in text(nvml) and "pass --driver-root" not in nvml["fix"]
        assert nvml["fix"] == check["fix"]
    healthy_code, healthy, _ = node.doctor()
    assert "driver.root" not in statuses(healthy) and healthy_code == 0
    fixes = " ".join(str(c.get("fix") or "") for c in report["checks"])
    assert f"--driver-root {missing}" not in fixes  # no fix repeats the root that is missing


def test_generate_fix_names_no_missing_root_and_no_live_folder_for_a_simulation(
    tmp_path: Path,
) -> None:
    from gpuctk.doctor.cdi import DEFAULT_OUTPUT, SIMULATED_OUTPUT, generate_fix
    from gpuctk.doctor.context import Context

    missing = Context(driver_root=str(tmp_path / "nonexistent"))
    assert str(tmp_path / "nonexistent") not in generate_fix(missing)
    assert generate_fix(Context(driver_root=str(tmp_path))).endswith(DEFAULT_OUTPUT)
    simulated = generate_fix(Context(simulate="h100-8"))
    assert DEFAULT_OUTPUT not in simulated and simulated.endswith(SIMULATED_OUTPUT)


def test_nvml_init_fails(
    make_node: NodeFactory, fake_nvml_env: Callable[..., dict[str, str]]
) -> None:
    node = make_node()
    env = fake_nvml_env("l4", init_error=9)  # NVML_ERROR_DRIVER_NOT_LOADED
    env |= {k: node.env[k] for k in ("PATH", "GPUCTK_NVML_LIBRARY")}
    code, report, _ = node.doctor(env=env)
    assert code == 2
    check = node.check(report, "nvml.load")
    assert check["status"] == "failed"
    assert "NVIDIA driver not loaded" in text(check)
    assert check["fix"].startswith("modprobe nvidia")
    assert statuses(report)["cdi.layout"] == "skipped"


def test_stale_spec_after_driver_upgrade(make_node: NodeFactory) -> None:
    node = make_node()
    # The spec was written for 535.129.03; the node has since been upgraded to 535.309.01.
    node.spec.write_text(node.spec.read_text().replace("535.309.01", "535.129.03"))
    code, report, _ = node.doctor()
    assert code == 2
    check = node.check(report, "cdi.driver-version")
    assert check["status"] == "failed"
    assert f"{node.spec}: generated for driver 535.129.03, the node runs 535.309.01" in text(check)
    assert "file(s) the spec mounts are missing on the host:" in text(check)
    libs = f"{node.driver_root}/usr/lib/x86_64-linux-gnu/nvidia/current"
    assert check["evidence"][2:4] == [
        f"{libs}/libcuda.so.535.129.03",
        f"{libs}/libnvidia-ml.so.535.129.03",
    ]
    assert check["fix"].startswith("gpuctk cdi generate --driver-root ")
    assert check["fix"].endswith(f"--output {node.spec}")
    assert statuses(report)["cdi.valid"] == "ok"  # stale is not invalid


def test_spec_uuid_set_differs_from_nvml(make_node: NodeFactory) -> None:
    machine = load_profile("l4")
    new_uuid = "GPU-00000000-1111-2222-3333-444444444444"
    swapped = replace(machine, gpus=(replace(machine.gpus[0], uuid=new_uuid),))
    node = make_node("l4", nvml=swapped)  # the GPU was replaced after the spec was written
    code, report, _ = node.doctor()
    assert code == 2
    check = node.check(report, "cdi.layout")
    assert check["status"] == "failed"
    old = machine.gpus[0].uuid
    assert f"GPU {old}: in the spec, not on the node (removed or replaced)" in check["evidence"]
    assert f"GPU 0 {new_uuid}: on the node, not in the spec" in check["evidence"]
    assert check["fix"].endswith(f"--output {node.spec}")


def test_mig_layout_changed_since_generation(make_node: NodeFactory) -> None:
    machine = load_profile("a100-mig")
    gpu2 = machine.gpus[2]
    repartitioned = replace(gpu2, mig_devices=gpu2.mig_devices[:1])
    nvml = replace(machine, gpus=(*machine.gpus[:2], repartitioned, *machine.gpus[3:]))
    node = make_node("a100-mig", nvml=nvml)
    code, report, _ = node.doctor()
    assert code == 2
    check = node.check(report, "cdi.layout")
    assert check["status"] == "failed"
    assert check["evidence"] == [
        "GPU 2: MIG layout changed: the spec has 3 MIG device(s), the node 1 (2 gone, 0 new)"
    ]
    assert check["fix"].startswith("gpuctk cdi generate")


def test_mig_layout_drift_in_a_spec_without_gpuctk_facts(make_node: NodeFactory) -> None:
    """Another tool's spec carries no facts: its UUID device names are compared instead."""
    machine = load_profile("a100-mig")
    gpu2 = machine.gpus[2]
    nvml = replace(
        machine,
        gpus=(*machine.gpus[:2], replace(gpu2, mig_devices=()), *machine.gpus[3:]),
    )
    node = make_node("a100-mig", nvml=nvml)
    lines = [ln for ln in node.spec.read_text().splitlines() if "GPUCTK_" not in ln]
    node.spec.write_text("\n".join(lines) + "\n")
    code, report, _ = node.doctor()
    check = node.check(report, "cdi.layout")
    assert check["status"] == "failed"
    gone = sorted(m.uuid for m in gpu2.mig_devices)
    assert [f"{u}: in the spec, not on the node" for u in gone] == check["evidence"]
    assert node.check(report, "nvml.mig")["status"] == "warning"  # MIG on, no devices
    assert code == 2


def test_no_spec(make_node: NodeFactory) -> None:
    node = make_node()
    node.spec.unlink()
    code, report, _ = node.doctor()
    assert code == 2
    check = node.check(report, "cdi.spec")
    assert check["status"] == "failed"
    assert f"no spec for nvidia.com/gpu in {node.spec_dir}" in check["evidence"]
    assert check["fix"].startswith("gpuctk cdi generate --driver-root ")


def test_invalid_spec(make_node: NodeFactory) -> None:
    node = make_node()
    node.spec.write_text(node.spec.read_text().replace("kind: nvidia.com/gpu", "kind: nvidia"))
    code, report, _ = node.doctor()
    assert code == 2
    # The registry skips a spec whose kind is malformed, as the shim would: no spec for the kind.
    assert node.check(report, "cdi.spec")["status"] == "failed"
    check = node.check(report, "cdi.valid")
    assert check["status"] == "failed"
    assert str(node.spec) in text(check) and "kind" in text(check)
    assert check["fix"].startswith(f"gpuctk cdi validate {node.spec}")


def test_conflicting_specs_in_one_dir(make_node: NodeFactory) -> None:
    node = make_node()
    copy = node.spec_dir / "other-tool.yaml"
    shutil.copyfile(node.spec, copy)
    code, report, _ = node.doctor()
    assert code == 2
    check = node.check(report, "cdi.conflicts")
    assert check["status"] == "failed"
    assert "defined by more than one file of one dir" in check["evidence"][0]
    assert check["fix"] == f"rm {copy}   # keep {node.spec}"


def test_spec_shadowed_by_another_tool(make_node: NodeFactory) -> None:
    node = make_node()
    # nvidia-ctk wrote a spec into a dir that is read first; gpuctk's later one wins.
    early = node.base / "etc-cdi"
    theirs = early / "nvidia.yaml"
    generate_spec(theirs, "l4", node.driver_root, node.roots, node.env)
    theirs.write_text(theirs.read_text().replace(str(BIN / "gpuctk-hook"), "/usr/bin/nvidia-ctk"))
    config = f'spec-dirs = ["{early}", "{node.spec_dir}"]\n'
    node.runtime_config.write_text(node.runtime_config.read_text().splitlines()[0] + "\n" + config)
    code, report, _ = node.doctor()
    assert code == 1
    check = node.check(report, "cdi.conflicts")
    assert check["status"] == "warning"
    assert f"{theirs} (nvidia-ctk): 3 device(s) overridden by {node.spec} (gpuctk)" in text(check)
    assert check["fix"] == f"rm {theirs}"


def test_containerd_config_without_the_handler(make_node: NodeFactory) -> None:
    node = make_node()
    shutil.rmtree(node.containerd_config.parent)
    node.containerd_config.parent.mkdir()
    node.containerd_config.write_text("version = 2\n")
    code, report, _ = node.doctor()
    assert code == 2
    check = node.check(report, "engine.containerd")
    assert check["status"] == "failed"
    assert "no runtime handler 'nvidia' (handlers: runc)" in text(check)
    assert check["fix"] == (
        f"gpuctk runtime configure --runtime containerd --config {node.containerd_config} "
        f"--runtime-path {BIN / 'gpuctk-runtime'} && systemctl restart containerd"
    )
    assert statuses(report)["engine.containerd.binary"] == "skipped"
    rc = node.check(report, "kubernetes.runtimeclass")  # the RuntimeClass names it too
    assert rc["status"] == "failed"
    assert "handler 'nvidia', unknown to the engine (handlers: runc)" in text(rc)


def test_handler_pointing_at_a_missing_binary(make_node: NodeFactory) -> None:
    node = make_node()
    node.configure("--runtime-path", "/opt/gone/gpuctk-runtime")
    for source in ("command", "file"):
        code, report, _ = node.doctor("--config-source", source)
        assert code == 2
        check = node.check(report, "engine.containerd.binary")
        assert check["status"] == "failed", source
        assert "BinaryName = '/opt/gone/gpuctk-runtime': missing" in text(check)
        assert check["fix"].startswith("gpuctk runtime configure --runtime containerd")
        assert f"--runtime-path {BIN / 'gpuctk-runtime'}" in check["fix"]


def test_nvidia_drop_in_that_wins_names_its_file_and_the_take_over(
    make_node: NodeFactory,
) -> None:
    """NVIDIA's conf.d/99-nvidia.toml loads after gpuctk's drop-in and wins:
    doctor names it, and its fix is configure --take-over, not plain configure again."""
    node = make_node()
    main = node.containerd_config
    conf_d = main.parent / "conf.d"
    nvidia = conf_d / "99-nvidia.toml"
    nvidia.write_text(
        "version = 2\n"
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
        '  runtime_type = "io.containerd.runc.v2"\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\n'
        '  BinaryName = "/usr/bin/nvidia-container-runtime"\n'
    )
    config = main.read_text()
    ours = f'"{conf_d / "99-gpuctk.toml"}"'
    assert ours in config
    main.write_text(config.replace(ours, f'{ours}, "{conf_d}/*.toml"'))  # nvidia-ctk's import
    for source in ("command", "file"):
        _, report, _ = node.doctor("--config-source", source)
        check = node.check(report, "engine.containerd.binary")
        assert check["status"] == "failed", (source, check)
        assert f"{nvidia} sets handler 'nvidia', loaded after gpuctk's" in text(check)
        assert check["fix"].startswith(
            f"gpuctk runtime configure --runtime containerd --config {main} --take-over"
        )
    node.configure("--take-over")
    _, report, _ = node.doctor()
    assert node.check(report, "engine.containerd.binary")["status"] == "ok"
    assert not nvidia.exists() and nvidia.with_name("99-nvidia.toml.gpuctk-disabled").exists()


def test_main_config_handler_of_nvidia_ctk_is_fixed_by_plain_configure(
    make_node: NodeFactory,
) -> None:
    """nvidia-ctk wrote the handler into config.toml itself and gpuctk is not configured: the
    main config is loaded first, so plain configure wins (no --take-over needed)."""
    node = make_node()
    main = node.containerd_config
    shutil.rmtree(main.parent / "conf.d")
    main.write_text(
        "version = 2\n"
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
        '  runtime_type = "io.containerd.runc.v2"\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\n'
        '  BinaryName = "/usr/bin/nvidia-container-runtime"\n'
    )
    _, report, _ = node.doctor("--config-source", "file")
    check = node.check(report, "engine.containerd.binary")
    assert check["status"] == ("warning" if os.path.exists("/usr/bin/nvidia-container-runtime")
                               else "failed"), check  # fmt: skip
    assert f"set in the main config {main}" in text(check)
    assert "--take-over" not in check["fix"]
    assert check["fix"].startswith(f"gpuctk runtime configure --runtime containerd --config {main}")


def test_hook_mode_without_cdi_is_a_warning(make_node: NodeFactory) -> None:
    node = make_node()
    node.configure("--mode", "hook", "--hook-path", str(BIN / "gpuctk-hook"))
    code, report, _ = node.doctor()
    assert node.check(report, "engine.containerd.binary")["status"] == "ok"
    check = node.check(report, "engine.containerd.cdi")
    assert check["status"] == "warning"
    assert "hook mode with containerd < 1.7 has no CDI" in text(check)
    assert code == 1


def test_invalid_runtime_config(make_node: NodeFactory) -> None:
    node = make_node()
    node.runtime_config.write_text(node.runtime_config.read_text() + "runtime = 'crun'\n")
    code, report, _ = node.doctor()
    assert code == 2
    check = node.check(report, "runtime.config")
    assert check["status"] == "failed"
    assert "runtime: unknown key" in text(check)
    assert check["fix"].startswith(f"edit {node.runtime_config}")


def test_low_level_runtime_missing(make_node: NodeFactory) -> None:
    node = make_node()
    node.runtime_config.write_text(
        f'runtimes = ["/opt/none/runc"]\nspec-dirs = ["{node.spec_dir}"]\n'
    )
    code, report, _ = node.doctor()
    assert code == 2
    check = node.check(report, "runtime.low-level")
    assert check["status"] == "failed"
    assert "no low-level runtime found: tried /opt/none/runc" in text(check)
    assert check["fix"].endswith(f"in {node.runtime_config}")


def test_shim_not_on_path(make_node: NodeFactory, tmp_path: Path) -> None:
    node = make_node()
    only_runc = tmp_path / "only-runc"  # not the system PATH: a gpuctk package may be installed
    only_runc.mkdir()
    (only_runc / "runc").symlink_to(shutil.which("runc") or "/usr/sbin/runc")
    env = dict(node.env, PATH=str(only_runc))
    code, report, _ = node.doctor(env=env)
    assert code == 2
    assert node.check(report, "runtime.shim")["status"] == "failed"
    assert node.check(report, "runtime.hook")["status"] == "failed"
    fix = node.check(report, "runtime.shim")["fix"]  # the venv's gpuctk: its bin/ has the shim
    assert fix == f"export PATH={BIN}:$PATH   # the gpuctk-runtime installed beside this gpuctk"
    lone = tmp_path / "lone"  # a gpuctk launcher with no shim beside it
    lone.mkdir()
    shutil.copy(BIN / "gpuctk", lone / "gpuctk")
    done = subprocess.run(
        [str(lone / "gpuctk"), "doctor", *node.args(), "--format", "json"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    fix = node.check(json.loads(done.stdout), "runtime.shim")["fix"]
    assert fix.startswith("apt install ./gpuctk_*.deb") and "pip install" not in fix
    assert "kubectl apply -k packaging/kubernetes" in fix and "gpuctk install" in fix


@pytest.mark.parametrize("front", ["none", "older"])
def test_a_hook_without_its_compiled_hook_fails(
    make_node: NodeFactory, tmp_path: Path, front: str
) -> None:
    """gpuctk-hook runs gpuctk-cdi-hook beside it for the device node guard and the ld cache
    merge: none there, or one of an older build (it hands its forms back), fails the check
    with what to do."""
    node = make_node()
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(BIN / "gpuctk-hook", lone / "gpuctk-hook")
    if front == "older":  # what an older build answers: it hands the form to gpuctk-hook
        (lone / "gpuctk-cdi-hook").write_text(
            f'#!/bin/sh\nexec {lone / "gpuctk-hook"} "$@" </dev/null\n'
        )
        (lone / "gpuctk-cdi-hook").chmod(0o755)
    code, report, _ = node.doctor(env=dict(node.env, PATH=f"{lone}:{node.env['PATH']}"))
    check = node.check(report, "runtime.hook")
    assert code == 2 and check["status"] == "failed", check
    want = "no gpuctk-cdi-hook beside" if front == "none" else "an older build than"
    assert want in text(check) and check["fix"].startswith("reinstall gpuctk")
    code, report, _ = node.doctor()  # the venv's, built together
    assert node.check(report, "runtime.hook")["status"] == "ok"
    assert "gpuctk-cdi-hook beside it" in text(node.check(report, "runtime.hook"))


def test_warnings_only_exit_1(make_node: NodeFactory) -> None:
    node = make_node()
    for sock in node.sockets:
        sock.close()
    (node.host / "var/run/nvidia-persistenced/socket").unlink()
    (node.kubelet / "device-plugins/nvidia-gpu.sock").unlink()
    node.sockets = [listen(node.kubelet / "device-plugins/kubelet.sock.new")]
    os.replace(
        node.kubelet / "device-plugins/kubelet.sock.new",
        node.kubelet / "device-plugins/kubelet.sock",
    )
    code, report, _ = node.doctor()
    assert bad(report) == {"driver.persistence": "warning", "kubernetes.device-plugin": "warning"}
    assert code == 1 and report["exitCode"] == 1
    assert "Insufficient nvidia.com/gpu" in text(node.check(report, "kubernetes.device-plugin"))
    assert node.check(report, "driver.persistence")["fix"].startswith("systemctl enable --now")


def test_device_plugin_seen_through_the_kubelet_checkpoint(make_node: NodeFactory) -> None:
    node = make_node()
    (node.kubelet / "device-plugins/nvidia-gpu.sock").unlink()
    checkpoint = node.kubelet / "device-plugins/kubelet_internal_checkpoint"
    checkpoint.write_text('{"Data": {"RegisteredDevices": {"nvidia.com/gpu": ["GPU-1"]}}}')
    code, report, _ = node.doctor()
    assert code == 0, bad(report)
    assert "kubelet checkpoint: nvidia.com/gpu" in text(
        node.check(report, "kubernetes.device-plugin")
    )


def test_runtimeclass_with_another_handler(make_node: NodeFactory) -> None:
    node = make_node()
    node.runtimeclass.write_text(
        node.runtimeclass.read_text().replace('handler: "nvidia"', 'handler: "gpu"')
    )
    code, report, _ = node.doctor()
    assert code == 2
    check = node.check(report, "kubernetes.runtimeclass")
    assert check["status"] == "failed"
    assert "RuntimeClass nvidia -> handler 'gpu', unknown to the engine" in text(check)


def test_simulate_stands_in_for_nvml(make_node: NodeFactory) -> None:
    node = make_node("a100-mig")
    env = {k: v for k, v in node.env.items() if not k.startswith(("GPUCTK_NVML", "FAKE_NVML"))}
    code, report, _ = node.doctor("--simulate", "a100-mig", env=env)
    assert code == 0, bad(report)
    assert node.check(report, "nvml.load")["evidence"] == [
        "machine from profile a100-mig (--simulate)"
    ]
    code, report, _ = node.doctor("--simulate", "h100-8", env=env)  # not this node's machine
    assert code == 2
    assert node.check(report, "cdi.layout")["status"] == "failed"
    assert node.check(report, "nvml.device-nodes")["status"] == "failed"


def test_crio_and_docker_when_present(make_node: NodeFactory) -> None:
    node = make_node()
    shim = BIN / "gpuctk-runtime"
    crio = node.host / "etc/crio/crio.conf"
    crio.parent.mkdir(parents=True)
    crio.write_text('[crio.runtime]\ndefault_runtime = "runc"\n')
    (crio.parent / "crio.conf.d").mkdir()
    docker = node.host / "etc/docker/daemon.json"
    docker.parent.mkdir(parents=True)
    docker.write_text('{"runtimes": {"nvidia": {"path": "/opt/gone/gpuctk-runtime"}}}')
    code, report, _ = node.doctor()
    assert code == 2
    check = node.check(report, "engine.crio")
    assert check["status"] == "failed"
    assert "no 'nvidia' (handlers: none)" in text(check)
    assert check["fix"].startswith(f"gpuctk runtime configure --runtime crio --config {crio}")
    check = node.check(report, "engine.docker")
    assert check["status"] == "failed"
    assert "runtimes.nvidia.path = '/opt/gone/gpuctk-runtime': not found" in text(check)
    assert check["fix"].endswith("&& systemctl restart docker")

    (crio.parent / "crio.conf.d/99-gpuctk.conf").write_text(
        f'[crio.runtime.runtimes.nvidia]\nruntime_path = "{shim}"\nruntime_type = "oci"\n'
    )
    docker.write_text(f'{{"runtimes": {{"nvidia": {{"path": "{shim}"}}}}}}')
    code, report, _ = node.doctor()
    assert code == 0, bad(report)
    assert node.check(report, "engine.crio")["evidence"] == [f"runtime_path = {shim}"]
    assert node.check(report, "engine.docker")["status"] == "ok"


def fake_containerd(node: DoctorNode, argv: list[str], started_ago: float) -> None:
    """A containerd process in the node's proc root, started `started_ago` seconds ago."""
    proc = node.roots.proc_root
    now = time.time()
    ticks = os.sysconf("SC_CLK_TCK")
    btime = int(now) - 100_000
    (proc / "stat").write_text(f"cpu  1 2 3 4\nbtime {btime}\n")
    pid = proc / "4242"
    pid.mkdir(exist_ok=True)
    (pid / "comm").write_text("containerd\n")
    (pid / "cmdline").write_bytes("\0".join(["/usr/bin/containerd", *argv, ""]).encode())
    start = int((now - started_ago - btime) * ticks)
    fields = ["S", *["0"] * 18, str(start), *["0"] * 10]  # starttime is field 22 of stat
    (pid / "stat").write_text(f"4242 (containerd) {' '.join(fields)}\n")


def test_containerd_not_restarted_after_configure(make_node: NodeFactory) -> None:
    node = make_node()
    fake_containerd(node, [], started_ago=3600)  # default --config: <host>/etc/containerd/...
    code, report, _ = node.doctor()
    check = node.check(report, "engine.containerd.loaded")
    assert check["status"] == "warning"
    assert "after containerd (pid 4242) started: the running daemon does not know" in text(check)
    assert check["fix"] == "systemctl restart containerd"
    assert code == 1

    old = time.time() - 7200
    for path in (node.containerd_config, node.containerd_config.parent / "conf.d/99-gpuctk.toml"):
        os.utime(path, (old, old))
    code, report, _ = node.doctor()
    check = node.check(report, "engine.containerd.loaded")
    assert check["status"] == "ok"
    assert check["evidence"] == ["containerd (pid 4242) started after 2 config file(s)"]
    assert code == 0

    fake_containerd(node, ["--config", "/srv/other.toml"], started_ago=3600)
    code, report, _ = node.doctor()
    assert node.check(report, "engine.containerd.loaded")["status"] == "skipped"


# --- the probe's verdict on what the container saw (gpuctk.doctor.probe._verdict) ------------


def _probe_out(*libs: str) -> str:
    return "\n".join(["NODE /dev/nvidia0", "OPEN /dev/nvidia0 ok", *libs])


def test_probe_asks_by_annotation_where_the_shim_reads_one() -> None:
    """By CDI annotation, as an orchestrator asks (accepted even with
    accept-envvar-unprivileged off); by NVIDIA_VISIBLE_DEVICES only without a prefix."""
    from gpuctk.doctor.probe import request_for

    assert request_for("nvidia.com/gpu", "1:0", ("cdi.k8s.io/",)) == (
        "cdi.k8s.io/gpuctk-doctor-probe", "nvidia.com/gpu=1:0",
        "cdi.k8s.io/gpuctk-doctor-probe: nvidia.com/gpu=1:0",
    )  # fmt: skip
    assert request_for("nvidia.com/gpu", "0", ()) == ("", "", "NVIDIA_VISIBLE_DEVICES=0")


def test_probe_verdict_ld_cache_or_loader_folder() -> None:
    from gpuctk.doctor.probe import _verdict

    both = ("LDCACHE libcuda.so.1", "LDCACHE libnvidia-ml.so.1")
    assert _verdict(_probe_out(*both), {"/dev/nvidia0"}, "0").status == "ok"
    # a mounts spec: no cache entry, the SONAMEs in the loader's system folders
    mounts = ("SYSDIR libcuda.so.1 /usr/lib/x86_64-linux-gnu",
              "SYSDIR libnvidia-ml.so.1 /usr/lib64")  # fmt: skip
    result = _verdict(_probe_out(*mounts), {"/dev/nvidia0"}, "0")
    assert result.status == "ok", result
    assert any("libcuda.so.1: in /usr/lib/x86_64-linux-gnu" in e for e in result.evidence)
    # neither: the warning names what is missing
    result = _verdict(_probe_out("LDCACHE libnvidia-ml.so.1"), {"/dev/nvidia0"}, "0")
    assert result.status == "warning"
    assert any("lack libcuda.so.1" in e for e in result.evidence)


def test_nvidia_node_without_its_dev_char_link(make_node: NodeFactory) -> None:
    node = make_node("a100-mig")
    char = node.host / "dev/char"  # the host's, where runc looks; the nodes: the dev root's
    ctl = os.path.relpath(node.roots.dev_root / "dev/nvidiactl", char)
    os.unlink(char / "195:0")
    (char / f"{UVM_MAJOR}:0").unlink()
    (char / f"{UVM_MAJOR}:0").symlink_to(ctl)  # leads to another node
    code, report, _ = node.doctor()
    assert code == 1, bad(report)
    check = node.check(report, "driver.dev-char")
    assert check["status"] == "warning"
    assert f"{char}/195:0 is missing" in check["evidence"]
    assert f"{char}/{UVM_MAJOR}:0 -> {ctl} is not nvidia-uvm" in check["evidence"]
    assert "systemctl daemon-reload" in text(check)
    dev_root, proc = node.roots.dev_root, node.roots.proc_root
    assert check["fix"] == (
        f"gpuctk system create-dev-char-symlinks --driver-root {dev_root} "
        f"--dev-char-path {char} --proc-root {proc}"
    )
    done = subprocess.run(
        [str(BIN / check["fix"].split()[0]), *check["fix"].split()[1:]],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    code, report, _ = node.doctor()
    assert code == 0 and node.check(report, "driver.dev-char")["status"] == "ok"


def test_stale_spec_fix_names_the_refresh_unit_that_writes_it(make_node: NodeFactory) -> None:
    machine = load_profile("a100-mig")
    gpu2 = machine.gpus[2]
    fewer = replace(gpu2, mig_devices=gpu2.mig_devices[:1])
    node = make_node("a100-mig", nvml=replace(machine, gpus=(*machine.gpus[:2], fewer,
                                                              *machine.gpus[3:])))  # fmt: skip
    # the spec where the package's refresh unit writes it, under the host root
    spec = node.host / "var/run/cdi/nvidia.yaml"
    spec.parent.mkdir(parents=True)
    shutil.move(node.spec, spec)
    config = f'spec-dirs = ["{spec.parent}"]\n'
    node.runtime_config.write_text(node.runtime_config.read_text().splitlines()[0] + "\n" + config)
    code, report, _ = node.doctor()
    check = node.check(report, "cdi.layout")
    assert code == 2 and check["status"] == "failed"
    assert check["fix"].startswith("gpuctk cdi generate")  # no refresh unit on this node
    unit = node.host / "usr/lib/systemd/system/gpuctk-cdi-refresh.service"
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\nType=oneshot\n")
    code, report, _ = node.doctor()
    check = node.check(report, "cdi.layout")
    assert code == 2 and check["status"] == "failed"
    assert check["fix"].startswith("systemctl start gpuctk-cdi-refresh.service   # or: gpuctk ")
    assert check["fix"].endswith(f"--output {spec}")


def test_nvidia_ctk_spec_where_the_refresh_unit_writes(make_node: NodeFactory) -> None:
    """nvidia-container-toolkit-base's refresh wrote the spec gpuctk's refresh unit writes:
    the unit refuses it, and doctor says so with the way out."""
    import yaml

    node = make_node("l4")
    spec = node.host / "var/run/cdi/nvidia.yaml"
    spec.parent.mkdir(parents=True)
    doc = yaml.safe_load(node.spec.read_text())
    node.spec.unlink()
    for block in [doc.get("containerEdits") or {}, *(d["containerEdits"] for d in doc["devices"])]:
        for hook in block.get("hooks") or []:
            hook["path"], hook["args"] = "/usr/bin/nvidia-cdi-hook", ["nvidia-cdi-hook", "x"]
    spec.write_text(yaml.safe_dump(doc, explicit_start=True))
    config = f'spec-dirs = ["{spec.parent}"]\n'
    node.runtime_config.write_text(node.runtime_config.read_text().splitlines()[0] + "\n" + config)
    _, report, _ = node.doctor()
    assert node.check(report, "cdi.spec")["status"] == "ok"  # no gpuctk refresh unit here
    unit = node.host / "usr/lib/systemd/system/gpuctk-cdi-refresh.service"
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\nType=oneshot\n")
    _, report, _ = node.doctor()
    check = node.check(report, "cdi.spec")
    assert check["status"] == "warning", check
    assert f"{spec} was written by nvidia-ctk" in check["evidence"][0]
    assert check["fix"].startswith("systemctl disable --now nvidia-cdi-refresh.path")
    assert "--force" in check["fix"] and check["fix"].endswith(f"--output {spec}")


def test_an_unknown_profile_is_a_usage_error() -> None:
    """`--simulate nope` is the user's mistake: one usage line, not an NVML finding."""
    done = subprocess.run(
        [str(BIN / "gpuctk"), "doctor", "--simulate", "nope"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    from gpuctk.cdi.node.profile import available_profiles

    names = available_profiles()
    assert {"a100-mig", "h100-8", "l4"} <= set(names)
    assert done.stderr.splitlines() == [
        f"gpuctk: error: unknown machine profile 'nope'; choose one of: {', '.join(names)} "
        "(or give a .yaml path)",
        "Try 'gpuctk doctor --help'.",
    ]
