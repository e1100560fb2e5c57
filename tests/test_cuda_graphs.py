"""Training with CUDA graphs (chapters/cuda_graphs.ipynb): bucketed batches with filler rows
give the plain batch's loss and gradients, the capturable step does no host work, the device
learning rate is Eq. (3), and the runner's CPU fallback trains as train_step does. Capture and
replay need a GPU: the last test runs only where there is one."""

import contextlib
import copy
import dataclasses

import pytest
import torch

import annotated_transformer as at
import training_runs as training
from annotated_transformer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    EncodedCorpus,
    batch_by_tokens,
    copy_task_pairs,
    forward_loss,
    make_model,
    make_optimizer,
    rate,
    subsequent_mask,
    train_bpe,
    train_step,
)
from cuda_graphs import (
    BUCKETS,
    GraphedTrainStep,
    bucket,
    bucketed_batch,
    bucketed_ids,
    capturable_step,
    make_capturable_optimizer,
)
from host_work import host_work
from toy import TINY, quiet, toy_pairs

VOCAB = 20


def random_pairs(source_lengths, seed=0):
    """(source ids + </s>, <s> + target ids + </s>) with targets one symbol longer."""
    generator = torch.Generator().manual_seed(seed)
    pairs = []
    for n in source_lengths:
        src, tgt = (torch.randint(4, VOCAB, (k,), generator=generator).tolist() for k in (n, n + 1))
        pairs.append((src + [EOS_ID], [BOS_ID] + tgt + [EOS_ID]))
    return pairs


def test_bucket_is_the_smallest_that_holds_n():
    assert [bucket(n) for n in (1, 8, 9, 10, 11, 13, 250, 256)] == [8, 8, 10, 10, 12, 16, 256, 256]
    assert bucket(257) == 512 and bucket(600) == 768  # multiples of the largest beyond it
    assert [bucket(n, (4, 6)) for n in (3, 5, 7, 13)] == [4, 6, 12, 18]


@pytest.mark.parametrize("fused", [True, False])
def test_bucketed_batch_gives_the_plain_batchs_loss_and_gradients(fused):
    # sources of 7..12 tokens with </s>: the longest, 12 + 1, is no bucket and is the
    # table's width, so the cut must pad past the table; 5 pairs take 3 filler rows
    corpus = EncodedCorpus(random_pairs([6, 11, 9, 12, 7, 8]))
    indices = [0, 1, 3, 4, 5]
    torch.manual_seed(0)
    model = make_model(VOCAB, VOCAB, N=2, d_model=16, d_ff=32, h=2, dropout=0.0, fused=fused)
    model = model.double()
    plain, bucketed = corpus.batch(indices), bucketed_batch(corpus, indices)
    assert tuple(plain.src.shape) == (5, 13) and tuple(bucketed.src.shape) == (8, 16)
    assert tuple(plain.tgt_in.shape) == (5, 14) and tuple(bucketed.tgt_in.shape) == (8, 16)
    assert bucketed.ntokens == plain.ntokens == int((bucketed.tgt_y != PAD_ID).sum())
    assert bucketed.src_mask.any(-1).all() and bucketed.tgt_mask.any(-1).all()

    def loss_and_gradients(batch):
        model.zero_grad()
        loss, _ = forward_loss(model, batch, smoothing=0.1)
        loss.backward()
        return loss.item() / batch.ntokens, [p.grad.clone() for p in model.parameters()]

    (plain_loss, plain_grads), (bucketed_loss, bucketed_grads) = map(
        loss_and_gradients, (plain, bucketed)
    )
    assert bucketed_loss == pytest.approx(plain_loss, rel=0, abs=1e-10)
    for a, b in zip(plain_grads, bucketed_grads):
        assert (a - b).abs().max().item() < 1e-10


@contextlib.contextmanager
def fused_adamw_on_meta():
    """PyTorch has no meta kernel for the fused AdamW update: lend it one that does nothing
    (all a kernel does on meta) and let the fused path accept meta tensors."""
    import torch.optim.optimizer as optimizers

    supported = optimizers._get_fused_kernels_supported_devices
    kernels = torch.library.Library("aten", "IMPL")
    kernels.impl("_fused_adamw_.tensor_lr", lambda *args, **kwargs: None, "Meta")
    optimizers._get_fused_kernels_supported_devices = lambda: [*supported(), "meta"]
    try:
        yield
    finally:
        optimizers._get_fused_kernels_supported_devices = supported
        kernels._destroy()


def test_the_capturable_step_and_the_cut_do_no_host_work():
    """Model, optimizer state, schedule, corpus tables and batch on meta; the exact optimizer
    a GPU uses (fused AdamW, learning rate a device tensor)."""
    corpus = EncodedCorpus(random_pairs([6, 11, 9, 12, 7, 8]))
    corpus = copy.copy(corpus)  # the lengths stay on the host, the tables go to meta
    corpus.src, corpus.tgt = corpus.src.to("meta"), corpus.tgt.to("meta")
    indices = [0, 1, 3, 4, 5]
    rows = torch.zeros(len(indices), dtype=torch.long, device="meta")
    with torch.device("meta"):
        model = make_model(VOCAB, VOCAB, N=1, d_model=16, d_ff=32, h=2)
    optimizer, schedule = make_capturable_optimizer(
        model, 16, 1.0, max_steps=10, warmup_steps=10, weight_decay=0.1
    )
    assert optimizer.param_groups[0]["fused"] and schedule.lr.device.type == "meta"
    step = capturable_step(model, optimizer, schedule, smoothing=0.1)
    with fused_adamw_on_meta():
        assert host_work(bucketed_ids, corpus, indices, rows=rows) == []
        src, tgt = bucketed_ids(corpus, indices, rows=rows)
        causal = subsequent_mask(tgt.size(1) - 1).to("meta")
        for _ in range(2):  # the first step creates the optimizer's state
            assert host_work(step, src, tgt, torch.zeros((), device="meta"), causal) == []
    state = optimizer.state[next(model.parameters())]
    assert state["step"].device.type == "meta" and state["exp_avg"].device.type == "meta"
    # what the check reports when there is host work: a device read
    assert host_work(schedule.state_dict)[0].startswith("aten._local_scalar_dense")


def float32(number):
    return torch.tensor(number, dtype=torch.float32).item()


def test_the_device_learning_rate_is_eq_3_from_the_host_rate_in_float32():
    optimizer, schedule = make_capturable_optimizer(
        torch.nn.Linear(3, 3), 512, 1.0, max_steps=12000, warmup_steps=4000
    )
    assert all(group["lr"] is schedule.lr for group in optimizer.param_groups)
    assert schedule.lr.dtype == torch.float32
    # by hand: at step 4000 = warmup both terms are 4000^-0.5, times 512^-0.5
    schedule.load_state_dict({"steps": 3999})  # the rate of update 4000
    assert schedule.lr.item() == pytest.approx(1 / (512 * 4000) ** 0.5, rel=1e-7)
    schedule.load_state_dict({"steps": 0})
    for update in range(1, 12002):  # one update past the table: its last rate again
        expected = rate(min(update, 12001), 512, 1.0, warmup_steps=4000)
        assert schedule.lr.item() == float32(expected)
        schedule.step()
    assert schedule.state_dict() == {"steps": 12001}
    # the optimizer reads it: Adam's first update moves each weight by the rate (g / |g|)
    layer = torch.nn.Linear(3, 3, bias=False)
    optimizer, schedule = make_capturable_optimizer(layer, 64, 2.0, max_steps=5, warmup_steps=10)
    before = layer.weight.detach().clone()
    layer.weight.grad = torch.full_like(before, 0.5)
    optimizer.step()
    moved = before - layer.weight.detach()
    assert torch.allclose(
        moved, torch.full_like(before, rate(1, 64, 2.0, warmup_steps=10)), rtol=1e-5
    )


def test_a_new_rate_is_tabulated_into_the_same_table_that_a_graph_reads():
    optimizer, schedule = make_capturable_optimizer(torch.nn.Linear(2, 2), 64, max_steps=30)
    table, lr = schedule.table.data_ptr(), schedule.lr.data_ptr()
    for _ in range(7):
        schedule.step()
    schedule.rate_of_update = lambda k: 0.5 / (k + 1)  # any host function of the update
    schedule.fill()
    assert schedule.table.data_ptr() == table and schedule.lr.data_ptr() == lr
    assert schedule.lr.item() == float32(0.5 / 8)  # the rate of update 8, at once
    assert schedule.rates == [0.5 / (k + 1) for k in range(31)]


def test_the_runner_on_a_cpu_trains_as_train_step_does():
    generator = torch.Generator().manual_seed(0)
    pairs = [pair for n in range(5, 10) for pair in copy_task_pairs(40, 12, n, generator=generator)]
    corpus = EncodedCorpus(pairs)
    torch.manual_seed(0)
    graphed = make_model(12, 12, N=1, d_model=32, d_ff=64, h=4, dropout=0.0)
    plain = copy.deepcopy(graphed)
    runner_optimizer, schedule = make_capturable_optimizer(
        graphed, 32, 1.0, max_steps=100, warmup_steps=100
    )
    runner = GraphedTrainStep(graphed, runner_optimizer, schedule, smoothing=0.0)
    assert not runner.graphed
    optimizer, scheduler = make_optimizer(plain, 32, 1.0, warmup_steps=100)
    plan = [b for epoch in range(2) for b in batch_by_tokens(corpus.lengths, 120, seed=epoch)]
    losses, gradients = [], None
    for indices in plan[:25]:
        # each update from the same state: a rounding difference carried over many updates
        # may tip a ReLU the other way (this seed's trajectories part after 10 updates)
        with torch.no_grad():
            for mine, theirs in zip(plain.parameters(), graphed.parameters()):
                mine.copy_(theirs)
                if theirs in runner_optimizer.state:
                    state = runner_optimizer.state[theirs]
                    optimizer.state[mine] = {k: v.clone() for k, v in state.items()}
        ntokens = corpus.target_tokens(indices)
        sums = runner(*bucketed_ids(corpus, indices), ntokens)
        expected = train_step(
            plain, corpus.batch(indices), optimizer, scheduler=scheduler, smoothing=0.0
        )
        assert torch.allclose(sums, expected, rtol=1e-5)
        for a, b in zip(graphed.parameters(), plain.parameters()):
            assert (a - b).abs().max().item() < 1e-6  # rounding; a rate off by one: >= 1e-5
        losses.append(sums[0].item() / ntokens)
        # the gradient buffers stay where they are, zeroed, as a replay needs them
        assert all(p.grad is not None and not p.grad.any() for p in graphed.parameters())
        gradients = gradients or [p.grad.data_ptr() for p in graphed.parameters()]
        assert [p.grad.data_ptr() for p in graphed.parameters()] == gradients
    assert losses[-1] < 0.7 * losses[0]


def test_the_runner_refuses_what_a_graph_cannot_do():
    model = make_model(12, 12, N=1, d_model=16, d_ff=32, h=2)
    optimizer, schedule = make_capturable_optimizer(model, 16, max_steps=10)
    with pytest.raises(ValueError, match="float16"):
        GraphedTrainStep(model, optimizer, schedule, smoothing=0.1, autocast=torch.float16)
    with pytest.raises(ValueError, match="eager_steps"):
        GraphedTrainStep(model, optimizer, schedule, smoothing=0.1, eager_steps=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="capture and replay need a GPU")
def test_graphs_replay_the_steps_train_step_makes():
    """Two shapes, each seen six times: three eager steps, a capture, then replays; the
    weights follow train_step's on the same batches (dropout off)."""
    generator = torch.Generator().manual_seed(0)
    pairs = [pair for n in (5, 9) for pair in copy_task_pairs(16, 12, n, generator=generator)]
    corpus = EncodedCorpus(pairs)
    tables = copy.copy(corpus)
    tables.src, tables.tgt = corpus.src.cuda(), corpus.tgt.cuda()
    torch.manual_seed(0)
    graphed = make_model(12, 12, N=1, d_model=32, d_ff=64, h=4, dropout=0.0).cuda()
    plain = copy.deepcopy(graphed)
    optimizer, schedule = make_capturable_optimizer(
        graphed, 32, 1.0, max_steps=100, warmup_steps=100
    )
    runner = GraphedTrainStep(graphed, optimizer, schedule, smoothing=0.0)
    optimizer, scheduler = make_optimizer(plain, 32, 1.0, warmup_steps=100)
    short, long = list(range(0, 12)), list(range(16, 26))
    for indices in [short, long] * 6:
        ntokens = corpus.target_tokens(indices)
        sums = runner(*bucketed_ids(tables, indices), ntokens)
        expected = train_step(
            plain,
            training.corpus_on(corpus, "cuda").batch(indices),
            optimizer,
            scheduler=scheduler,
            smoothing=0.0,
        )
        assert torch.allclose(sums, expected, rtol=1e-3)
    assert len(runner.shapes) == 2
    assert all(s.graph is not None and s.eager_steps == 3 for s in runner.shapes.values())
    torch.cuda.synchronize()
    for a, b in zip(graphed.parameters(), plain.parameters()):
        assert (a - b).abs().max().item() < 1e-4


def shapes_of_an_epoch(tmp_path, monkeypatch, buckets, compile="off"):
    """The (source, target) batch shapes that train's eager step meets over the first epoch
    of a toy run whose sentences have many lengths."""
    seen, step = [], training.train_step_amp

    def recording_step(model, batch, *args, **kwargs):
        seen.append((tuple(batch.src.shape), tuple(batch.tgt_in.shape)))
        return step(model, batch, *args, **kwargs)

    monkeypatch.setattr(training, "train_step_amp", recording_step)
    pairs = toy_pairs(200, seed=1)
    epoch = len(
        training.epoch_updates(at.EncodedCorpus.from_pairs(pairs, train_bpe(pairs, 200)), TINY, 0)
    )
    config = dataclasses.replace(
        TINY, max_steps=epoch, checkpoint_every=epoch, buckets=buckets, compile=compile
    )
    training.train(config, pairs, tmp_path / f"run{buckets}{compile}", log=quiet)
    return seen


def test_bucketed_runs_meet_only_bucketed_shapes(tmp_path, monkeypatch):
    plain = set(shapes_of_an_epoch(tmp_path, monkeypatch, buckets=False))
    bucketed = set(shapes_of_an_epoch(tmp_path, monkeypatch, buckets=True))
    sizes = {n for shapes in bucketed for shape in shapes for n in shape}
    assert sizes <= set(BUCKETS)  # rows, source and target lengths: all buckets
    assert not {n for shapes in plain for shape in shapes for n in shape} <= set(BUCKETS)
    assert len(bucketed) < len(plain)


@pytest.mark.parametrize("buckets", [True, False])
def test_a_compiled_run_compiles_one_graph_for_all_its_shapes(tmp_path, monkeypatch, buckets):
    # each inductor compile costs tens of seconds: dynamic shapes make one graph serve every
    # batch (without them dynamo compiles a static graph first, then a dynamic one)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    seen = shapes_of_an_epoch(tmp_path, monkeypatch, buckets=buckets, compile="eager")
    assert len(set(seen)) >= 4
    sizes = {n for shapes in seen for shape in shapes for n in shape}
    assert sizes <= set(BUCKETS) if buckets else all(n % 8 == 0 for n in sizes)  # none is 1
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()
