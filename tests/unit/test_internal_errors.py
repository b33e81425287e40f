"""A bug in the shim or the hook: its traceback always reaches the log file (the engine's
`--log`, the config's `log-file`, GPUCTK_HOOK_LOG), the one-line reason stays the last line
the engine reads, and stderr carries the traceback only with `--debug`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuctk.hook import config
from gpuctk.hook.requests import failsafe
from gpuctk.hook.shim import runtime_main
from gpuctk.hook.verbs import hook_main


def boom(*_: object, **__: object) -> None:
    raise RuntimeError("boom")


@pytest.mark.parametrize("debug", [False, True])
def test_the_shim_logs_a_bug_s_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], debug: bool
) -> None:
    monkeypatch.setattr(runtime_main, "inject", boom)
    monkeypatch.setattr(failsafe, "load", lambda: (config.Settings(), None))  # the defaults
    log = tmp_path / "engine.log"
    args = ["--log", str(log), "--log-format", "json", *(["--debug"] if debug else []),
            "create", "--bundle", str(tmp_path), "ctr"]  # fmt: skip
    status, _, _ = runtime_main.prepare(args)
    assert status == 1
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    errors = [line["msg"] for line in lines if line["level"] == "error"]
    assert errors[-1] == "gpuctk-runtime: internal error: RuntimeError: boom"
    (trace,) = [m for m in errors if m.startswith("traceback: ")]
    assert "Traceback (most recent call last)" in trace and "in boom" in trace
    err = capsys.readouterr().err
    assert "gpuctk-runtime: internal error: RuntimeError: boom" in err
    assert ("Traceback" in err) == debug


@pytest.mark.parametrize("debug", [False, True])
def test_the_hook_logs_a_bug_s_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], debug: bool
) -> None:
    log = tmp_path / "hook.log"
    monkeypatch.setenv("GPUCTK_HOOK_LOG", str(log))
    monkeypatch.setenv("GPUCTK_HOOK_LOG_LEVEL", "error")  # the traceback is written whatever it is
    monkeypatch.setattr(hook_main, "_run", boom)
    codes: list[int] = []
    hook_main.main(["createContainer", *(["--debug"] if debug else [])], exit=codes.append)
    assert codes == [1]
    text = log.read_text()
    assert "traceback: Traceback (most recent call last)" in text and "in boom" in text
    assert text.splitlines()[-1].endswith('msg="gpuctk-hook: internal error: RuntimeError: boom"')
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == "gpuctk-hook: internal error: RuntimeError: boom"
    assert ("Traceback" in err) == debug
