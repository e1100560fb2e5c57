"""code/budget.py: where a profile's time goes, measured on a toy run of a toy budgeted profile;
the sums it reports are checked against its own parts and against the run's recipe."""

import dataclasses
import json

import pytest

import budget
import precision
import profiles
import script_helpers as helpers
import training_runs as training
from toy import TINY, quiet, toy_ids, toy_pairs

BUDGETED = dataclasses.replace(TINY, max_seconds=30.0, eval_every=4, bleu_sentences=5)


@pytest.fixture
def toy_profile(monkeypatch, tmp_path):
    monkeypatch.setitem(profiles.PROFILES, "toy-budget", BUDGETED)
    monkeypatch.setattr(helpers, "load_multi30k", lambda split, data_dir=None: toy_pairs(40))
    run = tmp_path / "run"
    training.train(dataclasses.replace(BUDGETED, max_seconds=0.0), toy_pairs(40), run, log=quiet)
    return run


def test_the_budget_splits_an_update_and_counts_what_a_run_adds(toy_profile, tmp_path):
    out = tmp_path / "budget.json"
    argv = ["--profile", "toy-budget", "--run", str(toy_profile), "--out", str(out)]
    assert budget.main([*argv, "--steps", "4", "--rounds", "2", "--threads", "1"]) == 0
    found = json.loads(out.read_text())
    float32 = found["update_parts_seconds"]["float32"]
    assert set(float32) == {"cut", "forward", "backward", "optimizer"}
    assert all(seconds > 0 for seconds in float32.values())
    assert set(found["update_parts_seconds"]) == {"float32"} | (
        {"bfloat16"} if precision.native_bf16("cpu") else set()
    )
    plan = found["budget"]
    assert plan["precision"] == "float32"  # what the run trained in
    step = sum(float32.values())  # the parts add up to the step, unrounded figures aside
    assert plan["step_seconds"] == pytest.approx(step, abs=1e-4)
    assert plan["steps_in_budget"] == pytest.approx(30.0 / step, rel=0.01)  # parts rounded
    steps = plan["steps_in_budget"]
    assert plan["validations"] == steps // 4 + 1  # every eval_every steps, and the last
    assert plan["checkpoints"] == steps // BUDGETED.checkpoint_every + 1
    once = found["once_seconds"]
    assert plan["seconds"]["validations"] == pytest.approx(  # once's figures are rounded
        plan["validations"] * once["validation"], rel=0.01, abs=0.1
    )
    assert found["budget"]["steps_made_by_the_run"] == BUDGETED.max_steps


def test_a_profile_without_a_budget_or_a_run_without_weights_is_refused(
    toy_profile, tmp_path, capsys
):
    out = str(tmp_path / "b.json")
    assert budget.main(["--profile", "tiny", "--run", str(toy_profile), "--out", out]) == 2
    assert "has no time budget" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert budget.main(["--profile", "toy-budget", "--run", str(empty), "--out", out]) == 2
    assert "holds no checkpoint.pt" in capsys.readouterr().err
    assert not (tmp_path / "b.json").exists()


def test_the_timed_update_is_the_runs_update_with_a_clock_between_its_parts(monkeypatch):
    """timed_update makes train_step_amp's update (the same weights after each, bit for bit)
    and splits its time where train_step_amp calls the scaler: the four parts tile the call."""
    import torch

    import annotated_transformer as at

    corpus = at.EncodedCorpus(toy_ids(40, 50))
    config = dataclasses.replace(TINY, model=dataclasses.replace(TINY.model, dropout=0.0))
    timed, plain = (training.RunState.new(config, 50) for _ in range(2))  # the same seed
    batches = [b[0] for b in training.epoch_updates(corpus, config, 0)[:3]]
    ticks = iter(range(100))
    monkeypatch.setattr(budget.time, "perf_counter", lambda: float(next(ticks)))
    for indices in batches:
        parts = budget.timed_update(timed, indices, corpus, smoothing=0.1, autocast=None)
        # ticks: start, cut done, forward done (scale), backward done (step), end
        assert list(parts) == list(budget.PARTS) and list(parts.values()) == [1.0] * 4
        training.train_step_amp(
            plain.model,
            corpus.batch(indices),
            plain.optimizer,
            scheduler=plain.scheduler,
            scaler=plain.scaler,
            smoothing=0.1,
        )
    for a, b in zip(timed.model.parameters(), plain.model.parameters()):
        assert torch.equal(a, b)
    assert timed.scheduler.last_epoch == plain.scheduler.last_epoch == len(batches) > 1
