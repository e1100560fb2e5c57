"""§5 training (chapter 5) and the machinery of long runs (the training-runs page): batches,
the schedule of Eq. (3), Adam, label smoothing, checkpoints that are atomic and resume
exactly, and the plain loop agreeing with the full one."""

import dataclasses
import json
import math
import os
import pathlib
import socket
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import annotated_transformer as at
import distributed
import fast_decoding as fd
import hardware
import precision
import profiles
import run_folder
import safe_files
import schedule
import timing
import training_runs as training
from cuda_graphs import bucketed_batch
from host_work import host_work
from toy import TINY, quiet, toy_pairs

ROOT = pathlib.Path(__file__).resolve().parent.parent
# ---- batches ---------------------------------------------------------------------------


def test_batch_shifts_the_target_by_one():
    batch = at.Batch.from_ids([([5, 6, 2], [1, 7, 8, 9, 2]), ([5, 2], [1, 7, 2])])
    assert batch.tgt_in.tolist() == [[1, 7, 8, 9], [1, 7, 2, 0]]
    assert batch.tgt_y.tolist() == [[7, 8, 9, 2], [7, 2, 0, 0]]
    assert batch.src_mask.tolist() == [[[True, True, True]], [[True, True, False]]]
    assert batch.tgt_mask.shape == (2, 4, 4) and not batch.tgt_mask[1, 3, 3]
    assert batch.ntokens == 6


def test_token_batches_respect_the_budget_and_cover_every_pair_once():
    generator = torch.Generator().manual_seed(1)
    # like translations: a target about as long as its source
    src = torch.randint(2, 40, (500,), generator=generator)
    tgt = (src + torch.randint(-3, 4, (500,), generator=generator)).clamp(min=2)
    lengths = list(zip(src.tolist(), tgt.tolist()))
    batches = at.batch_by_tokens(lengths, max_tokens=400, seed=3)
    assert sorted(i for b in batches for i in b) == list(range(500))
    for batch in batches:
        assert len(batch) * max(max(lengths[i]) for i in batch) <= 400
    assert batches == at.batch_by_tokens(lengths, max_tokens=400, seed=3)
    assert batches != at.batch_by_tokens(lengths, max_tokens=400, seed=4)
    random_order = torch.randperm(500, generator=generator).tolist()
    size = 500 // len(batches)
    random_batches = [random_order[i : i + size] for i in range(0, 500, size)]
    assert padding(batches, lengths) < padding(random_batches, lengths) / 2


def padding(batches, lengths):
    """Padding cells of the (batch x longest) source and target tables of these batches."""
    cells = sum(len(b) * max(lengths[i][side] for i in b) for b in batches for side in (0, 1))
    return cells - sum(src + tgt for batch in batches for src, tgt in (lengths[i] for i in batch))


def test_a_pair_longer_than_the_budget_gets_a_batch_of_its_own():
    # budget 8: (2, 2) and (3, 4) fit together (2 x 4 = 8 tokens a side); (1, 9), the
    # shortest source and so sorted first, fits with nothing: alone, over budget, not dropped
    batches = at.batch_by_tokens([(3, 4), (1, 9), (2, 2)], max_tokens=8, shuffle=False)
    assert batches == [[1], [2, 0]]


# ---- schedule and optimizer -------------------------------------------------------------


def test_rate_is_equation_3():
    assert at.rate(0, 512) == at.rate(1, 512) == pytest.approx(512**-0.5 * 4000**-1.5)
    assert at.rate(100, 512, warmup_steps=4000) == pytest.approx(512**-0.5 * 100 * 4000**-1.5)
    assert at.rate(16000, 512, warmup_steps=4000) == pytest.approx(512**-0.5 * 16000**-0.5)
    peak = max(range(1, 20000, 7), key=lambda s: at.rate(s, 512, warmup_steps=4000))
    assert abs(peak - 4000) <= 7
    assert at.rate(4000, 512, lr_factor=2.0) == pytest.approx(2 * 512**-0.5 * 4000**-0.5)


def test_warmup_ablation_schedules_differ_from_equation_3_only_before_its_warmup_steps():
    import warmup_ablation

    peak = at.rate(400, 64, warmup_steps=400)
    paper, shorter, none = (warmup_ablation.schedule(peak, w, 400) for w in (400, 40, 0))
    for k in (1, 7, 39, 40, 399, 400, 401, 1000, 5000):
        assert paper(k) == pytest.approx(at.rate(k, 64, warmup_steps=400))
    assert none(1) == shorter(40) == none(400) == pytest.approx(peak)
    assert shorter(4) == pytest.approx(peak / 10)
    assert none(1600) == shorter(1600) == pytest.approx(peak / 2)


def test_warmup_ablation_small_run_writes_one_row_per_logged_step_and_the_machine(tmp_path, capsys):
    import warmup_ablation

    import script_helpers as helpers

    out = tmp_path / "warmup.csv"
    argv = ["--out", str(out), "--steps", "5", "--log-every", "2", "--seeds", "0"]
    assert warmup_ablation.main([*argv, "--arms", "1:2", "1:0"]) == 0
    assert capsys.readouterr().out.count("copied") == 2  # one line per run
    rows = helpers.read_csv(out)
    assert [(r["N"], r["warmup"], r["step"]) for r in rows] == [
        ("1", "2", "2"), ("1", "2", "4"), ("1", "2", "5"),
        ("1", "0", "2"), ("1", "0", "4"), ("1", "0", "5"),
    ]  # fmt: skip
    assert [r["accuracy"] != "" for r in rows] == [False, False, True] * 2
    assert all(0 <= float(r["accuracy"]) <= 1 for r in rows if r["accuracy"])
    assert all(r["hardware"] == hardware.hardware_description() for r in rows)
    assert all(math.isfinite(float(r["loss"])) for r in rows)


def test_warmup_ablation_ends_a_users_error_with_one_line_and_exit_2(tmp_path, capsys):
    import warmup_ablation

    # --out names a folder, not a file: an error on the path the user typed
    argv = ["--out", str(tmp_path), "--steps", "2", "--log-every", "1", "--seeds", "0"]
    assert warmup_ablation.main([*argv, "--arms", "1:0"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("warmup_ablation.py: ") and "\n" not in error and str(tmp_path) in error


def test_fit_follows_the_schedule_it_is_given_in_place_of_equation_3():
    corpus = at.EncodedCorpus(
        at.copy_task_pairs(50, 12, 5, generator=torch.Generator().manual_seed(0))
    )
    config = at.TrainConfig(model=at.ModelConfig(N=1, d_model=16, d_ff=32, h=2), max_steps=3)
    torch.manual_seed(config.seed)
    initial = at.build_model(12, 12, config.model).state_dict()
    still, _ = at.fit(config, corpus, 12, schedule=lambda step: 0.0)  # a rate of 0: no change
    moved, _ = at.fit(config, corpus, 12)
    for name, weight in initial.items():
        assert torch.equal(still.state_dict()[name], weight), name
    assert any(not torch.equal(moved.state_dict()[n], w) for n, w in initial.items())


def test_the_optimizer_makes_adams_updates_with_the_papers_betas_and_rate_k_at_update_k():
    # Adam written out by hand in float64 (Kingma and Ba, Algorithm 1) with beta1 0.9,
    # beta2 0.98, epsilon 1e-9 and the learning rate of Eq. (3) at update k = 1, 2, 3
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).double()
    target = torch.randn(2, 3, dtype=torch.float64)
    p = model.weight.detach().clone()
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    optimizer, scheduler = at.make_optimizer(model, d_model=64, lr_factor=1.0, warmup_steps=10)
    for k in range(1, 4):
        ((model.weight - target) ** 2).sum().backward()  # gradient 2 (w - target)
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        g = 2 * (p - target)
        m, v = 0.9 * m + 0.1 * g, 0.98 * v + 0.02 * g**2
        lr = 64**-0.5 * min(k**-0.5, k * 10**-1.5)
        p = p - lr * (m / (1 - 0.9**k)) / ((v / (1 - 0.98**k)).sqrt() + 1e-9)
        assert torch.allclose(model.weight.detach(), p, rtol=0, atol=1e-12), k


# ---- label smoothing ---------------------------------------------------------------------


def test_label_smoothing_distribution_is_szegedys():
    criterion = at.LabelSmoothing(size=5, pad_id=0, smoothing=0.2)
    dist = criterion.target_distribution(torch.tensor([3, 0, 4]))
    assert dist[0].tolist() == pytest.approx([0.04, 0.04, 0.04, 0.84, 0.04])
    assert dist[1].tolist() == [0] * 5  # a padding position has no target
    assert dist[2].sum().item() == pytest.approx(1.0)


def test_fused_loss_differs_from_label_smoothing_by_exactly_the_targets_entropy():
    K, eps = 50, 0.1
    logits = torch.randn(12, K, dtype=torch.float64)
    target = torch.randint(1, K, (12,))
    target[[2, 7]] = at.PAD_ID
    fused = at.label_smoothed_loss(logits, target, eps)
    kl = at.LabelSmoothing(K, at.PAD_ID, eps)(logits.log_softmax(-1), target)
    high, low = 1 - eps + eps / K, eps / K
    entropy = -(high * math.log(high) + (K - 1) * low * math.log(low))
    assert fused.item() == pytest.approx(kl.item() + 10 * entropy, rel=1e-12)
    # and the same gradients: the constant does not depend on the logits
    a, b = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    at.label_smoothed_loss(a, target, eps).backward()
    at.LabelSmoothing(K, at.PAD_ID, eps)(b.log_softmax(-1), target).backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-12)


def test_a_uniform_prediction_scores_ln_vocabulary_with_or_without_smoothing():
    for eps in (0.0, 0.1, 0.3):
        loss = at.label_smoothed_loss(torch.zeros(3, 800), torch.tensor([5, 6, 7]), eps)
        assert loss.item() / 3 == pytest.approx(math.log(800), rel=1e-6)


def test_padding_positions_contribute_nothing_to_the_loss():
    criterion = at.LabelSmoothing(size=6, pad_id=0, smoothing=0.1)
    target = torch.tensor([3, 0, 5, 0])
    log_probs = torch.randn(4, 6).log_softmax(-1)
    changed = log_probs.clone()
    changed[[1, 3]] = torch.randn(2, 6).log_softmax(-1)
    assert criterion(log_probs, target).item() == pytest.approx(criterion(changed, target).item())


def test_without_smoothing_the_loss_is_the_negative_log_likelihood():
    criterion = at.LabelSmoothing(size=6, pad_id=0, smoothing=0.0)
    target = torch.tensor([3, 0, 5, 1])
    log_probs = torch.randn(4, 6).log_softmax(-1)
    expected = F.nll_loss(log_probs, target, ignore_index=0, reduction="sum")
    assert criterion(log_probs, target).item() == pytest.approx(expected.item(), rel=1e-6)


# ---- checkpoints and resumption ------------------------------------------------------------


def parameters(model):
    return [p.detach().clone() for p in model.state_dict().values()]


def test_n_steps_then_resume_to_2n_equals_2n_straight(tmp_path):
    pairs = toy_pairs()  # a few batches per epoch, so the runs cross epoch boundaries
    straight, _, history = training.train(
        dataclasses.replace(TINY, max_steps=12), pairs, tmp_path / "a", log=quiet
    )
    training.train(TINY, pairs, tmp_path / "b", log=quiet)
    resumed, _, resumed_history = training.train(
        dataclasses.replace(TINY, max_steps=12), pairs, tmp_path / "b", resume=True, log=quiet
    )
    assert len(at.batch_by_tokens([(len(s.split()), 1) for s, _ in pairs], 200)) < 12
    assert all(torch.equal(a, b) for a, b in zip(parameters(straight), parameters(resumed)))
    assert history == resumed_history and len(history) == 12


def test_run_writes_checkpoint_tokenizer_and_metrics(tmp_path):
    training.train(TINY, toy_pairs(), tmp_path, log=quiet)
    checkpoint = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert checkpoint["step"] == 6 and checkpoint["config"] == TINY.defining_fields()
    tokenizer = at.load_tokenizer(tmp_path / "tokenizer.json")
    assert checkpoint["tokenizer"] == tokenizer.to_str()  # a checkpoint is self-contained
    assert tokenizer.get_vocab_size() <= 200
    snapshots = [p.name for p in run_folder.snapshot_paths(tmp_path)]
    assert snapshots == ["checkpoint-0000003.pt", "checkpoint-0000006.pt"]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert [h["step"] for h in metrics["history"]] == [1, 2, 3, 4, 5, 6]
    assert not list(tmp_path.glob("*.tmp"))


def test_a_write_that_fails_keeps_the_old_file_and_leaves_nothing(tmp_path):
    path = tmp_path / "metrics.json"
    safe_files.write_json(path, {"step": 1})
    with pytest.raises(RuntimeError), safe_files.atomic_file(path) as file:
        file.write('{"step": 2, "hal')
        raise RuntimeError("killed mid-write")
    assert json.loads(path.read_text()) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]
    with (
        safe_files.atomic_file(tmp_path / "a.bin", "wb") as first,
        safe_files.atomic_file(tmp_path / "a.bin", "wb") as second,
    ):  # two writers of one file never share a temporary name
        first.write(b"first"), second.write(b"second")
    assert (tmp_path / "a.bin").read_bytes() == b"first"  # the last to finish, whole


@pytest.fixture
def one_second_steps(monkeypatch):
    """train's clock, faked: a step takes one second; validating and saving take none."""
    clock = [0.0]
    monkeypatch.setattr(training.time, "perf_counter", lambda: clock[0])
    step = training.train_step_amp

    def one_second_step(*args, **kwargs):
        clock[0] += 1.0
        return step(*args, **kwargs)

    monkeypatch.setattr(training, "train_step_amp", one_second_step)


def test_a_time_budget_ends_the_run_at_the_last_checkpoint_its_pace_fits(
    tmp_path, one_second_steps
):
    config = dataclasses.replace(TINY, max_steps=30, checkpoint_every=3, max_seconds=10.0)
    _, _, history = training.train(config, toy_pairs(), tmp_path / "a", log=quiet)
    # at step 3 (3 s) the next checkpoint comes at 6 s, at step 6 at 9 s, at step 9 at 12 s,
    # past the 10 s budget: the run ends at step 9, its last snapshot
    checkpoint = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=True)
    assert len(history) == 9 and checkpoint["step"] == 9 and checkpoint["seconds"] == 9.0
    assert run_folder.snapshot_paths(tmp_path / "a")[-1].name == "checkpoint-0000009.pt"
    # a larger budget on resume continues the run: at step 12 the next would end at 15 s
    longer = dataclasses.replace(config, max_seconds=14.0)
    _, _, history = training.train(longer, toy_pairs(), tmp_path / "a", resume=True, log=quiet)
    assert len(history) == 12
    with pytest.raises(ValueError, match="max_seconds must be a finite number >= 0"):
        dataclasses.replace(TINY, max_seconds=-1.0)


@pytest.fixture
def asynchronous_one_second_steps(monkeypatch):
    """A device that runs behind the host, faked on the CPU: a step queues one second of
    work and returns at once; the host's clock moves only when the run waits for the
    device (DEVICE_WAITS), as torch.cuda.synchronize makes a GPU's host wait."""
    clock, queued = [0.0], [0.0]
    monkeypatch.setattr(training.time, "perf_counter", lambda: clock[0])
    step = training.train_step_amp

    def queue_one_second(*args, **kwargs):
        queued[0] += 1.0
        return step(*args, **kwargs)

    def wait(device):
        clock[0], queued[0] = clock[0] + queued[0], 0.0

    monkeypatch.setattr(training, "train_step_amp", queue_one_second)
    monkeypatch.setitem(training.DEVICE_WAITS, "cpu", wait)
    return clock


def test_a_budget_on_an_asynchronous_device_counts_the_work_not_the_queueing(
    tmp_path, asynchronous_one_second_steps
):
    # the same run as with synchronous one-second steps: ends at step 9, 9 s spent; a clock
    # read without waiting for the device would see 0 s and train all 30 steps
    config = dataclasses.replace(TINY, max_steps=30, checkpoint_every=3, max_seconds=10.0)
    _, _, history = training.train(config, toy_pairs(), tmp_path / "a", log=quiet)
    checkpoint = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=True)
    assert len(history) == 9 and checkpoint["seconds"] == 9.0
    # and the annealed plan: 3 warm-up steps at 1 s each put the last step at the budget's
    annealed = dataclasses.replace(config, anneal=0.5, warmup_steps=3)
    lines = []
    training.train(annealed, toy_pairs(), tmp_path / "b", log=lines.append)
    assert "step 3: the rate will reach 0 at step 9" in lines


def test_out_of_time_asks_at_checkpoints_whether_the_next_one_would_pass_the_budget(tmp_path):
    from types import SimpleNamespace

    def ask(step, seconds, max_seconds=10.0, world=1):
        config = dataclasses.replace(TINY, checkpoint_every=3, max_seconds=max_seconds)
        state = SimpleNamespace(step=step, seconds=seconds)
        return training.out_of_time(
            state, SimpleNamespace(config=config, world=world, device="cpu")
        )

    assert not ask(6, 6.0)  # next checkpoint at 6 * (1 + 3/6) = 9 s <= 10 s
    assert ask(9, 9.0)  # 12 s > 10 s
    assert ask(6, 7.0)  # 10.5 s > 10 s
    assert not ask(8, 30.0)  # not a checkpoint: the run goes on to one
    assert not ask(9, 9.0, max_seconds=0.0)  # no budget
    # several processes: the decision travels from rank 0 (here a group of one, over gloo)
    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        assert ask(9, 9.0, world=2) and not ask(6, 6.0, world=2)
    finally:
        torch.distributed.destroy_process_group()


# ---- an annealed rate, for a budget that more steps must not overfit -------------------


def test_the_annealed_rate_is_eq_3_until_warmup_ends_then_falls_on_a_line_to_zero():
    d_model, factor, warmup, last = 256, 0.33, 400, 2400
    for step in (1, 100, 399, 400):  # warm-up: Eq. (3) itself, planned or not
        assert schedule.annealed_rate(
            step, d_model, factor, warmup_steps=warmup, last_step=last
        ) == at.rate(step, d_model, factor, warmup_steps=warmup)
    # by hand: halfway from 400 to 2400, Eq. (3)'s 1400^-0.5 branch times one half
    halfway = factor * d_model**-0.5 * 1400**-0.5 * 0.5
    assert schedule.annealed_rate(
        1400, d_model, factor, warmup_steps=warmup, last_step=last
    ) == pytest.approx(halfway)
    assert schedule.annealed_rate(last, d_model, factor, warmup_steps=warmup, last_step=last) == 0.0
    assert (
        schedule.annealed_rate(last + 50, d_model, factor, warmup_steps=warmup, last_step=last)
        == 0.0
    )
    assert schedule.annealed_rate(
        1400, d_model, factor, warmup_steps=warmup, last_step=0
    ) == at.rate(1400, d_model, factor, warmup_steps=warmup)


def test_the_plain_and_the_device_schedule_anneal_alike_once_planned():
    config = dataclasses.replace(TINY, anneal=0.5, warmup_steps=10, max_steps=40)
    plain, graphed = (
        training.RunState.new(config, 50, cuda_graphs=graphs) for graphs in (False, True)
    )
    assert isinstance(plain.scheduler.lr_lambdas[0], schedule.AnnealedRate)
    d_model, factor = config.model.d_model, config.lr_factor
    for done in range(40):  # `done` updates made: both hold the rate of update done + 1
        if done == 12:
            schedule.set_last_step(plain, 40)
            schedule.set_last_step(graphed, 40)
        planned = 40 if done >= 12 else 0
        expected = at.rate(done + 1, d_model, factor, warmup_steps=10) * (
            min(1.0, (40 - done - 1) / (0.5 * 30)) if planned else 1.0
        )
        lr = plain.optimizer.param_groups[0]["lr"]
        assert lr == pytest.approx(expected, rel=1e-12)
        # the device holds the host's own rate, rounded to float32
        assert graphed.scheduler.lr.item() == torch.tensor(lr, dtype=torch.float32).item()
        assert graphed.scheduler.rates[done] == lr
        plain.optimizer.step()
        plain.scheduler.step()
        graphed.scheduler.step()
    assert graphed.scheduler.state_dict() == {"steps": 40}


def test_the_plan_ends_at_the_last_checkpoint_that_the_warmup_pace_fits(tmp_path):
    from types import SimpleNamespace

    def plan(seconds, max_seconds, max_steps=20_000, world=1):
        config = dataclasses.replace(
            TINY, anneal=0.2, warmup_steps=400, checkpoint_every=100, max_steps=max_steps
        )
        config = dataclasses.replace(config, max_seconds=max_seconds)
        state = training.RunState.new(config, 50)
        state.step, state.seconds = 400, seconds
        context = SimpleNamespace(config=config, world=world, device="cpu", log=quiet)
        schedule.plan_last_step(state, context)
        assert state.scheduler.lr_lambdas[0].last_step == state.last_step
        return state.last_step

    assert plan(60.0, 885.0) == 5900  # 400 steps a minute: 5900 fit in 885 s
    assert plan(61.0, 885.0) == 5800  # 5803 fit: the checkpoint before
    assert plan(60.0, 1770.0) == 11800  # twice the budget, twice the steps
    assert plan(30.0, 885.0) == 11800  # or a machine twice as fast
    assert plan(10.0, 885.0) == 20_000  # at most max_steps
    assert plan(60.0, 0.0, max_steps=3000) == 3000  # no budget: max_steps
    assert plan(600.0, 500.0) == 400  # the budget is spent: the run ends now
    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:  # several processes: rank 0's plan travels to all (here a group of one)
        assert plan(60.0, 885.0, world=2) == 5900
    finally:
        torch.distributed.destroy_process_group()


def test_an_annealed_budget_ends_at_its_plan_with_the_rate_at_zero(tmp_path, one_second_steps):
    config = dataclasses.replace(TINY, anneal=1.0, warmup_steps=10, checkpoint_every=3)
    config = dataclasses.replace(config, max_steps=100, max_seconds=31.0)
    _, _, history = training.train(config, toy_pairs(), tmp_path / "a", log=quiet)
    # planned at step 10 (the first log after warm-up): 10 s for 10 steps, 31 fit, and
    # the checkpoint before is step 30
    d_model = config.model.d_model
    assert len(history) == 30 and history[-1]["lr"] == 0.0
    assert history[9]["lr"] == pytest.approx(
        at.rate(10, d_model, config.lr_factor, warmup_steps=10)
    )
    expected = at.rate(20, d_model, config.lr_factor, warmup_steps=10) * (30 - 20) / (30 - 10)
    assert history[19]["lr"] == pytest.approx(expected)


def test_an_annealed_run_stopped_and_resumed_equals_one_that_never_stopped(tmp_path, monkeypatch):
    config = dataclasses.replace(TINY, anneal=0.5, warmup_steps=4, max_steps=12, log_every=2)
    pairs = toy_pairs()
    straight, _, history = training.train(config, pairs, tmp_path / "a", log=quiet)
    step, calls = training.train_step_amp, [0]

    def stop_after_seven(*args, **kwargs):  # the machine goes away during update 8
        calls[0] += 1
        if calls[0] == 8:
            raise KeyboardInterrupt
        return step(*args, **kwargs)

    monkeypatch.setattr(training, "train_step_amp", stop_after_seven)
    with pytest.raises(KeyboardInterrupt):
        training.train(config, pairs, tmp_path / "b", log=quiet)
    monkeypatch.setattr(training, "train_step_amp", step)
    assert torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)["step"] == 6
    resumed, _, resumed_history = training.train(
        config, pairs, tmp_path / "b", resume=True, log=quiet
    )
    assert all(torch.equal(a, b) for a, b in zip(parameters(straight), parameters(resumed)))
    assert history == resumed_history and history[-1]["lr"] == 0.0


@pytest.mark.parametrize("profile", sorted(profiles.PROFILES))
def test_every_profile_takes_two_steps_and_its_peak_learning_rate_is_moderate(profile, tmp_path):
    # the GPU-sized profiles too (base runs here only like this): two steps on toy data, a
    # finite loss and a learning rate that rises during warm-up
    config = dataclasses.replace(
        profiles.PROFILES[profile], max_steps=2, checkpoint_every=2, eval_every=2
    )
    training.train(config, toy_pairs(), tmp_path, log=quiet)
    history = json.loads((tmp_path / "metrics.json").read_text())["history"]
    assert [h["step"] for h in history] == [1, 2] and all(math.isfinite(h["loss"]) for h in history)
    assert history[0]["lr"] < history[1]["lr"]
    # the peak of Eq. (3), at step warmup_steps: factor * (d_model * warmup_steps)^-0.5
    peak = config.lr_factor * (config.model.d_model * config.warmup_steps) ** -0.5
    if profile == "multi30k":  # the search's evidence: about 1e-3 for 3 post-LN layers
        assert 0.9e-3 < peak < 1.1e-3, peak
    if profile == "base":  # 6 post-LN layers: no learning at 1e-3 (results/base-gpu), 5e-4 does
        assert 0.4e-3 < peak < 0.6e-3, peak


def test_only_the_last_keep_checkpoints_snapshots_are_kept(tmp_path):
    config = dataclasses.replace(TINY, max_steps=12, checkpoint_every=2, keep_checkpoints=3)
    training.train(config, toy_pairs(), tmp_path, log=quiet)
    steps = [torch.load(p, weights_only=True)["step"] for p in run_folder.snapshot_paths(tmp_path)]
    assert steps == [8, 10, 12]


def test_bf16_autocast_trains_close_to_float32(tmp_path):
    runs = {}
    for amp in (None, "bf16"):
        config = dataclasses.replace(TINY, amp=amp or "off")
        _, _, history = training.train(config, toy_pairs(), tmp_path / str(amp), log=quiet)
        runs[amp] = [h["loss"] for h in history]
    assert runs[None] != runs["bf16"]  # autocast really changed the arithmetic
    assert max(abs(a - b) for a, b in zip(runs[None], runs["bf16"])) < 0.1


DISTRIBUTED_SCRIPT = """
import json, sys
import torch
sys.path.insert(0, {code!r})
import annotated_transformer as at
import training_runs as training
import distributed
import hardware
import precision
import profiles
import run_folder
import schedule

torch.distributed.init_process_group("gloo")
rank = torch.distributed.get_rank()
config = profiles.RunConfig(**{config!r})
pairs = json.load(open({pairs!r}))
for steps, out, resume, *extra in {plan!r}:  # extra: other changes to the config
    config = profiles.apply_changes(config, {{"max_steps": steps, **(extra[0] if extra else {{}})}})
    model, _, history = training.train(config, pairs, out, resume=resume, log=lambda m: None)
    torch.save({{"model": model.state_dict(), "history": history, "rng": torch.get_rng_state()}},
               f"{{out}}/rank{{rank}}-{{steps}}.pt")
torch.distributed.barrier()  # as train.py: both done before either closes its connections
torch.distributed.destroy_process_group()
"""


def run_two_ranks(tmp_path, plan, config):
    pairs = toy_pairs(120)
    (tmp_path / "pairs.json").write_text(json.dumps(pairs))
    fields = dataclasses.asdict(config)
    fields["model"] = at.ModelConfig(**fields["model"])
    script = tmp_path / "run.py"
    script.write_text(
        DISTRIBUTED_SCRIPT.format(
            code=str(ROOT / "code"),
            config=fields,
            pairs=str(tmp_path / "pairs.json"),
            plan=plan,
        ).replace("ModelConfig(", "at.ModelConfig(")
    )
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [*command, "--nproc-per-node", "2", str(script)], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_two_ranks_n_steps_straight_equal_half_then_resume_bit_for_bit(tmp_path):
    config = dataclasses.replace(TINY, max_steps=8, checkpoint_every=2, max_tokens=400)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    run_two_ranks(tmp_path, [(8, a, False), (4, b, False), (8, b, True)], config)
    for rank in (0, 1):
        straight = torch.load(f"{a}/rank{rank}-8.pt", weights_only=True)
        resumed = torch.load(f"{b}/rank{rank}-8.pt", weights_only=True)
        for name, tensor in straight["model"].items():
            assert torch.equal(tensor, resumed["model"][name]), (rank, name)
        assert torch.equal(straight["rng"], resumed["rng"])  # the same dropout stream
        assert straight["history"] == resumed["history"]
    ranks = [torch.load(f"{a}/rank{r}-8.pt", weights_only=True) for r in (0, 1)]
    for name, tensor in ranks[0]["model"].items():  # DDP kept the replicas identical
        assert torch.equal(tensor, ranks[1]["model"][name]), name
    assert not torch.equal(ranks[0]["rng"], ranks[1]["rng"])  # but their dropout differs
    checkpoint = torch.load(f"{b}/checkpoint.pt", weights_only=True)
    assert len(checkpoint["rng"]) == 2  # one random state per rank
    # the logged loss is all ranks' (all-reduced), the same on both, per global token
    assert ranks[0]["history"] == ranks[1]["history"]
    # only rank 0 wrote the run's files
    assert {p.name for p in (tmp_path / "a").iterdir()} == {
        "checkpoint.pt", "checkpoint-0000004.pt", "checkpoint-0000006.pt",
        "checkpoint-0000008.pt", "checkpoint-0000002.pt", "metrics.json", "tokenizer.json",
        "rank0-8.pt", "rank1-8.pt",
    }  # fmt: skip


def test_two_ranks_with_a_compiled_model_train_as_without(tmp_path):
    # DistributedDataParallel inside torch.compile, on gloo: the compiler ("aot_eager": the
    # same tracing and autograd graphs as the default, without generating C++) must see
    # through the wrapper; the run then makes the same updates as the eager one
    config = dataclasses.replace(TINY, max_steps=4, checkpoint_every=4, max_tokens=400)
    config = profiles.apply_changes(config, {"dropout": 0.0})
    eager, compiled = str(tmp_path / "eager"), str(tmp_path / "compiled")
    plan = [(4, eager, False, {}), (4, compiled, False, {"compile": "aot_eager"})]
    run_two_ranks(tmp_path, plan, config)
    for rank in (0, 1):
        a = torch.load(f"{eager}/rank{rank}-4.pt", weights_only=True)
        b = torch.load(f"{compiled}/rank{rank}-4.pt", weights_only=True)
        for name, tensor in a["model"].items():
            assert torch.allclose(tensor, b["model"][name], atol=1e-5), (rank, name)
        assert [h["loss"] for h in a["history"]] == pytest.approx(
            [h["loss"] for h in b["history"]], rel=1e-4
        )


def test_resuming_with_another_configuration_or_format_is_refused(tmp_path):
    training.train(TINY, toy_pairs(), tmp_path, log=quiet)
    other = dataclasses.replace(TINY, smoothing=0.2, max_steps=9)
    with pytest.raises(ValueError, match="different configuration .*smoothing: 0.1 -> 0.2"):
        training.train(other, toy_pairs(), tmp_path, resume=True, log=quiet)
    other = profiles.apply_changes(TINY, {"dropout": 0.3})
    with pytest.raises(ValueError, match=r"\(model\.dropout: 0\.1 -> 0\.3\)"):
        training.train(other, toy_pairs(), tmp_path, resume=True, log=quiet)
    payload = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    torch.save({**payload, "format": 1}, tmp_path / "checkpoint.pt")
    with pytest.raises(ValueError, match=r"\(checkpoint format: 1 -> 3\)"):
        training.train(dataclasses.replace(TINY, max_steps=9), toy_pairs(), tmp_path, resume=True,
                 log=quiet)  # fmt: skip


def test_a_float32_run_resumes_in_float32_and_not_in_float16(tmp_path):
    training.train(TINY, toy_pairs(), tmp_path, log=quiet)  # its gradient scaler saved nothing
    more = dataclasses.replace(TINY, max_steps=8)
    with pytest.raises(ValueError, match=r"precision: 'float32' -> 'float16'.*amp='off'"):
        training.train(dataclasses.replace(more, amp="fp16"), toy_pairs(), tmp_path, resume=True,
                  log=quiet)  # fmt: skip
    _, _, history = training.train(more, toy_pairs(), tmp_path, resume=True, log=quiet)
    assert [h["step"] for h in history] == list(range(1, 9))


def test_a_new_run_never_overwrites_an_earlier_one(tmp_path):
    training.train(TINY, toy_pairs(), tmp_path, log=quiet)
    before = (tmp_path / "checkpoint.pt").read_bytes()
    with pytest.raises(FileExistsError, match="already exists; resume it"):
        training.train(TINY, toy_pairs(seed=1), tmp_path, log=quiet)
    assert (tmp_path / "checkpoint.pt").read_bytes() == before


def test_resuming_without_a_checkpoint_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        training.train(TINY, toy_pairs(), tmp_path, resume=True, log=quiet)


def test_a_crash_while_writing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    at.save_checkpoint(path, {"step": 1, "weights": torch.ones(3)})

    def crash(payload, file):
        file.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(at.torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        at.save_checkpoint(path, {"step": 2, "weights": torch.zeros(3)})
    monkeypatch.undo()
    assert torch.load(path, weights_only=True)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("max_tokens", 0, "max_tokens must be a positive integer, got 0"),
        ("max_steps", 2.5, "max_steps must be a positive integer, got 2.5"),
        ("log_every", True, "log_every must be a positive integer, got True"),
        ("seed", -1, "seed must be an integer >= 0, got -1"),
        ("smoothing", 1.0, r"smoothing must be in \[0, 1\), got 1.0"),
        ("weight_decay", -0.1, r"weight_decay must be in \[0, 1\), got -0.1"),
        ("lr_factor", float("nan"), "lr_factor must be a positive finite number, got nan"),
        ("lr_factor", float("inf"), "lr_factor must be a positive finite number, got inf"),
        ("lr_factor", 0.0, "lr_factor must be a positive finite number, got 0.0"),
    ],
)
def test_train_config_refuses_a_bad_field_naming_it_and_the_rule(field, value, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TINY, **{field: value})
    dataclasses.replace(TINY, seed=0, smoothing=0.0, lr_factor=3)  # the edges that are allowed


# ---- the GPU code paths, exercised on the CPU ------------------------------------------------


def tiny_batch(vocab=40, n=6, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return at.Batch.from_ids(at.copy_task_pairs(n, vocab, 7, generator=generator))


def test_an_fp16_step_with_the_gradient_scaler_is_close_to_the_float32_step():
    config = dataclasses.replace(TINY, vocab_size=40)
    steps = {}
    for autocast in (None, torch.float16):
        run = training.RunState.new(config, 40, "cpu", autocast=autocast)
        assert run.scaler.is_enabled() == (autocast is not None)  # only float16 needs the scaler
        before = parameters(run.model)
        torch.manual_seed(1)  # the same dropout masks for both
        sums = training.train_step_amp(
            run.model,
            tiny_batch(),
            run.optimizer,
            scheduler=run.scheduler,
            scaler=run.scaler,
            smoothing=0.1,
            autocast=autocast,
        )
        updates = [a - b for a, b in zip(parameters(run.model), before)]
        steps[autocast] = sums, torch.cat([u.flatten() for u in updates])
    (loss32, update32), (loss16, update16) = steps[None], steps[torch.float16]
    assert not torch.equal(loss32, loss16)  # float16 really computed the forward pass
    assert torch.allclose(loss16, loss32, rtol=1e-2)
    # Adam's first update is about lr * sign(gradient): the same sign where float32 moved
    moved = update32.abs() > 1e-3 * update32.abs().max()
    agree = (update16.sign() == update32.sign())[moved].float().mean().item()
    assert agree > 0.95, agree


def test_amp_auto_is_float32_on_a_cpu_and_names_are_checked():
    assert precision.autocast_dtype("auto", "cpu") is None
    assert precision.autocast_dtype("bf16", "cpu") is torch.bfloat16
    assert precision.autocast_dtype("fp16", "cuda") is torch.float16
    with pytest.raises(ValueError, match="amp must be one of"):
        precision.autocast_dtype("half", "cpu")


def test_compiled_step_equals_eager_within_tolerance():
    config = dataclasses.replace(
        TINY, vocab_size=40, model=dataclasses.replace(TINY.model, dropout=0.0)
    )
    runs = [training.RunState.new(config, 40) for _ in range(2)]
    # the model, as a run with compile set does, in one graph (no break); "aot_eager" traces
    # and builds the autograd graphs as inductor does, without generating code: inductor's
    # C++ for a CPU costs half a minute on a fresh machine, and a GPU generates Triton instead
    compiled = torch.compile(runs[1].model, backend="aot_eager", fullgraph=True)
    assert distributed.unwrap(compiled) is runs[1].model
    for step in range(3):
        batch = tiny_batch(seed=step)
        eager = training.train_step_amp(
            runs[0].model, batch, runs[0].optimizer,
            scheduler=runs[0].scheduler, scaler=runs[0].scaler, smoothing=0.1,
        )  # fmt: skip
        fast = training.train_step_amp(
            compiled, batch, runs[1].optimizer,
            scheduler=runs[1].scheduler, scaler=runs[1].scaler, smoothing=0.1,
        )  # fmt: skip
        assert torch.allclose(eager, fast, rtol=1e-4)
    for x, y in zip(parameters(runs[0].model), parameters(runs[1].model)):
        assert torch.allclose(x, y, atol=1e-5)


def test_the_whole_training_step_runs_on_the_meta_device():
    # every tensor the step creates must follow the model's device: a placement error
    # (a tensor made on the CPU by default) fails here just as it would on a GPU
    with torch.device("meta"):
        run = training.RunState.new(dataclasses.replace(TINY, vocab_size=40), 40, "meta")
    corpus = at.EncodedCorpus(
        at.copy_task_pairs(8, 40, 5, generator=torch.Generator().manual_seed(0))
    )
    batch = training.corpus_on(corpus, "meta").batch(list(range(8)))
    assert batch.src.device.type == "meta" and batch.tgt_mask.device.type == "meta"
    sums = training.train_step_amp(
        run.model, batch, run.optimizer, scheduler=run.scheduler, scaler=run.scaler, smoothing=0.1
    )
    assert sums.device.type == "meta" and sums.shape == (2,)


def meta_run_and_corpus():
    with torch.device("meta"):
        run = training.RunState.new(dataclasses.replace(TINY, vocab_size=40), 40, "meta")
    data = at.copy_task_pairs(8, 40, 5, generator=torch.Generator().manual_seed(0))
    return run, data, training.corpus_on(at.EncodedCorpus(data), "meta")


def test_a_training_step_and_the_batch_it_trains_on_do_no_host_work():
    # on a GPU each of these would make the host wait (or a CUDA graph fail to capture): a
    # mask made on the host and copied, a count read back with int(), a loss read with .item()
    run, data, corpus = meta_run_and_corpus()
    indices = [3, 1, 4, 0, 5]
    rows = torch.tensor(indices, device="meta")  # train_epoch copies an epoch's rows at once

    def step():
        batch = bucketed_batch(corpus, indices, (1,), rows=rows)  # the CPU's cut: exact
        return training.train_step_amp(
            run.model,
            batch,
            run.optimizer,
            scheduler=run.scheduler,
            scaler=run.scaler,
            smoothing=0.1,
        )

    assert host_work(step) == []
    src, tgt = (at.pad_ids([pair[side] for pair in data]).to("meta") for side in (0, 1))
    assert host_work(at.Batch.from_tensors, src, tgt) == []  # ntokens counted on the device
    assert host_work(at.target_mask, tgt, at.PAD_ID) == []
    memory = torch.zeros(8, src.size(1), 32, device="meta")
    decoder = fd.PrefixDecoder(run.model, memory, at.padding_mask(src, at.PAD_ID))
    assert host_work(decoder.next_log_probs, tgt[:, :3]) == []


def test_host_work_finds_what_it_names():
    # the finder itself: each kind of host work, and nothing in pure device work
    x = torch.ones(3, 4, device="meta")
    assert host_work(lambda: x * 2 + 1) == []
    assert "makes a host tensor" in host_work(lambda: torch.ones(2, 2))[0]
    assert any("copies a host tensor" in f for f in host_work(lambda: torch.ones(2).to("meta")))
    assert "reads a device value" in host_work(lambda: x.sum().item())[0]
    assert "depends on device values" in host_work(lambda: x.nonzero())[0]
    assert host_work(lambda: x / torch.tensor(2.0)) == []  # a host scalar is passed by value


@pytest.mark.parametrize(
    "capability, expected",
    [((6, 1), torch.float16), ((7, 0), torch.float16), ((7, 5), torch.float16),
     ((8, 0), torch.bfloat16), ((8, 6), torch.bfloat16), ((8, 9), torch.bfloat16),
     ((9, 0), torch.bfloat16), ((10, 0), torch.bfloat16)],
)  # fmt: skip
def test_amp_auto_picks_bf16_only_where_the_gpu_computes_in_it(capability, expected, monkeypatch):
    # P100 6.1, V100 7.0, T4 7.5: float16 with the scaler; A100 8.0, RTX 30xx 8.6, L4 8.9,
    # H100 9.0, B200 10.0: bfloat16. is_bf16_supported() says True on a T4 (emulated): unused
    asked = []
    monkeypatch.setattr(
        torch.cuda, "get_device_capability", lambda d: asked.append(d) or capability
    )
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert precision.autocast_dtype("auto", "cuda:1") is expected
    assert asked == [torch.device("cuda:1")]  # the training device, not the current one
    assert precision.autocast_dtype("fastest", "cuda:1") is None  # float32 (TF32): multi30k's start
    assert precision.autocast_dtype("auto", "cpu") is None


def test_tf32_is_set_through_fp32_precision_only_while_training_and_restored():
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    with precision.tf32_matmuls("cuda"):
        assert matmul.fp32_precision == "tf32"
    assert matmul.fp32_precision == before
    with pytest.raises(RuntimeError), precision.tf32_matmuls("cuda:0"):
        raise RuntimeError  # restored after an error too
    assert matmul.fp32_precision == before
    with precision.tf32_matmuls("cpu"):
        assert matmul.fp32_precision == before
    source = pathlib.Path(at.__file__).read_text()
    assert "allow_tf32" not in source  # the deprecated switch, process-wide and never restored


def test_the_schedule_does_not_advance_when_the_fp16_scaler_skips_an_update():
    config = dataclasses.replace(TINY, vocab_size=40)
    run = training.RunState.new(config, 40, "cpu", autocast=torch.float16)
    d_model, factor, warmup = config.model.d_model, config.lr_factor, config.warmup_steps
    before = parameters(run.model)
    run.scaler = torch.amp.GradScaler("cpu", init_scale=1e38)  # the scaled loss overflows
    training.train_step_amp(
        run.model, tiny_batch(), run.optimizer,
        scheduler=run.scheduler, scaler=run.scaler, smoothing=0.1, autocast=torch.float16,
    )  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(parameters(run.model), before))  # skipped
    assert run.scheduler.last_epoch == 0
    assert run.optimizer.param_groups[0]["lr"] == at.rate(1, d_model, factor, warmup_steps=warmup)
    run.scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
    training.train_step_amp(
        run.model, tiny_batch(), run.optimizer,
        scheduler=run.scheduler, scaler=run.scaler, smoothing=0.1, autocast=torch.float16,
    )  # fmt: skip
    assert not all(torch.equal(a, b) for a, b in zip(parameters(run.model), before))  # made
    assert run.scheduler.last_epoch == 1
    assert run.optimizer.param_groups[0]["lr"] == at.rate(2, d_model, factor, warmup_steps=warmup)


def test_a_resume_in_another_precision_is_refused_and_fastest_keeps_the_saved_one(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(training, "race_precisions", lambda *args: torch.bfloat16)
    fastest = dataclasses.replace(TINY, amp="fastest")
    training.train(fastest, toy_pairs(), tmp_path, log=quiet)
    checkpoint = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert checkpoint["precision"] == "bfloat16"
    more = dataclasses.replace(fastest, max_steps=8)
    with pytest.raises(ValueError, match=r"amp: 'fastest' -> 'off'.*precision: 'bfloat16' -> 'fl"):
        training.train(dataclasses.replace(more, amp="off"), toy_pairs(), tmp_path, resume=True,
                  log=quiet)  # fmt: skip

    def never(*args):
        raise AssertionError("a resumed run must not measure again")

    monkeypatch.setattr(training, "race_precisions", never)
    messages = []
    _, _, history = training.train(more, toy_pairs(), tmp_path, resume=True, log=messages.append)
    assert "amp fastest: bfloat16 (the checkpoint)" in messages and len(history) == 8


def fake_race_clock(monkeypatch, seconds_of):
    """Make the CPU race its precisions on a fake clock that each update advances by
    seconds_of(autocast, calls) (calls: the precisions of the updates so far, this one included),
    with native bfloat16. Returns (clock, calls, race), race() racing TINY on the toy pairs."""
    clock, calls = [0.0], []
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])  # the race's clock
    original = training.train_step_amp

    def timed(*args, autocast=None, **kwargs):
        calls.append(autocast)
        clock[0] += seconds_of(autocast, calls)
        return original(*args, autocast=autocast, **kwargs)

    monkeypatch.setattr(training, "train_step_amp", timed)
    monkeypatch.setattr(training, "native_bf16", lambda device: True)
    pairs = toy_pairs()
    tokenizer = at.train_bpe(pairs, TINY.vocab_size)
    corpus = at.EncodedCorpus.from_pairs(pairs, tokenizer)
    return clock, calls, lambda: training.race_precisions(TINY, corpus, tokenizer.get_vocab_size())


def test_a_moment_of_slowdown_during_the_race_does_not_flip_it(monkeypatch):
    # float32 takes 2 s an update, bf16 1 s, but one bf16 update is held up for 20 s: the
    # machine paused. Summed, bf16 would lose; its median still wins.
    def seconds_of(autocast, calls):
        held_up = autocast is torch.bfloat16 and calls.count(autocast) == 3
        return 20.0 if held_up else 1.0 if autocast is torch.bfloat16 else 2.0

    _, calls, race = fake_race_clock(monkeypatch, seconds_of)
    assert race() is torch.bfloat16
    # a warm-up update each, then 5 rounds of turns, each starting with the other precision
    assert calls == [None, torch.bfloat16] * 2 + [torch.bfloat16, None, None, torch.bfloat16] * 2


@pytest.mark.parametrize("slower", [None, torch.bfloat16])
def test_fastest_keeps_the_precision_whose_steps_take_less_time(slower, tmp_path, monkeypatch):
    clock, _, race = fake_race_clock(
        monkeypatch, lambda autocast, _: 2.0 if autocast is slower else 1.0
    )
    state = torch.get_rng_state()
    assert race() is (torch.bfloat16 if slower is None else None)
    assert torch.equal(torch.get_rng_state(), state)  # the run's initial weights are unchanged
    monkeypatch.setattr(training, "native_bf16", lambda device: False)  # emulated: float32, untimed
    clock[0] = 0.0
    assert race() is None
    assert clock[0] == 0.0


# ---- the faster loop -----------------------------------------------------------------------


def test_a_batch_cut_from_the_encoded_corpus_equals_one_padded_from_lists():
    data = at.encode_pairs(toy_pairs(), at.train_bpe(toy_pairs(), 200))
    corpus = at.EncodedCorpus(data)
    for indices in at.batch_by_tokens(corpus.lengths, 60, seed=0):
        fast, slow = corpus.batch(indices), at.Batch.from_ids([data[i] for i in indices])
        for name in ("src", "tgt_in", "tgt_y", "src_mask", "tgt_mask"):
            assert torch.equal(getattr(fast, name), getattr(slow, name)), name
        assert fast.ntokens == slow.ntokens
        exact = bucketed_batch(corpus, indices, (1,))  # the training loop's cut on a CPU
        for name in ("src", "tgt_in", "tgt_y", "src_mask", "tgt_mask"):
            assert torch.equal(getattr(exact, name), getattr(slow, name)), name
        rounded = bucketed_batch(corpus, indices, (8,))  # compiled: multiples of 8
        assert all(size % 8 == 0 for size in (*rounded.src.shape, rounded.tgt_in.size(1)))
        assert rounded.ntokens == exact.ntokens == slow.ntokens


def test_the_loss_is_read_from_the_device_only_every_log_every_steps(tmp_path, monkeypatch):
    reads = []
    original = training.record_losses

    def counting(state, pending, world):
        reads.append(len(state.history) + len(pending))  # the step a read reaches
        original(state, pending, world)

    monkeypatch.setattr(training, "record_losses", counting)
    pairs = toy_pairs(400)  # about 20 batches an epoch
    config = dataclasses.replace(TINY, max_steps=23, checkpoint_every=23, log_every=5)
    _, tokenizer, history = training.train(config, pairs, tmp_path, log=quiet)
    corpus = at.EncodedCorpus.from_pairs(pairs, tokenizer)
    per_epoch = len(training.epoch_updates(corpus, config, epoch=0))
    assert per_epoch < 23
    # every 5 steps, at the end, and at the end of an epoch (once per pass over the data)
    assert reads == sorted({5, 10, 15, 20, 23, per_epoch}), reads
    assert [h["step"] for h in history] == list(range(1, 24))


def test_validation_during_training_is_logged_and_stored_with_snapshots(tmp_path):
    config = dataclasses.replace(TINY, max_steps=6, eval_every=3, bleu_sentences=10)
    training.train(config, toy_pairs(), tmp_path, val_pairs=toy_pairs(20, seed=5), log=quiet)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert [v["step"] for v in metrics["validations"]] == [3, 6]
    for entry in metrics["validations"]:
        assert {"seconds", "tokens_seen", "val_loss", "val_ppl", "val_bleu"} <= entry.keys()
        assert entry["val_ppl"] == pytest.approx(math.exp(entry["val_loss"]), rel=1e-3)
        assert entry["bleu_sentences"] == 10 and 0 <= entry["val_bleu"] <= 100
    assert metrics["validations"][1]["tokens_seen"] == sum(h["tokens"] for h in metrics["history"])
    snapshot = torch.load(tmp_path / "checkpoint-0000006.pt", weights_only=True)
    assert snapshot["validation"] == metrics["validations"][1]
    checkpoint = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert checkpoint["validation"] == metrics["validations"][1]  # the last step's figures
    assert checkpoint["validations"] == metrics["validations"]  # and all of them
    assert all("nll" in h for h in metrics["history"])


def test_validating_more_or_less_often_trains_the_same_weights(tmp_path):
    # why a profile may validate at whatever interval suits the device: validation reads the
    # model in eval mode and draws no random numbers, so the updates are the same
    tokenizer, weights = at.train_bpe(toy_pairs(), 200), []
    for every in (1, 4, 0):  # validation at every step, twice, never
        config = dataclasses.replace(TINY, max_steps=8, eval_every=every or 8, bleu_sentences=5)
        val = toy_pairs(10, seed=5) if every else None
        model, _, _ = training.train(
            config,
            toy_pairs(),
            tmp_path / str(every),
            tokenizer=tokenizer,
            val_pairs=val,
            log=quiet,
        )
        weights.append(model.state_dict())
    metrics = json.loads((tmp_path / "1" / "metrics.json").read_text())
    assert len(metrics["validations"]) == 8
    for other in weights[1:]:
        assert all(torch.equal(weights[0][name], other[name]) for name in weights[0])


def test_a_given_tokenizer_is_used_and_not_retrained(tmp_path, monkeypatch):
    tokenizer = at.train_bpe(toy_pairs(), 200)
    monkeypatch.setattr(training, "train_bpe", lambda *a, **k: pytest.fail("retrained the BPE"))
    _, used, _ = training.train(TINY, toy_pairs(), tmp_path, tokenizer=tokenizer, log=quiet)
    assert used is tokenizer
    assert at.load_tokenizer(tmp_path / "tokenizer.json").to_str() == tokenizer.to_str()


# ---- refusals --------------------------------------------------------------------------------


def test_a_second_process_cannot_train_into_a_busy_folder(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (tmp_path / ".lock").write_text(f"{socket.gethostname()} {sleeper.pid}\n")
        with pytest.raises(FileExistsError, match="is in use by process"):
            training.train(TINY, toy_pairs(), tmp_path, log=quiet)
    finally:
        sleeper.kill()
        sleeper.wait()
    # the holder is dead now: its lock is stale and the folder is taken over
    training.train(TINY, toy_pairs(), tmp_path, log=quiet)
    assert not (tmp_path / ".lock").exists()  # released at the end


def test_stale_temporary_files_of_a_killed_save_are_removed_at_the_next_start(tmp_path):
    training.train(TINY, toy_pairs(), tmp_path, log=quiet)
    (tmp_path / "checkpoint.ptabc123.tmp").write_bytes(b"half a checkpoint")
    training.train(
        dataclasses.replace(TINY, max_steps=7), toy_pairs(), tmp_path, resume=True, log=quiet
    )
    assert not list(tmp_path.glob("*.tmp"))


def test_a_missing_gpu_is_reported_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setattr(at.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(training, "train_bpe", lambda *a, **k: pytest.fail("work was done first"))
    with pytest.raises(ValueError, match="sees no GPU"):
        training.train(TINY, toy_pairs(), tmp_path, device="cuda", log=quiet)
    with pytest.raises(ValueError, match="is not a device"):
        training.train(TINY, toy_pairs(), tmp_path, device="gpu0", log=quiet)


@pytest.mark.parametrize("content", [b"", b"garbage, not a checkpoint", b"PK\x03\x04broken zip"])
def test_a_damaged_checkpoint_is_reported_with_its_path(tmp_path, content):
    training.train(TINY, toy_pairs(), tmp_path, log=quiet)
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(content)
    message = f"{path} cannot be read as a checkpoint .*not a checkpoint written by train"
    with pytest.raises(ValueError, match=message):
        at.read_checkpoint(path)
    with pytest.raises(ValueError, match=message):
        training.train(dataclasses.replace(TINY, max_steps=9), toy_pairs(), tmp_path, resume=True,
                 log=quiet)  # fmt: skip


def test_a_foreign_file_is_reported_as_not_a_checkpoint(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"state_dict": {}}, path)
    with pytest.raises(ValueError, match=f"{path} .*holds no config, model and tokenizer"):
        at.read_checkpoint(path)


def test_training_on_no_pairs_is_refused(tmp_path):
    with pytest.raises(ValueError, match="train_pairs is empty"):
        training.train(TINY, [], tmp_path, log=quiet)
    assert not any(tmp_path.iterdir())


def test_an_empty_out_dir_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an empty path would otherwise mean the working directory
    for empty in ("", "  ", ".", pathlib.Path("")):
        with pytest.raises(ValueError, match="is the working directory: pass a folder"):
            training.train(TINY, toy_pairs(), empty, log=quiet)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: profiles.apply_changes(TINY, {"heads": 4}), "unknown field 'heads'"),
        (
            lambda: precision.autocast_dtype("fp32", "cpu"),
            "amp must be one of auto, bf16, fp16, off",
        ),
        (lambda: training.check_device("gpu0"), "device='gpu0': it is not a device"),
    ],
)
def test_public_functions_refuse_bad_arguments_naming_them(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ---- the two layers agree ----------------------------------------------------------------------


def test_the_plain_fit_and_the_full_train_give_the_same_parameters(tmp_path):
    # chapter 5's fit and the training-runs page's train, same pairs, vocabulary, seed and
    # steps (crossing an epoch boundary, with dropout and checkpoints on the way): equal bit
    # for bit, because train adds only copies (logs, checkpoints) around the same updates
    pairs = toy_pairs(200)
    tokenizer = at.train_bpe(pairs, 200)
    config = dataclasses.replace(TINY, max_steps=15, checkpoint_every=4, log_every=3)
    corpus = at.EncodedCorpus.from_pairs(pairs, tokenizer)
    assert len(at.batch_by_tokens(corpus.lengths, config.max_tokens)) < 15
    plain, losses = at.fit(config, corpus, tokenizer.get_vocab_size())
    full, _, history = training.train(config, pairs, tmp_path, tokenizer=tokenizer, log=quiet)
    assert all(torch.equal(a, b) for a, b in zip(parameters(plain), parameters(full)))
    assert [round(loss, 5) for loss in losses] == [h["loss"] for h in history]


@pytest.mark.skipif(not pathlib.Path("/proc/cpuinfo").is_file(), reason="reads Linux's cpuinfo")
def test_native_bf16_on_this_cpu_follows_its_instruction_flags():
    flags = set()
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags |= set(line.split(":", 1)[1].split())
    assert precision.native_bf16("cpu") == bool({"avx512_bf16", "amx_tile"} & flags)


def test_train_with_cuda_graphs_runs_its_step_eagerly_on_a_cpu_as_the_plain_loop(tmp_path):
    # the same updates through the capturable step (bucketed batches with filler rows, fused
    # AdamW, Eq. (3) on the device) as through train_step; dropout off, as padding would
    # change which random numbers a row draws
    config = dataclasses.replace(profiles.apply_changes(TINY, {"dropout": 0.0}), max_steps=6)
    plain, _, plain_history = training.train(config, toy_pairs(), tmp_path / "plain", log=quiet)
    graphs = dataclasses.replace(config, cuda_graphs=True)
    graphed, _, graphed_history = training.train(
        graphs, toy_pairs(), tmp_path / "graphed", log=quiet
    )
    for (name, a), b in zip(plain.state_dict().items(), graphed.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-5), name
    for a, b in zip(plain_history, graphed_history):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)
        assert a["lr"] == pytest.approx(b["lr"], rel=1e-12) and a["tokens"] == b["tokens"]
    more = dataclasses.replace(graphs, max_steps=8)
    with pytest.raises(ValueError, match="steps as CUDA graphs: True -> False"):
        training.train(dataclasses.replace(more, cuda_graphs=False), toy_pairs(),
                  tmp_path / "graphed", resume=True, log=quiet)  # fmt: skip
    _, _, history = training.train(more, toy_pairs(), tmp_path / "graphed", resume=True, log=quiet)
    assert [h["step"] for h in history] == list(range(1, 9))
    with pytest.raises(ValueError, match="drop compile"):
        compiled = dataclasses.replace(graphs, compile="inductor")
        training.train(compiled, toy_pairs(), tmp_path / "c", log=quiet)


def test_an_annealed_graphed_run_resumes_from_the_schedule_state_older_checkpoints_hold(
    tmp_path,
):
    """Graphed runs' checkpoints written before the device schedule became a table hold
    {"steps", "last_step"}; such a run resumes as one whose checkpoint holds {"steps"}: the
    count is read, and the last step planned again from the recipe."""
    import shutil

    config = dataclasses.replace(
        profiles.apply_changes(TINY, {"dropout": 0.0}),
        cuda_graphs=True,
        anneal=0.5,
        warmup_steps=2,
        max_steps=8,
        checkpoint_every=4,
    )
    training.train(
        dataclasses.replace(config, max_steps=4), toy_pairs(), tmp_path / "new", log=quiet
    )
    shutil.copytree(tmp_path / "new", tmp_path / "old")
    payload = at.read_checkpoint(tmp_path / "old" / "checkpoint.pt")
    assert payload["scheduler"] == {"steps": 4}
    payload["scheduler"]["last_step"] = 4  # what the older format stored: the plan of then
    at.save_checkpoint(tmp_path / "old" / "checkpoint.pt", payload)
    runs = {
        name: training.train(config, toy_pairs(), tmp_path / name, resume=True, log=quiet)
        for name in ("new", "old")
    }
    (new_model, _, new_history), (old_model, _, old_history) = runs.values()
    assert new_history == old_history and [h["step"] for h in new_history] == list(range(1, 9))
    for a, b in zip(new_model.parameters(), old_model.parameters()):
        assert torch.equal(a, b)
    ramped = schedule.AnnealedRate(
        config.model.d_model, config.lr_factor, config.warmup_steps, share=0.5, last_step=8
    )
    assert [h["lr"] for h in new_history[4:]] == [ramped(k) for k in range(4, 8)]


def test_the_machine_description_names_the_instruction_sets_that_decide_cpu_speed():
    description = hardware.hardware_description()
    threads = torch.get_num_threads()
    assert f"{threads} thread" in description and torch.__version__ in description
    # independently of /proc/cpuinfo: torch's own view of the processor
    assert ("AVX-512 BF16" in description) == torch.cpu._is_avx512_bf16_supported()
    assert ("AMX" in description) == torch.cpu._is_amx_tile_supported()
    assert ("AVX2" in description) == (torch.backends.cpu.get_cpu_capability() != "DEFAULT")
