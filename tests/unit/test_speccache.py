"""gpuctk.cdi.specs.speccache: the shim's pre-parsed spec cache. A second create in a fresh process
serves an unchanged YAML spec without importing PyYAML; any change of the file, of its trust
or of the cache's own trust means a fresh parse."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gpuctk.cdi.specs import registry, speccache
from gpuctk.cdi.specs.speccache import SpecCache

SPEC = {
    "cdiVersion": "0.5.0",
    "kind": "nvidia.com/gpu",
    "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}],
    "containerEdits": {"env": ["A=1"]},
}

# a fresh process resolves nvidia.com/gpu=0 as the shim does; prints its edits and whether
# PyYAML was imported
PROBE = """
import json, sys
from gpuctk.cdi.specs import registry
from gpuctk.cdi.specs.speccache import SpecCache
reg = registry.load([sys.argv[1]], cache=SpecCache.for_this_process())
blocks = reg.resolve(["nvidia.com/gpu=0"])
print(json.dumps([b.edits for b in blocks]), "yaml" in sys.modules)
"""


def settle(path: Path) -> None:
    """Age the file past SETTLE_NS (ctime cannot be set back: wait it out)."""
    past = time.time() - 60
    os.utime(path, (past, past))
    time.sleep(speccache.SETTLE_NS / 1e9 + 0.05)


@pytest.fixture
def node(tmp_path: Path) -> dict[str, Path]:
    spec_dir, state = tmp_path / "cdi", tmp_path / "state"
    spec_dir.mkdir()
    spec = spec_dir / "nvidia.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    return {"dir": spec_dir, "spec": spec, "state": state}


def probe(node: dict[str, Path], **env: str) -> tuple[list[dict[str, object]], bool]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(node["dir"])],
        env={**os.environ, "GPUCTK_STATE_DIR": str(node["state"]), **env},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    edits, imported = done.stdout.rsplit(" ", 1)
    return json.loads(edits), imported.strip() == "True"


def test_an_unchanged_yaml_spec_is_served_without_pyyaml(node: dict[str, Path]) -> None:
    settle(node["spec"])
    first, imported = probe(node)
    assert imported and (node["state"] / "specs.cache").exists()
    assert oct(node["state"].stat().st_mode & 0o777) == "0o700"
    again, imported = probe(node)
    assert again == first and not imported  # decoded from the cache


def test_a_rewritten_spec_is_read_again(node: dict[str, Path]) -> None:
    settle(node["spec"])
    probe(node)
    changed = {**SPEC, "containerEdits": {"env": ["A=2"]}}
    tmp = node["spec"].with_suffix(".new")
    tmp.write_text(yaml.safe_dump(changed))
    tmp.rename(node["spec"])  # as `gpuctk cdi generate` replaces it: a new inode
    edits, imported = probe(node)
    assert imported and edits[0]["env"] == ["A=2"]
    with node["spec"].open("r+") as f:  # edited in place: same inode, new mtime/ctime
        text = f.read().replace("A=2", "A=3")
        f.seek(0)
        f.write(text)
    edits, imported = probe(node)
    assert imported and edits[0]["env"] == ["A=3"]


def test_a_file_that_has_not_settled_is_not_cached(node: dict[str, Path]) -> None:
    probe(node)  # written just now: a second write in the same clock tick could hide
    _, imported = probe(node)
    assert imported


def test_a_spec_the_trust_policy_now_refuses_is_not_served_from_the_cache(
    node: dict[str, Path],
) -> None:
    settle(node["spec"])
    probe(node)
    node["spec"].chmod(0o666)
    reg = registry.load([str(node["dir"])], cache=SpecCache(str(node["state"])))
    assert reg.refused and "nvidia.com/gpu=0" not in reg.devices


@pytest.mark.parametrize("how", ["corrupt", "foreign format", "group-writable folder", "off"])
def test_a_cache_it_cannot_trust_is_ignored(node: dict[str, Path], how: str) -> None:
    settle(node["spec"])
    probe(node)
    cache = node["state"] / "specs.cache"
    env = {}
    if how == "corrupt":
        cache.write_bytes(cache.read_bytes()[:40])
    elif how == "foreign format":
        import marshal

        cache.write_bytes(marshal.dumps({"format": "other", "entries": {}}))
    elif how == "group-writable folder":
        node["state"].chmod(0o770)
    else:
        env["GPUCTK_SPEC_CACHE"] = "0"
    edits, imported = probe(node, **env)
    assert imported and edits[0]["env"] == ["A=1"]


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_cache_file_owned_by_another_user_is_ignored(node: dict[str, Path]) -> None:
    settle(node["spec"])
    probe(node)
    os.chown(node["state"] / "specs.cache", 65534, 65534)
    _, imported = probe(node)
    assert imported


def test_entries_of_vanished_specs_are_dropped(node: dict[str, Path], tmp_path: Path) -> None:
    cache = SpecCache(str(node["state"]))
    gone = tmp_path / "gone.json"
    gone.write_text("{}")
    st = gone.stat()
    old = os.stat_result((*st[:7], 0, 0, 0), {"st_mtime_ns": 0, "st_ctime_ns": 0})  # settled
    cache.put(str(gone), old, {"a": 1})
    assert cache.save()  # an earlier process cached it
    gone.unlink()
    settle(node["spec"])
    registry.load([str(node["dir"])], cache=SpecCache(str(node["state"])))
    assert list(SpecCache(str(node["state"])).entries) == [str(node["spec"])]
