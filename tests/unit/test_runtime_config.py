"""gpuctk-runtime configuration (hook.config), runc-format logging (gpuctk.log), argv parsing."""

from __future__ import annotations

import io
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuctk.errors import InputError, ValidationError
from gpuctk.hook import config
from gpuctk.hook.shim.runtime_main import parse_argv
from gpuctk.jsonfast import dumps, loads
from gpuctk.log import RuncLog, format_line, rfc3339


def test_defaults_when_the_default_file_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the default path, made one that does not exist (a host may have the deb's file)
    monkeypatch.setattr(config, "DEFAULT_PATH", str(tmp_path / "etc" / "config.toml"))
    s = config.load({})
    assert s.runtimes == ("runc", "crun")
    assert s.spec_dirs == ("/etc/cdi", "/var/run/cdi")
    assert s.default_kind == "nvidia.com/gpu" and s.device_list_kinds == ()
    assert s.annotation_prefixes == ("cdi.k8s.io/",)
    assert s.accept_envvar_unprivileged is None and s.accept_volume_mounts is False  # auto
    assert (s.log_file, s.log_level, s.source) == ("", "info", "")


def test_named_file_must_exist(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="named by GPUCTK_CONFIG"):
        config.load({"GPUCTK_CONFIG": str(tmp_path / "nope.toml")})


def test_full_file(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        "# gpuctk\n"
        'runtimes = ["/usr/sbin/runc", "crun"]  # first found\n'
        "spec-dirs = ['/etc/cdi']\n"
        'default-kind = "example.com/gpu"\n'
        'device-list-kinds = ["nvidia.com/nic"]\n'
        "annotation-prefixes = [\"cdi.k8s.io/\", 'x/',]\n"
        "accept-envvar-unprivileged = false\n"
        "accept-volume-mounts = true\n"
        'log-file = ""\n'
        '\tlog-level = "debug"\r\n'
    )
    s = config.load({"GPUCTK_CONFIG": str(path)})
    assert s.runtimes == ("/usr/sbin/runc", "crun")
    assert s.spec_dirs == ("/etc/cdi",)
    assert s.default_kind == "example.com/gpu" and s.device_list_kinds == ("nvidia.com/nic",)
    assert s.annotation_prefixes == ("cdi.k8s.io/", "x/")
    assert s.accept_envvar_unprivileged is False and s.accept_volume_mounts is True
    assert s.log_level == "debug" and s.source == str(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('runtime = ["runc"]', "runtime: unknown key"),
        ('runtimes = "runc"', "runtimes: must be a list of strings"),
        ("runtimes = []", "name at least one runtime"),
        ('runtimes = ["bin/runc"]', "must be a name or an absolute path"),
        ('spec-dirs = ["cdi"]', "must be an absolute path"),
        ('accept-volume-mounts = "yes"', "must be true or false"),
        ('accept-envvar-unprivileged = "yes"', 'must be true, false or "auto"'),
        ("accept-envvar-unprivileged = 1", 'must be true, false or "auto"'),
        ('default-kind = "gpu"', "default-kind: invalid kind"),
        ('device-list-kinds = "nvidia.com/nic"', "device-list-kinds: must be a list of strings"),
        ('device-list-kinds = ["nic"]', "device-list-kinds: invalid kind 'nic'"),
        ('log-level = "trace"', "not one of debug, info, warning, error"),
        ('log-file = "gpuctk.log"', "must be an absolute path"),
        ("log-level = 3", "log-level: must be a string"),
        ("[runtime]\nx = 1", "runtime: unknown key"),
        ("runtimes = [", "invalid TOML"),
        ("a = 1\na = 2", "invalid TOML"),
    ],
)
def test_bad_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ValidationError, match=message):
        config.load({"GPUCTK_CONFIG": str(path)})


@pytest.mark.parametrize(
    ("text", "value"),
    [("", None), ('accept-envvar-unprivileged = "auto"', None),
     ("accept-envvar-unprivileged = true", True), ("accept-envvar-unprivileged = false", False)],
)  # fmt: skip
def test_envvar_setting_is_tri_state(text: str, value: bool | None) -> None:
    """Unset and "auto" mean auto (None: gpuctk.hook.requests.devices.env_allowed decides per
    container); true and false are taken as written."""
    assert config.parse(text, "c.toml").accept_envvar_unprivileged is value


def test_every_problem_is_listed() -> None:
    with pytest.raises(ValidationError) as err:
        config.parse('x = 1\nlog-level = "no"\nruntimes = []', "c.toml")
    assert len(err.value.problems) == 3 and "(and 2 more)" in str(err.value)


_plain = st.text(alphabet="ab/._ -é#=[],'\"", max_size=6)  # mostly inside the subset
_text = st.one_of(_plain, _plain, st.text(st.characters(codec="utf-8"), max_size=4))
_value = st.one_of(st.booleans(), _text, _text, st.lists(_text, max_size=3), st.integers(-5, 5))


def _render(value: Any, quote: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return quote + value + quote
    return "[" + ", ".join(_render(v, quote) for v in value) + "]"


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["runtimes", "log-level", "a_b", "x", "y", "z-1", "x y", "k.j", '"q"']),
            _value,
            st.sampled_from(['"', "'"]),
            st.sampled_from(["", "", "", " # c", "#c", "  ", " x", " #\x01"]),
            st.sampled_from(["", "  ", "\t"]),
        ),
        max_size=4,
    ),
    st.sampled_from(["\n", "\r\n"]),
)
def test_simple_parser_agrees_with_tomllib(lines: list[Any], newline: str) -> None:
    """Whatever the fast subset parser accepts, tomllib parses to the same table."""
    text = newline.join(
        f"{indent}{key} = {_render(value, quote)}{tail}"
        for key, value, quote, tail, indent in lines
    )
    mine = config.parse_simple(text)
    try:
        theirs = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        assert mine is None
        return
    if mine is not None:
        assert mine == theirs


def test_simple_parser_handles_the_usual_file_without_tomllib() -> None:
    text = 'runtimes = ["runc"]\nlog-file = ""\naccept-volume-mounts = false # off\n'
    assert config.parse_simple(text) == {
        "runtimes": ["runc"],
        "log-file": "",
        "accept-volume-mounts": False,
    }
    for hard in ('x = "a\\"b"', "x = 1", "[t]", 'x = """a"""', "a.b = true", "x = [\n]"):
        assert config.parse_simple(hard) is None


def test_rfc3339() -> None:
    stamp = rfc3339(0)
    assert stamp[:4] == "1970" and stamp[10] == "T"
    assert stamp.endswith("Z") or stamp[-6] in "+-"


def test_log_formats() -> None:
    line = format_line("error", 'bad "thing"\n', "text", now=0)
    assert line.startswith('time="') and line.endswith(' level=error msg="bad \\"thing\\"\\n"\n')
    doc = json.loads(format_line("warning", 'é "x"\x01', "json", now=0))
    assert list(doc) == ["level", "msg", "time"]
    assert doc["level"] == "warning" and doc["msg"] == 'é "x"\x01'


def test_log_destinations(tmp_path: Path) -> None:
    engine, extra, err = tmp_path / "log.json", tmp_path / "gpuctk.log", io.StringIO()
    log = RuncLog(str(engine), "json", stderr=err)
    log.configure(str(extra), "info")
    log.debug("hidden")
    log.info("hello")
    log.error("it failed")
    lines = [json.loads(x) for x in engine.read_text().splitlines()]
    assert [(x["level"], x["msg"]) for x in lines] == [("info", "hello"), ("error", "it failed")]
    assert extra.read_text().count("gpuctk-runtime: ") == 2
    assert err.getvalue() == "it failed\n"  # plain, as runc's fatal() when logging to a file
    quiet = RuncLog(str(engine), "text", stderr=io.StringIO())
    quiet.configure("", "warning")
    quiet.info("not logged")
    assert "not logged" not in engine.read_text()
    debug = RuncLog(str(engine), "text", level="debug", stderr=io.StringIO())
    debug.configure("", "error")
    debug.debug("logged with --debug")
    assert "logged with --debug" in engine.read_text()
    # no --log: runc logs to stderr in its format
    err = io.StringIO()
    RuncLog(None, "text", stderr=err).error("boom")
    assert err.getvalue().endswith('level=error msg="boom"\n')


@pytest.mark.parametrize(
    ("argv", "verb", "bundle", "container"),
    [
        (["create", "--bundle", "/b", "id"], "create", "/b", "id"),
        (["create", "--bundle=/b", "id"], "create", "/b", "id"),
        (["create", "-b", "/b", "id"], "create", "/b", "id"),
        (["create", "-b=/b", "id"], "create", "/b", "id"),
        (["create", "-bundle", "/b", "id"], "create", "/b", "id"),
        (["create", "id", "--bundle", "/b"], "create", "/b", "id"),
        (["create", "-b/b", "id"], "create", "/b", "id"),  # crun's attached form
        (["create", "--pid-file", "/p", "--console-socket", "/s", "id"], "create", "", "id"),
        (["create", "--bundle", "/a", "--bundle", "/b", "id"], "create", "/b", "id"),
        (["--root", "/r", "--log", "/l", "--log-format", "json", "run", "-d", "x"], "run", "", "x"),
        (["--systemd-cgroup", "--debug", "state", "x"], "state", "", "x"),
        (["--version"], "", "", ""),
        (["--", "create", "x"], "create", "", "x"),
    ],
)
def test_parse_argv(argv: list[str], verb: str, bundle: str, container: str) -> None:
    inv = parse_argv(argv)
    assert (inv.verb, inv.bundle, inv.container) == (verb, bundle, container)


def test_parse_argv_globals_and_config_name() -> None:
    inv = parse_argv(["--log=/l.json", "--log-format=json", "--debug", "create", "-f", "c.json"])
    assert (inv.log, inv.log_format, inv.debug, inv.config_name) == (
        "/l.json",
        "json",
        True,
        "c.json",
    )


def test_json_codec_round_trip() -> None:
    doc = {"a": [1, 2.5, "é\n\x00", None, True, {}], "b": 10**20, "c": -0.0}
    assert loads(dumps(doc).decode()) == doc
    assert dumps({"é": "ü"}) == '{"é":"ü"}'.encode()
    assert loads(' \n{"a": 1} \t') == {"a": 1}
    assert dumps(loads('"\\ud800"')) == b'"\\ud800"'  # lone surrogate: escaped, not mangled
    for bad in ("", "{", '{"a": NaN}', "[1] x", '{"a": 1,}', "nul"):
        with pytest.raises(ValueError):
            loads(bad)


def test_a_creates_warning_names_its_container(tmp_path: Path) -> None:
    engine, extra = tmp_path / "engine.log", tmp_path / "gpuctk.log"
    log = RuncLog(str(engine), "text", stderr=io.StringIO())
    log.configure(str(extra), "info")
    log.container = "ctr1"
    log.warning("a note")
    log.warning("gpuctk-runtime: a prefixed note")
    log.info("ctr1: injected x")
    assert "ctr1: a" not in engine.read_text()  # the engine's log is this container's alone
    assert 'msg="gpuctk-runtime: a prefixed note"' in engine.read_text()
    assert [x.split("msg=")[1] for x in extra.read_text().splitlines()] == [
        '"gpuctk-runtime: ctr1: a note"',
        '"gpuctk-runtime: ctr1: a prefixed note"',
        '"gpuctk-runtime: ctr1: injected x"',
    ]
