"""Every file the project writes is renamed into place whole: a scan of every module in code/
(the generated ones too) finds each call that writes a file and requires it to sit inside a
`with atomic_file(...)` block (safe_files.atomic_file, which writes a temporary file beside the
target and renames it onto it once complete). Then the writes of export.py, recipe_search.py
and export_onnx.py are made to fail halfway, and the old files must still be whole."""

import ast
import errno
import json
import os
import pathlib

import nbclient
import nbformat
import pytest

import export
import export_onnx
import recipe_search
import safe_files

CODE = pathlib.Path(__file__).resolve().parent.parent / "code"
REAL_FSYNC = os.fsync

# (file, function): why it may write in place
ALLOWED = {
    ("safe_files.py", "atomic_file"): "the atomic writer itself: the temporary file and the rename",
    ("script_helpers.py", "log_to"): "a log grows by appends of whole lines, which a crash "
    "cannot tear in two; renaming a new copy into place for each line would rewrite the whole "
    "log every time",
    ("run_folder.py", "RunFolder.__enter__"): "the run folder's lock file: creating it with "
    "O_EXCL is the lock itself, which a rename onto the name would silently take from its owner",
}
OPENERS = {"open", "io.open", "os.fdopen", "gzip.open", "bz2.open", "lzma.open"}
WRITERS = {  # called by these names, they write to a path
    *"shutil.copy shutil.copy2 shutil.copyfile shutil.copytree shutil.move".split(),
    *"os.replace os.rename os.link os.symlink urllib.request.urlretrieve".split(),
    *"torch.save onnx.save np.save nbformat.write".split(),
}
# methods that write to the path they are given (a DataFrame's to_csv() without one returns
# the text); `save` catches torch.save, onnx.save, a tokenizer's or a figure's save
METHODS = {"write_text", "write_bytes", "savefig", "save", "touch", "tofile"}
PATH_METHODS = {"to_csv", "to_json", "to_parquet", "to_pickle", "to_excel", "to_feather"}
DUMPS = {"json.dump", "pickle.dump", "yaml.dump", "yaml.safe_dump", "marshal.dump"}
WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC"}


def dotted(node):
    """'a.b.c' for a name or an attribute chain on a name; '?.c' when the chain starts
    elsewhere (a call, a subscript)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return "?"


def opens_for_writing(call, name):
    """Whether an open()-like call's mode writes: any of w, a, x, +; a mode that is not a
    literal counts as writing."""
    position = 0 if name.endswith(".open") and name not in OPENERS else 1  # Path.open(mode)
    mode = next((k.value for k in call.keywords if k.arg == "mode"), None)
    if mode is None and len(call.args) > position:
        mode = call.args[position]
    if mode is None:
        return False  # "r"
    if not (isinstance(mode, ast.Constant) and isinstance(mode.value, str)):
        return True
    return bool(set(mode.value) & set("wax+"))


def writes(call):
    """Whether `call` writes a file (open in a writing mode, a write to a path, a copy, a
    rename), as far as its spelling tells."""
    name = dotted(call.func)
    method = name.rpartition(".")[2]
    if name in OPENERS or (method == "open" and name not in ("os.open", "webbrowser.open")):
        return opens_for_writing(call, name)
    if name == "os.open":
        flags = {n.attr for n in ast.walk(call) if isinstance(n, ast.Attribute)}
        return bool(flags & WRITE_FLAGS)
    if name == "torch.onnx.export":
        return len(call.args) > 2 or any(k.arg == "f" for k in call.keywords)
    if name in DUMPS:
        return len(call.args) > 1 or any(k.arg in ("fp", "file", "stream") for k in call.keywords)
    if not isinstance(call.func, ast.Attribute) or name.startswith("safe_files."):
        return name in WRITERS  # a function of our own (to_json) or safe_files' own writers
    if method in PATH_METHODS:
        return bool(call.args) or any(k.arg in ("path", "path_or_buf") for k in call.keywords)
    return name in WRITERS or method in METHODS


def is_atomic_block(node):
    return isinstance(node, ast.With | ast.AsyncWith) and any(
        isinstance(item.context_expr, ast.Call)
        and dotted(item.context_expr.func).rpartition(".")[2] == "atomic_file"
        for item in node.items
    )


def unguarded_writes(source):
    """[(qualified name of the enclosing function, line, the call's text)] for every write
    that is not inside a `with atomic_file(...)` block."""
    found = []

    def visit(node, scope, guarded):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            scope = [*scope, node.name]
        guarded = guarded or is_atomic_block(node)
        if isinstance(node, ast.Call) and writes(node) and not guarded:
            where = ".".join(scope) or "<module>"
            found.append((where, node.lineno, ast.get_source_segment(source, node)))
        for child in ast.iter_child_nodes(node):
            visit(child, scope, guarded)

    visit(ast.parse(source), [], False)
    return found


def writes_in_place(path):
    """The unguarded writes of a file of code/, less those ALLOWED: {(file, function): [calls]}."""
    found = {}
    for function, line, text in unguarded_writes(path.read_text()):
        if (path.name, function) not in ALLOWED:
            found.setdefault((path.name, function), []).append(f"line {line}: {text}")
    return found


def test_the_scan_finds_every_kind_of_write_and_passes_those_inside_atomic_file():
    source = """
def everything(path, data, fig, frame, tokenizer, model, fd):
    open(path, "w").write("x")
    open(path, mode="ab")
    open(path, "r+")
    open(path, some_mode)
    os.fdopen(fd, "w")
    gzip.open(path, "wt")
    path.open("w")
    path.write_text("x")
    path.with_suffix(".y").write_bytes(b"x")
    torch.save(data, path)
    json.dump(data, file)
    fig.savefig(path)
    onnx.save(model, path)
    frame.to_csv(path)
    tokenizer.save(str(path))
    shutil.copy(path, path)
    shutil.copyfile(path, path)
    nbformat.write(data, path)
    torch.onnx.export(model, (data,), path)
    os.open(path, os.O_CREAT | os.O_WRONLY)
    os.replace(path, path)


def nothing(path, data, frame, model):
    open(path)
    open(path, "rb")
    path.open()
    gzip.open(path, "rt")
    json.dumps(data)
    frame.to_csv()
    torch.onnx.export(model, (data,))
    os.open(path, os.O_RDONLY)
    "text".replace("a", "b")
    with safe_files.atomic_file(path) as file:
        json.dump(data, file)
        torch.save(data, file)
    with open(path) as source, atomic_file(path, "wb") as file:
        shutil.copyfileobj(source, file)
"""
    found = unguarded_writes(source)
    body = source.split("\n\n\n")[0].strip().splitlines()[1:]
    assert [(where, text) for where, _, text in found] == [
        ("everything", line.strip().removesuffix('.write("x")')) for line in body
    ]  # each line of everything(), once; nothing of nothing()


@pytest.mark.parametrize("path", sorted(CODE.glob("*.py")), ids=lambda p: p.name)
def test_every_file_written_by_code_is_renamed_into_place_by_atomic_file(path):
    found = writes_in_place(path)
    assert not found, f"write these with safe_files (atomic_file, write_text, write_json): {found}"


def test_every_allowed_exception_still_exists():
    # an exception whose write is gone (or moved) must leave ALLOWED too
    for file, function in ALLOWED:
        assert any(
            where == function for where, _, _ in unguarded_writes((CODE / file).read_text())
        ), (file, function)


# ---- writes that fail halfway leave the old file whole ------------------------------------


def fail_once_written(monkeypatch):
    """Make the sync after a temporary file's bytes are written fail, as a full disk would: the
    failure comes after the new bytes, before the rename."""

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)


def only_file(folder):
    return sorted(p.name for p in folder.iterdir())


def test_a_module_export_fails_to_write_leaves_the_old_module_whole(tmp_path, monkeypatch):
    module = tmp_path / "annotated_transformer.py"
    module.write_text('"""the old module"""\n')
    monkeypatch.setattr(export, "generate_all", lambda: {module: '"""the new module"""\n'})
    fail_once_written(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        export.main([])
    assert module.read_text() == '"""the old module"""\n'
    assert only_file(tmp_path) == [module.name]  # no temporary file left behind
    monkeypatch.setattr(os, "fsync", REAL_FSYNC)
    assert export.main([]) == 0
    assert module.read_text() == '"""the new module"""\n'


class RunsOneCell:
    """A stand-in for nbclient's NotebookClient: "executing" gives the first cell an output."""

    def __init__(self, notebook, **options):
        self.notebook = notebook

    def execute(self):
        output = nbformat.v4.new_output("stream", name="stdout", text="4\n")
        self.notebook.cells[0].outputs = [output]


def test_an_executed_chapter_that_fails_to_be_written_keeps_its_old_outputs(tmp_path, monkeypatch):
    chapter = tmp_path / "chapter.ipynb"
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(2 + 2)")])
    nbformat.write(notebook, chapter)
    before = chapter.read_bytes()
    monkeypatch.setattr(nbclient, "NotebookClient", RunsOneCell)
    fail_once_written(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        export.execute(chapter, timeout=10)
    assert chapter.read_bytes() == before and only_file(tmp_path) == [chapter.name]
    monkeypatch.setattr(os, "fsync", REAL_FSYNC)
    export.execute(chapter, timeout=10)
    stored = json.loads(chapter.read_text())
    assert "".join(stored["cells"][0]["outputs"][0]["text"]) == "4\n"
    assert stored["metadata"]["kernelspec"] == export.KERNEL  # tidied as before


def test_a_search_table_copy_that_fails_keeps_the_old_copy(tmp_path, monkeypatch):
    table, copy = tmp_path / "trials.csv", tmp_path / "copy" / "trials.csv"
    row = dict.fromkeys(recipe_search.COLUMNS, "1") | {"trial": "a", "rung": "0"}
    recipe_search.record(row, table, copy)
    old = copy.read_bytes()
    assert old == table.read_bytes()
    replace = os.replace

    def fails_on_the_copy(source, target):
        if pathlib.Path(target) == copy:
            raise OSError(errno.ENOSPC, "No space left on device")
        replace(source, target)

    monkeypatch.setattr(os, "replace", fails_on_the_copy)
    with pytest.raises(OSError, match="No space left"):
        recipe_search.record({**row, "trial": "b"}, table, copy)
    assert copy.read_bytes() == old and only_file(copy.parent) == [copy.name]
    assert len(table.read_text().splitlines()) == 3  # the table itself took the new row


def test_the_pages_engine_is_copied_whole_or_not_at_all(tmp_path, monkeypatch):
    modules = tmp_path / "node_modules"
    for package, names in export_onnx.ENGINE.items():
        (modules / package / "dist").mkdir(parents=True)
        for name in names:
            (modules / package / "dist" / name).write_bytes(f"{name} v2".encode())
    monkeypatch.setattr(export_onnx, "NODE_MODULES", modules)
    out = tmp_path / "translator"
    (out / "vendor").mkdir(parents=True)
    old = out / "vendor" / "ort.wasm.min.mjs"
    old.write_bytes(b"ort.wasm.min.mjs v1")
    fail_once_written(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        export_onnx.copy_engine(out)
    assert old.read_bytes() == b"ort.wasm.min.mjs v1" and only_file(out / "vendor") == [old.name]
    monkeypatch.setattr(os, "fsync", REAL_FSYNC)
    copied = export_onnx.copy_engine(out)
    assert {p.read_bytes() for p in copied} == {f"{p.name} v2".encode() for p in copied}
    assert len(copied) == sum(map(len, export_onnx.ENGINE.values()))


def test_safe_files_writes_text_whole(tmp_path, monkeypatch):
    path = tmp_path / "notes.txt"
    safe_files.write_text(path, "first\n")
    fail_once_written(monkeypatch)
    with pytest.raises(OSError):
        safe_files.write_text(path, "second\n")
    assert path.read_text() == "first\n" and only_file(tmp_path) == [path.name]


def test_an_atomic_write_keeps_the_files_permissions(tmp_path):
    old = tmp_path / "kept.txt"
    old.write_text("old")
    old.chmod(0o640)
    safe_files.write_text(old, "new")
    assert (old.stat().st_mode & 0o777, old.read_text()) == (0o640, "new")
    umask = os.umask(0o027)
    try:  # a new file gets what open() gives it under this umask: 0o666 & ~0o027 = 0o640
        safe_files.write_text(tmp_path / "new.txt", "new")
        open(tmp_path / "plain.txt", "w").close()
    finally:
        os.umask(umask)
    assert (tmp_path / "new.txt").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "plain.txt").stat().st_mode & 0o777 == 0o640
