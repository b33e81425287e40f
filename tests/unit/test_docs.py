"""The documentation: README.md stays a short manual that starts with the two set-up commands,
every relative link in README.md and docs/*.md leads somewhere, and no file of the project
carries development history (those words belong in commit messages, not in what users read).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

MAX_README_LINES = 250
# The two commands CI checks (README's first ```sh block); only their start is fixed here.
SETUP = (
    "python3 -m venv .venv && .venv/bin/pip install -q . && .venv/bin/gpuctk cdi generate",
    "bash tests/run.sh",
)

# Development history, in any tracked text file. Spaces are written \s+ so that this file's
# own source never matches.
HISTORY = re.compile(
    r"\b(?:sessions?|issues?)\s+\d+\b"
    r"|\bwork\s+period"
    r"|\bearlier\s+figures\b"
    r"|\btried\s+and\s+not\s+kept\b",
    re.IGNORECASE,
)
# In README.md and docs/ (written for users, in the present tense), more words than that.
DOC_HISTORY = re.compile(
    r"\bpreviously\b|\bused\s+to\b|\bwas\s+changed\b|\bthis\s+round\b|\bno\s+longer\b"
    r"|\bearlier\s+(?:runs?|sessions?|versions?)\b|#\d+\b",
    re.IGNORECASE,
)
SCANNED_SUFFIXES = (".md", ".py", ".sh", ".toml", ".yaml", ".yml", ".service", ".txt")

FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+).*?\1")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def doc_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def fenced_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(info string, lines) of every fenced code block, in order."""
    blocks: list[tuple[str, list[str]]] = []
    fence: str | None = None
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                blocks.append((m.group(2), []))
        elif m and m.group(1).startswith(fence) and not m.group(2):
            fence = None
        else:
            blocks[-1][1].append(line)
    return blocks


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, inline code spans removed."""
    out: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None:
            if m and m.group(1).startswith(fence) and not m.group(2):
                fence = None
        else:
            out.append((number, INLINE_CODE.sub("", line)))
    return out


def heading_lines(path: Path) -> list[str]:
    """The heading titles, code spans kept (anchors are made from them)."""
    titles: list[str] = []
    fence: str | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            continue
        if fence is not None:
            if m and m.group(1).startswith(fence) and not m.group(2):
                fence = None
            continue
        h = HEADING.match(line)
        if h:
            titles.append(h.group(2))
    return titles


def github_anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found: set[str] = set()
    for title in heading_lines(path):
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def test_readme_is_a_short_manual() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines, at most {MAX_README_LINES}: move details to docs/"
    )


def test_readme_starts_with_the_two_set_up_commands() -> None:
    blocks = [b for info, b in fenced_blocks(README.read_text(encoding="utf-8")) if info == "sh"]
    assert blocks, "README.md has no ```sh block"
    first = blocks[0]
    assert len(first) == 2, f"README's first ```sh block must be the two set-up lines: {first}"
    for line, start in zip(first, SETUP, strict=True):
        assert line.startswith(start), f"{line!r} should start with {start!r}"


def test_fenced_blocks_are_closed() -> None:
    for path in doc_files():
        fence: str | None = None
        for line in path.read_text(encoding="utf-8").splitlines():
            m = FENCE.match(line)
            if fence is None and m:
                fence = m.group(1)
            elif fence is not None and m and m.group(1).startswith(fence) and not m.group(2):
                fence = None
        assert fence is None, f"{path.relative_to(ROOT)}: a code block is never closed"


def test_relative_links_lead_to_files_and_headings() -> None:
    problems: list[str] = []
    for path in doc_files():
        for number, line in prose_lines(path.read_text(encoding="utf-8")):
            for target in LINK.findall(line):
                if SCHEME.match(target):
                    continue  # https:, mailto:, ...
                where = f"{path.relative_to(ROOT)}:{number}: {target}"
                file_part, _, anchor = target.partition("#")
                linked = (path.parent / file_part).resolve() if file_part else path
                if not linked.exists():
                    problems.append(f"{where}: no such file")
                elif anchor and linked.suffix == ".md" and anchor not in github_anchors(linked):
                    problems.append(f"{where}: no heading #{anchor} in {linked.name}")
    assert not problems, "broken links:\n" + "\n".join(problems)


def history_hits(path: Path, pattern: re.Pattern[str]) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    return [
        f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
        for m in pattern.finditer(text)
    ]


def test_docs_are_written_in_the_present_tense() -> None:
    hits = [hit for path in doc_files() for hit in history_hits(path, DOC_HISTORY)]
    hits += [hit for path in doc_files() for hit in history_hits(path, HISTORY)]
    assert not hits, "development history in the docs:\n" + "\n".join(hits)


def tracked_files() -> list[Path]:
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    done = subprocess.run(
        [git, "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=False
    )
    if done.returncode != 0:
        pytest.skip("not a git checkout")
    names = [n for n in done.stdout.decode("utf-8", "replace").split("\0") if n]
    return [ROOT / n for n in names if n.endswith(SCANNED_SUFFIXES) or n.startswith("packaging/")]


def test_no_tracked_file_carries_development_history() -> None:
    hits = [
        hit for path in tracked_files() if path.is_file() for hit in history_hits(path, HISTORY)
    ]
    assert not hits, "development history (say it in the commit message):\n" + "\n".join(hits)
