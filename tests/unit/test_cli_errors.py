"""Usage errors, --help, --version and the exit-code table, through the INSTALLED launchers.

The launchers are written by gpuctk.install.launchers into a temporary folder for the packaged,
non-editable venv (fixtures.appvenv, built once per source state): `gpuctk-runtime` is the sh
front, so what is tested is what an operator runs. Every leaf command of the click tree is
walked, so a new command is covered without a line here.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from fixtures.appvenv import run_installed

from gpuctk import __version__, errors
from gpuctk.cli import cli

ROOT = Path(__file__).resolve().parents[2]
MAX_HELP_LINES = 40
BOGUS = "--no-such-flag-anywhere"


def leaf_commands() -> Iterator[list[str]]:
    """Every leaf command path below `gpuctk`, from the click tree."""

    def walk(command: click.Command, path: list[str], parent: click.Context | None) -> Iterator:
        ctx = click.Context(command, info_name=path[-1], parent=parent)
        if not isinstance(command, click.Group):
            yield path[1:]
            return
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None, name
            yield from walk(sub, [*path, name], ctx)

    yield from walk(cli, ["gpuctk"], None)


LEAVES = [" ".join(path) for path in leaf_commands()]


def run(installed_bin: Path, name: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_installed(installed_bin, name, *args, **{"PATH": "/usr/bin:/bin", **env})


def assert_usage_error(done: subprocess.CompletedProcess[str], prog: str, path: str) -> str:
    """Exit 2, and exactly two stderr lines: the error and the --help hint. The message."""
    lines = done.stderr.splitlines()
    assert done.returncode == errors.EXIT_USAGE, done.stderr
    assert len(lines) == 2, done.stderr
    assert lines[0].startswith(f"{prog}: error: "), done.stderr
    assert lines[1] == f"Try '{path} --help'.", done.stderr
    return lines[0]


def test_the_tree_is_walked() -> None:
    assert "cdi generate" in LEAVES and "doctor" in LEAVES and "runtime configure" in LEAVES


@pytest.mark.parametrize("path", LEAVES)
def test_help_is_short_and_starts_with_usage(installed_bin: Path, path: str) -> None:
    done = run(installed_bin, "gpuctk", *path.split(), "--help")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"Usage: gpuctk {path} "), lines[0]
    assert len(lines) <= MAX_HELP_LINES, f"gpuctk {path} --help: {len(lines)} lines"


@pytest.mark.parametrize("path", LEAVES)
def test_an_unknown_option_is_a_two_line_usage_error(installed_bin: Path, path: str) -> None:
    message = assert_usage_error(
        run(installed_bin, "gpuctk", *path.split(), BOGUS), "gpuctk", f"gpuctk {path}"
    )
    assert BOGUS in message


@pytest.mark.parametrize(
    ("args", "path", "needle"),
    [
        ([BOGUS], "gpuctk", BOGUS),  # the root's own option
        (["cdi", "no-such-command"], "gpuctk cdi", "no-such-command"),  # unknown subcommand
        (["no-such-command"], "gpuctk", "no-such-command"),
        (["cdi", "validate"], "gpuctk cdi validate", "Missing argument"),  # missing argument
        (["cdi", "generate", "--mode", "x"], "gpuctk cdi generate", "'x'"),  # bad choice
        (["install", "--refresh-interval", "-1"], "gpuctk install", "--refresh-interval"),
        (["cdi", "generate", "--output"], "gpuctk cdi generate", "--output"),  # no value
        # gpuctk's own UsageError, raised by the command: the hint names the command too
        (
            ["cdi", "generate", "--simulate", "h100-8", "--hook-path", "relative"],
            "gpuctk cdi generate",
            "--hook-path",
        ),
    ],
)
def test_every_kind_of_usage_error(
    installed_bin: Path, args: list[str], path: str, needle: str
) -> None:
    assert needle in assert_usage_error(run(installed_bin, "gpuctk", *args), "gpuctk", path)


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("gpuctk-runtime", []),  # no verb
        ("gpuctk-runtime", [BOGUS]),  # flags but no verb
        ("gpuctk-runtime", ["create", "--bundle"]),  # the shim reads --bundle: it needs a value
        ("gpuctk-hook", []),
        ("gpuctk-hook", [BOGUS]),
        ("gpuctk-hook", ["createContainer", "--link"]),
    ],
)
def test_runtime_and_hook_usage_errors(installed_bin: Path, name: str, args: list[str]) -> None:
    assert_usage_error(run(installed_bin, name, *args), name, name)


@pytest.mark.parametrize("name", ["gpuctk-runtime", "gpuctk-hook"])
def test_runtime_and_hook_help(installed_bin: Path, name: str) -> None:
    done = run(installed_bin, name, "--help")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"Usage: {name} [OPTIONS] ") or lines[0].startswith(
        f"Usage: {name} [GLOBAL OPTIONS] "
    ), lines[0]
    assert len(lines) <= MAX_HELP_LINES
    assert "gpuctk." not in done.stdout, "no internal module names in --help"
    assert all(len(line) <= 80 for line in lines if "docs/" not in line), done.stdout


def test_versions(installed_bin: Path, tmp_path: Path) -> None:
    want = f"version {__version__}"
    assert run(installed_bin, "gpuctk", "--version").stdout.strip() == f"gpuctk {want}"
    assert run(installed_bin, "gpuctk-hook", "--version").stdout.strip() == f"gpuctk-hook {want}"
    # the shim's line first, then the low-level runtime's (here `true`, which prints nothing)
    true = next(p for p in ("/usr/bin/true", "/bin/true") if os.access(p, os.X_OK))
    config = tmp_path / "config.toml"
    config.write_text(f'runtimes = ["{true}"]\n')
    done = run(
        installed_bin,
        "gpuctk-runtime",
        "--version",
        GPUCTK_CONFIG=str(config),
        GPUCTK_STATE_DIR=str(tmp_path / "state"),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"gpuctk-runtime {want}"


def readme_exit_codes() -> dict[int, str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    return {
        int(m.group(1)): m.group(2).strip()
        for m in re.finditer(r"^\| (\d+) \| (.*) \|$", section, re.MULTILINE)
    }


def docstring_exit_codes() -> dict[int, str]:
    doc = errors.__doc__ or ""
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^ {4}(\d) {2}(.*)$", doc, re.M)}


def test_one_exit_code_table() -> None:
    constants = {
        getattr(errors, n): n for n in dir(errors) if n.startswith("EXIT_")
    }  # value -> name
    assert len(constants) == len([n for n in dir(errors) if n.startswith("EXIT_")])
    readme = readme_exit_codes()
    assert set(readme) == set(constants), "README's Exit codes table vs gpuctk/errors.py"
    assert readme == docstring_exit_codes(), "README's table vs gpuctk/errors.py's docstring"
    for cls in (errors.UsageError, errors.NvmlError, errors.InputError, errors.OutputError):
        assert cls.exit_code in readme
    assert errors.NoDevicesError.exit_code in readme and errors.RequestError.exit_code in readme


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["cdi", "generate", "--simulate", "h100-8", BOGUS], errors.EXIT_USAGE),
        (["cdi", "validate", "/nonexistent.yaml"], errors.EXIT_INPUT),
    ],
)
def test_exit_codes_of_the_table(installed_bin: Path, args: list[str], code: int) -> None:
    done = run(installed_bin, "gpuctk", *args)
    assert done.returncode == code, done.stderr
    assert done.stderr.startswith("gpuctk: error: "), done.stderr


def test_usage_hint_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    """The same edge in this interpreter (for coverage where no system python exists)."""
    from gpuctk.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["cdi", "list", BOGUS])
    assert exit_.value.code == errors.EXIT_USAGE
    assert capsys.readouterr().err.splitlines()[1] == "Try 'gpuctk cdi list --help'."
