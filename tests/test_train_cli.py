"""code/train.py and what the scripts share in code/script_helpers.py: flags from the config
dataclasses (help from their docstrings), integer types held to the module's rule, the flags
several scripts take (declared once), user errors as one line and exit code 2 (every script),
results tables and shared tokenizers. What the module checks is tested with the module; here,
only what the command line itself does."""

import argparse
import ast
import dataclasses
import errno
import pathlib
import re

import pytest
import torch

import annotated_transformer as at
import multi30k_files
import profiles
import safe_files
import script_helpers as helpers
import train
import training_runs as training
from toy import toy_pairs

TINY_FLAGS = ["--N", "1", "--d-model", "32", "--d-ff", "64", "--h", "2", "--vocab-size", "200"]
TINY_FLAGS += ["--max-tokens", "200", "--warmup-steps", "10", "--device", "cpu"]


@pytest.fixture
def toy_data(monkeypatch, tmp_path_factory):
    monkeypatch.setattr(helpers, "load_multi30k", lambda split, data_dir=None: toy_pairs())
    cache = tmp_path_factory.mktemp("tokenizers")  # not the machine's shared cache
    monkeypatch.setattr(helpers, "default_tokenizer_cache", lambda: cache)


def exits_2_with_one_line(capsys, call, argv):
    """call(argv) either returns 2 naming the problem in one line on stderr, "train.py: ..."
    (a progress bar may share the line's start), or stops argparse's way (SystemExit 2,
    usage and one line "...: error: ..."); no traceback. Returns that line from its marker."""
    try:
        code = call(argv)
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    found = [re.search(r"(train\.py|error): .*", line) for line in err.splitlines()]
    found = [match.group(0) for match in found if match]
    assert code == 2 and "Traceback" not in err and len(found) == 1, err
    return found[0]


# ---- flags from the dataclasses ------------------------------------------------------------


def test_every_config_field_is_a_flag_that_parses():
    given = {bool: [], int: ["3"], float: ["0.25"], str: ["learned"]}
    parsed = {bool: True, int: 3, float: 0.25, str: "learned"}
    names = set()
    for field in dataclasses.fields(profiles.RunConfig) + dataclasses.fields(at.ModelConfig):
        if field.name == "model":
            continue
        kind = {int | None: int, bool | None: bool}.get(field.type, field.type)  # None: unset
        flag = "--" + field.name.replace("_", "-")
        args = train.parse_args(["--out", "x", flag, *given[kind]])
        assert getattr(args, field.name) == parsed[kind], field.name
        names.add(field.name)
    assert {"attention_dropout", "relu_dropout", "pre_norm", "weight_decay", "eval_every"} <= names


def test_booleans_have_a_yes_and_a_no_form_and_unset_flags_keep_the_profile():
    args = train.parse_args(["--out", "x", "--no-pre-norm", "--share-embeddings"])
    assert args.pre_norm is False and args.share_embeddings is True
    assert args.dropout is None and args.max_steps is None
    assert train.config_from_args(train.parse_args(["--out", "x"])) == profiles.PROFILES["multi30k"]


def test_a_field_documented_in_its_class_docstring_becomes_a_flag_with_that_help(
    monkeypatch, capsys
):
    @dataclasses.dataclass(frozen=True)
    class Extended(profiles.RunConfig):
        """A made-up recipe with one more field.

        Attributes:
            gradient_clip: largest norm of the
                gradient before an update
        """

        gradient_clip: float = 0.0

    monkeypatch.setattr(profiles, "RunConfig", Extended)
    assert train.parse_args(["--out", "x", "--gradient-clip", "1.5"]).gradient_clip == 1.5
    with pytest.raises(SystemExit):
        train.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps long help
    assert "--gradient-clip FLOAT largest norm of the gradient before an update" in text
    assert "(Extended.gradient_clip)" in text


def test_every_train_and_model_config_field_has_help():
    for cls in (at.TrainConfig, at.ModelConfig):
        helps = helpers.field_help(cls)
        for field in dataclasses.fields(cls):
            if field.name != "model":
                assert helps.get(field.name, "").strip(), f"{cls.__name__}.{field.name}"


def test_flags_override_the_profile_and_the_logged_command_round_trips():
    argv = ["--out", "x", "--d-model", "128", "--pre-norm", "--lr-factor", "0.5", "--h", "8"]
    config = train.config_from_args(train.parse_args([*argv, "--N", "1"]))
    profile = profiles.PROFILES["multi30k"]  # the default profile
    changed = dict(d_model=128, pre_norm=True, h=8, N=1)  # N=1: a flag with a value, not --N
    assert config.model == dataclasses.replace(profile.model, **changed)
    assert config == dataclasses.replace(profile, model=config.model, lr_factor=0.5)
    command = helpers.command_for(config)
    assert command.startswith("python code/train.py --profile quick ")
    assert "--pre-norm" in command.split() and "--d-model 128" in command
    assert train.config_from_args(train.parse_args(["--out", "x", *command.split()[2:]])) == config


# ---- the command line: exit 2 with one line, files written ----------------------------------


def test_command_line_trains_and_resumes(tmp_path, toy_data):
    flags = ["--out", str(tmp_path), *TINY_FLAGS]
    assert train.main([*flags, "--max-steps", "4"]) == 0
    assert train.main([*flags, "--max-steps", "6", "--resume"]) == 0
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 6
    names = {p.name for p in tmp_path.iterdir()}
    assert {"checkpoint.pt", "tokenizer.json", "metrics.json", "train.log"} <= names
    log = (tmp_path / "train.log").read_text().splitlines()
    assert sum(line.startswith("training multi30k on 60 pairs") for line in log) == 2


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--lr-factor", "nan"], "train.py: lr_factor must be a positive finite number, got nan"),
        (["--d-model", "255"], "train.py: d_model=255 is not divisible by h=8"),
    ],
)
def test_a_value_the_configs_refuse_exits_2_with_one_line_before_any_file(
    flags, message, tmp_path, toy_data, capsys
):
    line = exits_2_with_one_line(capsys, train.main, ["--out", str(tmp_path / "run"), *flags])
    assert line.startswith(message)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--out", ""], "--out: must name a file or folder, got an empty path"),
        (["--out", "x", "--max-steps", "many"], "--max-steps: invalid int value: 'many'"),
        (["--out", "x", "--pre-norm", "yes"], "unrecognized arguments: yes"),
    ],
)
def test_a_bad_flag_exits_2_naming_it(argv, message, capsys):
    # parse_args, not main: were a check missing, main would start a long run
    assert message in exits_2_with_one_line(capsys, train.parse_args, argv)


def test_cuda_without_a_gpu_is_refused_while_parsing(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = exits_2_with_one_line(capsys, train.parse_args, ["--out", "x", "--device", "cuda"])
    assert "--device" in line and "no GPU" in line


def test_train_into_an_unwritable_folder_exits_2_with_the_reason(tmp_path, toy_data, capsys):
    (tmp_path / "file").write_text("not a folder")
    line = exits_2_with_one_line(capsys, train.main, ["--out", str(tmp_path / "file" / "run")])
    assert line.startswith("train.py: ") and "Not a directory" in line


def test_a_full_disk_during_a_save_exits_2_and_keeps_the_last_checkpoint(
    tmp_path, toy_data, capsys, monkeypatch
):
    flags = ["--out", str(tmp_path), *TINY_FLAGS, "--checkpoint-every", "3", "--no-validation"]
    assert train.main([*flags, "--max-steps", "3"]) == 0
    before = (tmp_path / "checkpoint.pt").read_bytes()

    def full(payload, file):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(at.torch, "save", full)
    line = exits_2_with_one_line(capsys, train.main, [*flags, "--max-steps", "6", "--resume"])
    assert "No space left on device" in line
    assert (tmp_path / "checkpoint.pt").read_bytes() == before
    assert not list(tmp_path.glob("*.tmp")) and not (tmp_path / ".lock").exists()


@pytest.mark.parametrize(
    "bug",
    [TypeError("'NoneType' object is not subscriptable"), ValueError("math domain error"),
     OSError("a socket error, no path")],
    ids=["TypeError", "ValueError", "OSError"],
)  # fmt: skip
def test_a_bug_inside_a_script_keeps_its_traceback(tmp_path, toy_data, monkeypatch, bug):
    def broken(*args, **kwargs):
        raise bug

    monkeypatch.setattr(training, "train", broken)
    with pytest.raises(type(bug), match=str(bug)):
        train.main(["--out", str(tmp_path / "run"), *TINY_FLAGS])


def test_the_users_errors_are_told_from_bugs():
    users = [at.InputError("d_model must be even"), multi30k_files.DatasetError("no file"),
             FileNotFoundError(2, "No such file or directory", "de.txt"),
             OSError(errno.ENOSPC, "No space left on device")]  # fmt: skip
    bugs = [ValueError("x"), TypeError("x"), KeyError("x"), OSError("x"), RuntimeError("x")]
    assert [helpers.users_to_fix(e) for e in users + bugs] == [True] * 4 + [False] * 5


def test_command_line_reports_missing_data(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MULTI30K_DIR", raising=False)
    argv = ["--out", str(tmp_path / "run"), "--data-dir", str(tmp_path / "nowhere")]
    assert "MULTI30K_DIR" in exits_2_with_one_line(capsys, train.main, argv)


# ---- tables, logs and tokenizers the scripts share -----------------------------------------


def test_a_results_table_is_written_whole_and_read_back_as_strings(tmp_path, monkeypatch):
    path = tmp_path / "table.csv"
    assert helpers.read_csv(path) == []
    helpers.write_csv(path, [{"row": "base", "ppl": 4.5}], ["row", "ppl"])
    assert path.read_bytes() == b"row,ppl\r\nbase,4.5\r\n"
    assert helpers.read_csv(path) == [{"row": "base", "ppl": "4.5"}]

    def crash(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(helpers.os, "replace", crash)
    with pytest.raises(OSError):
        helpers.write_csv(path, [{"row": "other", "ppl": 1}], ["row", "ppl"])
    assert helpers.read_csv(path) == [{"row": "base", "ppl": "4.5"}]  # the old table, whole


def test_the_log_appends_to_its_file_and_echoes(tmp_path):
    echoed = []
    for message in ("first", "second"):
        with helpers.log_to(tmp_path / "logs" / "run.log", echo=echoed.append) as log:
            log(message)
    assert (tmp_path / "logs" / "run.log").read_text() == "first\nsecond\n"
    assert echoed == ["first", "second"]
    with helpers.log_to(None, echo=None) as log:
        log("nowhere")  # rank > 0 of a distributed run: no file, no output


def test_one_tokenizer_per_vocabulary_size_is_learned_once(tmp_path, monkeypatch):
    learned = []
    original = at.train_bpe

    def counting(pairs, vocab_size):
        learned.append(vocab_size)
        return original(pairs, vocab_size)

    monkeypatch.setattr(at, "train_bpe", counting)
    get = helpers.tokenizers(toy_pairs(), tmp_path)
    first = get(40)
    assert get(40) is first and get(50).get_vocab_size() == 50 and learned == [40, 50]
    assert (tmp_path / "tokenizer-40.json").exists()
    # another process (a second search sharing the folder) reads the file, learns nothing
    again = helpers.tokenizers(toy_pairs(), tmp_path)(40)
    assert again.get_vocab() == first.get_vocab() and learned == [40, 50]
    assert helpers.tokenizers(toy_pairs())(40).get_vocab() == first.get_vocab()  # in memory only


def test_a_second_run_on_the_same_pairs_reads_the_vocabulary_the_first_learned(
    tmp_path, toy_data, monkeypatch
):
    learned = []
    original = at.train_bpe
    monkeypatch.setattr(at, "train_bpe", lambda *args: learned.append(args[1]) or original(*args))
    for run in ("first", "second"):
        assert train.main(["--out", str(tmp_path / run), *TINY_FLAGS, "--max-steps", "1"]) == 0
    assert learned == [200]  # the second run learned nothing
    first, second = ((tmp_path / run / "tokenizer.json").read_text() for run in ("first", "second"))
    assert first == second == original(toy_pairs(), 200).to_str(pretty=True)
    # the cache's folder names what the vocabulary depends on: other pairs, another folder
    folder = helpers.tokenizer_cache_folder(toy_pairs())
    assert folder.parent == helpers.default_tokenizer_cache()
    assert helpers.tokenizer_cache_folder(toy_pairs()[1:]) != folder
    monkeypatch.setattr(helpers.hf_tokenizers, "__version__", "0.0.0")
    assert helpers.tokenizer_cache_folder(toy_pairs()) != folder  # another tokenizers library


@pytest.mark.parametrize("capability", [(7, 0), (7, 5), (8, 0), (9, 0)])  # V100 T4 A100 H100
def test_on_any_gpu_the_default_is_float32_with_cuda_graphs_for_one_process(
    capability, monkeypatch, tmp_path
):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)

    def options(*flags, world=1, device="cuda", profile="multi30k"):
        args = train.parse_args(["--out", str(tmp_path), "--profile", profile, *flags])
        return training.run_options(train.config_from_args(args), device, world)

    float16 = capability < (8, 0)  # auto: bf16 from compute capability 8.0, fp16 below
    assert options() == (None, True, True)
    assert options(profile="fast") == (None, True, True)  # a GPU does not race the CPU's clock
    assert options(world=2) == (None, False, True)  # graphs hold one process's step
    assert options("--compile", "inductor") == (None, False, True)
    assert options("--no-cuda-graphs", "--no-buckets") == (None, False, False)
    auto = torch.float16 if float16 else torch.bfloat16
    assert options("--amp", "auto") == (auto, not float16, True)  # graphs cannot hold fp16
    assert options("--amp", "bf16", "--cuda-graphs") == (torch.bfloat16, True, True)
    # on a CPU: eager and unbucketed, the fast profile racing the clock, the others float32
    assert options(device="cpu") == (None, False, False)
    assert options(device="cpu", profile="fast") == ("fastest", False, False)
    assert options("--cuda-graphs", "--buckets", device="cpu") == (None, True, True)
    with pytest.raises(at.InputError, match="drop compile"):
        options("--cuda-graphs", "--compile", "inductor")


def test_a_run_option_the_config_refuses_exits_2_naming_it(tmp_path, capsys):
    line = exits_2_with_one_line(capsys, train.main, ["--out", str(tmp_path), "--amp", "half"])
    assert "amp must be one of auto, bf16, fp16, off, fastest, got 'half'" in line


def test_a_tokenizer_shared_through_a_folder_is_written_whole(tmp_path, monkeypatch):
    def full_disk(source, target):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safe_files.os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        helpers.tokenizers(toy_pairs(), tmp_path)(40)
    assert list(tmp_path.iterdir()) == []  # neither half a tokenizer nor a temporary file


# ---- what every script shares ----------------------------------------------------------------

CODE = pathlib.Path(helpers.__file__).resolve().parent
SCRIPTS = sorted(p for p in CODE.glob("*.py") if re.search(r"^def main\(", p.read_text(), re.M))
# scripts whose main is not guarded by helpers.user_errors_exit_2, and why
UNGUARDED = {
    "export.py": "it generates annotated_transformer.py, so it must run when that module does "
    "not import (a chapter half edited): it loads neither torch nor script_helpers, and ends "
    "its own errors (a cell it refuses, a missing notebook) with one line and exit 2",
}
SHARED_FLAGS = ("--checkpoint", "--data-dir", "--device", "--threads")


@pytest.mark.parametrize(
    "parse, text, value",
    [
        (helpers.positive_int_flag, "3", 3),
        (helpers.positive_int_flag, " 12 ", 12),
        (helpers.non_negative_int, "0", 0),
        (helpers.non_negative_int, "7", 7),
    ],
)
def test_an_integer_flag_reads_its_text_as_an_int(parse, text, value):
    assert parse(text) == value


@pytest.mark.parametrize(
    "parse, text, message",
    [
        (helpers.positive_int_flag, "0", "must be a positive integer, got '0'"),
        (helpers.positive_int_flag, "-2", "must be a positive integer, got '-2'"),
        (helpers.positive_int_flag, "2.5", "must be a positive integer, got '2.5'"),
        (helpers.positive_int_flag, "True", "must be a positive integer, got 'True'"),
        (helpers.positive_int_flag, "", "must be a positive integer, got ''"),
        (helpers.non_negative_int, "-1", "must be an integer >= 0, got '-1'"),
        (helpers.non_negative_int, "zero", "must be an integer >= 0, got 'zero'"),
    ],
)
def test_an_integer_flag_refuses_other_text_naming_it(parse, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(message)):
        parse(text)


def test_both_integer_types_hold_the_value_to_the_modules_one_rule(monkeypatch):
    checked, rule = [], at.positive_int

    def counted(name, value):
        checked.append(value)
        return rule(name, value)

    monkeypatch.setattr(at, "positive_int", counted)
    assert helpers.positive_int_flag("3") == 3 and helpers.non_negative_int("0") == 0
    assert checked == [3, 1]  # >= 0: the value plus one is a positive integer


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--arms", "0:5"], "--arms: must be N:warmup, layers a positive integer and warm-up"),
        (["--arms", "6:-1"], "(e.g. 6:400), got '6:-1'"),
        (["--arms", "6"], "got '6'"),
        (["--steps", "0"], "--steps: must be a positive integer, got '0'"),
        (["--seeds", "-1"], "--seeds: must be an integer >= 0, got '-1'"),
    ],
)
def test_the_warmup_ablation_refuses_a_bad_arm_or_count_while_parsing(argv, message, capsys):
    import warmup_ablation

    with pytest.raises(SystemExit) as stop:
        warmup_ablation.main(["--out", "never.csv", *argv])
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_a_flag_several_scripts_take_is_declared_once_in_script_helpers():
    declared = []
    for path in CODE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                if node.args[0].value in SHARED_FLAGS:
                    declared.append((path.name, node.args[0].value))
    assert sorted(declared) == [("script_helpers.py", flag) for flag in SHARED_FLAGS]


def test_threads_are_pytorchs_choice_unless_a_script_budgets_cpu_time():
    import benchmark
    import recipe_search
    import translate
    import variations

    assert translate.parse_args(["Hund"]).threads is None
    assert variations.parse_args(["--out", "o"]).threads is None
    assert benchmark.parse_args([]).threads is None
    assert recipe_search.parse_args(["--out", "o"]).threads == 1  # CPU-second budgets
    threads = torch.get_num_threads()
    helpers.set_threads(None)  # no --threads: PyTorch's own count stays
    assert torch.get_num_threads() == threads


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda path: path.name)
def test_every_scripts_main_ends_a_users_error_with_one_line_and_exit_2(path):
    tree = ast.parse(path.read_text())
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    guards = [
        ast.literal_eval(d.args[0])
        for d in main.decorator_list
        if isinstance(d, ast.Call) and ast.unparse(d.func) == "helpers.user_errors_exit_2"
    ]
    assert guards == ([] if path.name in UNGUARDED else [path.name])  # named as it is run


def test_the_scripts_are_found():
    names = {path.name for path in SCRIPTS}
    assert {"train.py", "evaluate.py", "translate.py", "export_onnx.py", "export.py"} <= names
    assert set(UNGUARDED) <= names
