"""gpuctk.jsonfast decodes and encodes as the json package does, without importing it, and
gpuctk.libc reaches libc without the ctypes package (both are on the container-create path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuctk import jsonfast, libc

finite = st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | finite | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_round_trip_equals_json(value: Any) -> None:
    text = json.dumps(value)
    assert jsonfast.loads(text) == json.loads(text)
    assert json.loads(jsonfast.dumps(value)) == value
    assert (
        jsonfast.dumps(value)
        == json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": ', "Expecting value"),
        ('{"a": 1} x', "Extra data"),
        ("[NaN]", "NaN is not valid JSON"),
        ("[-Infinity]", "-Infinity is not valid JSON"),
        ("\ufeff{}", "BOM"),
        ("", "Expecting value"),
        ("[" * 100000 + "]" * 100000, "nested too deeply"),
    ],
)
def test_malformed_documents_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        jsonfast.loads(text)


def test_pairs_hook_sees_every_object_and_its_errors_propagate() -> None:
    def no_dupes(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        if len({k for k, _ in pairs}) != len(pairs):
            raise KeyError("duplicate")
        return dict(pairs)

    assert jsonfast.loads(' {"a": {"b": [1]}} \n', pairs_hook=no_dupes) == {"a": {"b": [1]}}
    with pytest.raises(KeyError):
        jsonfast.loads('{"a": 1, "a": 2}', pairs_hook=no_dupes)


def test_surrogates_are_escaped_not_lost() -> None:
    assert json.loads(jsonfast.dumps({"k": "\udc80x"})) == {"k": "\udc80x"}
    with pytest.raises(TypeError):
        jsonfast.dumps({"k": {1, 2}})


def test_neither_imports_json_or_ctypes() -> None:
    code = (
        "import sys, gpuctk\n"  # the editable install's finder loads what it loads
        "before = set(sys.modules)\n"
        "from gpuctk import jsonfast, libc\n"
        "jsonfast.dumps(jsonfast.loads('{\"a\": [1, 2.5, null]}'))\n"
        "libc.function('getpid')()\n"
        "print(' '.join(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True
    )
    loaded = set(out.stdout.split())
    assert "gpuctk.libc" in loaded
    assert not {"json", "ctypes", "re", "enum"} & loaded


def test_libc_calls_and_errno() -> None:
    assert libc.function("getpid")() == os.getpid()
    assert libc.function("syscall", "l")(libc.long_arg(39)) == os.getpid()  # x86_64 getpid
    assert libc.function("close")(-1) == -1
    assert libc.get_errno() == 9  # EBADF
    with pytest.raises(AttributeError):
        libc.function("gpuctk_no_such_function")


def test_too_deep_is_its_own_error_and_the_hook_says_so() -> None:
    from gpuctk.errors import InputError
    from gpuctk.hook import oci_state

    deep = "[" * 100000 + "]" * 100000
    with pytest.raises(jsonfast.NestingError):
        jsonfast.loads(deep)
    with pytest.raises(InputError, match="state is nested too deeply"):
        oci_state.parse_json(deep.encode(), "state")
    with pytest.raises(ValueError, match="duplicate key 'a'"):
        jsonfast.loads('{"a": 1, "a": 2}', pairs_hook=jsonfast.unique_pairs)
