"""Flags are checked where click reads them (gpuctk.clitypes): a host path refuses a relative
one, a CDI name, a capability list, a handler name, a resource name or an interval refuses what
its rule refuses; one message, exit 2 and nothing done, from the flag, from nvidia-ctk's
spelling of it, and from the variable click reads for it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuctk import errors
from gpuctk.cli import main

GENERATE = ["cdi", "generate", "--simulate", "h100-8", "--output", "out.json"]
RELATIVE = "must be an absolute path, got 'rel'"
# (argv, environment, the flag or variable the message names, what it says)
CASES = [
    ([*GENERATE, "--hook-path", "rel"], {}, "--hook-path", RELATIVE),
    ([*GENERATE, "--nvidia-cdi-hook-path", "rel"], {}, "--nvidia-cdi-hook-path", RELATIVE),
    (GENERATE, {"NVIDIA_CTK_CDI_HOOK_PATH": "rel"}, "NVIDIA_CTK_CDI_HOOK_PATH", RELATIVE),
    ([*GENERATE, "--library-mode", "folder", "--staging-dir", "rel"], {}, "--staging-dir",
     RELATIVE),
    (["system", "create-device-nodes", "--control-devices", "--dev-root", "rel"], {},
     "--dev-root", RELATIVE),
    (["system", "create-device-nodes", "--control-devices"], {"DEV_ROOT": "rel"}, "--dev-root",
     RELATIVE),
    (["system", "create-dev-char-symlinks", "--dev-char-path", "rel"], {}, "--dev-char-path",
     RELATIVE),
    (["cdi", "transform", "root", "--from", "rel", "--to", "/x", "in.json"], {}, "--from",
     RELATIVE),
    (["runtime", "configure", "--runtime-path", "rel", "--dry-run"], {}, "--runtime-path",
     RELATIVE),
    (["runtime", "configure", "--cdi-spec-dir", "rel", "--dry-run"], {}, "--cdi-spec-dir",
     RELATIVE),
    (["install", "--host-root", ".", "--prefix", "rel"], {}, "--prefix", RELATIVE),
    ([*GENERATE, "--vendor", "nvidia com"], {}, "--vendor", "example: --vendor nvidia.com"),
    ([*GENERATE, "--cdi-class", "g/pu"], {}, "--cdi-class", "example: --vendor nvidia.com"),
    (GENERATE, {"NVIDIA_CTK_CDI_GENERATE_VENDOR": "-x"}, "NVIDIA_CTK_CDI_GENERATE_VENDOR", ""),
    ([*GENERATE, "--driver-capabilities", "compute,bogus"], {}, "--driver-capabilities",
     "unknown capabilities bogus"),
    (["runtime", "configure", "--runtime-name", "runc", "--dry-run"], {}, "--runtime-name",
     "'runc' names an existing runtime"),
    (["runtime", "configure", "--runtime-name", "Nvidia", "--dry-run"], {}, "--runtime-name",
     "a Kubernetes RuntimeClass handler is a DNS label"),
    (["install", "--host-root", ".", "--runtime-name", "crun"], {}, "--runtime-name",
     "names an existing runtime"),
    (["device-plugin", "--simulate", "l4", "--list", "--health-interval", "0.01"], {},
     "--health-interval", "0.01"),
    (["device-plugin", "--simulate", "l4", "--list", "--resource-name", "gpu"], {},
     "--resource-name", "'gpu' must be DOMAIN/NAME"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "env", "named", "says"), CASES, ids=[c[2] for c in CASES])
def test_a_value_its_rule_refuses_is_a_usage_error_and_nothing_is_done(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    env: dict[str, str],
    named: str,
    says: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.json").write_text("{}")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    lines = capsys.readouterr().err.splitlines()
    assert stopped.value.code == errors.EXIT_USAGE, lines
    assert len(lines) == 2 and lines[0].startswith("gpuctk: error: "), lines
    assert named in lines[0] and says in lines[0], lines
    assert sorted(os.listdir(tmp_path)) == ["in.json"]  # nothing written
