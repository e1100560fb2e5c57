"""The chapters as stored: each is in the table of contents, executed with its outputs
kept, free of error outputs, and opens with the same setup cell (folded in the book)."""

import json

import pytest

import export

CHAPTERS = sorted((export.ROOT / "chapters").glob("*.ipynb"))


def code_cells(path):
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def test_every_chapter_is_in_the_table_of_contents():
    listed = set(export.toc_files())
    assert CHAPTERS and all(f"chapters/{p.stem}" in listed for p in CHAPTERS)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_is_executed_with_outputs_and_no_errors(path):
    cells = code_cells(path)
    assert all(c["execution_count"] is not None for c in cells), "run code/export.py --execute"
    assert [c["execution_count"] for c in cells] == list(range(1, len(cells) + 1))
    assert not any(o["output_type"] == "error" for c in cells for o in c["outputs"])


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_opens_with_the_shared_setup_cell(path):
    first, reference = code_cells(path)[0], code_cells(CHAPTERS[0])[0]
    assert "".join(first["source"]) == "".join(reference["source"])
    assert 'sys.path.insert(0, str(ROOT / "code"))' in "".join(first["source"])
    assert first["metadata"].get("tags") == ["hide-input"]
