"""The code cites the design where it now lives (issue 42): the README is a short map, and the text the code points to
is in docs/. Every `docs/X.md` a source file names exists, every `#anchor` after it is one of that page's headings, and
every quoted section after it (`docs/design.md, "Verdict rules"`) begins one of its headings; no code string cites a
README section any more."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CITE = re.compile(r"docs/([\w.-]+\.md)(#[\w-]+)?(?:'s)?(?:,\s*(?:§(\d+)|[\"“]([^\"”\n]+)[\"”]))?")
# a README section cited by name: "README, ...", "the README's ...", "(README)"; README.md as a file, or the install
# line's "README: the torch pin" (the README still holds it), is not
README_SECTION = re.compile(r"README(?!\.md|: )")
# files other sessions were editing when the citations moved (2026-12-05): each may keep at most this many
LEFT: dict[str, int] = {}


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped but hyphens, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(page: Path) -> list[str]:
    return [line.lstrip("#").strip() for line in page.read_text().splitlines() if re.match(r"#{1,6} ", line)]


def sources() -> list[Path]:
    found = [p for folder in ("engine", "dashboard", "tests") for p in sorted((ROOT / folder).rglob("*.py"))]
    return [p for p in found if p != Path(__file__).resolve()]  # this file's made-up citations are its own test


def citations(text: str) -> list[tuple[str, str | None, str | None, str | None]]:
    return [m.groups() for m in CITE.finditer(text)]


def broken(path: Path, cited: tuple[str, str | None, str | None, str | None]) -> str | None:
    """Why one citation does not resolve, or None."""
    name, fragment, number, section = cited
    page = ROOT / "docs" / name
    if not page.is_file():
        return f"docs/{name} does not exist"
    found = headings(page)
    if fragment and fragment[1:] not in {anchor(h) for h in found}:
        return f"docs/{name} has no heading {fragment}"
    if number and not any(h.startswith(f"{number}. ") for h in found):
        return f"docs/{name} has no §{number}"
    if section and not any(h.lower().startswith(section.lower()) for h in found):
        return f"docs/{name} has no heading beginning {section!r}"
    return None


def test_every_docs_page_and_section_the_code_cites_exists():
    bad = [
        f"{p.relative_to(ROOT)}: {why}" for p in sources() for c in citations(p.read_text()) if (why := broken(p, c))
    ]
    assert not bad, "\n".join(bad)
    assert sum(len(citations(p.read_text())) for p in sources()) > 40  # the check sees the citations


def test_no_code_string_cites_a_readme_section():
    over = []
    for path in (p for p in sources() if p.parts[len(ROOT.parts)] in ("engine", "dashboard")):
        rel = path.relative_to(ROOT).as_posix()
        found = len(README_SECTION.findall(path.read_text()))
        if found > LEFT.get(rel, 0):
            over.append(f"{rel}: {found} README citations (at most {LEFT.get(rel, 0)})")
    assert not over, "\n".join(over)


def test_the_checks_find_what_is_broken():
    """The checks themselves, on made-up citations."""
    assert anchor("Verdict rules of the second CPU study (written 2026-12-03, before it runs)") == (
        "verdict-rules-of-the-second-cpu-study-written-2026-12-03-before-it-runs"
    )
    assert anchor("7. The second CPU design") == "7-the-second-cpu-design"
    here = Path(__file__)
    good = 'see docs/design.md, "Verdict rules" and docs/gpu-study.md#how-to-run-it and docs/design.md, §8'
    assert [broken(here, c) for c in citations(good)] == [None, None, None]
    bad = 'docs/nowhere.md and docs/design.md, "No such rules" and docs/design.md#nope and docs/design.md, §99'
    assert all(broken(here, c) for c in citations(bad)) and len(citations(bad)) == 4
    assert README_SECTION.findall('(README, "Verdict rules") the README\'s rule README.md "README: the torch pin"') == [
        "README",
        "README",
    ]
