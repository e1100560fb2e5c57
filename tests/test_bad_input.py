"""Bad input and faults: every refusal names what is wrong, nothing is lost, nothing is
silently wrong. One test per case; the case is in the test's name."""

import csv
import errno
import json
import math

import pytest
import torch

import annotated_transformer as at
import evaluate
import train
import variations
from toy import TINY, quiet, toy_pairs


@pytest.fixture
def trained(tmp_path):
    folder = tmp_path / "run"
    at.train(TINY, toy_pairs(), folder, log=quiet)
    return folder


def exits_2(parse, argv, capsys, message):
    with pytest.raises(SystemExit) as stop:
        parse(argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


# ---- command lines ---------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--average", "--batch-size", "--limit"])
@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_evaluate_refuses_zero_negative_or_non_integer_counts(flag, value, capsys):
    argv = ["--run", "r", "--out", "o", flag, value]
    exits_2(evaluate.parse_args, argv, capsys, f"{flag}: must be a positive integer")


def test_evaluate_refuses_to_write_into_the_training_run(trained, capsys):
    before = (trained / "metrics.json").read_bytes()
    assert evaluate.main(["--run", str(trained), "--out", str(trained)]) == 2
    assert "is a training run's folder" in capsys.readouterr().err
    assert (trained / "metrics.json").read_bytes() == before
    assert not (trained / "averaged.pt").exists()


def test_evaluate_of_a_folder_without_snapshots_says_so(tmp_path, capsys):
    assert evaluate.main(["--run", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "no checkpoint-<step>.pt in" in capsys.readouterr().err


def test_train_refuses_a_nan_learning_rate_factor_with_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(at, "load_multi30k", lambda split, data_dir=None: toy_pairs())
    assert train.main(["--out", str(tmp_path), "--lr-factor", "nan"]) == 2
    assert "lr_factor must be a positive finite number, got nan" in capsys.readouterr().err
    assert not (tmp_path / "checkpoint.pt").exists()


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--max-tokens", "0", "max_tokens must be a positive integer"),
        ("--dropout", "1.5", "dropout must be a probability"),
        ("--smoothing", "-0.1", "smoothing must be in [0, 1)"),
        ("--d-model", "255", "d_model=255 is not divisible by h=8"),
        ("--positions", "rotary", "positions must be 'sinusoidal'"),
    ],
)
def test_train_refuses_bad_recipe_values_naming_the_field(flag, value, message, tmp_path, capsys):
    assert train.main(["--out", str(tmp_path), flag, value]) == 2
    assert message in capsys.readouterr().err


def test_train_on_cuda_without_a_gpu_stops_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    exits_2(train.parse_args, ["--out", str(tmp_path), "--device", "cuda"], capsys, "no GPU")


def test_train_into_an_unwritable_folder_exits_2_with_the_reason(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(at, "load_multi30k", lambda split, data_dir=None: toy_pairs())
    (tmp_path / "file").write_text("not a folder")
    assert train.main(["--out", str(tmp_path / "file" / "run")]) == 2
    assert "Not a directory" in capsys.readouterr().err


def test_a_full_disk_during_a_save_exits_2_and_keeps_the_last_checkpoint(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(at, "load_multi30k", lambda split, data_dir=None: toy_pairs())
    flags = ["--out", str(tmp_path), "--N", "1", "--d-model", "32", "--d-ff", "64", "--h", "2"]
    flags += ["--vocab-size", "200", "--max-tokens", "200", "--checkpoint-every", "3"]
    assert train.main([*flags, "--max-steps", "3", "--no-validation"]) == 0
    before = (tmp_path / "checkpoint.pt").read_bytes()

    def full(payload, file):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(at.torch, "save", full)
    assert train.main([*flags, "--max-steps", "6", "--no-validation", "--resume"]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert (tmp_path / "checkpoint.pt").read_bytes() == before
    assert not list(tmp_path.glob("*.tmp")) and not (tmp_path / ".lock").exists()


def test_variations_train_pairs_zero_is_refused_not_read_as_all(capsys):
    exits_2(variations.parse_args, ["--out", "o", "--train-pairs", "0"], capsys, "positive")


def test_variations_refuses_a_negative_seed(capsys):
    exits_2(variations.parse_args, ["--out", "o", "--seeds", "0", "-1"], capsys, "integer >= 0")


def test_variations_does_not_reuse_a_subset_run_for_a_bigger_one(tmp_path, monkeypatch):
    monkeypatch.setattr(at, "load_multi30k", lambda split, data_dir=None: toy_pairs(40))
    flags = ["--out", str(tmp_path), "--scale", "tiny", "--max-steps", "2", "--rows", "base"]
    flags += ["--vocab-size", "60", "--seeds", "0", "--device", "cpu"]
    assert variations.main([*flags, "--train-pairs", "20"]) == 0
    assert variations.main([*flags, "--train-pairs", "30"]) == 0
    assert variations.main([*flags, "--train-pairs", "30"]) == 0  # this one is done
    with open(tmp_path / "variations.csv", newline="") as file:
        assert [r["train_pairs"] for r in csv.DictReader(file)] == ["20", "30"]


# ---- the module's functions ------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, message",
    [
        ({"batch_size": -1}, "batch_size must be a positive integer, got -1"),
        ({"batch_size": 0}, "batch_size must be a positive integer, got 0"),
        ({"beam_size": 0}, "beam_size must be a positive integer, got 0"),
        ({"alpha": float("nan")}, "alpha must be a finite number >= 0, got nan"),
        ({"alpha": -0.5}, "alpha must be a finite number >= 0, got -0.5"),
    ],
)
def test_translate_refuses_bad_decoding_settings(trained, options, message):
    model, tokenizer = at.load_checkpoint(trained / "checkpoint.pt")
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        at.translate(model, tokenizer, ["a dog"], **options)


@pytest.mark.parametrize("fused", [True, False])
def test_a_float_mask_is_refused_on_both_attention_paths(fused):
    model = at.make_model(20, 20, N=1, d_model=16, d_ff=32, h=2, fused=fused).eval()
    src = torch.randint(4, 20, (2, 5))
    mask = at.padding_mask(src, at.PAD_ID)
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        model.encode(src, mask.float())
    model.encode(src, mask)  # the bool mask works


def test_averaging_checkpoints_of_different_vocabularies_is_refused(tmp_path):
    at.train(TINY, toy_pairs(seed=0), tmp_path / "a", log=quiet)
    at.train(TINY, toy_pairs(seed=3), tmp_path / "b", log=quiet)
    paths = [at.snapshot_paths(tmp_path / "a")[-1], at.snapshot_paths(tmp_path / "b")[-1]]
    assert json.loads(torch.load(paths[0], weights_only=True)["tokenizer"]) != json.loads(
        torch.load(paths[1], weights_only=True)["tokenizer"]
    )
    with pytest.raises(ValueError, match="different tokenizers"):
        at.average_checkpoints(paths)


@pytest.mark.parametrize("content", [b"", b"garbage, not a checkpoint", b"PK\x03\x04broken zip"])
def test_a_damaged_checkpoint_is_reported_with_its_path(tmp_path, content):
    path = tmp_path / "checkpoint-0000001.pt"
    path.write_bytes(content)
    for load in (at.load_checkpoint, lambda p: at.average_checkpoints([p])):
        with pytest.raises(ValueError, match=f"{path} cannot be read as a checkpoint"):
            load(path)


def test_a_foreign_file_is_reported_as_not_a_checkpoint(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"state_dict": {}}, path)
    with pytest.raises(ValueError, match="is not a checkpoint written by train"):
        at.load_checkpoint(path)


def test_an_older_checkpoint_format_is_loaded_but_not_resumed(trained):
    payload = torch.load(trained / "checkpoint.pt", weights_only=True)
    payload.pop("format")
    torch.save(payload, trained / "checkpoint.pt")
    at.load_checkpoint(trained / "checkpoint.pt")  # still loads for translation
    with pytest.raises(ValueError, match="has checkpoint format 1, this code writes 2"):
        at.train(TINY, toy_pairs(), trained, resume=True, log=quiet)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: at.LabelSmoothing(0, 0, 0.1), "size .* must be an integer >= 2"),
        (lambda: at.LabelSmoothing(10, 12, 0.1), "padding_idx must be in"),
        (lambda: at.LabelSmoothing(10, 0, float("nan")), "smoothing must be in"),
        (lambda: at.rate(10, 512, warmup=0), "warmup must be a positive integer"),
        (lambda: at.rate(10, -512), "model_size must be a positive integer"),
        (lambda: at.rate(10, 512, factor=math.inf), "factor must be a positive finite"),
        (lambda: at.Batch.from_ids([]), "at least one"),
        (lambda: at.EncodedCorpus([]), "at least one"),
    ],
)
def test_public_functions_refuse_bad_arguments_naming_them(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_training_on_no_pairs_is_refused(tmp_path):
    with pytest.raises(ValueError, match="train_pairs is empty"):
        at.train(TINY, [], tmp_path, log=quiet)


def test_load_checkpoint_of_a_missing_file_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        at.load_checkpoint(tmp_path / "nothing.pt")
