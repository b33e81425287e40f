"""gpuctk.hook.requests.failsafe: what a create does under a config file gpuctk cannot use.

The shim's side is tested with real runc in tests/integration/test_shim_broken_config.py; here:
the fallback settings (only `runtimes`, `log-*` and `annotation-prefixes`, each valid on its
own, from a file that parsed), the broad reading of "asks for a GPU", the one-line error that
names the file, the key (with the known key it is likely a typo of) and the fix, and
`gpuctk-hook precreate` (podman / CRI-O) passing a no-GPU config through byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuctk.errors import InputError, ValidationError
from gpuctk.hook import config
from gpuctk.hook.requests import failsafe
from gpuctk.hook.verbs import precreate


def load(tmp_path: Path, text: str) -> tuple[config.Settings, Any]:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return failsafe.load({config.ENV_VAR: str(path)})


def test_a_valid_file_is_no_error(tmp_path: Path) -> None:
    settings, error = load(tmp_path, 'runtimes = ["/usr/bin/crun"]\n')
    assert error is None and settings.runtimes == ("/usr/bin/crun",)


def test_a_typo_keeps_the_valid_runtimes_and_suggests_the_key(tmp_path: Path) -> None:
    text = 'runtimes = ["/usr/bin/crun"]\nspec-dirs = ["/srv/cdi"]\nacept-volume-mounts = true\n'
    settings, error = load(tmp_path, text)
    assert isinstance(error, ValidationError)
    assert "acept-volume-mounts: unknown key (did you mean accept-volume-mounts?)" in error.message
    assert settings.runtimes == ("/usr/bin/crun",)
    assert settings.spec_dirs == tuple(config.DEFAULTS["spec-dirs"])  # not taken from it
    assert settings.source == "" and settings.source_identity is None


def test_a_bad_runtimes_value_is_not_kept(tmp_path: Path) -> None:
    settings, error = load(tmp_path, 'runtimes = ["bin/runc"]\nlog-level = "loud"\n')
    assert error is not None
    assert settings.runtimes == tuple(config.DEFAULTS["runtimes"])
    assert settings.log_level == "info"
    assert failsafe.runtimes_said(settings) == "the default runtimes"


def test_invalid_toml_gives_the_defaults(tmp_path: Path) -> None:
    settings, error = load(tmp_path, "runtimes = [\n")
    assert isinstance(error, ValidationError) and "invalid TOML" in error.message
    assert settings.runtimes == tuple(config.DEFAULTS["runtimes"])


def doc(env: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"ociVersion": "1.0.2", "process": {"env": env or []}, **extra}


@pytest.mark.parametrize(
    ("config_doc", "asked"),
    [
        (doc(), ""),
        (doc(["NVIDIA_VISIBLE_DEVICES=void"]), ""),
        (doc(["NVIDIA_VISIBLE_DEVICES="]), ""),
        (doc(["NVIDIA_VISIBLE_DEVICES=0"]), "NVIDIA_VISIBLE_DEVICES"),
        (doc(["NVIDIA_VISIBLE_DEVICES=none"]), "NVIDIA_VISIBLE_DEVICES"),
        (doc(annotations={"cdi.k8s.io/x": "nvidia.com/gpu=0"}), "annotations"),
        (doc(annotations={"cdi.k8s.io/x": "not qualified"}), "a malformed GPU request"),
        (doc(annotations={"example.org/x": "nvidia.com/gpu=0"}), ""),
        (
            doc(
                mounts=[
                    {
                        "source": "/dev/null",
                        "destination": "/var/run/nvidia-container-devices/0",
                    }
                ]
            ),
            "mounts",
        ),
    ],
)
def test_gpu_asked_reads_every_source(config_doc: dict[str, Any], asked: str) -> None:
    assert failsafe.gpu_asked(config_doc, config.Settings()) == asked


def test_a_prefix_the_broken_file_names_counts(tmp_path: Path) -> None:
    settings, _ = load(tmp_path, 'annotation-prefixes = ["example.org/"]\ntypo = 1\n')
    asked = doc(annotations={"example.org/x": "nvidia.com/gpu=0"})
    assert failsafe.gpu_asked(asked, settings) == "annotations"


def test_gate(tmp_path: Path) -> None:
    settings, error = load(tmp_path, "acept-volume-mounts = true\n")
    assert error is not None
    warned: list[str] = []
    failsafe.gate(doc(), settings, error, warned.append, "prestart c1")
    assert len(warned) == 1 and warned[0].startswith("prestart c1: ")
    assert "asks for no GPU" in warned[0] and str(tmp_path / "config.toml") in warned[0]
    with pytest.raises(InputError) as got:
        failsafe.gate(doc(["NVIDIA_VISIBLE_DEVICES=all"]), settings, error, warned.append, "x")
    message = got.value.message
    assert "\n" not in message and str(tmp_path / "config.toml") in message
    assert "acept-volume-mounts" in message and "did you mean accept-volume-mounts" in message
    assert "asks for a GPU (NVIDIA_VISIBLE_DEVICES)" in message and "fix the file" in message


def test_precreate_passes_a_no_gpu_config_through(tmp_path: Path) -> None:
    settings, error = load(tmp_path, "acept-volume-mounts = true\n")
    data = json.dumps(doc(["A=1"])).encode()
    assert precreate.transform(data, settings, error) == data
    gpu = json.dumps(doc(["NVIDIA_VISIBLE_DEVICES=0"])).encode()
    with pytest.raises(InputError, match="asks for a GPU"):
        precreate.transform(gpu, settings, error)
