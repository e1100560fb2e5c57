"""Literate export: build the modules of code/ from the chapters' cells whose first line is
exactly `#| export`, in _toc.yml order, and re-execute chapters.

The paper's pages (the first part of _toc.yml) build one module, code/annotated_transformer.py.
Every other page with exported cells builds a module of its own, named after the page
(chapters/fast_decoding.ipynb -> code/fast_decoding.py); such a module imports the paper's,
never the other way round. A page explains code in the order a reader needs it, but the
code is filed by job: a cell whose first line is `#| export precision` goes to
code/precision.py instead (as in nbdev), and the first cell of each such module begins with a
string saying what the module holds, which becomes its docstring.

Imports are gathered per page: every import of a page's exported cells is offered to each
module the page builds, and each module keeps, in one block at its top (isort's order), those
it uses. The cells of one page share one namespace, so a module that uses a name which
another module of the same page defines imports it from there.

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
import re
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
JOB_HEADER = '''"""{purpose}

GENERATED FILE, DO NOT EDIT. code/export.py writes it from the cells marked
`#| export {name}` in {pages};
change them, then run `python code/export.py`.
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


MODULE_NAME = re.compile(r"[a-z][a-z0-9_]*")


def export_target(source):
    """None if a cell is not exported, "" if it goes to its page's module, else the module it
    names (`#| export precision` -> "precision")."""
    first = source.partition("\n")[0].rstrip()
    if first == MARKER:
        return ""
    if first.startswith(MARKER + " "):
        return first[len(MARKER) + 1 :].strip()
    return None


def targeted_cells(notebook_path):
    """(cell number, target module or "", source without the marker line) of each exported
    cell, checked."""
    notebook = json.loads(notebook_path.read_text())
    cells = []
    for number, cell in enumerate(notebook["cells"], start=1):
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        target = export_target(source) if cell["cell_type"] == "code" else None
        if target is None:
            continue
        where = f"{_shown(notebook_path)}, cell {number}"
        if target and not MODULE_NAME.fullmatch(target):
            raise ExportError(
                f"{where}: {target!r} is not a module name; write `{MARKER} name` with a "
                "lower-case Python name, such as `#| export precision`"
            )
        body = source.partition("\n")[2]
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
        cells.append((number, target, body.strip("\n")))
    return cells


def exported_cells(notebook_path):
    """(cell number, source without the marker line) of each exported cell, checked."""
    return [(number, body) for number, _, body in targeted_cells(notebook_path)]


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


def bound_names(statement):
    """The names an import statement binds (`import a.b` binds a)."""
    node = ast.parse(statement).body[0]
    return [(a.asname or a.name).split(".")[0] for a in node.names]


def defined_names(body):
    """The names a module body defines at its top level."""
    names = set()
    for node in ast.parse(body).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                elements = target.elts if isinstance(target, ast.Tuple) else [target]
                names |= {e.id for e in elements if isinstance(e, ast.Name)}
    return names


def used_names(body):
    return {node.id for node in ast.walk(ast.parse(body)) if isinstance(node, ast.Name)}


def _used_imports(statements, used, own):
    """The import statements (narrowed to the names used) a module body needs; none from
    the module itself."""
    kept = []
    for statement in dict.fromkeys(statements):
        node = ast.parse(statement).body[0]
        if isinstance(node, ast.ImportFrom) and node.module == own:
            continue
        aliases = [a for a in node.names if (a.asname or a.name).split(".")[0] in used]
        if aliases:
            node.names = aliases
            kept.append(ast.unparse(node))
    return kept


def _banner(path, root):
    return f"# {'-' * 86}\n# {_title(path)}, from {path.relative_to(root)}\n# {'-' * 86}"


def module_plan(root=ROOT):
    """{module name: {page path: [cell sources]}}, modules and pages in reading order."""
    paper = set(paper_files(root))
    plan = {MODULE.stem: {}}
    for file in toc_files(root):
        path = root / f"{file}.ipynb"
        if not path.exists():
            continue
        default = MODULE.stem if file in paper else path.stem
        for _, target, body in targeted_cells(path):
            plan.setdefault(target or default, {}).setdefault(path, []).append(body)
    hand_written = {
        p.stem
        for p in (root / "code").glob("*.py")
        if "GENERATED FILE, DO NOT EDIT" not in p.read_text()
    }
    clash = sorted(set(plan) & hand_written)
    if clash:
        raise ExportError(
            f"cells export to {', '.join(clash)}, which code/ holds as a file written by hand; "
            "name another module in the cells' `#| export` line"
        )
    return plan


def _header(name, pages, root, bodies):
    if name == MODULE.stem:
        return HEADER, bodies
    if len(pages) == 1 and name == pages[0].stem:
        return PAGE_HEADER.format(title=_title(pages[0]), page=name), bodies
    first = ast.parse(bodies[0]).body[:1]
    if not (
        first
        and isinstance(first[0], ast.Expr)
        and isinstance(first[0].value, ast.Constant)
        and isinstance(first[0].value.value, str)
    ):
        raise ExportError(
            f"the first cell exporting to {name} ({_shown(pages[0])}) must begin with a string "
            "saying what the module holds; it becomes the module's docstring"
        )
    purpose = first[0].value.value.strip()
    lines = bodies[0].splitlines()
    bodies = ["\n".join(lines[first[0].end_lineno :]).strip("\n"), *bodies[1:]]
    shown = ", ".join(f"chapters/{p.stem}.ipynb" for p in pages)
    return JOB_HEADER.format(purpose=purpose, name=name, pages=shown), bodies


def generate_all(root=ROOT):
    """{module path: text} for the paper's module and every module the pages' cells name."""
    plan = module_plan(root)
    first_party = {p.stem for p in (root / "code").glob("*.py")} | set(plan)
    rests, page_imports = {}, {}  # a page's imports serve every module it builds
    for name, pages in plan.items():
        rests[name] = {}
        for path, bodies in pages.items():
            split = [split_imports(body) for body in bodies]
            page_imports.setdefault(path, []).extend(i for found, _ in split for i in found)
            rests[name][path] = [rest for _, rest in split if rest]
    defines = {
        name: set().union(*(defined_names(b) for bodies in pages.values() for b in bodies))
        for name, pages in rests.items()
    }
    modules = {}
    for name, pages in rests.items():
        paths = list(pages)
        if name == MODULE.stem and not paths:
            continue
        header, first_bodies = _header(name, paths, root, pages[paths[0]])
        pages = {**pages, paths[0]: first_bodies}
        text = "".join(
            "\n\n" + _banner(path, root) + "\n\n" + "\n\n\n".join(b for b in bodies if b) + "\n"
            for path, bodies in pages.items()
        )
        used = used_names(text) - defines[name]
        imports = _used_imports([i for p in paths for i in page_imports[p]], used, name)
        imported = {n for i in imports for n in bound_names(i)}
        siblings = [
            other for other in plan if other != name and set(plan[other]) & set(paths)
        ]  # modules built from the same pages share their namespace
        for other in siblings:
            borrowed = sorted((used - imported) & defines[other])
            if borrowed:
                imports.append(f"from {other} import {', '.join(borrowed)}")
        path = MODULE if name == MODULE.stem and root == ROOT else root / "code" / f"{name}.py"
        # one blank line between the imports and the first banner, as isort sets it
        modules[path] = header + "\n" + import_block(imports, first_party) + "\n" + text[1:]
    return modules


def generate(root=ROOT):
    """The paper's module, built from the exported cells of the paper's pages, with the
    imports of all of them in one block at the top."""
    modules = generate_all(root)
    return modules[MODULE if root == ROOT else root / "code" / MODULE.name]


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
