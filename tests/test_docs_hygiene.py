"""The documentation speaks to users: no pointer into the project's internal work log, the
benchmark pages stay short, and every relative Markdown link (and its heading anchor) resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# built from pieces so that this file does not match its own pattern
WORK_LOG = re.compile(r"\b(" + "sess" + r"ion|" + "iss" + r"ue)[ -]#?[0-9]", re.IGNORECASE)
# a section number of the benchmark pages (they are organised by question, not numbered)
SECTION_POINTER = re.compile(r"benchmarks(/\w+)?\.md\W{0,4}" + "\u00a7")
SCANNED = ("docs", "README.md", "CHANGELOG.md", "labfbo", "examples", "tests", "benchmarks")
TEXT_SUFFIXES = {".md", ".py", ".txt", ".yaml", ".yml", ".html", ".toml", ".cfg", ".ini", ".rst",
                 ".sh", ".js", ".css", ".j2"}
MAX_BENCHMARK_LINES = 1199
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _text_files() -> list[Path]:
    files: list[Path] = []
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += [p for p in sorted(path.rglob("*")) if p.is_file() and p.suffix in TEXT_SUFFIXES
                      and not any(part.startswith(".") or part == "__pycache__" for part in p.parts)]
    return files


def _prose_lines(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = _slug(match.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _markdown_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_no_pointer_into_the_work_log():
    hits = []
    for path in _text_files():
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if WORK_LOG.search(line) or SECTION_POINTER.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not hits, "pointers into the internal work log:\n" + "\n".join(hits)


def test_benchmark_pages_are_short():
    pages = [ROOT / "docs" / "benchmarks.md", *sorted((ROOT / "docs" / "benchmarks").glob("*.md"))]
    total = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in pages if p.exists())
    assert total <= MAX_BENCHMARK_LINES, f"docs/benchmarks.md and docs/benchmarks/ have {total} lines"


@pytest.mark.parametrize("page", _markdown_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    broken = []
    for line in _prose_lines(page.read_text(encoding="utf-8")):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                continue  # http:, https:, mailto: ...
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            if not dest.exists():
                broken.append(f"{target}: no such file")
                continue
            docs = (ROOT / "docs").resolve()
            if anchor and dest.suffix == ".md" and docs in dest.parents and anchor not in _anchors(dest):
                broken.append(f"{target}: no heading with this anchor")
    assert not broken, f"broken links in {page.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_slug_matches_github():
    assert _slug("Each Buchwald–Hartwig lab alone") == "each-buchwaldhartwig-lab-alone"
    assert _slug("Suite `pmcbo` (PMCBO Tables 4–5)") == "suite-pmcbo-pmcbo-tables-45"
    assert _slug("ask() latency against a BoTorch loop") == "ask-latency-against-a-botorch-loop"
