"""code/evaluate.py: the table of §6.1 for a training run (greedy and beam search, last and
averaged weights), written into a folder of its own; user errors end as exit code 2."""

import dataclasses
import json

import pytest
import sacrebleu
import torch

import annotated_transformer as at
import evaluate
import fast_decoding as fd
import hardware
import run_folder
import scoring
import script_helpers as helpers
import training_runs as training
from toy import TINY, quiet, toy_pairs


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run")
    training.train(TINY, toy_pairs(), folder, log=quiet)
    return folder


@pytest.fixture
def short_outputs(monkeypatch):
    """Toy data (test2016 apart from val), and outputs of at most 5 tokens: a 6-step model
    rarely ends a sentence."""
    seeds = {"test2016": 3}  # val, and any other split: 2
    monkeypatch.setattr(
        helpers,
        "load_multi30k",
        lambda split, data_dir=None: toy_pairs(8, seed=seeds.get(split, 2)),
    )
    capped = lambda src_mask, max_len=None: torch.full((src_mask.size(0),), 5)  # noqa: E731
    monkeypatch.setattr(fd, "output_limits", capped)


@pytest.mark.parametrize("flag", ["--average", "--batch-size", "--limit"])
@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_evaluate_refuses_zero_negative_or_non_integer_counts(flag, value, capsys):
    with pytest.raises(SystemExit) as stop:
        evaluate.parse_args(["--run", "r", "--out", "o", flag, value])
    assert stop.value.code == 2
    assert f"{flag}: must be a positive integer" in capsys.readouterr().err


def test_evaluate_refuses_to_write_into_the_training_run(tiny_run, capsys):
    before = {p.name: p.read_bytes() for p in tiny_run.iterdir()}
    assert evaluate.main(["--run", str(tiny_run), "--out", str(tiny_run)]) == 2
    assert "is a training run's folder" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in tiny_run.iterdir()} == before


def test_evaluate_of_a_folder_without_snapshots_says_so(tmp_path, capsys):
    assert evaluate.main(["--run", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "no checkpoint-<step>.pt in" in capsys.readouterr().err


def test_evaluate_command_line_writes_the_table(tiny_run, tmp_path, short_outputs):
    flags = ["--average", "2", "--alpha", "0.6"]
    assert evaluate.main(["--run", str(tiny_run), "--out", str(tmp_path), *flags]) == 0
    evaluation = json.loads((tmp_path / "evaluation.json").read_text())
    assert evaluation["steps"] == 6 and evaluation["averaged_steps"] == [3, 6]
    seconds = torch.load(tiny_run / "checkpoint.pt", weights_only=True)["seconds"]
    assert evaluation["train_hours"] == round(seconds / 3600, 2)  # kept by the checkpoint
    assert evaluation["train_seconds"] == round(seconds, 1)
    assert len(evaluation["results"]) == 8  # 2 weights x 2 sets x 2 decodings
    assert {r["decoding"] for r in evaluation["results"]} == {"greedy", "beam 4, alpha 0.6"}
    assert evaluation["alpha"] == 0.6 and "alpha_on_val" not in evaluation  # nothing chosen
    assert len(evaluation["samples"]) == 8
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["history"][0]["step"] == 6  # one window of 10 steps, ending at step 6
    assert (tmp_path / "averaged.pt").exists() and not (tiny_run / "averaged.pt").exists()
    # the averaged weights are stored in float16, and load back into a float32 model
    stored = at.read_checkpoint(tmp_path / "averaged.pt")["model"]
    assert {t.dtype for t in stored.values() if t.is_floating_point()} == {torch.float16}
    snapshots = [at.read_checkpoint(p)["model"] for p in run_folder.snapshot_paths(tiny_run)[-2:]]
    model, _ = at.load_checkpoint(tmp_path / "averaged.pt")
    for name, tensor in model.state_dict().items():
        # the mean of the two snapshots in float64, rounded to float16 once
        mean = (snapshots[0][name].double() + snapshots[1][name].double()) / 2
        expected = mean.to(tensor.dtype).half().float() if tensor.is_floating_point() else mean
        assert tensor.dtype == snapshots[0][name].dtype
        assert torch.equal(tensor.double(), expected.double()), name


def test_evaluate_takes_its_settings_as_parameters(tiny_run, tmp_path, short_outputs):
    snapshots = run_folder.snapshot_paths(tiny_run)
    evaluate.evaluate(tiny_run, tmp_path, snapshots, average=1, limit=3, dtype="float32")
    evaluation = json.loads((tmp_path / "evaluation.json").read_text())
    assert evaluation["averaged_steps"] == [6] and evaluation["sentences"] == {
        "val": 3,
        "test2016": 3,
    }
    stored = at.read_checkpoint(tmp_path / "averaged.pt")["model"]
    last = at.read_checkpoint(snapshots[-1])["model"]
    assert all(torch.equal(stored[name], last[name]) for name in last)  # float32: unchanged
    # the training machine, as the run recorded it with its precision, not the scorer's
    trained_on = json.loads((tiny_run / "metrics.json").read_text())["hardware"]
    assert evaluation["hardware"] == trained_on and trained_on.endswith(", float32")
    assert trained_on.startswith(hardware.hardware_description())


@pytest.mark.parametrize("value", ["", "0.6,", "-1", "0.6,x", "inf", "nan"])
def test_evaluate_refuses_alphas_that_are_not_finite_numbers_at_least_zero(value, capsys):
    with pytest.raises(SystemExit) as stop:
        evaluate.parse_args(["--run", "r", "--out", "o", "--alpha", value])
    assert stop.value.code == 2
    assert "--alpha: must be finite numbers >= 0 separated by commas" in capsys.readouterr().err


def test_every_row_stores_its_hypotheses_and_they_score_as_the_table_says(
    tiny_run, tmp_path, short_outputs
):
    evaluate.evaluate(tiny_run, tmp_path, run_folder.snapshot_paths(tiny_run), alphas=(0.6,))
    evaluation = json.loads((tmp_path / "evaluation.json").read_text())
    references = [t for _, t in helpers.load_multi30k("val")]  # toy pairs, the same for both
    assert len(scoring.stored_settings(tmp_path)) == len(evaluation["results"]) == 8
    for row in evaluation["results"]:
        setting = {
            "split": row["set"],
            "decoding": "greedy" if row["decoding"] == "greedy" else "beam",
            "weights": "last" if row["weights"] == "last" else "averaged",
        }
        hypotheses = scoring.read_hypotheses(tmp_path, **setting)
        assert len(hypotheses) == len(references)
        rescored = sacrebleu.corpus_bleu(hypotheses, [references]).score  # sacreBLEU itself
        assert round(rescored, 2) == row["sacreBLEU"], setting


def test_evaluate_reads_one_alpha_or_several():
    # the book's one grid by default: 0.6 (§6.1's) to 1.5
    grid = (0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5)
    assert evaluate.parse_args(["--run", "r", "--out", "o"]).alphas == grid
    assert evaluate.parse_args(["--run", "r", "--out", "o", "--alpha", "0.6"]).alphas == (0.6,)
    assert evaluate.parse_args(["--run", "r", "--out", "o", "--alpha", "1,0.5"]).alphas == (
        1.0,
        0.5,
    )


def test_evaluate_decodes_test_only_at_the_alpha_that_val_chose(
    tiny_run, tmp_path, short_outputs, monkeypatch
):
    # scores made up by alpha, and a record of every decoding asked for: val prefers 0.9 over
    # 0.6 and 1.2; test2016 would prefer 1.2, and must never be decoded at it
    calls, real = [], at.evaluate_bleu
    made_up = {0.6: 30.0, 0.9: 31.5, 1.2: 31.0}

    def recorded(model, tokenizer, pairs, *, beam_size, alpha, **options):
        split = "val" if pairs == val_pairs else "test2016"
        calls.append((split, beam_size, alpha))
        scores = real(model, tokenizer, pairs, beam_size=beam_size, alpha=alpha, **options)
        return {
            **scores,
            "bleu": made_up[alpha] + (5 if split == "test2016" and alpha == 1.2 else 0),
            "length_ratio": alpha / 2,
        }

    def decoded(model, src, src_mask, *, beam_size, alpha):  # every batch any row decodes
        alphas.append((model.training, beam_size, alpha))
        return real_decode(model, src, src_mask, beam_size=beam_size, alpha=alpha)

    val_pairs, alphas, real_decode = helpers.load_multi30k("val"), [], fd.fast_decode_batch
    monkeypatch.setattr(fd, "evaluate_bleu", recorded)  # what fast_evaluate_bleu calls
    monkeypatch.setattr(fd, "fast_decode_batch", decoded)
    flags = ["--average", "2", "--alpha", "0.6,1.2,0.9"]
    assert evaluate.main(["--run", str(tiny_run), "--out", str(tmp_path), *flags]) == 0
    evaluation = json.loads((tmp_path / "evaluation.json").read_text())
    assert evaluation["alpha"] == 0.9
    assert evaluation["alpha_on_val"] == [
        {"alpha": 0.6, "sacreBLEU": 30.0, "length ratio": 0.3},
        {"alpha": 1.2, "sacreBLEU": 31.0, "length ratio": 0.6},
        {"alpha": 0.9, "sacreBLEU": 31.5, "length ratio": 0.45},
    ]
    # the search: beam 4 on val only, once per alpha; then the table at 0.9 alone
    assert calls[:3] == [("val", 4, 0.6), ("val", 4, 1.2), ("val", 4, 0.9)]
    assert {alpha for _, beam, alpha in calls[3:] if beam == 4} == {0.9}
    # val at 0.9: the search's decoding with the averaged weights, reused for their row, and
    # the last weights' row; never a third time
    assert calls.count(("val", 4, 0.9)) == 2
    assert ("test2016", 4, 1.2) not in calls and ("test2016", 4, 0.6) not in calls
    assert {r["decoding"] for r in evaluation["results"]} == {"greedy", "beam 4, alpha 0.9"}
    paper = scoring.read_hypotheses(
        tmp_path, split="test2016", decoding="beam-0.6", weights="averaged"
    )
    model, tokenizer = at.load_checkpoint(tmp_path / "averaged.pt")
    sources = [source for source, _ in helpers.load_multi30k("test2016")]
    # test2016 once more at §6.1's 0.6 with the averaged weights, stored but not a row (the
    # table's decodings are checked above), as the paper's own decoder gives it
    assert paper == at.translate(model, tokenizer, sources, beam_size=4, alpha=0.6)
    assert {alpha for _, beam, alpha in alphas if beam == 4} == {0.6, 1.2, 0.9}
    # the averaged weights record val's choice, which translate.py decodes with by default
    assert at.read_checkpoint(tmp_path / "averaged.pt")["alpha"] == 0.9
    assert helpers.recorded_alpha(at.read_checkpoint(tmp_path / "averaged.pt")) == 0.9
    assert (
        helpers.recorded_alpha(at.read_checkpoint(run_folder.snapshot_paths(tiny_run)[-1])) == 0.6
    )  # none: §6.1's


def test_stored_scores_an_average_whose_run_is_gone_and_keeps_its_record(
    tiny_run, tmp_path, short_outputs, monkeypatch
):
    evaluate.evaluate(tiny_run, tmp_path, run_folder.snapshot_paths(tiny_run), alphas=(0.6,))
    before = json.loads((tmp_path / "evaluation.json").read_text())
    weights = at.read_checkpoint(tmp_path / "averaged.pt")["model"]
    real = at.evaluate_bleu
    made_up = {0.6: 20.0, 1.0: 22.0, 1.4: 21.0}  # val prefers 1.0

    def scored(model, tokenizer, pairs, *, beam_size, alpha, **options):
        scores = real(model, tokenizer, pairs, beam_size=beam_size, alpha=alpha, **options)
        return {**scores, "bleu": made_up[alpha]} if beam_size == 4 else scores

    monkeypatch.setattr(fd, "evaluate_bleu", scored)
    assert evaluate.main(["--stored", str(tmp_path), "--alpha", "0.6,1.0,1.4"]) == 0
    after = json.loads((tmp_path / "evaluation.json").read_text())
    assert after["alpha"] == 1.0 and [a["alpha"] for a in after["alpha_on_val"]] == [0.6, 1.0, 1.4]
    for key in ("steps", "averaged_steps", "train_seconds", "hardware", "config"):
        assert after[key] == before[key], key
    assert {r["weights"] for r in after["results"]} == {"average of last 2"}  # no last weights
    assert {r["decoding"] for r in after["results"]} == {"greedy", "beam 4, alpha 1.0"}
    # the last weights' hypotheses of the first scoring, at another alpha, are gone with them
    assert {w for _, _, w in scoring.stored_settings(tmp_path)} == {"averaged"}
    stored = at.read_checkpoint(tmp_path / "averaged.pt")
    assert stored["alpha"] == 1.0
    assert all(torch.equal(stored["model"][n], weights[n]) for n in weights)  # unchanged


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--run", "r"], "--run needs --out"),
        (["--stored", "s", "--out", "o"], "--stored scores into its own folder"),
        (["--run", "r", "--stored", "s", "--out", "o"], "not allowed with argument"),
    ],
)
def test_evaluate_refuses_flags_that_do_not_go_together(flags, message, capsys):
    with pytest.raises(SystemExit) as stop:
        evaluate.parse_args(flags)
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_evaluate_keeps_the_first_of_equal_alphas(tiny_run, tmp_path, short_outputs, monkeypatch):
    real = at.evaluate_bleu
    monkeypatch.setattr(
        fd, "evaluate_bleu", lambda *args, **options: {**real(*args, **options), "bleu": 20.0}
    )  # every alpha ties
    evaluate.evaluate(tiny_run, tmp_path, run_folder.snapshot_paths(tiny_run), alphas=(1.0, 0.6))
    assert json.loads((tmp_path / "evaluation.json").read_text())["alpha"] == 1.0


def test_evaluate_within_hours_scores_the_run_as_it_stood_then(tmp_path, short_outputs):
    # a run that validates at every snapshot, so each records its training time
    config = dataclasses.replace(TINY, eval_every=3, bleu_sentences=2)
    folder = tmp_path / "run"
    training.train(config, toy_pairs(), folder, val_pairs=toy_pairs(4, seed=3), log=quiet)
    # the tiny run takes well under a second: give its snapshots the training times of a
    # long one, half an hour and two hours, so that one hour falls between them
    for path, seconds in zip(run_folder.snapshot_paths(folder), (1800.0, 7200.0)):
        payload = at.read_checkpoint(path)
        payload["validation"]["seconds"] = seconds
        at.save_checkpoint(path, payload)
    out = tmp_path / "early"
    assert evaluate.main(["--run", str(folder), "--out", str(out), "--within-hours", "1"]) == 0
    evaluation = json.loads((out / "evaluation.json").read_text())
    assert evaluation["steps"] == 3 and evaluation["averaged_steps"] == [3]
    assert evaluation["train_seconds"] == 1800.0
    metrics = json.loads((out / "metrics.json").read_text())
    assert [v["step"] for v in metrics["validations"]] == [3]
    assert max(h["step"] for h in metrics["history"]) <= 3


def test_evaluate_within_hours_refuses_snapshots_without_training_time(tiny_run, tmp_path, capsys):
    # tiny_run was trained without validation pairs
    flags = ["--run", str(tiny_run), "--out", str(tmp_path / "o"), "--within-hours", "1"]
    assert evaluate.main(flags) == 2
    assert "records no training time" in capsys.readouterr().err


# Table 2 of the paper, typed here from the paper, not read from the CSV: BLEU EN-DE, BLEU
# EN-FR, training cost in FLOPs EN-DE, EN-FR (None: empty in the paper). The big model's EN-FR
# is 41.0, §6.1's figure (and the NeurIPS version's Table 2); arXiv v5's Table 2 prints 41.8
PAPER_TABLE2 = {
    "ByteNet": (23.75, None, None, None),
    "Deep-Att + PosUnk": (None, 39.2, None, 1.0e20),
    "GNMT + RL": (24.6, 39.92, 2.3e19, 1.4e20),
    "ConvS2S": (25.16, 40.46, 9.6e18, 1.5e20),
    "MoE": (26.03, 40.56, 2.0e19, 1.2e20),
    "Deep-Att + PosUnk Ensemble": (None, 40.4, None, 8.0e20),
    "GNMT + RL Ensemble": (26.30, 41.16, 1.8e20, 1.1e21),
    "ConvS2S Ensemble": (26.36, 41.29, 7.7e19, 1.2e21),
    "Transformer (base model)": (27.3, 38.1, 3.3e18, 3.3e18),
    "Transformer (big)": (28.4, 41.0, 2.3e19, 2.3e19),
}


def test_the_stored_table2_is_the_papers():
    import csv
    import pathlib

    path = pathlib.Path(__file__).parents[1] / "results" / "paper_table2.csv"
    rows = list(csv.DictReader(path.open()))
    assert [r["model"] for r in rows] == list(PAPER_TABLE2)  # the paper's order
    columns = ("bleu_en_de", "bleu_en_fr", "flops_en_de", "flops_en_fr")
    for row in rows:
        stored = tuple(float(row[c]) if row[c] else None for c in columns)
        assert stored == PAPER_TABLE2[row["model"]], row["model"]
        assert row["kind"] == (
            "transformer"
            if row["model"].startswith("Transformer")
            else "ensemble"
            if row["model"].endswith("Ensemble")
            else "single"
        )
    # §6.1's claims hold in it: big beats every earlier EN-DE model by more than 2.0 BLEU
    earlier = [v for name, v in PAPER_TABLE2.items() if not name.startswith("Transformer")]
    assert 28.4 - max(v[0] for v in earlier if v[0]) > 2.0
    # and the Transformers' cost is §5.2's training time x 8 P100s x 9.5 TFLOPS
    assert f"{12 * 3600 * 8 * 9.5e12:.1e}" == "3.3e+18"
    assert f"{3.5 * 86400 * 8 * 9.5e12:.1e}" == "2.3e+19"


def test_the_stored_average_is_float16_with_its_tied_matrix_once(tiny_run, tmp_path, short_outputs):
    evaluate.evaluate(tiny_run, tmp_path, run_folder.snapshot_paths(tiny_run), alphas=(0.6,))
    stored = torch.load(tmp_path / "averaged.pt", weights_only=True)["model"]
    tied = ["src_embed.0.embedding.weight", "tgt_embed.0.embedding.weight"]
    tied.append("generator.projection.weight")  # TINY shares them (§3.4)
    assert len({stored[name].data_ptr() for name in tied}) == 1
    assert {t.dtype for t in stored.values() if t.is_floating_point()} == {torch.float16}


def test_at_the_papers_alpha_the_beam_rows_serve_as_its_baseline_undecoded_again(
    tiny_run, tmp_path, short_outputs, monkeypatch
):
    monkeypatch.setattr(fd, "fast_translate", lambda *a, **k: pytest.fail("decoded again"))
    evaluate.evaluate(tiny_run, tmp_path, run_folder.snapshot_paths(tiny_run), alphas=(0.6,))
    setting = {"split": "test2016", "weights": "averaged"}
    paper = scoring.read_hypotheses(tmp_path, decoding="beam-0.6", **setting)
    assert paper == scoring.read_hypotheses(tmp_path, decoding="beam", **setting)
