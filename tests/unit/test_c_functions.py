"""The C that runs as root (hook/*.c, gpuctk-cdi-hook), as a reviewer reads it: no function over
MAX_LINES lines, from the line that names it to its closing brace (a longer one does more than
one step of the work and is split into named helpers). The scan matches braces with comments,
strings, character constants and preprocessor lines taken out; the Python rule is
tests/unit/test_module_text.py's."""

from __future__ import annotations

import re

from fixtures.layout import REPO

MAX_LINES = 100
TOKENS = re.compile(
    r"""/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'|^[ \t]*#[^\n]*(?:\\\n[^\n]*)*""",
    re.DOTALL | re.MULTILINE,
)
NAME = re.compile(r"(\w+)\s*\($")


def blank(text: str) -> str:
    """`text` with comments, literals and preprocessor lines made spaces (newlines kept)."""
    return TOKENS.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)


def functions(text: str) -> dict[str, int]:
    """Each function defined in `text` -> its length in lines."""
    code = blank(text)
    found: dict[str, int] = {}
    depth, head_start, open_at, name = 0, 0, 0, ""
    for i, ch in enumerate(code):
        if ch == "{":
            if depth == 0:
                head = code[head_start:i]  # what stands before the brace since the last ; or }
                paren = head.find("(")
                match = NAME.search(head[: paren + 1]) if paren >= 0 else None
                plain = not head.lstrip().startswith(("struct", "enum", "union"))
                name = match.group(1) if match and plain and "=" not in head[:paren] else ""
                if name:  # counted from the start of the line that names it
                    open_at = code.rfind("\n", 0, head_start + match.start(1)) + 1
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                if name:
                    found[name] = code.count("\n", open_at, i) + 1
                head_start, name = i + 1, ""
        elif ch == ";" and depth == 0:
            head_start = i + 1
    assert depth == 0, "unbalanced braces"
    return found


def test_the_scan_measures_functions() -> None:
    body = "\n".join(["\tx++;"] * 101)
    text = (
        '#include <stdio.h>\nstruct s { int a; };\nstatic const char *t = "{";\n'
        "/* } { */\nstatic int\nlong_one(int x)\n{\n" + body + "\n\treturn '}';\n}\n"
        "int short_one(void) { return 0; }\nstatic int v[] = { 1, 2 };\n"
    )
    assert functions(text) == {"long_one": 105, "short_one": 1}


def test_no_c_function_is_over_the_limit() -> None:
    sizes = {
        f"{path.relative_to(REPO)}:{name}": n
        for path in sorted((REPO / "hook").glob("*.c"))
        for name, n in functions(path.read_text()).items()
    }
    assert "hook/cdihook.c:main" in sizes and len(sizes) > 50  # the scan found the functions
    over = {where: n for where, n in sizes.items() if n > MAX_LINES}
    assert not over, f"split these C functions (at most {MAX_LINES} lines): {over}"
