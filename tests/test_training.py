"""§5 training machinery: batches, the schedule of Eq. (3), label smoothing, checkpoints
that are atomic and resume exactly, the copy task and the command line."""

import dataclasses
import json
import pathlib
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import annotated_transformer as at

ROOT = pathlib.Path(__file__).resolve().parent.parent
TINY = at.TrainConfig(
    model=at.ModelConfig(N=1, d_model=32, d_ff=64, h=2, share_embeddings=True),
    vocab_size=200,
    max_tokens=200,
    warmup_steps=10,
    max_steps=6,
    checkpoint_every=3,
)
WORDS = "a man woman dog runs sits on the red blue big small ball street grass".split()


def toy_pairs(n=60, seed=0):
    """Made-up sentence pairs with varied lengths (a 'translation' that reverses words)."""
    generator = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(n):
        length = int(torch.randint(2, 9, (1,), generator=generator))
        words = [WORDS[int(i)] for i in torch.randint(len(WORDS), (length,), generator=generator)]
        pairs.append((" ".join(words), " ".join(reversed(words))))
    return pairs


def quiet(message):
    pass


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
    assert at.padding_fraction(batches, lengths) < at.padding_fraction(random_batches, lengths) / 2


def test_token_budget_smaller_than_a_sentence_is_refused():
    with pytest.raises(ValueError, match="max_tokens=5 is smaller than the longest sentence"):
        at.batch_by_tokens([(3, 4), (9, 2)], max_tokens=5)


# ---- schedule and optimizer -------------------------------------------------------------


def test_rate_is_equation_3():
    assert at.rate(0, 512) == at.rate(1, 512)  # step 0 counts as step 1
    assert at.rate(100, 512, warmup=4000) == pytest.approx(512**-0.5 * 100 * 4000**-1.5)
    assert at.rate(16000, 512, warmup=4000) == pytest.approx(512**-0.5 * 16000**-0.5)
    peak = max(range(1, 20000, 7), key=lambda s: at.rate(s, 512, warmup=4000))
    assert abs(peak - 4000) <= 7
    assert at.rate(4000, 512, factor=2.0) == pytest.approx(2 * at.rate(4000, 512))


def test_optimizer_is_adam_with_the_papers_betas_and_update_k_uses_rate_k():
    model = torch.nn.Linear(4, 4)
    optimizer, scheduler = at.make_optimizer(model, d_model=512, factor=1.0, warmup=10)
    assert isinstance(optimizer, torch.optim.Adam)
    group = optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9
    for k in range(1, 25):
        assert group["lr"] == pytest.approx(at.rate(k, 512, 1.0, 10))
        model(torch.ones(1, 4)).sum().backward()
        optimizer.step()
        scheduler.step()


# ---- label smoothing ---------------------------------------------------------------------


def test_label_smoothing_distribution():
    criterion = at.LabelSmoothing(size=6, padding_idx=0, smoothing=0.2)
    dist = criterion.target_distribution(torch.tensor([3, 0, 5]))
    assert dist[0].tolist() == pytest.approx([0, 0.05, 0.05, 0.8, 0.05, 0.05])
    assert dist[1].tolist() == [0] * 6  # a padding position has no target
    assert dist[:, 0].tolist() == [0, 0, 0]  # padding is never a target
    assert dist[2].sum().item() == pytest.approx(1.0)


def test_padding_positions_contribute_nothing_to_the_loss():
    criterion = at.LabelSmoothing(size=6, padding_idx=0, smoothing=0.1)
    target = torch.tensor([3, 0, 5, 0])
    log_probs = torch.randn(4, 6).log_softmax(-1)
    changed = log_probs.clone()
    changed[[1, 3]] = torch.randn(2, 6).log_softmax(-1)
    assert criterion(log_probs, target).item() == pytest.approx(criterion(changed, target).item())


def test_without_smoothing_the_loss_is_the_negative_log_likelihood():
    criterion = at.LabelSmoothing(size=6, padding_idx=0, smoothing=0.0)
    target = torch.tensor([3, 0, 5, 1])
    log_probs = torch.randn(4, 6).log_softmax(-1)
    expected = F.nll_loss(log_probs, target, ignore_index=0, reduction="sum")
    assert criterion(log_probs, target).item() == pytest.approx(expected.item(), rel=1e-6)


# ---- checkpoints and resumption ------------------------------------------------------------


def parameters(model):
    return [p.detach().clone() for p in model.state_dict().values()]


def test_n_steps_then_resume_to_2n_equals_2n_straight(tmp_path):
    pairs = toy_pairs()  # a few batches per epoch, so the runs cross epoch boundaries
    straight, _, history = at.train(
        dataclasses.replace(TINY, max_steps=12), pairs, tmp_path / "a", log=quiet
    )
    at.train(TINY, pairs, tmp_path / "b", log=quiet)
    resumed, _, resumed_history = at.train(
        dataclasses.replace(TINY, max_steps=12), pairs, tmp_path / "b", resume=True, log=quiet
    )
    assert len(at.batch_by_tokens([(len(s.split()), 1) for s, _ in pairs], 200)) < 12
    assert all(torch.equal(a, b) for a, b in zip(parameters(straight), parameters(resumed)))
    assert history == resumed_history and len(history) == 12


def test_run_writes_checkpoint_tokenizer_and_metrics(tmp_path):
    at.train(TINY, toy_pairs(), tmp_path, log=quiet)
    checkpoint = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert checkpoint["step"] == 6 and checkpoint["config"] == TINY.identity()
    tokenizer = at.load_tokenizer(tmp_path / "tokenizer.json")
    assert checkpoint["tokenizer"] == tokenizer.to_str()  # a checkpoint is self-contained
    assert tokenizer.get_vocab_size() <= 200
    snapshots = [p.name for p in at.snapshot_paths(tmp_path)]
    assert snapshots == ["checkpoint-0000003.pt", "checkpoint-0000006.pt"]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert [h["step"] for h in metrics["history"]] == [1, 2, 3, 4, 5, 6]
    assert not list(tmp_path.glob("*.tmp"))


def test_only_the_last_keep_checkpoints_snapshots_are_kept(tmp_path):
    config = dataclasses.replace(TINY, max_steps=12, checkpoint_every=2, keep_checkpoints=3)
    at.train(config, toy_pairs(), tmp_path, log=quiet)
    steps = [torch.load(p, weights_only=True)["step"] for p in at.snapshot_paths(tmp_path)]
    assert steps == [8, 10, 12]


def test_bf16_autocast_trains_close_to_float32(tmp_path):
    runs = {}
    for amp in (None, "bf16"):
        _, _, history = at.train(TINY, toy_pairs(), tmp_path / str(amp), log=quiet, amp=amp)
        runs[amp] = [h["loss"] for h in history]
    assert runs[None] != runs["bf16"]  # autocast really changed the arithmetic
    assert max(abs(a - b) for a, b in zip(runs[None], runs["bf16"])) < 0.1
    with pytest.raises(ValueError, match="amp must be None or 'bf16'"):
        at.train(TINY, toy_pairs(), tmp_path / "fp16", log=quiet, amp="fp16")


DISTRIBUTED_SCRIPT = """
import json, sys
import torch
sys.path.insert(0, {code!r})
import annotated_transformer as at

torch.distributed.init_process_group("gloo")
rank = torch.distributed.get_rank()
config = at.TrainConfig(**{config!r})
model, _, history = at.train(config, json.load(open({pairs!r})), {out!r}, log=lambda m: None)
torch.save({{"model": model.state_dict(), "history": history}}, f"{out}/rank{{rank}}.pt")
torch.distributed.destroy_process_group()
"""


def test_two_processes_under_torchrun_end_with_identical_parameters(tmp_path):
    pairs = toy_pairs(120)
    (tmp_path / "pairs.json").write_text(json.dumps(pairs))
    fields = dataclasses.asdict(dataclasses.replace(TINY, max_steps=4, checkpoint_every=2))
    fields["model"] = at.ModelConfig(**fields["model"])
    script = tmp_path / "run.py"
    script.write_text(
        DISTRIBUTED_SCRIPT.format(
            code=str(ROOT / "code"),
            config=fields,
            pairs=str(tmp_path / "pairs.json"),
            out=str(tmp_path / "run"),
        ).replace("ModelConfig(", "at.ModelConfig(")
    )
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    result = subprocess.run(
        [*command, "--nproc-per-node", "2", str(script)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    ranks = [torch.load(tmp_path / "run" / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    for name, tensor in ranks[0]["model"].items():
        assert torch.equal(tensor, ranks[1]["model"][name]), name
    # each rank trained on its own share of the batches ...
    tokens = [[h["tokens"] for h in rank["history"]] for rank in ranks]
    assert tokens[0] != tokens[1] and len(tokens[0]) == 4
    # ... and only rank 0 wrote checkpoints, metrics and the tokenizer
    written = {p.name for p in (tmp_path / "run").iterdir()}
    assert written == {
        "checkpoint.pt",
        "checkpoint-0000002.pt",
        "checkpoint-0000004.pt",
        "metrics.json",
        "tokenizer.json",
        "rank0.pt",
        "rank1.pt",
    }
    initial = at.build_model(
        ranks[0]["model"]["generator.projection.weight"].size(0),
        ranks[0]["model"]["generator.projection.weight"].size(0),
        TINY.model,
    )
    assert not torch.equal(
        initial.state_dict()["encoder.layers.0.feed_forward.w_1.weight"],
        ranks[0]["model"]["encoder.layers.0.feed_forward.w_1.weight"],
    )


def test_resuming_with_another_configuration_is_refused(tmp_path):
    at.train(TINY, toy_pairs(), tmp_path, log=quiet)
    other = dataclasses.replace(TINY, smoothing=0.2, max_steps=9)
    with pytest.raises(ValueError, match="different configuration .*smoothing"):
        at.train(other, toy_pairs(), tmp_path, resume=True, log=quiet)


def test_a_new_run_never_overwrites_an_earlier_one(tmp_path):
    at.train(TINY, toy_pairs(), tmp_path, log=quiet)
    before = (tmp_path / "checkpoint.pt").read_bytes()
    with pytest.raises(FileExistsError, match="already exists; resume it"):
        at.train(TINY, toy_pairs(seed=1), tmp_path, log=quiet)
    assert (tmp_path / "checkpoint.pt").read_bytes() == before


def test_resuming_without_a_checkpoint_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        at.train(TINY, toy_pairs(), tmp_path, resume=True, log=quiet)


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


def test_train_config_validates_its_fields():
    with pytest.raises(ValueError, match="max_tokens must be a positive integer"):
        dataclasses.replace(TINY, max_tokens=0)
    with pytest.raises(ValueError, match="smoothing must be in"):
        dataclasses.replace(TINY, smoothing=1.0)


# ---- the copy task ---------------------------------------------------------------------------


def test_copy_task_is_learned_and_greedy_decoding_reproduces_the_input():
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    vocab = 12
    model = at.make_model(
        vocab, vocab, N=2, d_model=64, d_ff=128, h=4, dropout=0.0, share_embeddings=True
    )
    optimizer, scheduler = at.make_optimizer(model, 64, factor=1.0, warmup=100)
    criterion = at.LabelSmoothing(vocab, at.PAD_ID, 0.0)
    for _ in range(600):
        batch = at.Batch.from_ids(at.copy_task_pairs(32, vocab, 10, generator))
        at.run_step(model, criterion, batch, optimizer, scheduler)
    model.eval()
    test = at.Batch.from_ids(at.copy_task_pairs(20, vocab, 10, generator))
    with torch.no_grad():
        output = at.greedy_decode(model, test.src, test.src_mask, max_len=11)
    # an untrained model copies about one symbol in eight; 600 steps copy nearly all, and
    # which few repeated symbols are missed depends on the CPU's float rounding
    accuracy = (output[:, 1:] == test.tgt_y).float().mean().item()
    copied = (output[:, 1:] == test.tgt_y).all(dim=1).sum().item()
    assert accuracy > 0.95 and copied >= 14, (accuracy, copied)


# ---- the command line ------------------------------------------------------------------------


def test_help_is_clear():
    result = subprocess.run(
        [sys.executable, str(ROOT / "code" / "train.py"), "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0
    for flag in (
        "--profile",
        "--out",
        "--max-steps",
        "--resume",
        "--seed",
        "--device",
        "--d-model",
    ):
        assert flag in result.stdout


def test_command_line_trains_and_resumes(tmp_path, monkeypatch):
    import train

    monkeypatch.setattr(at, "load_multi30k", lambda split, data_dir=None: toy_pairs())
    flags = [
        "--out",
        str(tmp_path),
        "--N",
        "1",
        "--d-model",
        "32",
        "--d-ff",
        "64",
        "--h",
        "2",
        "--vocab-size",
        "200",
        "--max-tokens",
        "200",
        "--warmup-steps",
        "10",
        "--device",
        "cpu",
    ]
    assert train.main([*flags, "--max-steps", "4"]) == 0
    assert train.main([*flags, "--max-steps", "6", "--resume"]) == 0
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 6
    assert {p.name for p in tmp_path.iterdir()} >= {
        "checkpoint.pt",
        "tokenizer.json",
        "metrics.json",
        "train.log",
    }
    assert train.main([*flags, "--max-steps", "8", "--resume", "--smoothing", "0.3"]) == 2


def test_command_line_reports_missing_data(tmp_path, monkeypatch, capsys):
    import train

    monkeypatch.delenv("MULTI30K_DIR", raising=False)
    assert (
        train.main(["--out", str(tmp_path / "run"), "--data-dir", str(tmp_path / "nowhere")]) == 2
    )
    assert "MULTI30K_DIR" in capsys.readouterr().err
