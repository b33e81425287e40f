"""gpuctk.cdi.specs.yamlout: PyYAML (the reader every engine-side tool and our validator use) must
read
back exactly the document written, for real specs and for hostile strings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuctk.cdi.node.profile import available_profiles
from gpuctk.cdi.specs import yamlout

GPUCTK = str(Path(sys.executable).with_name("gpuctk"))


def read_back(text: str) -> Any:
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@pytest.mark.parametrize("profile", available_profiles())
def test_generated_specs_read_back_equal_to_their_json(profile: str, tmp_path: Path) -> None:
    for fmt in ("yaml", "json"):
        subprocess.run(
            [GPUCTK, "cdi", "generate", "--simulate", profile, "--output", str(tmp_path / fmt),
             "--format", fmt],
            check=True, capture_output=True,
        )  # fmt: skip
    text = (tmp_path / "yaml").read_text()
    first, _, rest = text.partition("\n")
    assert first.startswith("# simulated "), first  # --simulate says what the spec is
    assert rest.startswith("---\ncdiVersion: ")
    assert read_back(text) == json.loads((tmp_path / "json").read_text())


@pytest.mark.parametrize(
    "value",
    ["0", "0:1", "1.5", "1e3", "0x1f", "0o17", "190:20:30", "2001-12-14", "yes", "No", "on",
     "OFF", "y", "n", "null", "~", "", " ", "-", "- a", "a: b", "a:", "#x", "a #b", "&x", "*x",
     "!x", "|", ">", "'", '"', "\\", "[a]", "{a}", "%x", "@x", "`x", "<<", "=", ".inf", ".nan",
     "-.inf", "+1", "1_000", "a\nb", "a\tb", "\x00", "\x85", "\u2028", "é", "\U0001f600",
     "NVIDIA_VISIBLE_DEVICES=void", "nvidia.com/gpu", "/usr/lib/x86_64-linux-gnu",
     "GPU-f1a85645-b0c3-6430-0376-a1f64fe544fa", "MIG-1::2"],
)  # fmt: skip
def test_awkward_strings_stay_strings(value: str) -> None:
    doc = {"k": value, value or "empty": [value, {value or "e": value}]}
    assert read_back(yamlout.dump(doc)) == doc


def test_plain_where_pyyaml_would_be_plain() -> None:
    text = yamlout.dump({"kind": "nvidia.com/gpu", "path": "/dev/nvidia0", "m": 0, "b": True})
    assert text == "---\nkind: nvidia.com/gpu\npath: /dev/nvidia0\nm: 0\nb: true\n"


def test_nested_and_empty_collections_layout() -> None:
    doc = {"a": [], "b": {}, "c": [[1, [2]], [], {"d": [{"e": 1, "f": [3]}]}], "g": None}
    text = yamlout.dump(doc)
    assert read_back(text) == doc
    assert (
        "a: []\nb: {}\nc:\n- - 1\n  - - 2\n- []\n- d:\n  - e: 1\n    f:\n    - 3\ng: null\n" in text
    )


def test_unsupported_types_are_refused() -> None:
    with pytest.raises(TypeError, match="float"):
        yamlout.dump({"x": 1.5})
    with pytest.raises(TypeError, match="keys must be strings"):
        yamlout.dump({1: "x"})
    with pytest.raises(ValueError, match="lone surrogate"):
        yamlout.dump({"x": "\ud800"})


@pytest.mark.parametrize("value", ["v", [1, [2]], {"a": {"b": 1}}, [], {}])
def test_keys_too_long_for_an_implicit_key_use_an_explicit_one(value: Any) -> None:
    doc = {"k" * 2000: value, "\x01" * 300: value, "after": 1}
    assert read_back(yamlout.dump(doc)) == doc


_scalars = st.one_of(st.text(), st.integers(), st.booleans(), st.none())
_documents = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(), _documents, max_size=5))
def test_any_document_reads_back_equal(doc: dict[str, Any]) -> None:
    assert read_back(yamlout.dump(doc)) == doc
