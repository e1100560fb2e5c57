"""The recipe search: budgets in CPU time, successive halving, val only, resumable."""

import csv

import pytest

import profiles
import recipe_search
import script_helpers as helpers
from toy import TINY, toy_pairs


@pytest.fixture
def tiny_search(monkeypatch):
    loaded = []

    def load(split, data_dir=None):
        loaded.append(split)
        return toy_pairs(40, seed={"train": 0, "val": 1}[split])

    monkeypatch.setattr(helpers, "load_multi30k", load)
    start = profiles.apply_changes(
        TINY, {"eval_every": 3, "checkpoint_every": 3, "bleu_sentences": 5, "max_steps": 3}
    )
    monkeypatch.setattr(recipe_search, "START", start)
    trials = {"a": {}, "b": {"lr_factor": 3.0}, "c": {"dropout": 0.0}, "d": {"smoothing": 0.0}}
    monkeypatch.setattr(recipe_search, "TRIALS", trials)
    return loaded


def rows_of(path):
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def test_every_trial_runs_then_the_best_quarter_goes_on_and_only_val_is_read(tmp_path, tiny_search):
    flags = ["--out", str(tmp_path), "--budgets", "0.001", "0.03", "--csv", str(tmp_path / "c")]
    assert recipe_search.main(flags) == 0
    rows = rows_of(tmp_path / "trials.csv")
    first = [r for r in rows if r["rung"] == "0"]
    assert [r["trial"] for r in first] == ["a", "b", "c", "d"]
    best = max(first, key=lambda r: (float(r["val_bleu"]), -float(r["val_loss"])))
    second = [r for r in rows if r["rung"] == "1"]
    assert [r["trial"] for r in second] == [best["trial"]]  # 4 // 3 = 1 promoted
    assert int(second[0]["step"]) > int(best["step"])  # it resumed and trained on
    assert float(second[0]["cpu_seconds"]) >= 0.03 * 60
    for r in rows:
        assert r["command"].startswith("python code/train.py --profile quick")
        assert 0 <= float(r["val_bleu"]) <= 100 and float(r["val_ppl"]) > 1
    assert set(tiny_search) == {"train", "val"}  # test2016 is never loaded
    assert rows_of(tmp_path / "c") == rows
    # run again: everything is done, nothing is trained or added
    assert recipe_search.main(flags) == 0
    assert rows_of(tmp_path / "trials.csv") == rows


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--budgets", "0"], "--budgets: must be a positive finite number"),
        (["--trials", "a", "z"], "--trials: invalid choice: 'z'"),
        (["--rungs", "-1"], "--rungs: must be an integer >= 0"),
    ],
)
def test_bad_flags_exit_2_naming_them(flags, message, tmp_path, tiny_search, capsys):
    # parse_args, not main: were a check missing, main would start a search of many minutes
    with pytest.raises(SystemExit) as stop:
        recipe_search.parse_args(["--out", str(tmp_path), *flags])
    assert stop.value.code == 2 and message in capsys.readouterr().err
