"""The C's vocabulary (hook/cvocab.py): gpuctk_vocab.h holds the Python constants' values, as a C
compiler reads them; the C sources spell none of those words themselves and name no Python
function they would mirror; a changed constant changes the header."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fixtures.layout import REPO

from gpuctk.cdi.node import capabilities, facts
from gpuctk.cdi.specs import apply
from gpuctk.hook import cbuild, cvocab
from gpuctk.hook.verbs import cudacompat, ldmerge
from gpuctk.install import launchers

SOURCES = {path.name: path.read_text() for path in cbuild.SOURCES}
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)


def compiled_values(tmp_path: Path) -> dict[str, Any]:
    """Each name of the header -> its value, printed by a C program that includes it."""
    cc = cbuild.compiler()
    if not cc:
        pytest.skip("no C compiler")
    lines = ["#include <stdio.h>", f'#include "{cvocab.HEADER}"',
             "static void hex(const char *s) { while (*s) printf(\"%02x\", (unsigned char)*s++); }",
             "int main(void) {"]  # fmt: skip
    for name, value in cvocab.values().items():  # strings in hex: white space stays whole
        if isinstance(value, tuple):
            lines.append(f'for (int i = 0; i < {name}_COUNT; i++) {{ printf("%s {name} ", '
                         f'i ? "+" : "="); hex({name}[i]); printf("\\n"); }}')  # fmt: skip
        elif isinstance(value, str):
            lines.append(f'printf("= {name} "); hex({name}); printf("\\n");')
        else:
            lines.append(f'printf("= {name} %lld\\n", (long long)({name}));')
    (tmp_path / "probe.c").write_text("\n".join([*lines, "return 0; }", ""]))
    cvocab.write(tmp_path)
    exe, probe = tmp_path / "probe", tmp_path / "probe.c"
    subprocess.run([cc, *cbuild.WARNINGS, f"-I{tmp_path}", "-o", str(exe), str(probe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    found: dict[str, Any] = {}
    for line in out.splitlines():  # "= NAME value", "+ NAME value": a list's next element
        mark, name, text = line.split(" ", 2)
        if not isinstance(cvocab.values()[name], int):
            text = bytes.fromhex(text).decode("ascii")
        if mark == "+":
            found[name] = (*found[name], text)
        elif isinstance(cvocab.values()[name], tuple):
            found[name] = (text,)
        else:
            found[name] = int(text) if isinstance(cvocab.values()[name], int) else text
    return found


def test_the_header_holds_the_python_constants(tmp_path: Path) -> None:
    got = compiled_values(tmp_path)
    assert got["GPUCTK_CAPS"] == capabilities.ALL
    assert got["GPUCTK_CAPS_DEFAULT"] == 0b11  # utility and compute: bits 0 and 1 of ALL
    assert got["GPUCTK_CAPS_BLANKS"] == capabilities.BLANKS == " \t\n\r\x0b\x0c"
    assert got["GPUCTK_HOOK_VERB"] == facts.HOOK_VERB == "createContainer"
    assert got["GPUCTK_LINK_FOR_OPT"] == facts.LINK_FOR_OPT == "--link-for"
    assert got["GPUCTK_MAX_CACHE"] == ldmerge.MAX_CACHE
    assert got["GPUCTK_COMPAT_CONF"] == cudacompat.COMPAT_CONF
    assert got["GPUCTK_LAUNCHER_MARK"] == launchers.LAUNCHER_MARK
    assert set(got["GPUCTK_HOOK_STAGES"]) == apply.HOOK_STAGES
    assert f"{got['GPUCTK_LD_CACHE_DIR']}/{got['GPUCTK_LD_CACHE_NAME']}" == ldmerge.LD_CACHE
    for name, source, take in cvocab.WORDS:  # every value taken whole: the constant itself
        module, _, attr = source.rpartition(".")
        if not take:
            assert got[name] == getattr(importlib.import_module(module), attr), name
    assert set(got) == {name for name, _, _ in cvocab.WORDS}


def test_the_c_spells_no_word_of_the_vocabulary() -> None:
    words = [w for v in cvocab.values().values() if not isinstance(v, int)
             for w in (v if isinstance(v, tuple) else (v,))]  # fmt: skip
    assert "--link" in words and "compute" in words and "createContainer" in words
    words = [w for w in words if len(w) > 1]  # a one-character separator is JSON's too
    for file, text in SOURCES.items():
        spelled = sorted({w for w in words if f'"{w}"' in text})
        assert not spelled, f"hook/{file} spells {spelled}: name them from {cvocab.HEADER}"
    assert f'#include "{cvocab.HEADER}"' in SOURCES["cdihook.c"]
    code = "".join(COMMENT.sub("", text) for text in SOURCES.values())
    unused = [name for name, _, _ in cvocab.WORDS if not re.search(rf"\b{name}\b", code)]
    assert not unused, f"names {cvocab.HEADER} has and the C does not use: {unused}"


def test_no_c_comment_names_a_python_function_it_mirrors() -> None:
    named = []
    for file, text in SOURCES.items():
        for comment in COMMENT.findall(text):
            for dotted in re.findall(r"\bgpuctk(?:\.\w+)+", comment):
                module, _, attr = dotted.rpartition(".")
                try:
                    obj = getattr(importlib.import_module(module), attr, None)
                except ImportError:
                    continue  # a module's name: what the C works with, not what it copies
                if callable(obj):
                    named.append(f"hook/{file}: {dotted}")
    assert not named, named


def test_a_changed_constant_changes_the_header(monkeypatch: pytest.MonkeyPatch) -> None:
    before = cvocab.header()
    assert cvocab.header() == before  # the same constants, the same bytes
    monkeypatch.setattr(capabilities, "ALL", (*capabilities.ALL, "fabric"))
    monkeypatch.setattr(ldmerge, "MAX_CACHE", 8 << 20)
    monkeypatch.setattr(facts, "LINK_OPT", "--symlink")
    after = cvocab.header()
    assert after != before
    assert '"compat32", "fabric" };\n#define GPUCTK_CAPS_COUNT 8\n' in after
    assert "#define GPUCTK_MAX_CACHE 8388608\n" in after
    assert '#define GPUCTK_LINK_OPT "--symlink"\n' in after
    monkeypatch.undo()
    assert cvocab.header() == before


def test_the_header_says_where_each_value_comes_from_and_is_no_source_file() -> None:
    text = cvocab.header()
    for name, source, _ in cvocab.WORDS:
        line = f"/* generated by hook/cvocab.py from {source}; do not edit */\n"
        assert line in text and re.search(rf"(#define|\*const) {name}\b", text), name
    assert json.dumps(text).isascii()
    assert not list(REPO.glob(f"*/{cvocab.HEADER}")) and not (REPO / cvocab.HEADER).exists()
