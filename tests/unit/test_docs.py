"""The docs live with the code: every file the README, the docs or the code cite exists, and
the README stays short enough to read first."""

from __future__ import annotations

import re

import pytest

from support import REPO

LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
CITED = re.compile(r"\b((?:docs|examples|scripts|configs)/[\w./-]+\.(?:md|py|yaml))\b")


def sources():
    yield from (REPO / "hogwild").rglob("*.py")
    yield from (REPO / "configs").rglob("*.yaml")
    yield from (REPO / "scripts").glob("*.py")
    yield from (REPO / "tests").rglob("*.py")
    yield REPO / "README.md"
    yield from (REPO / "docs").glob("*.md")


def test_the_readme_is_at_most_ten_thousand_characters():
    assert len((REPO / "README.md").read_text()) <= 10_000


@pytest.mark.parametrize(
    "page", ["README.md", *sorted(p.name for p in (REPO / "docs").glob("*.md"))]
)
def test_every_relative_link_points_to_a_file(page):
    path = REPO / page if page == "README.md" else REPO / "docs" / page
    for target in LINK.findall(path.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        assert (path.parent / target).exists(), f"{page} links to {target}, which does not exist"


def test_every_file_the_code_and_docs_cite_exists():
    missing = set()
    for source in sources():
        for cited in CITED.findall(source.read_text()):
            if not (REPO / cited).exists():
                missing.add(f"{source.relative_to(REPO)} cites {cited}")
    assert not missing, sorted(missing)


def test_nothing_points_outside_the_repository():
    for source in sources():
        if source.name == "test_docs.py":  # this test names what it looks for
            continue
        text = source.read_text()
        assert "../shared" not in text and "DESIGN.md" not in text, source
