"""The paper's pages stay light: what a reader sees of the code on chapters 1-7.

A line of shown code is a non-blank line, not a comment, of a code cell that is neither
folded (`hide-input`) nor hidden (`remove-input`, `remove-cell`). The code that implements
the paper (the cells exported to the module) is always shown in full; the code that
measures or keeps the prose equal to the outputs may be folded. Shown cells carry no lint
pragma and never reach into the tests."""

import json
import re

import pytest

import export

FOLDING_TAGS = {"hide-input", "remove-input", "remove-cell"}
BOOK_BUDGET = 1600  # shown lines over chapters 1-7
CHAPTER_BUDGET = 350  # shown lines on any one of them
PRAGMA = re.compile(r"#\s*(noqa|fmt:\s*(skip|off|on)|type:\s*ignore|pragma|pylint|ruff:)")


def paper_chapters():
    """The notebooks of the book's first part (the paper's sections), in reading order."""
    return [
        export.ROOT / f"{file}.ipynb"
        for file in export.toc_files()
        if file.startswith("chapters/0") and (export.ROOT / f"{file}.ipynb").exists()
    ]


def shown_code_cells(path):
    """(source, folded) of each code cell of a notebook."""
    cells = json.loads(path.read_text())["cells"]
    return [
        ("".join(c["source"]), bool(FOLDING_TAGS & set(c["metadata"].get("tags", []))))
        for c in cells
        if c["cell_type"] == "code"
    ]


def code_lines(source):
    """Non-blank lines that are not comments (the export marker is a comment)."""
    return sum(
        1 for line in source.splitlines() if line.strip() and not line.lstrip().startswith("#")
    )


def shown_lines(path):
    return sum(code_lines(source) for source, folded in shown_code_cells(path) if not folded)


def test_the_paper_chapters_are_found():
    names = [p.stem for p in paper_chapters()]
    assert names[0] == "01_introduction" and names[-1] == "07_conclusion"
    assert "05_training" in names and "06_1_machine_translation" in names


def test_counting_rules_on_a_known_cell():
    source = "#| export\n# a comment\n\ndef f(x):\n    return x  # why\n"
    assert code_lines(source) == 2


def test_the_paper_chapters_show_at_most_the_book_budget():
    lines = {p.stem: shown_lines(p) for p in paper_chapters()}
    assert sum(lines.values()) <= BOOK_BUDGET, lines


@pytest.mark.parametrize("path", paper_chapters(), ids=lambda p: p.stem)
def test_no_chapter_shows_more_than_its_budget(path):
    assert shown_lines(path) <= CHAPTER_BUDGET


@pytest.mark.parametrize("path", paper_chapters(), ids=lambda p: p.stem)
def test_exported_cells_are_shown_in_full(path):
    for source, folded in shown_code_cells(path):
        if source.startswith(export.MARKER):
            assert not folded, f"{path.stem}: an exported cell is folded:\n{source[:200]}"


@pytest.mark.parametrize("path", paper_chapters(), ids=lambda p: p.stem)
def test_shown_cells_hold_no_pragma_and_no_test_machinery(path):
    for source, folded in shown_code_cells(path):
        if folded:
            continue
        assert not PRAGMA.search(source), f"{path.stem}: a lint pragma in a shown cell:\n{source}"
        assert '"tests"' not in source and "tests/" not in source, (
            f"{path.stem}: a shown cell reaches into tests/:\n{source}"
        )
