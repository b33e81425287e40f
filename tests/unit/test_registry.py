"""gpuctk.cdi.specs.registry: spec dirs in order, later dir wins, conflicts, clear messages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuctk.cdi.specs import registry
from gpuctk.errors import RequestError


def spec(kind: str = "nvidia.com/gpu", names: tuple[str, ...] = ("0", "1"), **extra: Any) -> Any:
    return {
        "cdiVersion": "0.5.0",
        "kind": kind,
        "devices": [
            {
                "name": n,
                "containerEdits": {
                    "deviceNodes": [{"path": f"/dev/nvidia{n}", "type": "c", "major": 195}]
                },
            }
            for n in names
        ],
        "containerEdits": {"env": [f"FROM={extra.pop('tag', kind)}"]},
        **extra,
    }


def write(path: Path, doc: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def test_resolve_orders_spec_edits_before_the_first_device_of_each_spec(tmp_path: Path) -> None:
    write(tmp_path / "etc/gpu.json", spec(names=("0", "1", "all")))
    write(tmp_path / "etc/other.json", spec(kind="example.com/net", names=("a",)))
    reg = registry.load([str(tmp_path / "etc")])
    blocks = reg.resolve(
        ["nvidia.com/gpu=1", "example.com/net=a", "nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    )
    assert [(b.spec.kind, b.device) for b in blocks] == [
        ("nvidia.com/gpu", None),
        ("nvidia.com/gpu", "nvidia.com/gpu=1"),
        ("example.com/net", None),
        ("example.com/net", "example.com/net=a"),
        ("nvidia.com/gpu", "nvidia.com/gpu=0"),
    ]
    assert blocks[0].edits == {"env": ["FROM=nvidia.com/gpu"]}


def test_later_dir_wins_and_same_dir_conflicts(tmp_path: Path) -> None:
    write(tmp_path / "etc/a.json", spec(names=("0", "1"), tag="etc"))
    write(tmp_path / "run/b.json", spec(names=("1",), tag="run"))
    write(tmp_path / "run/c.json", spec(names=("2",), tag="run-c"))
    write(tmp_path / "run/d.json", spec(names=("2",), tag="run-d"))
    reg = registry.load([str(tmp_path / "etc"), str(tmp_path / "run")])
    assert reg.devices["nvidia.com/gpu=1"][0].path.endswith("run/b.json")
    assert reg.devices["nvidia.com/gpu=0"][0].path.endswith("etc/a.json")
    with pytest.raises(RequestError, match=r"nvidia.com/gpu=2 is defined by more than one spec"):
        reg.resolve(["nvidia.com/gpu=2"])


def test_yaml_spec_and_ignored_files(tmp_path: Path) -> None:
    d = tmp_path / "cdi"
    d.mkdir()
    (d / "gpu.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n"
        "- name: '0'\n  containerEdits:\n    env: [A=1]\n"
    )
    write(d / "ignored.yml", spec(names=("7",)))
    write(d / "ignored.txt", spec(names=("8",)))
    write(d / "sub/nested.json", spec(names=("9",)))
    reg = registry.load([str(d)])
    assert reg.known() == ["nvidia.com/gpu=0"]


def test_no_spec_anywhere_says_run_generate(tmp_path: Path) -> None:
    reg = registry.load([str(tmp_path / "etc-cdi"), str(tmp_path / "run-cdi")])
    with pytest.raises(RequestError) as err:
        reg.resolve(["nvidia.com/gpu=0"])
    assert str(err.value) == (
        f"cannot inject nvidia.com/gpu=0: no CDI spec found in {tmp_path}/etc-cdi, "
        f"{tmp_path}/run-cdi: run gpuctk cdi generate"
    )
    with pytest.raises(RequestError, match="run gpuctk cdi generate"):
        reg.common("nvidia.com/gpu")


def test_unknown_device_lists_known_ones_abbreviated(tmp_path: Path) -> None:
    write(tmp_path / "a.json", spec(names=tuple(str(i) for i in range(20))))
    write(tmp_path / "b.json", spec(kind="example.com/x", names=("z",)))
    reg = registry.load([str(tmp_path)])
    with pytest.raises(RequestError) as err:
        reg.resolve(["nvidia.com/gpu=0", "nvidia.com/gpu=99", "nvidia.com/gpu=GPU-nope"])
    text = str(err.value)
    assert text.startswith("unknown CDI devices nvidia.com/gpu=99, nvidia.com/gpu=GPU-nope")
    assert "known: nvidia.com/gpu=0, nvidia.com/gpu=1, nvidia.com/gpu=2," in text
    assert "(9 more)" in text  # 21 known, 12 shown


def test_broken_spec_is_skipped_and_named(tmp_path: Path) -> None:
    write(tmp_path / "good.json", spec(names=("0",)))
    (tmp_path / "bad.json").write_text("{not json")
    write(tmp_path / "nokind.json", {"cdiVersion": "0.5.0", "devices": []})
    reg = registry.load([str(tmp_path)])
    assert reg.known() == ["nvidia.com/gpu=0"]
    assert len(reg.errors) == 2
    with pytest.raises(RequestError) as err:
        reg.resolve(["nvidia.com/gpu=1"])
    assert "specs skipped:" in str(err.value) and "bad.json" in str(err.value)


def test_only_broken_specs(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("[]")
    reg = registry.load([str(tmp_path)])
    with pytest.raises(RequestError, match=r"no usable CDI spec in .*bad\.json"):
        reg.resolve(["nvidia.com/gpu=0"])


def test_common_prefers_the_spec_with_all(tmp_path: Path) -> None:
    write(tmp_path / "etc/a.json", spec(names=("0", "all"), tag="with-all"))
    write(tmp_path / "run/b.json", spec(names=("5",), tag="later"))
    reg = registry.load([str(tmp_path / "etc"), str(tmp_path / "run")])
    (block,) = reg.common("nvidia.com/gpu")
    assert block.device is None and block.edits == {"env": ["FROM=with-all"]}
    with pytest.raises(RequestError, match=r"no CDI spec for kind example.com/x .*nvidia.com/gpu"):
        reg.common("example.com/x")


def test_unlistable_dir_is_an_error_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    write(tmp_path / "ok/a.json", spec(names=("0",)))
    reg = registry.load([str(tmp_path / "file"), str(tmp_path / "ok")])
    assert reg.known() == ["nvidia.com/gpu=0"]
