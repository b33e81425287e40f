"""gpuctk.hook.requests.require: NVIDIA_REQUIRE_* parsing and checking against the spec's facts."""

from __future__ import annotations

import pytest

from gpuctk.cdi.node import facts as f
from gpuctk.errors import RequestError
from gpuctk.hook.requests.require import (
    check,
    facts_of,
    gpus_for,
    parse_expression,
    parse_term,
    requirements,
)

H100 = f.GpuFacts(0, "GPU-aaaa", "9.0", "hopper", ())
A100 = f.GpuFacts(1, "GPU-bbbb", "8.0", "ampere", ("MIG-x", "MIG-y"))
FACTS = f.Facts("535.309.01", "12.2", (H100, A100))


def test_parse() -> None:
    assert parse_term("cuda>=12.0") == ("cuda", ">=", "12.0")
    assert parse_term("driver<536") == ("driver", "<", "536")
    assert parse_term("arch=sm_90") == ("arch", "=", "sm_90")
    assert parse_term("brand!=geforce") == ("brand", "!=", "geforce")
    assert parse_expression("cuda>=12.0 brand=tesla,driver>=470,driver<471") == [
        [("cuda", ">=", "12.0")],
        [("brand", "=", "tesla"), ("driver", ">=", "470"), ("driver", "<", "471")],
    ]


@pytest.mark.parametrize(
    ("term", "message"),
    [
        ("cuda", "expected <key><operator><value>"),
        ("cuda>=", "no value"),
        ("gpu>=1", "unknown key 'gpu'"),
        ("cuda=>12", "not a version"),
        ("cuda>=twelve", "not a version"),
        ("arch=sm_x", "bad architecture"),
        ("brand>=tesla", "brand takes = or !="),
    ],
)
def test_bad_terms(term: str, message: str) -> None:
    with pytest.raises(RequestError, match=message):
        parse_term(term)


def test_requirements_collects_legacy_and_disable() -> None:
    env = {"NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "NVIDIA_REQUIRE_JETPACK": "x", "PATH": "/bin"}
    assert requirements(env) == [("NVIDIA_REQUIRE_CUDA", "cuda>=12.0")]
    assert requirements({"CUDA_VERSION": "11.8.0"}) == [("CUDA_VERSION", "cuda>=11.8")]
    assert requirements({"CUDA_VERSION": "11.8.0", "NVIDIA_REQUIRE_CUDA": "cuda>=9"}) == [
        ("NVIDIA_REQUIRE_CUDA", "cuda>=9")
    ]
    assert requirements({**env, "NVIDIA_DISABLE_REQUIRE": "true"}) == []
    assert requirements({**env, "NVIDIA_DISABLE_REQUIRE": "1"}) == []
    assert requirements({**env, "NVIDIA_DISABLE_REQUIRE": "false"}) != []


@pytest.mark.parametrize(
    "expression",
    [
        "cuda>=12.0",
        "cuda>=12.2",
        "cuda=12.2.0",
        "cuda>=13.0 driver>=535",  # OR: the second alternative holds
        "driver>=535,driver<536",
        "driver>535",  # 535.309.01 > 535(.0.0)
        "driver!=470",
        "arch>=8.0",
        "cuda<12.3 arch=sm_100",  # first alternative
    ],
)
def test_met(expression: str) -> None:
    assert check({"NVIDIA_REQUIRE_CUDA": expression}, FACTS, [H100, A100]) == []


@pytest.mark.parametrize(
    ("expression", "found"),
    [
        ("cuda>=12.4", "cuda>=12.4 (the driver supports CUDA 12.2)"),
        ("driver>=550", "driver>=550 (the driver is 535.309.01)"),
        ("driver>=535,cuda>=12.3", "cuda>=12.3 (the driver supports CUDA 12.2)"),
        ("arch=sm_90", "arch=sm_90 (GPU 1 has compute capability 8.0)"),
    ],
)
def test_unmet_names_constraint_and_value(expression: str, found: str) -> None:
    with pytest.raises(RequestError) as err:
        check({"NVIDIA_REQUIRE_CUDA": expression}, FACTS, [H100, A100])
    assert str(err.value).startswith(
        f"unsatisfied requirement NVIDIA_REQUIRE_CUDA={expression!r}: {found}"
    )


def test_or_failure_lists_each_alternative() -> None:
    with pytest.raises(RequestError) as err:
        check({"NVIDIA_REQUIRE_X": "cuda>=13 driver>=560"}, FACTS, [])
    assert "cuda>=13 (the driver supports CUDA 12.2); driver>=560 (the driver is" in str(err.value)


def test_arch_checked_per_selected_gpu_only() -> None:
    env = {"NVIDIA_REQUIRE_ARCH": "arch=sm_90"}
    assert check(env, FACTS, [H100]) == []
    assert check(env, FACTS, []) == []  # no GPU (NVIDIA_VISIBLE_DEVICES=none): holds
    with pytest.raises(RequestError):
        check(env, FACTS, [A100])


def test_brand_and_missing_facts_are_unverifiable_not_failures() -> None:
    notes = check({"NVIDIA_REQUIRE_CUDA": "brand=tesla,cuda>=12.0"}, FACTS, [H100])
    assert notes == ["cannot verify brand=tesla: the GPU brand is not in the CDI spec; assumed met"]
    notes = check({"NVIDIA_REQUIRE_CUDA": "cuda>=99"}, None, [])
    assert "carries no gpuctk facts" in notes[0]
    notes = check({"NVIDIA_REQUIRE_CUDA": "cuda>=99"}, f.Facts("535.1", "", ()), [])
    assert "does not record cuda" in notes[0]


def test_legacy_cuda_version_requirement() -> None:
    with pytest.raises(RequestError, match=r"CUDA_VERSION='cuda>=12.4'"):
        check({"CUDA_VERSION": "12.4.1"}, FACTS, [])


def test_facts_of_and_gpus_for() -> None:
    edits = {
        "hooks": [
            {"hookName": "createContainer", "path": "/x", "env": ["PATH=/bin"]},
            {"hookName": "createContainer", "path": "/usr/bin/gpuctk-hook", "env": f.encode(FACTS)},
        ]
    }
    assert facts_of(edits) == FACTS
    assert facts_of({"hooks": [{"path": "/x"}]}) is None
    assert facts_of({}) is None

    def idx(names: list[str]) -> list[int]:
        return [g.index for g in gpus_for(names, FACTS)]

    assert idx(["nvidia.com/gpu=all"]) == [0, 1]
    assert idx(["nvidia.com/gpu=1"]) == [1]
    assert idx(["nvidia.com/gpu=GPU-aaaa"]) == [0]
    assert idx(["nvidia.com/gpu=1:0"]) == [1]
    assert idx(["nvidia.com/gpu=MIG-y"]) == [1]
    assert idx(["nvidia.com/gpu=gpu0", "nvidia.com/gpu=mig1:1"]) == [0, 1]
    assert idx(["nvidia.com/gpu=7"]) == []


@pytest.mark.parametrize(
    "env",
    [
        {"CUDA_VERSION": "1" * 5000 + ".0"},  # int() of it: ValueError past 4300 digits
        {"CUDA_VERSION": "12." + "9" * 10},
        {"NVIDIA_REQUIRE_CUDA": "cuda>=" + "1" * 5000},
        {"NVIDIA_REQUIRE_DRIVER": "driver>=535." + "0" * 10},
        {"NVIDIA_REQUIRE_CUDA": "cuda>=1\u00b2"},  # a digit to str.isdigit, not to int()
        {"NVIDIA_REQUIRE_ARCH": "arch=sm_" + "9" * 5000},
    ],
)
def test_a_version_number_too_long_is_refused_in_one_short_line(env: dict[str, str]) -> None:
    with pytest.raises(RequestError) as caught:
        check(env, FACTS, [H100])
    message = caught.value.message
    assert "\n" not in message and len(message) < 300, message
    assert "not a version" in message or "bad architecture" in message


def test_nine_digits_a_component_are_a_version() -> None:
    assert parse_term("driver>=123456789.0") == ("driver", ">=", "123456789.0")
    assert requirements({"CUDA_VERSION": "11.123456789"}) == [
        ("CUDA_VERSION", "cuda>=11.123456789")
    ]
    with pytest.raises(RequestError, match="unsatisfied requirement CUDA_VERSION"):
        check({"CUDA_VERSION": "123456789.0"}, FACTS, [])
