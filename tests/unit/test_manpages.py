"""packaging/deb/manpages.py: a man page for every command the click tree has (and for
gpuctk-runtime and gpuctk-hook), each one `man` reads without a warning; build.py ships them
with docs/*.md, which each page's SEE ALSO and each --help's Details line name."""

from __future__ import annotations

import gzip
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fixtures.layout import REPO
from test_help_details import ALL

DEB = REPO / "packaging" / "deb"
REQUESTS = re.compile(r"^\.(TH|SH|SS|TP|PP|nf|fi|B)( |$)")


def _script(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"deb_{name}", DEB / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("man1")
    _script("manpages").write(out, "0.1.0")
    return out


def test_every_command_has_a_page(pages: Path) -> None:
    want = {"-".join(["gpuctk", *words]) for words in ALL} | {"gpuctk-runtime", "gpuctk-hook"}
    assert {p.name.removesuffix(".1.gz") for p in pages.iterdir()} == want
    generate = gzip.decompress((pages / "gpuctk-cdi-generate.1.gz").read_bytes()).decode()
    assert "\\fB\\-\\-library\\-mode MODE\\fR" in generate  # its options, from click
    assert "/usr/share/doc/gpuctk/commands.md#gpuctk\\-cdi\\-generate" in generate
    shim = gzip.decompress((pages / "gpuctk-runtime.1.gz").read_bytes()).decode()
    assert "create" in shim and "gpuctk runtime configure" in shim  # the program and the group


def test_every_page_is_sound_roff(pages: Path) -> None:
    for page in sorted(pages.iterdir()):
        text = gzip.decompress(page.read_bytes()).decode()
        assert text.startswith('.TH "'), page.name
        assert ".SH NAME\n" in text and ".SH SEE ALSO\n" in text, page.name
        for line in text.splitlines():  # no text line read as a request by accident
            assert not line.startswith((".", "'")) or REQUESTS.match(line), (page.name, line)


@pytest.mark.skipif(shutil.which("man") is None, reason="man is not installed")
def test_man_reads_every_page(pages: Path) -> None:
    env = dict(os.environ, MANWIDTH="80")
    for page in sorted(pages.iterdir()):
        done = subprocess.run(["man", "--warnings=all", "-l", str(page)], env=env,
                              capture_output=True, text=True, check=False)  # fmt: skip
        assert done.returncode == 0 and not done.stderr, (page.name, done.stderr)
        shown = re.sub(".\b", "", done.stdout)  # no overstrike (bold) when piped
        title = page.name.removesuffix(".1.gz").upper() + "(1)"
        assert shown.rstrip().endswith(title), page.name  # the footer: the title in full
        assert "\nNAME\n" in shown and "\nSEE ALSO\n" in shown, page.name


def test_the_package_ships_the_pages_and_the_docs() -> None:
    build = _script("build")
    files = build.static_files("amd64")
    for doc in (REPO / "docs").glob("*.md"):
        assert files[f"/usr/share/doc/gpuctk/{doc.name}"] == doc.read_text()
    assert "/usr/share/doc/gpuctk/commands.md" in files
    assert build.MANPAGES == DEB / "manpages.py"
    assert (
        'run([str(venv_py), "-I", str(MANPAGES), str(mandir), version]'
        in (DEB / "build.py").read_text()
    )
