"""The literate export: the committed module is what the chapters generate, in _toc.yml
order, and cells with side effects are refused."""

import ast
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

import export


def test_committed_modules_match_the_chapters():
    modules = export.generate_all()
    assert set(modules) == {
        export.MODULE,
        *(export.MODULE.parent / f"{name}.py" for name in (*PAGE_MODULES, *JOB_MODULES)),
    }
    for path, generated in modules.items():
        assert path.read_text() == generated, (
            f"{path.name} differs from the chapters: run `python code/export.py`"
        )


PAGE_MODULES = ("fast_decoding", "cuda_graphs", "training_runs")  # in reading order
# filed by job from the back matter's pages (`#| export <module>`), as CONTRIBUTING lists them
JOB_MODULES = ("precision", "step", "distributed", "run_folder", "profiles", "schedule")
BACK_MATTER_MODULES = (*PAGE_MODULES, *JOB_MODULES)
# what belongs to the back matter: fast decoding, CUDA graphs, runs that survive (the
# checkpoint format is the paper's: 6.1 reads and writes it, beside averaging)
MACHINERY = (
    "RunFolder", "RunConfig", "PROFILES", "GradScaler",
    "autocast", "DistributedDataParallel", "CUDAGraph", "GraphedTrainStep", "KeyValueCache",
    "AttentionCache", "tqdm", ".lock",
)  # fmt: skip


def test_the_papers_module_holds_chapters_3_to_6_and_no_machinery():
    """The paper's module names no lock, checkpoint format, scaler, CUDA graph or cache of the
    back matter, and imports none of its modules; each back-matter module imports the
    paper's, and its code comes from back-matter pages only."""
    text = export.MODULE.read_text()
    tree = ast.parse(text)
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module)])
    }
    assert not imported & {*BACK_MATTER_MODULES, "tqdm"}, imported
    found = [word for word in MACHINERY if word in text]
    assert not found, f"the paper's module names machinery of the back matter: {found}"
    banners = re.findall(r"^# .*, from (chapters/\S+)\.ipynb$", text, re.M)
    assert banners and all(b.split("/")[1][:2].isdigit() for b in banners), banners
    back_matter = {f"chapters/{page}" for page in PAGE_MODULES}
    for name in BACK_MATTER_MODULES:
        module = (export.MODULE.parent / f"{name}.py").read_text()
        assert "from annotated_transformer import" in module or name in JOB_MODULES, name
        banners = re.findall(r"^# .*, from (chapters/\S+)\.ipynb$", module, re.M)
        if name in PAGE_MODULES:
            assert banners == [f"chapters/{name}"]
        assert banners and set(banners) <= back_matter, (name, banners)


def imported_modules(path):
    """Every module a file imports, at its top or inside a function."""
    return imported_in(path.read_text())


def imported_in(source):
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
    return found


def first_pages():
    """{generated module: the position in _toc.yml of the first page whose cells build it}"""
    files = export.toc_files()
    return {
        name: files.index(str(next(iter(pages)).relative_to(export.ROOT).with_suffix("")))
        for name, pages in export.module_plan().items()
    }


def test_each_generated_module_imports_only_modules_of_its_page_or_earlier_ones():
    """Reading order is import order: a module may use the modules built by its own page and
    the pages before it, never one after it, not even inside a function."""
    order = first_pages()
    assert set(order) == {export.MODULE.stem, *BACK_MATTER_MODULES}
    assert all(order[m] > order[export.MODULE.stem] for m in BACK_MATTER_MODULES)
    for name in order:
        later = {other for other in order if order[other] > order[name]}
        path = export.MODULE.parent / f"{name}.py"
        assert not imported_modules(path) & later, f"{name} imports a page after it: {later}"


def test_every_page_imports_only_modules_built_by_it_or_by_earlier_pages():
    """A reader who opens a page has read the pages before it: no cell of a page, shown,
    folded or hidden, imports a module that a later page builds. Modules written by hand
    (plots, hardware, safe_files, ...) are no page's and may be imported anywhere."""
    order, files = first_pages(), export.toc_files()
    reaching = []
    for position, file in enumerate(files):
        path = export.ROOT / f"{file}.ipynb"
        if not path.exists():
            continue
        for number, cell in enumerate(json.loads(path.read_text())["cells"], start=1):
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            later = {m for m in imported_in(source) if order.get(m, -1) > position}
            reaching += [f"{file}, cell {number}: {m}" for m in sorted(later)]
    assert not reaching, reaching


def scripts():
    """The commands of code/: the files with a __main__ block."""
    return {
        path.stem
        for path in export.MODULE.parent.glob("*.py")
        if 'if __name__ == "__main__":' in path.read_text()
    }


def test_no_page_imports_a_script():
    """A page reads its helpers from modules named for their jobs (attention_analysis, table3,
    benchmark_rows, recipe_trials, ...), never from a command, which it may only quote. The
    one exception: the map of the code reads the generator's own plan of where cells go."""
    assert {"attention_maps", "variations", "benchmark", "recipe_search"} <= scripts()
    commands, importing = scripts(), []
    for path in sorted((export.ROOT / "chapters").glob("*.ipynb")):
        allowed = {"export"} if path.stem == "map" else set()
        for number, cell in enumerate(json.loads(path.read_text())["cells"], start=1):
            if cell["cell_type"] == "code":
                found = imported_in("".join(cell["source"])) & commands - allowed
                importing += [f"{path.stem}, cell {number}: {m}" for m in sorted(found)]
    assert not importing, importing


def _project(tmp_path, pages):
    """A small book in tmp_path: {page name: [cell sources]}, in reading order, the first
    being the paper's page."""
    (tmp_path / "code").mkdir()
    (tmp_path / "chapters").mkdir()
    (tmp_path / "code" / "helpers.py").write_text('"""written by hand"""\n')
    names = list(pages)
    toc = {
        "root": "index",
        "parts": [
            {"chapters": [{"file": f"chapters/{names[0]}"}]},
            {"chapters": [{"file": f"chapters/{n}"} for n in names[1:]]},
        ],
    }
    (tmp_path / "_toc.yml").write_text(json.dumps(toc))
    for name, sources in pages.items():
        _notebook(tmp_path / "chapters", *sources).rename(tmp_path / "chapters" / f"{name}.ipynb")
    return tmp_path


def test_a_cell_that_names_a_module_is_filed_there_with_the_imports_it_uses(tmp_path):
    root = _project(
        tmp_path,
        {
            "03_model": ["#| export\nimport math\n\n\ndef area(r):\n    return math.pi * r * r\n"],
            "loops": [
                "#| export\nimport os\nimport math\nfrom model import area\n",
                '#| export timing\n"""Clocks."""\n\n\ndef now():\n    return os.times()\n',
                "#| export\ndef disc(r):\n    return area(r), now()\n",
                "#| export timing\nLIMIT = math.inf\n",
            ],
        },
    )
    modules = {path.stem: text for path, text in export.generate_all(root).items()}
    assert set(modules) == {"annotated_transformer", "loops", "timing"}
    timing, loops = modules["timing"], modules["loops"]
    assert timing.startswith('"""Clocks.\n\nGENERATED FILE, DO NOT EDIT.')
    assert "#| export timing` in chapters/loops.ipynb" in timing
    # each module keeps the page's imports it uses, and borrows from its page's siblings
    assert "import math\nimport os\n" in timing and "from model" not in timing
    assert "def now():" in timing and "LIMIT = math.inf" in timing and "disc" not in timing
    assert "import os" not in loops and "import math" not in loops
    assert "from model import area\n" in loops and "from timing import now\n" in loops
    assert "def disc(r):" in loops and "def now" not in loops
    for text in modules.values():
        compile(text, "module", "exec")


@pytest.mark.parametrize(
    "cells, message",
    [
        (["#| export Timing\nX = 1\n"], "is not a module name"),
        (["#| export timing\ndef now():\n    pass\n"], "must begin with a string"),
        (['#| export helpers\n"""Mine."""\nX = 1\n'], "written by hand"),
    ],
)
def test_a_misnamed_or_undescribed_module_is_refused(tmp_path, cells, message):
    root = _project(tmp_path, {"03_model": ["#| export\nY = 2\n"], "loops": cells})
    with pytest.raises(export.ExportError, match=message):
        export.generate_all(root)


def test_check_flag_reports_drift(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "annotated_transformer.py"
    stale.write_text(export.generate().replace("def attention(", "def attention_renamed("))
    monkeypatch.setattr(export, "MODULE", stale)
    assert export.main(["--check"]) == 1
    assert "run `python code/export.py`" in capsys.readouterr().out
    stale.write_text(export.generate())
    assert export.main(["--check"]) == 0


def test_module_follows_the_table_of_contents():
    text = export.MODULE.read_text()
    chapters = [f for f in export.paper_files() if (export.ROOT / f"{f}.ipynb").exists()]
    positions = [
        text.find(f"from {f}.ipynb\n")
        for f in chapters
        if export.exported_cells(export.ROOT / f"{f}.ipynb")
    ]
    assert all(p > 0 for p in positions) and positions == sorted(positions)
    # the paper's order: attention (3.2.1) before multi-head (3.2.2) before the full model (3.6)
    assert (
        text.index("def attention(")
        < text.index("class MultiHeadedAttention")
        < text.index("def make_model(")
    )


def _notebook(tmp_path, *sources):
    cells = [
        {"cell_type": "code", "source": s, "metadata": {}, "outputs": [], "execution_count": None}
        for s in sources
    ]
    path = tmp_path / "chapter.ipynb"
    path.write_text(
        json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    )
    return path


def test_only_marked_cells_are_exported(tmp_path):
    path = _notebook(
        tmp_path, "#| export\ndef f():\n    return 1\n", "x = f()\n", "# | export\ndef g(): pass"
    )
    assert export.exported_cells(path) == [(1, "def f():\n    return 1")]


@pytest.mark.parametrize(
    "statement", ["print('side effect')", "model = make()", "for i in range(3):\n    pass"]
)
def test_side_effects_are_refused_naming_the_cell(tmp_path, statement):
    path = _notebook(tmp_path, "#| export\nimport math\n", f"#| export\nLIMIT = 3\n{statement}\n")
    with pytest.raises(export.ExportError, match=r"chapter.ipynb, cell 2, line 3"):
        export.exported_cells(path)


def test_module_imports_without_side_effects(tmp_path):
    """A fresh interpreter imports the module: nothing printed, no file written anywhere
    under its working directory or beside the module, the names the chapters define, and
    none of the back matter's modules."""
    code_dir = export.MODULE.parent
    before = sorted(p.name for p in code_dir.iterdir())
    probe = (
        "import sys\n"
        "import annotated_transformer as at\n"
        "assert at.BASE.d_model == 512 and callable(at.make_model)\n"
        f"loaded = {set(BACK_MATTER_MODULES)!r} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(code_dir), "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and result.stderr == ""
    assert list(tmp_path.iterdir()) == []
    assert sorted(p.name for p in code_dir.iterdir()) == before


@pytest.mark.parametrize(
    "module, unwanted",
    [
        ("safe_files", {"torch", "annotated_transformer"}),  # written files need no torch
        ("multi30k_files", {"torch", "annotated_transformer"}),  # nor does verified data
        ("script_helpers", {"training_runs", "cuda_graphs", "fast_decoding", "distributed"}),
        ("translate", {"training_runs", "cuda_graphs"}),  # translating trains nothing
    ],
)
def test_a_module_loads_only_what_its_job_needs(module, unwanted):
    probe = f"import sys\nimport {module}\nprint(sorted({unwanted!r} & set(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(export.MODULE.parent), "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", f"importing {module} loads {result.stdout.strip()}"


def test_no_exported_function_is_longer_than_a_screen():
    """Each function of the module (methods too) fits on one screen: 55 lines at most,
    docstring included, so that a reader sees it whole beside its prose."""
    tree = ast.parse(export.MODULE.read_text())
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > 55
    ]
    assert not long, f"split these into named parts: {long}"


def test_the_papers_model_reads_without_decoding_or_training_machinery():
    """The module's part from 3.1 to 3.6 (everything a forward pass uses) names no cache,
    checkpoint, device or process: those live on the back-matter pages, after the paper."""
    text = export.MODULE.read_text()
    start = text.index("from chapters/03_1_encoder_decoder_stacks.ipynb")
    end = text.index("from chapters/05_training.ipynb")
    model_part = text[start:end]
    for word in ("cache", "checkpoint", "distributed", "rank", "autocast"):
        assert not re.search(rf"\b{word}", model_part, re.I), f"{word!r} in the paper's model"


def test_no_script_imports_another_script():
    """Scripts in code/ share through the modules and code/script_helpers.py, never through
    each other: a file with a `main` (a script) is never imported by another file of code/."""
    code_dir = export.MODULE.parent
    scripts = {
        p.stem for p in code_dir.glob("*.py") if re.search(r"^def main\(", p.read_text(), re.M)
    }
    borrowed = []
    for path in code_dir.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            borrowed += [f"{path.name} imports {n}" for n in names if n in scripts]
    assert not borrowed, borrowed


def test_every_script_that_reads_multi30k_takes_data_dir():
    """A script that reads Multi30k (directly or through a function of its own file) offers
    --data-dir, and every read hands the folder on by name: a run trained from a local copy
    is scored, exported and timed from it too, never from a download."""
    code_dir = export.MODULE.parent
    missing = []
    for path in sorted(code_dir.glob("*.py")):
        text = path.read_text()
        if not re.search(r"^def main\(", text, re.M) or path.name == "script_helpers.py":
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "load_multi30k":
                if "data_dir" not in {k.arg for k in node.keywords}:
                    missing.append(f"{path.name}:{node.lineno} reads without data_dir=")
        if "load_multi30k(" in text and "add_data_dir_flag(parser)" not in text:
            missing.append(f"{path.name} reads Multi30k without a --data-dir flag")
    assert not missing, missing


def test_executing_a_missing_notebook_is_refused_by_name(tmp_path, monkeypatch, capsys):
    module = tmp_path / "annotated_transformer.py"
    module.write_text(export.generate())
    monkeypatch.setattr(export, "MODULE", module)
    assert export.main(["--execute", str(tmp_path / "nope.ipynb")]) == 2
    error = capsys.readouterr().err
    assert "no such notebook" in error and "nope.ipynb" in error


def test_stored_notebooks_keep_tags_and_alt_text_and_nothing_else():
    nbformat = pytest.importorskip("nbformat")
    notebook = nbformat.v4.new_notebook(metadata={"widgets": {"state": {}}})
    alt = {"image": {"alt": "A line chart of the loss falling over 100 steps."}}
    notebook.cells = [
        nbformat.v4.new_code_cell(
            "plot()",
            metadata={"tags": ["nbval-ignore-output"], "mystnb": alt, "scrolled": True},
        ),
        nbformat.v4.new_markdown_cell("text", metadata={"collapsed": True, "tags": []}),
    ]
    tidied = export.tidy(notebook)
    assert dict(tidied.cells[0].metadata) == {"tags": ["nbval-ignore-output"], "mystnb": alt}
    assert dict(tidied.cells[1].metadata) == {}
    assert "widgets" not in tidied.metadata


def test_each_generated_module_has_one_import_block_at_its_top():
    for path, text in export.generate_all().items():
        body = ast.parse(text).body[1:]  # after the module's docstring
        is_import = [isinstance(node, ast.Import | ast.ImportFrom) for node in body]
        assert is_import == sorted(is_import, reverse=True), path  # imports first, none later


def test_the_import_block_merges_and_orders_as_isort_does():
    statements = [
        "import torch",
        "from dataclasses import replace",
        "import math",
        "from annotated_transformer import rate, BASE, Batch",
        "from dataclasses import dataclass",
        "import torch.nn.functional as F",
        "import math",
    ]
    assert export.import_block(statements, {"annotated_transformer"}) == (
        "import math\nfrom dataclasses import dataclass, replace\n\n"
        "import torch\nimport torch.nn.functional as F\n\n"
        "from annotated_transformer import BASE, Batch, rate"
    )


MODULE_LINES = 660  # a job's worth: about 600 lines, with a margin
# the paper's module is one file by design: chapters 3-6 read top to bottom, in the paper's order
LONGER_BY_DESIGN = {"annotated_transformer.py"}


@pytest.mark.parametrize(
    "path", sorted(export.MODULE.parent.glob("*.py")), ids=lambda path: path.name
)
def test_every_file_of_code_is_listed_by_contributing_and_holds_one_jobs_worth(path):
    """Every file of code/ is named in CONTRIBUTING's table of what each holds, and none but
    the paper's module grows much past 600 lines: a longer one holds more than one job."""
    contributing = (export.ROOT / "CONTRIBUTING.md").read_text()
    assert f"`code/{path.name}`" in contributing, f"describe code/{path.name} in CONTRIBUTING"
    lines = len(path.read_text().splitlines())
    assert path.name in LONGER_BY_DESIGN or lines <= MODULE_LINES, (
        f"{path.name} has {lines} lines: file a job of it in a module of its own"
    )


def test_code_holds_only_python_files():
    """Data the code reads (the lexicon of chapter 7) lives in data/, results in results/."""
    others = [
        p.name
        for p in export.MODULE.parent.iterdir()
        if p.is_file() and p.suffix != ".py" and not p.name.startswith(".")
    ]
    assert not others, f"move these out of code/ (data/ or results/): {others}"


def test_every_generated_module_is_left_to_its_cells_formatting_and_known_to_the_linter():
    """A new `#| export <module>` needs two lines of pyproject.toml: ruff format skips the
    generated file (its cells are formatted one by one), and isort counts it as ours."""
    import tomllib

    pyproject = export.MODULE.parent.parent / "pyproject.toml"
    ruff = tomllib.loads(pyproject.read_text())["tool"]["ruff"]
    generated = {
        path.stem
        for path in export.MODULE.parent.glob("*.py")
        if "GENERATED FILE, DO NOT EDIT" in path.read_text()[:1000]
    }
    assert generated >= {"annotated_transformer", "step", "schedule"}
    skipped = {pathlib.Path(path).stem for path in ruff["format"]["exclude"]}
    assert generated <= skipped, f"add to [tool.ruff.format] exclude: {generated - skipped}"
    ours = set(ruff["lint"]["isort"]["known-first-party"])
    assert generated <= ours, f"add to known-first-party: {generated - ours}"
