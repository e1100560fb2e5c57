"""Calls that name their arguments: a public function or method of code/ with more than
three parameters takes the rest by keyword only, and no call in code/ hands a function of the
book a tuple to spread over its parameters, so that reordering a parameter can never send a
value silently to the wrong place."""

import ast
import pathlib

import pytest

CODE = pathlib.Path(__file__).resolve().parent.parent / "code"
POSITIONAL = 3  # at most this many parameters (self and cls not counted) by position


def positional_parameters(node, method):
    names = [a.arg for a in node.args.posonlyargs + node.args.args]
    return names[1:] if method and names[:1] in (["self"], ["cls"]) else names


def public_signatures(tree):
    """(qualified name, node, is a method) of every module-level function and every method
    of a module-level class that a caller may use: no leading underscore (__init__ counts).
    forward is left out: nn.Module.__call__ passes its arguments on by position."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield node.name, node, False
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name != "forward":
                    yield f"{node.name}.{item.name}", item, True


def too_positional(text):
    return [
        f"{name}({', '.join(positional_parameters(node, method))})"
        for name, node, method in public_signatures(ast.parse(text))
        if (name.split(".")[-1] == "__init__" or not name.split(".")[-1].startswith("_"))
        and len(positional_parameters(node, method)) > POSITIONAL
    ]


def test_the_rule_on_known_signatures():
    source = (
        "def three(a, b, c): pass\n"
        "def four(a, b, c, d): pass\n"
        "def named(a, b, c, *, d, e): pass\n"
        "def _private(a, b, c, d): pass\n"
        "class Layer:\n"
        "    def __init__(self, a, b, c, d): pass\n"
        "    def forward(self, a, b, c, d): pass\n"
        "    @classmethod\n"
        "    def new(cls, a, b, c, *, d): pass\n"
        "def outer(a):\n"
        "    def inner(a, b, c, d): pass\n"
    )
    assert too_positional(source) == ["four(a, b, c, d)", "Layer.__init__(a, b, c, d)"]


@pytest.mark.parametrize("path", sorted(CODE.glob("*.py")), ids=lambda p: p.name)
def test_public_functions_take_all_but_three_parameters_by_keyword(path):
    found = too_positional(path.read_text())
    assert not found, f"make all but the first three keyword-only (a bare *): {found}"


def wide_signatures():
    """{name: positional parameter count} of the book's functions and classes of more than
    three parameters: what a spread tuple could fill in the wrong order."""
    wide = {}
    for path in CODE.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef):
                count = len(node.args.args) + len(node.args.kwonlyargs)
            elif isinstance(node, ast.ClassDef):  # a dataclass's fields, or its __init__
                fields = [n for n in node.body if isinstance(n, ast.AnnAssign)]
                inits = [n for n in node.body if getattr(n, "name", "") == "__init__"]
                count = len(inits[0].args.args) - 1 if inits else len(fields)
            else:
                continue
            if count > POSITIONAL:
                wide[node.name] = count
    return wide


@pytest.mark.parametrize("path", sorted(CODE.glob("*.py")), ids=lambda p: p.name)
def test_no_call_spreads_a_tuple_over_a_wide_signature(path):
    wide = wide_signatures()
    spread = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and any(isinstance(a, ast.Starred) for a in node.args):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name in wide or name == "cls":
                spread.append(f"line {node.lineno}: {ast.unparse(node)[:80]}")
    assert not spread, f"name the arguments instead of spreading a tuple: {spread}"


# one name per idea: the name the book uses, and the synonyms it has dropped
ONE_NAME = {
    "pad_id": ("pad_idx", "padding_idx"),  # the padding token's id (PAD_ID)
    "d_model": ("model_size",),  # the model's width, as the paper writes it
    "lr_factor": ("factor",),  # the learning rate's scale, as TrainConfig names it
    "summarise": ("summarize",),  # the book's spelling, as initialise
}


def names_in(tree):
    """Every name a module defines or uses: functions, classes, parameters, variables,
    attributes and keyword arguments."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            yield node.name
        elif isinstance(node, ast.arg):
            yield node.arg
        elif isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute):
            yield node.attr
        elif isinstance(node, ast.keyword) and node.arg:
            yield node.arg


@pytest.mark.parametrize("path", sorted(CODE.glob("*.py")), ids=lambda p: p.name)
def test_one_name_per_idea(path):
    used = set(names_in(ast.parse(path.read_text())))
    dropped = {old: name for name, olds in ONE_NAME.items() for old in olds if old in used}
    assert not dropped, f"use the book's name for each: {dropped}"


def too_positional_records(text):
    """Dataclasses of more than three fields that let a caller fill a fourth by position:
    neither kw_only=True nor a `_: KW_ONLY` marker after at most three fields."""
    found = []
    for node in ast.parse(text).body:
        if not isinstance(node, ast.ClassDef):
            continue
        decorators = [d for d in node.decorator_list if "dataclass" in ast.unparse(d)]
        if not decorators:
            continue
        keyword_only = any("kw_only=True" in ast.unparse(d) for d in decorators)
        fields = [item for item in node.body if isinstance(item, ast.AnnAssign)]
        marked = (
            [ast.unparse(item.annotation) for item in fields].index("KW_ONLY")
            if any(ast.unparse(item.annotation) == "KW_ONLY" for item in fields)
            else len(fields)
        )
        if len(fields) > POSITIONAL and not keyword_only and marked > POSITIONAL:
            found.append(node.name)
    return found


def test_the_record_rule_on_known_dataclasses():
    source = (
        "@dataclass\nclass Four:\n    a: int\n    b: int\n    c: int\n    d: int\n"
        "@dataclass(kw_only=True)\nclass Named:\n    a: int\n    b: int\n    c: int\n    d: int\n"
        "@dataclass\nclass Marked:\n    a: int\n    _: KW_ONLY\n    b: int\n    c: int\n"
        "    d: int\n"
        "@dataclass\nclass Three:\n    a: int\n    b: int\n    c: int\n"
    )
    assert too_positional_records(source) == ["Four"]


@pytest.mark.parametrize("path", sorted(CODE.glob("*.py")), ids=lambda p: p.name)
def test_records_of_more_than_three_fields_take_the_rest_by_keyword(path):
    found = too_positional_records(path.read_text())
    assert not found, f"add kw_only=True or a `_: KW_ONLY` after three fields: {found}"


def test_amp_is_the_configs_string_and_autocast_the_dtype_it_means():
    """`amp` is a run's precision as its config spells it ("auto", "bf16", "off", ...); the
    autocast dtype that it means on a device (precision.autocast_dtype) is `autocast`
    everywhere: only autocast_dtype takes an `amp`, and only RunConfig holds one."""
    taking, holding = [], []
    for path in sorted(CODE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                if "amp" in [a.arg for a in arguments]:
                    taking.append(f"{path.stem}.{node.name}")
            elif isinstance(node, ast.ClassDef):
                fields = [item.target for item in node.body if isinstance(item, ast.AnnAssign)]
                if "amp" in [getattr(target, "id", None) for target in fields]:
                    holding.append(f"{path.stem}.{node.name}")
    assert taking == ["precision.autocast_dtype"]
    assert holding == ["profiles.RunConfig"]
