"""One training step and one schedule. The update (a backward pass and an optimizer's step)
is written twice in code/, on purpose: chapter 5's train_step, the paper's, and
train_step_amp, the runs' (mixed precision, a gradient scaler, a graph's needs), which
tests/test_training.py proves equal to it in float32; everything else that trains calls
one of the two. Eq. (3) is written once, in rate: the annealed rate multiplies it, and the
device schedule tabulates the same function."""

import ast
import pathlib

CODE = pathlib.Path(__file__).resolve().parent.parent / "code"
UPDATES = {"annotated_transformer.train_step", "step.train_step_amp"}
EQ_3 = {"annotated_transformer.rate"}


def functions(tree, prefix):
    """(qualified name, node) of every function and method, nested ones included."""
    methods = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    methods[item] = f"{prefix}.{node.name}.{item.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            yield methods.get(node, f"{prefix}.{node.name}"), node


def called_methods(node):
    return {
        call.func.attr
        for call in ast.walk(node)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
    }


def makes_an_update(node):
    return {"backward", "step"} <= called_methods(node)


def writes_eq_3(node):
    """A power of -1.5 (warmup_steps^-1.5) or a reciprocal square root on a tensor."""
    for part in ast.walk(node):
        if isinstance(part, ast.BinOp) and isinstance(part.op, ast.Pow):
            exponent = part.right
            if isinstance(exponent, ast.UnaryOp) and isinstance(exponent.operand, ast.Constant):
                if exponent.operand.value == 1.5:
                    return True
    return "rsqrt" in called_methods(node)


def found(rule):
    return {
        name
        for path in sorted(CODE.glob("*.py"))
        for name, node in functions(ast.parse(path.read_text()), path.stem)
        if rule(node)
    }


def test_the_rules_on_known_code():
    source = (
        "def update(model, optimizer):\n"
        "    model(1).backward()\n"
        "    optimizer.step()\n"
        "def measured(outputs):\n"
        "    outputs.sum().backward()\n"  # a backward pass alone trains nothing
        "def rate(step, warmup_steps):\n"
        "    return min(step**-0.5, step * warmup_steps**-1.5)\n"
        "class Schedule:\n"
        "    def step(self):\n"
        "        self.lr = self.count.rsqrt()\n"
    )
    tree = ast.parse(source)
    assert {name for name, node in functions(tree, "m") if makes_an_update(node)} == {"m.update"}
    assert {name for name, node in functions(tree, "m") if writes_eq_3(node)} == {
        "m.rate",
        "m.Schedule.step",
    }


def test_the_update_is_written_in_the_papers_step_and_the_runs_step_alone():
    assert found(makes_an_update) == UPDATES


def test_eq_3_is_written_in_rate_alone():
    assert found(writes_eq_3) == EQ_3
