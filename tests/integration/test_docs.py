"""The pages of docs/ as a site, and the links into them: every page is in the site's navigation and the index, every
link of the README reaches a page, every place the code cites docs/architecture.md names one of its sections, and
``mkdocs build --strict`` (which fails on a link to a missing page or heading) builds the site."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest
from runs import REPO

DOCS = REPO / "docs"
_CITATION = re.compile(r"docs/architecture\.md: ([^)`\"]+)")


def headings(page: str) -> list[str]:
    """The section headings of docs/``page``, without their #."""
    text = (DOCS / page).read_text(encoding="utf-8")
    return [line.lstrip("#").strip() for line in text.splitlines() if re.match(r"#{1,6} ", line)]


def test_every_page_is_in_the_site_navigation_and_the_index():
    pages = sorted(page.name for page in DOCS.glob("*.md"))
    navigation = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    assert [page for page in pages if page not in navigation] == []
    assert [page for page in pages if page != "index.md" and f"({page})" not in index] == []


def test_every_link_of_the_readme_into_docs_reaches_a_page():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert links, "the README links to no page of docs/"
    assert [link for link in links if not (REPO / link).is_file()] == []


def test_the_code_cites_sections_that_docs_architecture_has():
    sections = headings("architecture.md")
    for required in ("Wire", "Batching", "Episode edges", "Failures", "Security", "What the hot path costs"):
        assert required in sections
    wrong = []
    code = [path for folder in ("flare2", "examples", "tools", "tests") for path in (REPO / folder).rglob("*.py")]
    for path in [path for path in code if path.name != "test_docs.py"]:
        # A citation may be wrapped over lines of a comment or a docstring.
        text = re.sub(r"\s*\n\s*(#\s*)?", " ", path.read_text(encoding="utf-8"))
        for cited in _CITATION.findall(text):
            for part in cited.split(";"):
                if not any(part.strip().startswith(section) for section in sections):
                    wrong.append(f"{path.relative_to(REPO)}: docs/architecture.md: {part.strip()}")
    assert wrong == [], f"sections that docs/architecture.md lacks: {wrong}"


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
    reason='mkdocs and mkdocs-material are not installed: python -m pip install -e ".[docs]"',
)
def test_mkdocs_builds_the_site_with_no_warning(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(REPO / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "architecture" / "index.html").is_file()
