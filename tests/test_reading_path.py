"""The paper's pages stay light: what a reader sees of the code on chapters 1-7.

A line of shown code is a non-blank line, not a comment, of a code cell that is neither
folded (`hide-input`) nor hidden (`remove-input`, `remove-cell`). The code that implements
the paper (the cells exported to the module) is always shown in full; the code that
measures or keeps the prose equal to the outputs may be folded. Shown cells carry no lint
pragma and never reach into the tests."""

import ast
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


BACK_MATTER_MODULES = {"training_runs", "cuda_graphs", "fast_decoding"}
PAPER_MODULE = "annotated_transformer"


def defined_names(source):
    """The top-level names an exported cell binds (imports, functions, classes, constants)."""
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(name, ast.Name):
                        names.add(name.id)
    return names


def paper_module_names_by_page():
    """{chapter stem: names the paper's module gains on that page}, in reading order."""
    return {
        path.stem: set().union(*(defined_names(body) for _, body in export.exported_cells(path)))
        for path in paper_chapters()
    }


def names_from_elsewhere(sources, known):
    """The names a notebook's cells (`sources`) bind by importing what it may not show: any
    name of a back-matter module, or a name of the paper's module that only a later page
    defines (not in `known`).
    Returns ({local name: where it comes from}, {module alias: (module, names allowed)})."""
    names, aliases = {}, {}
    for source in sources:
        if source.startswith(("%", "!")):
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.module in BACK_MATTER_MODULES:
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.ImportFrom) and node.module == PAPER_MODULE:
                for alias in node.names:
                    if alias.name not in known:
                        names[alias.asname or alias.name] = f"{PAPER_MODULE}.{alias.name} (later)"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in BACK_MATTER_MODULES:
                        aliases[alias.asname or alias.name] = (alias.name, set())
                    elif alias.name == PAPER_MODULE:
                        aliases[alias.asname or alias.name] = (alias.name, known)
    return names, aliases


def used_from_elsewhere(source, names, aliases):
    """What a shown cell uses of the names and module aliases found by names_from_elsewhere."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and node.id in names:
            found.append(names[node.id])
        elif isinstance(node, ast.ImportFrom) and (
            node.module in BACK_MATTER_MODULES or node.module == PAPER_MODULE
        ):
            found += [
                names[a.asname or a.name] for a in node.names if (a.asname or a.name) in names
            ]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr not in aliases[node.value.id][1]
        ):
            found.append(f"{aliases[node.value.id][0]}.{node.attr}")
    return found


def test_the_reading_order_check_catches_what_it_should():
    imports = (
        "from training_runs import load_multi30k\n"
        "from annotated_transformer import attention, beam_search\n"
        "import fast_decoding as fd\nimport annotated_transformer as at\n"
    )
    names, aliases = names_from_elsewhere([imports], known={"attention"})
    shown = "pairs = load_multi30k('train')\nbeam_search(1)\nattention(1)\nfd.x(at.y, at.attention)"
    assert sorted(used_from_elsewhere(shown, names, aliases)) == [
        "annotated_transformer.beam_search (later)",
        "annotated_transformer.y",
        "fast_decoding.x",
        "training_runs.load_multi30k",
    ]
    assert used_from_elsewhere("attention(at.attention)", names, aliases) == []


def test_shown_cells_use_only_what_this_or_an_earlier_page_explains():
    """A reader of chapters 1-7 meets no name in a shown cell before the page that explains
    it: nothing from the back-matter modules, nothing the paper's module gains on a later page.
    Folded and hidden cells may call machinery (with a sentence that links to its page)."""
    known, problems = set(), []
    for path, gained in zip(paper_chapters(), paper_module_names_by_page().values(), strict=True):
        known |= gained
        names, aliases = names_from_elsewhere([s for s, _ in shown_code_cells(path)], known)
        for number, (source, folded) in enumerate(shown_code_cells(path), start=1):
            if folded or source.startswith(("%", "!")):
                continue
            for name in used_from_elsewhere(source, names, aliases):
                problems.append(f"{path.stem}, code cell {number}: {name}")
    assert not problems, "\n".join(problems)
