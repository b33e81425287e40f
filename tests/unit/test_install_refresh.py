"""The waiting agent's refresh: `gpuctk install --wait` regenerates the spec and the /dev/char
links each --refresh-interval, and logs only what changed or failed.

The copied gpuctk is stood in for by a shell script in the record's bin folder (the host root is
`/`, so nothing is chrooted) that logs its arguments and answers as the real commands do.
"""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import pytest

from gpuctk.install import cli as install_cli
from gpuctk.install import host as install_host
from gpuctk.install.host import Record

FAKE = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/calls"
case "$1" in
cdi) cat "$(dirname "$0")/generate.err" >&2; exit "$(cat "$(dirname "$0")/generate.rc")" ;;
system) cat "$(dirname "$0")/links.json" ;;
esac
"""


def fake_gpuctk(tmp_path: Path, generate: str, rc: int, statuses: list[str]) -> Record:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "gpuctk"
    script.write_text(FAKE)
    script.chmod(0o755)
    (bin_dir / "generate.err").write_text(generate + "\n")
    (bin_dir / "generate.rc").write_text(f"{rc}\n")
    links = [{"status": s} for s in statuses]
    (bin_dir / "links.json").write_text(json.dumps({"links": links}))
    (bin_dir / "calls").write_text("")
    return Record(prefix="/usr/local/gpuctk", bin_dir=str(bin_dir), cdi_spec="/run/cdi/x.yaml")


def test_a_pass_with_nothing_new_logs_nothing(tmp_path: Path) -> None:
    record = fake_gpuctk(tmp_path, "gpuctk: /run/cdi/x.yaml unchanged: 3 devices", 0, ["unchanged"])
    assert install_host.refresh("/", record, ["--simulate", "l4"], "/run/nvidia/driver") == []
    generate, links = (Path(record.bin_dir) / "calls").read_text().splitlines()
    assert generate == (
        f"cdi generate --output /run/cdi/x.yaml --hook-path {record.bin_dir}/gpuctk-hook "
        "--simulate l4"
    )
    assert links == "system create-dev-char-symlinks --format json --driver-root /run/nvidia/driver"


def test_a_pass_logs_a_rewritten_spec_and_new_links(tmp_path: Path) -> None:
    record = fake_gpuctk(
        tmp_path, "gpuctk: wrote /run/cdi/x.yaml: 2 devices", 0, ["created", "unchanged"]
    )
    assert install_host.refresh("/", record, [], None) == [
        "wrote /run/cdi/x.yaml: 2 devices",
        "/dev/char: 1 link(s) made, 1 already right",
    ]
    calls = (Path(record.bin_dir) / "calls").read_text().splitlines()
    assert calls[1] == "system create-dev-char-symlinks --format json"


def test_a_failed_pass_is_a_warning_not_an_error(tmp_path: Path) -> None:
    record = fake_gpuctk(tmp_path, "gpuctk: error: NVML: driver not loaded", 3, [])
    (Path(record.bin_dir) / "links.json").write_text("not json")
    assert install_host.refresh("/", record, [], None) == [
        "warning: CDI spec refresh failed: NVML: driver not loaded",
        "warning: /dev/char links: unreadable answer from create-dev-char-symlinks",
    ]


def test_the_wait_ticks_until_sigterm(capsys: pytest.CaptureFixture[str]) -> None:
    main = threading.get_ident()
    ticks: list[int] = []

    def tick() -> None:
        ticks.append(1)
        if len(ticks) == 3:
            signal.raise_signal(signal.SIGTERM)  # blocked: pending until the next wait

    old = signal.pthread_sigmask(signal.SIG_BLOCK, install_cli.STOPS)
    watchdog = threading.Timer(10, lambda: signal.pthread_kill(main, signal.SIGINT))
    watchdog.start()
    try:
        got = install_cli._wait_for_signal(0.01, tick)
    finally:
        watchdog.cancel()
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    assert got == signal.SIGTERM and len(ticks) == 3
    assert "waiting for SIGTERM (refreshing every 0.01 s)" in capsys.readouterr().err


def test_refresh_interval_is_an_install_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from fixtures.containerd import gpuctk

    code, out, _ = gpuctk(capsys, "install", "--help")
    assert code == 0 and "--refresh-interval SECONDS" in out
    code, _, err = gpuctk(capsys, "install", "--refresh-interval", "-1")
    assert code == 2 and "--refresh-interval" in err


def test_a_stuck_pass_is_cut_short(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = fake_gpuctk(tmp_path, "", 0, [])
    script = Path(record.bin_dir) / "gpuctk"
    script.write_text("#!/bin/sh\nexec sleep 30\n")  # NVML init that never returns
    monkeypatch.setattr(install_host, "REFRESH_TIMEOUT", 0.2)
    lines = install_host.refresh("/", record, [], None)
    assert [x.split(":")[0] for x in lines] == ["warning", "warning"]
    assert "timed out" in lines[0] and "timed out" in lines[1]
