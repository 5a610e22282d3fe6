"""The names ``flare2`` exports are exactly those docs/python.md lists, and every name the README, the docs and the
examples import from ``flare2`` is one of them."""

from __future__ import annotations

import re

from runs import REPO

import flare2

_LISTED = re.compile(r"^- `(\w+)`: ", re.M)
_IMPORTED = re.compile(r"from flare2 import ([\w, ]+)")
# flare2.NAME in prose and code, where NAME is no subpackage, module or entry-point group of flare2.
_ATTRIBUTE = re.compile(r"\bflare2\.(\w+)\b")
_NOT_NAMES = {"zoo", "core", "runtime", "wire", "commands", "errors", "cli", "algorithms", "progress"}


def _public_section() -> str:
    page = (REPO / "docs" / "python.md").read_text(encoding="utf-8")
    return page[page.index("## Public names") :]


def _texts() -> list[tuple[str, str]]:
    paths = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "examples").glob("*.py"))]
    return [(path.name, path.read_text(encoding="utf-8")) for path in paths]


def test_the_package_exports_exactly_the_names_its_python_page_lists():
    listed = _LISTED.findall(_public_section())
    assert len(listed) == len(set(listed)), "a name is listed twice"
    assert sorted(listed) == sorted(set(flare2.__all__) - {"__version__"})


def test_every_name_the_docs_and_examples_take_from_flare2_is_exported_and_loads():
    used: dict[str, str] = {}
    for source, text in _texts():
        for names in _IMPORTED.findall(text):
            used.update({name.strip(): source for name in names.split(",") if name.strip()})
        used.update({name: source for name in _ATTRIBUTE.findall(text) if name not in _NOT_NAMES})
    assert used, "the docs import nothing from flare2: the pattern is wrong"
    unknown = {name: source for name, source in used.items() if name not in flare2.__all__}
    assert not unknown, f"names the docs use that flare2 does not export: {unknown}"
    for name in used:
        assert getattr(flare2, name) is not None
