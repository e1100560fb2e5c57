"""Literate export: build the modules of code/ from the chapters' cells whose first line is
exactly `#| export`, in _toc.yml order, and re-execute chapters.

The paper's pages (the first part of _toc.yml) build one module, code/annotated_transformer.py.
Every other page with exported cells builds a module of its own, named after the page
(chapters/fast_decoding.ipynb -> code/fast_decoding.py); such a module imports the paper's,
never the other way round. The imports of a module's cells are gathered into one block at
its top (isort's order), so that a chapter can import what its own code needs.

    python code/export.py           # regenerate the modules
    python code/export.py --check   # exit 1, with a diff, if a module is out of date
    python code/export.py --execute chapters/03_5_*.ipynb   # regenerate, then re-execute
    python code/export.py --execute                          # ... every chapter, in order

The book shows stored outputs and nbval compares against them, so outputs are never edited
by hand: change a chapter, run --execute on it, commit. Each chapter runs on a fresh kernel.

Exported cells may hold only imports, definitions and UPPER_CASE constants, so that
importing the module has no side effects; anything else is refused, naming the cell.
"""

import argparse
import ast
import difflib
import json
import pathlib
import sys
import time

import yaml

import safe_files

MARKER = "#| export"
ROOT = pathlib.Path(__file__).resolve().parent.parent
MODULE = ROOT / "code" / "annotated_transformer.py"
HEADER = '''"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), annotated.

GENERATED FILE, DO NOT EDIT. code/export.py writes it from the cells marked
`#| export` in chapters/, in the order of _toc.yml; change a chapter, then run
`python code/export.py` (or `python code/export.py --execute`, which also re-executes).
"""
'''
PAGE_HEADER = '''"""{title}: the code of chapters/{page}.ipynb.

GENERATED FILE, DO NOT EDIT. code/export.py writes it from the cells marked
`#| export` in chapters/{page}.ipynb; change the page, then run `python code/export.py`.
"""
'''


class ExportError(Exception):
    pass


def _walk(entries, files):
    for entry in entries:
        if "file" in entry:
            files.append(entry["file"])
        _walk(entry.get("sections", []), files)
    return files


def toc_files(root=ROOT):
    """The files of _toc.yml in reading order (root first, sections depth-first)."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        _walk(part.get("chapters", []), files)
    return _walk(toc.get("chapters", []), files)


def paper_files(root=ROOT):
    """The files of _toc.yml's first part, the paper's pages, in reading order."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    return _walk(toc["parts"][0]["chapters"], [])


def _is_allowed(node):
    if isinstance(
        node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    ):
        return True
    if (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    ):
        return True  # a bare string (docstring)
    targets = (
        node.targets
        if isinstance(node, ast.Assign)
        else [node.target]
        if isinstance(node, ast.AnnAssign)
        else None
    )
    names = [n for t in targets or [] for n in (t.elts if isinstance(t, ast.Tuple) else [t])]
    return bool(names) and all(isinstance(n, ast.Name) and n.id.isupper() for n in names)


def _shown(path):
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def exported_cells(notebook_path):
    """(cell number, source without the marker line) of each exported cell, checked."""
    notebook = json.loads(notebook_path.read_text())
    cells = []
    for number, cell in enumerate(notebook["cells"], start=1):
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        first, _, body = source.partition("\n")
        if cell["cell_type"] != "code" or first.rstrip() != MARKER:
            continue
        where = f"{_shown(notebook_path)}, cell {number}"
        try:
            tree = ast.parse(body)
        except SyntaxError as error:
            raise ExportError(f"{where}: not valid Python: {error}") from error
        for node in tree.body:
            if not _is_allowed(node):
                raise ExportError(
                    f"{where}, line {node.lineno + 1}: exported cells may hold only imports, "
                    f"definitions and UPPER_CASE constants, found {type(node).__name__}; "
                    f"move it to a cell without '{MARKER}'"
                )
        cells.append((number, body.strip("\n")))
    return cells


def _title(notebook_path):
    for cell in json.loads(notebook_path.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and source.startswith("# "):
            return source.splitlines()[0][2:].strip()
    return notebook_path.stem


def split_imports(body):
    """(the cell's import statements, the rest of its source): a module gathers the
    imports of all its cells into one block at its top."""
    lines = body.splitlines()
    nodes = [n for n in ast.parse(body).body if isinstance(n, ast.Import | ast.ImportFrom)]
    imports = [ast.get_source_segment(body, node) for node in nodes]
    for node in reversed(nodes):
        del lines[node.lineno - 1 : node.end_lineno]
    return imports, "\n".join(lines).strip("\n")


def _import_section(module, first_party):
    top = module.split(".")[0]
    return 2 if top in first_party else 0 if top in sys.stdlib_module_names else 1


def _name_order(name):
    """ruff's isort order inside `from m import ...`: CONSTANTS, Classes, functions."""
    bare = name.split(" as ")[0]
    kind = 0 if bare.isupper() else 1 if bare[:1].isupper() else 2
    return kind, bare.lower(), bare


def import_block(statements, first_party):
    """One isort-ordered block (standard library, third party, first party; in each, plain
    imports before from-imports) of the given import statements, duplicates merged."""
    plain, named = set(), {}
    for statement in statements:
        for node in ast.parse(statement).body:
            if isinstance(node, ast.Import):
                plain.update(
                    (a.name, f"import {a.name}" + (f" as {a.asname}" if a.asname else ""))
                    for a in node.names
                )
            else:
                names = named.setdefault(node.module, set())
                names.update(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
    sections = [[], [], []]
    for module, line in sorted(plain, key=lambda item: (item[0].lower(), item[1])):
        sections[_import_section(module, first_party)].append(line)
    for module in sorted(named, key=str.lower):
        names = sorted(named[module], key=_name_order)
        line = f"from {module} import {', '.join(names)}"
        if len(line) > 100:
            line = f"from {module} import (\n" + "".join(f"    {n},\n" for n in names) + ")"
        sections[_import_section(module, first_party)].append(line)
    return "\n\n".join("\n".join(lines) for lines in sections if lines)


def _section(path, root, imports):
    banner = f"# {'-' * 86}\n# {_title(path)}, from {path.relative_to(root)}\n# {'-' * 86}"
    bodies = []
    for _, body in exported_cells(path):
        found, rest = split_imports(body)
        imports += found
        if rest:
            bodies.append(rest)
    return "\n\n" + banner + "\n\n" + "\n\n\n".join(bodies) + "\n"


def _module(header, paths, root):
    imports = []
    sections = "".join(_section(path, root, imports) for path in paths)
    first_party = {p.stem for p in (root / "code").glob("*.py")} | {MODULE.stem}
    # one blank line between the imports and the first banner, as isort sets it
    return header + "\n" + import_block(imports, first_party) + "\n" + sections[1:]


def generate(root=ROOT):
    """The paper's module, built from the exported cells of the paper's pages, with the
    imports of all of them in one block at the top."""
    paths = [root / f"{file}.ipynb" for file in paper_files(root)]
    return _module(HEADER, [p for p in paths if p.exists() and exported_cells(p)], root)


def generate_all(root=ROOT):
    """{module path: text} for the paper's module and each back-matter page's module."""
    modules = {MODULE if root == ROOT else root / "code" / MODULE.name: generate(root)}
    paper = set(paper_files(root))
    for file in toc_files(root):
        path = root / f"{file}.ipynb"
        if file in paper or not path.exists() or not exported_cells(path):
            continue
        header = PAGE_HEADER.format(title=_title(path), page=path.stem)
        modules[root / "code" / f"{path.stem}.py"] = _module(header, [path], root)
    return modules


KERNEL = {"display_name": "Python 3", "language": "python", "name": "python3"}


KEPT_METADATA = ("tags", "mystnb")


def tidy(notebook):
    """Keep only metadata that matters, so diffs show content, not bookkeeping: a cell's tags
    (nbval's and the book's) and its `mystnb` settings (a figure's alt text)."""
    import nbformat

    notebook.metadata = nbformat.from_dict(
        {"kernelspec": KERNEL, "language_info": {"name": "python"}}
    )
    for cell in notebook.cells:
        kept = {key: cell.metadata[key] for key in KEPT_METADATA if cell.metadata.get(key)}
        cell.metadata = nbformat.from_dict(kept)
    return notebook


def execute(path, timeout):
    """Run a chapter on a fresh kernel and store its outputs in place."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    with safe_files.atomic_file(path) as file:  # a chapter is replaced whole or not at all
        nbformat.write(tidy(notebook), file)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--check", action="store_true", help="fail if the module differs from the chapters"
    )
    parser.add_argument(
        "--execute",
        nargs="*",
        type=pathlib.Path,
        metavar="NOTEBOOK",
        help="after regenerating, re-execute these chapters (none named: all, in _toc.yml order)",
    )
    parser.add_argument("--timeout", type=int, default=1200, help="seconds per cell")
    args = parser.parse_args(argv)
    try:
        modules = generate_all()
    except ExportError as error:
        print(f"export: {error}", file=sys.stderr)
        return 2
    stale = {}
    for path, text in modules.items():
        current = path.read_text() if path.exists() else ""
        if current != text:
            stale[path] = current
    if args.check:
        for path, current in stale.items():
            diff = difflib.unified_diff(
                current.splitlines(keepends=True),
                modules[path].splitlines(keepends=True),
                f"{_shown(path)} (committed)",
                "generated from chapters/",
            )
            sys.stdout.writelines(diff)
            print(f"\n{_shown(path)} differs from the chapters: run `python code/export.py`")
        if not stale:
            print(f"{', '.join(str(_shown(p)) for p in modules)} are up to date with chapters/")
        return 1 if stale else 0
    for path in stale:
        safe_files.write_text(path, modules[path])
        print(f"wrote {_shown(path)}")
    if not stale:
        print("modules already up to date")
    if args.execute is not None:
        paths = args.execute or [
            ROOT / f"{file}.ipynb" for file in toc_files() if (ROOT / f"{file}.ipynb").exists()
        ]
        missing = [str(path) for path in paths if not path.is_file()]
        if missing:
            print(f"export: no such notebook: {', '.join(missing)}", file=sys.stderr)
            return 2
        for path in paths:
            start = time.perf_counter()
            execute(path.resolve(), args.timeout)
            print(f"executed {_shown(path.resolve())} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
