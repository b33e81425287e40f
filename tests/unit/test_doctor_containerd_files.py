"""`gpuctk doctor`'s containerd file checks: config versions and each handler's runtime_type.

The checks run first on plain files (no root needed), then on whole fake nodes
(fixtures.doctornode) through the real CLI, where containerd's own `config dump` is read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.doctornode import BIN, DoctorNode, build_node

from gpuctk.doctor import containerdfiles, engine
from gpuctk.doctor.context import Context, Findings

NodeFactory = Callable[[], DoctorNode]
CONFIGURE_FIX = "gpuctk runtime configure --runtime containerd && systemctl restart containerd"
MARKER = '# gpuctk-state: {"added": [], "created": false, "dirs": [], "files": []}\n'


def tree(tmp_path: Path, main: str, **drop_ins: str) -> Path:
    """config.toml importing conf.d/*.toml, with the given drop-ins (name: text)."""
    config = tmp_path / "config.toml"
    config.write_text(main.replace("IMPORTS", f'imports = ["{tmp_path}/conf.d/*.toml"]'))
    (tmp_path / "conf.d").mkdir()
    for name, text in drop_ins.items():
        (tmp_path / "conf.d" / f"{name}.toml").write_text(text)
    return config


def fake_containerd(tmp_path: Path, release: str) -> str:
    path = tmp_path / "containerd"
    path.write_text(f"#!/bin/sh\necho 'containerd github.com/containerd/containerd v{release}'\n")
    path.chmod(0o755)
    return str(path)


def test_versions_ok_when_no_file_is_newer(tmp_path: Path) -> None:
    config = tree(tmp_path, "version = 3\nIMPORTS\n", site="version = 2\n", other="x = 1\n")
    result = containerdfiles.check_versions(str(config), None, CONFIGURE_FIX)
    assert result.status == "ok", result
    assert result.evidence == ("3 file(s), main version 3, newest 3",)


def test_versions_flags_someone_elses_newer_drop_in(tmp_path: Path) -> None:
    config = tree(tmp_path, "version = 2\nIMPORTS\n", site="version = 4\n")
    site = tmp_path / "conf.d" / "site.toml"
    result = containerdfiles.check_versions(str(config), None, CONFIGURE_FIX)
    assert result.status == "failed"
    assert result.evidence == (
        f"{site}: version 4, above the main config's version 2 ({config}): a containerd that "
        "reads only version 2 exits at start",
    )
    assert result.fix == (
        f"set `version = 2` in {site} (and that version's plugin names) && "
        "systemctl restart containerd"
    )


def test_versions_fix_for_gpuctks_own_drop_in_is_configure(tmp_path: Path) -> None:
    config = tree(tmp_path, "version = 2\nIMPORTS\n", ours=MARKER + "version = 4\n")
    result = containerdfiles.check_versions(str(config), None, CONFIGURE_FIX)
    assert result.status == "failed" and result.fix == CONFIGURE_FIX


@pytest.mark.parametrize(("release", "status"), [("2.2.3", "failed"), ("2.3.0", "ok")])
def test_versions_against_what_the_binary_reads(tmp_path: Path, release: str, status: str) -> None:
    config = tree(tmp_path, "version = 4\nIMPORTS\n", site="version = 4\n")
    binary = fake_containerd(tmp_path, release)
    result = containerdfiles.check_versions(str(config), binary, CONFIGURE_FIX)
    assert result.status == status, result
    if status == "failed":
        assert result.evidence[0] == (
            f"{config}: version 4, but containerd 2.2 ({binary}) reads up to version 3: it "
            "exits at start (1.6 before 1.6.32 ignores the newer plugin tables instead)"
        )
        assert result.fix.startswith(f"set `version = 3` in {config}")


V3_HANDLER = """\
version = 3
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.kata]
  runtime_path = "/opt/kata/bin/containerd-shim-kata-v2"
"""


def test_runtime_type_ok() -> None:
    runtimes = {"runc": {"runtime_type": "io.containerd.runc.v2"}}
    result = containerdfiles.check_runtime_types("/none", runtimes, "dump", CONFIGURE_FIX)
    assert result.status == "ok"
    assert result.evidence == ("dump: 1 handler(s), each with runtime_type",)


def test_runtime_type_missing_names_the_file(tmp_path: Path) -> None:
    config = tree(tmp_path, "version = 3\nIMPORTS\n", kata=V3_HANDLER)
    kata = tmp_path / "conf.d" / "kata.toml"
    runtimes = {"runc": {"runtime_type": "io.containerd.runc.v2"}, "kata": {"runtime_type": ""}}
    result = containerdfiles.check_runtime_types(str(config), runtimes, "dump", CONFIGURE_FIX)
    assert result.status == "failed"
    header = '[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.kata]'
    assert result.evidence == (
        f"{kata}: {header} has no runtime_type: every pod of handler 'kata' fails "
        '("container.Runtime.Name must be set")',
    )
    assert result.fix == (
        f'add runtime_type = "io.containerd.runc.v2" to {header} in {kata} && '
        "systemctl restart containerd"
    )
    ours = tmp_path / "conf.d" / "kata.toml"
    ours.write_text(MARKER + V3_HANDLER)
    result = containerdfiles.check_runtime_types(str(config), runtimes, "dump", CONFIGURE_FIX)
    assert result.fix == CONFIGURE_FIX


def test_containerd_2_3_dump_is_read_at_version_4(tmp_path: Path) -> None:
    """containerd 2.3 dumps version 4: the handlers are under io.containerd.cri.v1.runtime."""
    config = tree(tmp_path, "version = 2\nIMPORTS\n")
    binary = tmp_path / "containerd"
    binary.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo "containerd x v2.3.0 abc"; exit 0; fi\n'
        "cat <<'EOF'\n"
        "version = 4\n"
        "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]\n"
        '  runtime_type = "io.containerd.runc.v2"\n'
        "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]\n"
        f'  BinaryName = "{BIN / "gpuctk-runtime"}"\n'
        "EOF\n"
    )
    binary.chmod(0o755)
    (tmp_path / "proc").mkdir()
    ctx = Context(
        containerd=str(binary), containerd_config=str(config), proc_root=str(tmp_path / "proc")
    )
    found = Findings()
    results = {r.id: r for r in engine.check_containerd(ctx, found)}
    assert found.handlers["containerd"] == {"nvidia"}
    assert results["engine.containerd"].status == "ok"
    assert results["engine.containerd.runtime-type"].status == "ok"
    assert results["engine.containerd.versions"].status == "ok"


# --- whole nodes, the real CLI and containerd's own dump ----------------------------------------


@pytest.fixture
def make_node(
    tmp_path: Path, driver_root: Path, fake_nvml_env: Callable[..., dict[str, str]]
) -> Iterator[NodeFactory]:
    if os.geteuid() != 0:
        pytest.skip("device nodes need mknod (root)")
    nodes: list[DoctorNode] = []

    def make() -> DoctorNode:
        node = build_node(tmp_path / f"n{len(nodes)}", driver_root, "l4", fake_nvml_env)
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.close()


def check(node: DoctorNode, id_: str, *extra: str) -> tuple[int, dict[str, Any]]:
    code, report, _ = node.doctor(*extra)
    return code, node.check(report, id_)


def configure_fix(node: DoctorNode) -> str:
    return (
        f"gpuctk runtime configure --runtime containerd --config {node.containerd_config} "
        f"--runtime-path {BIN / 'gpuctk-runtime'} && systemctl restart containerd"
    )


def test_node_with_a_newer_site_drop_in(make_node: NodeFactory) -> None:
    node = make_node()
    assert check(node, "engine.containerd.versions")[1]["status"] == "ok"
    site = node.containerd_config.parent / "conf.d" / "10-site.toml"
    site.write_text("version = 3\n")
    text = node.containerd_config.read_text()
    node.containerd_config.write_text(text.replace("imports = [", f'imports = ["{site}", ', 1))
    for source in ("command", "file"):
        code, result = check(node, "engine.containerd.versions", "--config-source", source)
        assert code == 2 and result["status"] == "failed", (source, result)
        assert result["evidence"][0].startswith(f"{site}: version 3, above the main config's")
        assert result["fix"].startswith(f"set `version = 2` in {site}")


def test_node_with_gpuctks_drop_in_at_a_newer_version(make_node: NodeFactory) -> None:
    node = make_node()
    ours = node.containerd_config.parent / "conf.d" / "99-gpuctk.toml"
    ours.write_text(re.sub(r"(?m)^version = 2$", "version = 4", ours.read_text()))
    code, result = check(node, "engine.containerd.versions")
    assert code == 2 and result["status"] == "failed"
    assert result["fix"] == configure_fix(node)
    node.configure()  # the fix: written again at the main config's version
    code, result = check(node, "engine.containerd.versions")
    assert result["status"] == "ok", (code, result)


def test_node_with_a_handler_without_runtime_type(make_node: NodeFactory) -> None:
    node = make_node()
    assert check(node, "engine.containerd.runtime-type")[1]["status"] == "ok"
    ours = node.containerd_config.parent / "conf.d" / "99-gpuctk.toml"
    header = '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
    text = ours.read_text()
    start = text.index(header) + len(header)
    ours.write_text(
        text[:start] + text[start:].replace('  runtime_type = "io.containerd.runc.v2"\n', "", 1)
    )
    assert ours.read_text().count("runtime_type") == text.count("runtime_type") - 1
    for source in ("command", "file"):
        code, result = check(node, "engine.containerd.runtime-type", "--config-source", source)
        assert code == 2 and result["status"] == "failed", (source, result)
        assert result["evidence"] == [
            f"{ours}: {header.strip()} has no runtime_type: every pod of handler 'nvidia' "
            'fails ("container.Runtime.Name must be set")'
        ]
        assert result["fix"] == configure_fix(node)
    node.configure()
    assert check(node, "engine.containerd.runtime-type")[1]["status"] == "ok"
