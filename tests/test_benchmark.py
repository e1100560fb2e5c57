"""The benchmark suite (code/benchmark.py): its FLOP formula against PyTorch's flop counter,
its nn.Transformer baseline, its interleaved rounds and ratios, the real batches of its profile
configurations, its flags, and a smoke run end to end. Tiny sizes only (the multi30k model is
built and its batches cut, never trained), and no timed assertions: speed depends on the
machine."""

import json
import math
import os
import pathlib
from dataclasses import asdict, replace

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import annotated_transformer as at
import benchmark
import benchmark_rows
import flops
import profiles
import script_helpers as helpers
import stand_in
from hardware import hardware_description
from torch_transformer import TorchTransformer

TINY = benchmark_rows.CONFIGS["tiny"]
ROOT = pathlib.Path(__file__).resolve().parent.parent
LOCAL_COPY = pathlib.Path(
    os.environ.get("MULTI30K_DIR") or ROOT.parent / "shared" / "data" / "multi30k"
)


@pytest.fixture(autouse=True)
def one_thread():
    """These tests count and smoke-run, they do not time: one thread is enough, and spares
    them the waits of two threads on a machine whose cores are busy with other work."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_inputs(batch=3, src_len=7, tgt_len=5, vocab=50, seed=0):
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (batch, src_len), generator=generator)
    tgt = torch.randint(4, vocab, (batch, tgt_len), generator=generator)
    return src, tgt, at.padding_mask(src, at.PAD_ID), at.target_mask(tgt, at.PAD_ID)


def counted_flops(model, inputs, backward):
    """FLOPs that torch's FlopCounterMode sees in a forward (and backward) pass."""
    with FlopCounterMode(display=False) as counter:
        log_probs = model.generator(model(*inputs))
        if backward:
            log_probs.sum().backward()
    return counter.get_total_flops()


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"N": 2, "h": 2},
        {"d_k": 4, "d_v": 6},
        {"pre_norm": True},
        {"share_embeddings": True},
    ],
)
@pytest.mark.parametrize("shape", [(3, 7, 5), (2, 4, 9)])
def test_flop_formula_equals_the_flop_counter_on_the_reference_path(options, shape):
    # Exact: the formula counts the same matrix products the counter counts, and both leave
    # out element-wise work (softmax, LayerNorm, dropout, residuals, log-softmax).
    batch, src_len, tgt_len = shape
    config = replace(TINY.model, fused=False, **options)
    torch.manual_seed(0)
    model = at.build_model(50, 50, config)
    inputs = tiny_inputs(batch, src_len, tgt_len)
    expected = flops.forward_flops(config, 50, batch, src_len=src_len, tgt_len=tgt_len)
    assert counted_flops(model, inputs, backward=False) == expected["total"]
    # training = forward + a backward of two products per forward product = 3x forward
    assert counted_flops(model, inputs, backward=True) == flops.training_flops(
        config, 50, batch, src_len=src_len, tgt_len=tgt_len
    )


def test_flop_formula_on_the_fused_path():
    # The counter knows the CUDA kernels of scaled_dot_product_attention, but has no formula
    # for the CPU's fused kernel: there it misses exactly the attention part, nothing else.
    config = replace(TINY.model, fused=True)
    torch.manual_seed(0)
    model = at.build_model(50, 50, config)
    parts = flops.forward_flops(config, 50, 3, src_len=7, tgt_len=5)
    counted = counted_flops(model, tiny_inputs(), backward=False)
    assert counted in (parts["total"], parts["total"] - parts["attention"])


def test_flop_formula_parts_for_the_base_model():
    # the familiar rule of thumb: a forward pass costs about 2 FLOPs per weight and token
    parts = flops.forward_flops(at.BASE, 8000, 32, src_len=30, tgt_len=30)
    assert parts["total"] == sum(v for k, v in parts.items() if k != "total")
    assert parts["feed_forward"] == 6 * 2 * 2 * (32 * 30) * 512 * 2048 * 2
    per_token = parts["total"] / (32 * 30)
    weights = at.count_parameters(at.make_model(8000, 8000)) - 2 * 8000 * 512  # no embeddings
    assert 2 * weights * 0.98 < per_token < 2 * weights * 1.1  # attention adds a little


def test_the_baseline_has_the_configured_sizes():
    config = TINY.model
    baseline = TorchTransformer(TINY.vocab, config)
    transformer = baseline.transformer
    assert transformer.d_model == config.d_model and transformer.nhead == config.h
    assert len(transformer.encoder.layers) == len(transformer.decoder.layers) == config.N
    for layer in [*transformer.encoder.layers, *transformer.decoder.layers]:
        assert layer.linear1.out_features == config.d_ff
        assert not layer.norm_first and layer.self_attn.batch_first
        assert layer.activation is F.relu
        assert layer.dropout1.p == config.dropout  # residual dropout, as ours (§5.4)
        assert layer.dropout.p == layer.self_attn.dropout == 0.0  # not in the paper, nor ours


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_the_baseline_has_our_parameter_count_plus_known_extras(name):
    # nn.MultiheadAttention has biases on W^Q, W^K, W^V and W^O (4 d_model in each of the
    # 3N attention modules) and nn.Transformer ends encoder and decoder with a LayerNorm
    # (2 d_model each); everything else (embeddings, feed-forward, generator) is the same
    bench = benchmark_rows.CONFIGS[name]
    c = bench.model
    ours = at.count_parameters(at.build_model(bench.vocab, bench.vocab, c))
    theirs = at.count_parameters(TorchTransformer(bench.vocab, c))
    assert theirs - ours == 12 * c.N * c.d_model + 4 * c.d_model
    assert (theirs - ours) / ours < 0.005 or name == "tiny"


@pytest.mark.parametrize("profile", ["multi30k", "tiny"])
def test_the_twin_of_a_profile_model_shares_its_embeddings_and_has_our_count_plus_extras(
    profile,
):
    # the training-sized row's baseline: one matrix for both embeddings and the generator,
    # as in our model (§3.4), so only the documented extras differ
    c = profiles.PROFILES[profile].model
    vocab = profiles.PROFILES[profile].vocab_size
    assert c.share_embeddings
    ours = at.count_parameters(at.build_model(vocab, vocab, c))
    twin = TorchTransformer(vocab, c)
    shared = twin.src_embed[0].embedding.weight
    assert twin.tgt_embed[0].embedding.weight is shared
    assert twin.generator.projection.weight is shared
    theirs = at.count_parameters(twin)
    # counted by hand: the shared matrix V d once; W^Q, W^K, W^V, W^O (4 d^2, no biases in
    # ours, 4 d in nn.MultiheadAttention) per attention module; 2 d d_ff + d_ff + d per
    # feed-forward; 2 d per LayerNorm, of which nn.Transformer has one more per stack
    d, f, N = c.d_model, c.d_ff, c.N
    attention, ff, norm = 4 * d * d, 2 * d * f + f + d, 2 * d
    by_hand = vocab * d + N * (attention + ff + 2 * norm) + N * (2 * attention + ff + 3 * norm)
    assert ours == by_hand
    assert theirs == by_hand + 3 * N * 4 * d + 2 * norm == ours + 12 * N * d + 4 * d
    assert (theirs - ours) / ours < 0.005 or profile == "tiny"


def test_the_baseline_masks_padding_and_the_future():
    torch.manual_seed(0)
    # training mode without dropout: the same function as eval, without nn.Transformer's
    # inference fast path (nested tensors, which warn that they are a prototype)
    baseline = TorchTransformer(50, replace(TINY.model, dropout=0.0)).train()
    src, tgt, src_mask, tgt_mask = tiny_inputs()
    src[0, -2:] = at.PAD_ID
    src_mask = at.padding_mask(src, at.PAD_ID)
    with torch.no_grad():
        out = baseline(src, tgt, src_mask, tgt_mask)
        changed_src, changed_tgt = src.clone(), tgt.clone()
        changed_src[0, -2:] = 7  # what padding hides must not matter ...
        changed_tgt[:, -1] = 9  # ... nor a later target token to an earlier position
        other = baseline(changed_src, changed_tgt, src_mask, tgt_mask)
    assert out.shape == (3, 5, TINY.model.d_model)
    torch.testing.assert_close(out[:, :-1], other[:, :-1])


def test_bf16_peaks_by_device_name():
    # a more precise name comes before the name it contains ("H100 PCIe" before "H100")
    for name, peak in flops.BF16_PEAK_FLOPS.items():
        assert flops.bf16_peak_flops(f"NVIDIA {name}") == peak, name
    assert flops.bf16_peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert flops.bf16_peak_flops("NVIDIA H100 PCIe") == 756e12
    assert flops.bf16_peak_flops("NVIDIA H200") == 989e12
    assert flops.bf16_peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert flops.bf16_peak_flops("Some Future GPU") is None


def test_rounds_visit_the_rows_in_rotated_order():
    # every call of every row, in order: warm-up A B C, then rounds A B C, B C A, C A B,
    # each row's measurement a run of calls (the Timer's untimed sizing call, then its block)
    calls = []
    rows = [benchmark_rows.Row(key, key, lambda key=key: calls.append(key), 1) for key in "ABC"]
    measured = benchmark_rows.measure(rows, rounds=3, warmup=1, min_seconds=0.0, log=lambda _: None)
    visits = [key for i, key in enumerate(calls) if i == 0 or calls[i - 1] != key]
    assert visits == list("ABC" + "ABC" + "BCA" + "CAB")
    assert [len(m) for m in measured] == [3, 3, 3]  # one Measurement per row and round
    assert all(m.median > 0 for per_row in measured for m in per_row)


def test_ratio_of_medians_lies_within_the_per_round_range():
    # rounds are paired: if a <= r * b in every round, median(a) <= r * median(b)
    rows = {"a": {"times_s": [1.0, 4.0, 2.0, 9.0]}, "b": {"times_s": [2.0, 2.0, 8.0, 3.0]}}
    r = benchmark_rows.ratio(rows, "a", "b")
    assert r["ratio"] == pytest.approx(3.0 / 2.5)
    assert r["paired_min"] == 0.25 and r["paired_max"] == 3.0 and r["paired_median"] == 1.25
    assert r["paired_min"] <= r["ratio"] <= r["paired_max"]


def test_bf16_rows_train_on_a_cpu():
    # the code path, not the speed: autocast bf16 on a CPU that may only emulate it
    rows = benchmark_rows.training_rows(TINY, torch.device("cpu"), bf16=True)
    assert [row.key for row in rows][-1] == "train/ours-fused-bf16"
    for row in rows:
        row.work()
        assert row.tokens == TINY.batch * TINY.seq
        assert row.flops == flops.training_flops(TINY.model, TINY.vocab, 4, src_len=6, tgt_len=6)


def test_the_graphed_row_trains_the_model_it_is_given_on_the_benchmark_batch():
    # on a CPU GraphedTrainStep runs its step eagerly: the row's code path, not a graph
    torch.manual_seed(0)
    model = at.build_model(TINY.vocab, TINY.vocab, TINY.model)
    start = [p.detach().clone() for p in model.parameters()]
    row = benchmark_rows.graphed_row(TINY, model, torch.device("cpu"), eager_steps=1)
    assert row.key == "train/ours-graphed" and row.updates == 1
    assert row.tokens == TINY.batch * TINY.seq
    assert row.flops == flops.training_flops(TINY.model, TINY.vocab, 4, src_len=6, tgt_len=6)
    after_warmup = [p.detach().clone() for p in model.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(start, after_warmup))  # 2 steps made
    row.work()
    assert any(not torch.equal(a, p) for a, p in zip(after_warmup, model.parameters()))
    assert benchmark_rows.graphed_row(
        TINY, model, torch.device("cpu"), autocast=torch.bfloat16
    ).key == ("train/ours-graphed-bf16")
    compiled = torch.compile(model, backend="aot_eager")  # the wrapper names the row
    assert benchmark_rows.graphed_row(TINY, compiled, torch.device("cpu"), eager_steps=1).key == (
        "train/ours-compiled-graphed"
    )


def test_spread_batches_takes_the_middle_batch_of_equal_slices_of_lengths():
    # max_tokens 1: every pair is a batch of its own (a longer pair still gets one), so the
    # epoch's batches by length are the pairs of lengths 1, 2, ..., 12; in 4 slices of 3
    # the middle ones have lengths 2, 5, 8 and 11
    lengths = [(n, n) for n in (7, 3, 12, 1, 9, 5, 11, 2, 6, 10, 4, 8)]
    chosen = benchmark_rows.spread_batches(lengths, max_tokens=1, count=4)
    assert [[lengths[i][0] for i in batch] for batch in chosen] == [[2], [5], [8], [11]]
    epoch = at.batch_by_tokens(lengths, 1, seed=0)  # as training cuts (and shuffles) them
    assert all(batch in epoch for batch in chosen)
    with pytest.raises(ValueError, match="count must be in 1..12"):
        benchmark_rows.spread_batches(lengths, max_tokens=1, count=13)


def test_real_token_flops_count_each_pair_at_its_own_lengths():
    # against the flop counter, one pair at a time (batch 1: no padding), forward + backward
    config = replace(TINY.model, fused=False)
    lengths = [(5, 4), (9, 7), (3, 8)]  # source with </s>; target ids with <s> and </s>
    torch.manual_seed(0)
    model = at.build_model(50, 50, config)
    counted = 0
    for i, (src_len, tgt_len) in enumerate(lengths):
        inputs = tiny_inputs(1, src_len, tgt_len - 1, seed=i)  # the decoder reads tgt_len - 1
        counted += counted_flops(model, inputs, backward=True)
    assert flops.real_token_flops(config, 50, lengths, indices=[0, 1, 2]) == counted
    # pairs of equal lengths: the formula of a batch without padding
    same = [(6, 5)] * 3
    assert flops.real_token_flops(config, 50, same, indices=[0, 1, 2]) == flops.training_flops(
        config, 50, 3, src_len=6, tgt_len=4
    )


def test_side_by_side_pairs_rows_of_the_same_precision_only():
    # base and small time ours in bf16 but not nn.Transformer: no bf16 pair to show there
    def row(tokens_per_s, *times):
        return {"tokens_per_s": tokens_per_s, "times_s": list(times)}

    run = {
        "rows": {
            "train/ours-fused": row(900.0, 1.0, 2.0, 3.0),
            "train/torch": row(800.0, 2.0, 2.0, 2.0),
            "train/ours-fused-bf16": row(2000.0, 0.5, 0.5, 0.5),
        }
    }
    table = benchmark_rows.side_by_side(run)
    assert list(table) == ["float32"]
    assert table["float32"]["ours"] == 900.0 and table["float32"]["torch.nn.Transformer"] == 800.0
    ratio = table["float32"]["time ratio"]
    assert ratio["ratio"] == 1.0 and (ratio["paired_min"], ratio["paired_max"]) == (0.5, 1.5)
    run["rows"]["train/torch-bf16"] = row(1600.0, 1.0, 1.0, 1.0)
    table = benchmark_rows.side_by_side(run)
    assert list(table) == ["float32", "bf16 autocast"]
    assert table["bf16 autocast"]["time ratio"]["ratio"] == 0.5


@pytest.fixture(scope="module")
def multi30k(tmp_path_factory):
    """The multi30k configuration's data, its tokenizer learned into a temporary cache."""
    if not (LOCAL_COPY / "train.de.gz").is_file():
        pytest.skip(f"no local Multi30k copy at {LOCAL_COPY}; set MULTI30K_DIR")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MULTI30K_DIR", str(LOCAL_COPY))
        cache = tmp_path_factory.mktemp("tokenizers")
        return benchmark_rows.profile_data(benchmark_rows.CONFIGS["multi30k"], cache), cache


def test_the_training_sized_row_trains_on_real_multi30k_batches(multi30k, monkeypatch):
    data, cache = multi30k
    bench, profile = benchmark_rows.CONFIGS["multi30k"], profiles.PROFILES["multi30k"]
    assert (bench.profile, bench.corpus) == ("multi30k", "multi30k")
    monkeypatch.setenv("MULTI30K_DIR", str(LOCAL_COPY))
    pairs = helpers.load_multi30k("train")
    assert data.record["pairs"] == len(pairs) == 29000
    assert data.tokenizer.get_vocab_size() == data.record["vocab"] == profile.vocab_size == 5000
    # lengths counted here, one sentence at a time: source + </s>, <s> + target + </s>
    encode = data.tokenizer.encode
    lengths = [(len(encode(s).ids) + 1, len(encode(t).ids) + 2) for s, t in pairs]
    assert data.corpus.lengths == lengths
    epoch = at.batch_by_tokens(lengths, profile.max_tokens, profile.seed)  # as training cuts
    assert data.record["epoch_batches"] == len(epoch)
    assert len(data.chosen) == bench.batches == 4
    assert all(batch in epoch for batch in data.chosen)
    assert len({tuple(batch) for batch in data.chosen}) == 4
    # spread over the epoch's lengths: from below the median longest source to above it
    longest = [max(lengths[i][0] for i in batch) for batch in data.chosen]
    median = sorted(max(lengths[i][0] for i in batch) for batch in epoch)[len(epoch) // 2]
    assert longest == sorted(longest) and longest[0] < median < longest[-1]
    targets = [sum(lengths[i][1] - 1 for i in batch) for batch in data.chosen]
    assert [b["target_tokens"] for b in data.record["batches"]] == targets
    for batch, record in zip(data.chosen, data.record["batches"]):
        padded = len(batch) * max(record["source_length"], record["target_length"] + 1)
        assert record["sentences"] == len(batch) and padded <= profile.max_tokens
    rows = benchmark_rows.profile_rows(data, torch.device("cpu"), bf16=False)
    assert [row.key for row in rows] == ["train/ours-fused", "train/torch"]
    for row in rows:
        assert row.tokens == sum(targets) and row.updates == 4
        per_pair = [
            flops.training_flops(
                profile.model, 5000, 1, src_len=lengths[i][0], tgt_len=lengths[i][1] - 1
            )
            for batch in data.chosen
            for i in batch
        ]
        assert row.flops == sum(per_pair)
    # the tokenizer was learned once and kept: a second read finds it in the cache
    (kept,) = cache.glob("*/tokenizer-5000.json")
    assert at.load_tokenizer(kept).to_str() == data.tokenizer.to_str()


def test_profile_rows_train_ours_and_the_twin_on_the_same_batches(tmp_path):
    data = benchmark_rows.profile_data(benchmark_rows.CONFIGS["tiny-profile"], tmp_path)
    rows = benchmark_rows.profile_rows(data, torch.device("cpu"), bf16=True)
    keys = ["train/ours-fused", "train/torch", "train/ours-fused-bf16", "train/torch-bf16"]
    assert [row.key for row in rows] == keys
    seen = []
    original = benchmark_rows.train_step_amp

    def recording(model, batch, *args, **kwargs):
        name, ntokens = type(model).__name__, int(batch.ntokens)
        seen.append((name, batch.src.shape, ntokens, kwargs.get("autocast")))
        return original(model, batch, *args, **kwargs)

    benchmark_rows.train_step_amp = recording
    try:
        for row in rows:
            row.work()
    finally:
        benchmark_rows.train_step_amp = original
    shapes = [(len(b), max(data.corpus.lengths[i][0] for i in b)) for b in data.chosen]
    tokens = [data.corpus.target_tokens(b) for b in data.chosen]
    expected = [
        (model, torch.Size(shape), n, autocast)
        for model, autocast in [
            ("EncoderDecoder", None),
            ("TorchTransformer", None),
            ("EncoderDecoder", torch.bfloat16),
            ("TorchTransformer", torch.bfloat16),
        ]
        for shape, n in zip(shapes, tokens)
    ]
    assert seen == expected


@pytest.mark.parametrize(
    "avx512_bf16, amx, native",
    [
        (False, False, False),
        (True, False, True),
        (False, True, True),
        (True, True, True),
        (None, None, False),
    ],
)
def test_the_bf16_column_appears_exactly_when_the_cpu_has_native_bf16(
    avx512_bf16, amx, native, tmp_path, monkeypatch
):
    if avx512_bf16 is None:  # torch without its private helpers: no native bf16 assumed
        monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")
    else:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    out = tmp_path / "quick.json"
    argv = ["--quick", "--config", "tiny-profile", "--rounds", "1", "--warmup", "0"]
    argv += ["--threads", "1", "--tokenizer-cache", str(tmp_path), "--out", str(out)]
    assert benchmark.main(argv, log=lambda _: None) == 0
    results = json.loads(out.read_text())
    assert results["hardware"]["bf16_native"] is native
    run = results["runs"]["tiny-profile"]
    bf16 = {"train/ours-fused-bf16", "train/torch-bf16"}
    assert set(run["rows"]) == {"train/ours-fused", "train/torch"} | (bf16 if native else set())
    assert set(run["skipped"]) == (set() if native else bf16)
    columns = list(benchmark_rows.side_by_side(run))
    assert columns == (["float32", "bf16 autocast"] if native else ["float32"])


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--rounds", "0"], "--rounds"),
        (["--warmup", "-1"], "--warmup"),
        (["--min-seconds", "-0.5"], "--min-seconds"),
        (["--threads", "two"], "--threads"),
        (["--config", "huge"], "--config"),
        (["--bf16", "maybe"], "--bf16"),
        (["--device", "tpu"], "--device"),
    ],
)
def test_a_bad_flag_exits_2_naming_it(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        benchmark.main(argv, log=lambda _: None)
    assert exit_.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


def test_an_output_folder_that_cannot_be_made_exits_2_before_measuring(tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder")
    out = tmp_path / "file" / "results.json"
    assert benchmark.main(["--quick", "--out", str(out)], log=print) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("benchmark.py: ") and "File exists" in captured.err
    assert captured.out == ""  # nothing was measured


def test_the_recorded_tf32_setting_is_read_as_training_sets_it(tmp_path):
    """Training sets TF32 through fp32_precision; reading the legacy allow_tf32 after that
    raises in torch (a mix of the two APIs), so the benchmark reads the same flag."""
    out = tmp_path / "quick.json"
    saved = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    try:
        argv = ["--quick", "--threads", "1", "--tokenizer-cache", str(tmp_path), "--out", str(out)]
        assert benchmark.main(argv, log=lambda _: None) == 0
    finally:
        torch.backends.cuda.matmul.fp32_precision = saved
    assert json.loads(out.read_text())["settings"]["tf32"] is True


def test_no_decoding_times_the_training_step_alone_and_the_compile_mode_is_recorded(tmp_path):
    out = tmp_path / "tiny.json"
    argv = ["--quick", "--config", "tiny", "--threads", "1", "--no-decoding", "--out", str(out)]
    argv += ["--compile-mode", "max-autotune-no-cudagraphs"]  # compiles only on a GPU
    assert benchmark.main(argv, log=lambda _: None) == 0
    results = json.loads(out.read_text())
    rows = results["runs"]["tiny"]["rows"]
    assert rows and all(key.startswith("train/") for key in rows)
    assert results["settings"]["compile_mode"] == "max-autotune-no-cudagraphs"


def test_quick_run_writes_json_with_every_row_and_ratio(tmp_path, capsys):
    out = tmp_path / "results" / "quick.json"
    torch.set_num_threads(2)
    argv = ["--quick", "--threads", "1", "--tokenizer-cache", str(tmp_path), "--out", str(out)]
    assert benchmark.main(argv, log=print) == 0
    assert torch.get_num_threads() == 2  # main() restores the thread count it changed
    results = json.loads(out.read_text())
    assert results["schema"] == benchmark.SCHEMA
    assert {"schema", "command", "created", "settings", "hardware", "runs"} == set(results)
    hardware = results["hardware"]
    torch.set_num_threads(1)  # as during the run: the description names the thread count
    assert hardware["description"] == hardware_description("cpu")
    assert hardware["threads"] == 1 and hardware["torch"] == torch.__version__
    assert len(hardware["load_average_start"]) == len(hardware["load_average_end"]) == 3
    assert hardware["gpu"] is None and hardware["gpu_bf16_peak_flops"] is None
    assert results["settings"]["rounds"] == 2 and results["settings"]["decode_end_symbol"] == -1
    assert list(results["runs"]) == benchmark_rows.QUICK == ["tiny", "tiny-profile"]
    run = results["runs"]["tiny"]
    expected = {
        "train/ours-fused",
        "train/ours-reference",
        "train/torch",
        "decode/greedy-nocache",
        "decode/greedy-cache",
        "decode/beam-nocache",
        "decode/beam-cache",
    }
    bf16 = "train/ours-fused-bf16"
    assert set(run["rows"]) == expected | ({bf16} if bf16 in run["rows"] else set())
    assert (bf16 in run["rows"]) == hardware["bf16_native"]  # --bf16 auto
    assert (bf16 in run["rows"]) != (bf16 in run["skipped"])
    printed = capsys.readouterr().out
    for key, row in run["rows"].items():
        assert f"{key}: {row['label']}" in printed  # a row of Compare's table
        assert len(row["times_s"]) == 2 and all(0 < t < math.inf for t in row["times_s"])
        assert min(row["times_s"]) <= row["median_s"] <= max(row["times_s"])
        assert row["tokens_per_s"] == pytest.approx(row["tokens"] / row["median_s"])
        assert row["mfu"] is None and row["peak_memory_bytes"] is None  # a CPU: neither
    assert run["rows"]["train/torch"]["flops"] == run["flops"]["training_step"]
    assert run["flops"]["forward"] == flops.forward_flops(TINY.model, 64, 4, src_len=6, tgt_len=6)
    assert run["rows"]["decode/beam-cache"]["tokens"] == 4 * 6
    labels = [label for a, b, label in benchmark_rows.RATIOS if {a, b} <= set(run["rows"])]
    assert list(run["ratios"]) == labels and len(labels) >= 6
    for label, r in run["ratios"].items():
        a, b = (run["rows"][key]["median_s"] for key in (r["numerator"], r["denominator"]))
        assert r["ratio"] == pytest.approx(a / b)
        assert r["paired_min"] <= min(r["ratio"], r["paired_median"])
        assert max(r["ratio"], r["paired_median"]) <= r["paired_max"]
        assert label in printed
    # the stand-in for the training-sized row: real batches of a made-up corpus
    profile = results["runs"]["tiny-profile"]
    data = profile["data"]
    assert profile["config"]["recipe"] == json.loads(json.dumps(asdict(profiles.PROFILES["tiny"])))
    assert data["corpus"] == "stand-in" and len(data["batches"]) == 2
    tokens = sum(b["target_tokens"] for b in data["batches"])
    assert set(profile["rows"]) - {"train/ours-fused-bf16", "train/torch-bf16"} == {
        "train/ours-fused",
        "train/torch",
    }
    for key, row in profile["rows"].items():
        assert f"{key}: {row['label']}" in printed
        assert row["tokens"] == tokens and row["updates"] == 2
        assert row["seconds_per_update"] == pytest.approx(row["median_s"] / 2)
        assert row["flops"] == profile["flops"]["per_call"] == 2 * profile["flops"]["training_step"]
    float32 = benchmark_rows.side_by_side(profile)["float32"]
    assert float32["ours"] == profile["rows"]["train/ours-fused"]["tokens_per_s"]
    assert f"target tokens/s, float32: ours {float32['ours']:,.0f}" in printed


def test_a_recipes_step_flops_count_its_mean_batch_at_the_mean_lengths():
    # 30 pairs, all of source length 4 and target length 6 (<s> ... </s>): a batch of
    # max_tokens 40 holds 40 // 6 = 6 of them (padding-free: every sentence is as long)
    corpus = at.EncodedCorpus([([5, 6, 7, at.EOS_ID], [at.BOS_ID, 5, 6, 7, 8, at.EOS_ID])] * 30)
    config = at.TrainConfig(model=at.ModelConfig(N=1, d_model=8, d_ff=16, h=2), max_tokens=40)
    expected = flops.training_flops(config.model, config.vocab_size, 6, src_len=4, tgt_len=5)
    assert flops.recipe_step_flops(config, corpus) == pytest.approx(expected)


def test_a_decoding_calls_flops_grow_in_proportion_to_its_batch():
    # the Performance page counts the base model's decoding on an eighth of its batch
    counts = []
    for batch in (2, 4):
        rows = benchmark_rows.decoding_rows(
            replace(benchmark_rows.CONFIGS["tiny"], batch=batch), "cpu"
        )
        for row in rows:
            with FlopCounterMode(display=False) as count:
                row.work()
            counts.append(count.get_total_flops())
    half = len(counts) // 2
    assert counts[half:] == [2 * n for n in counts[:half]] and min(counts) > 0


def test_the_stand_in_pairs_reverse_their_words_and_are_the_tests_toy_pairs():
    import toy

    pairs = stand_in.stand_in_pairs(20, seed=3)
    assert pairs == stand_in.stand_in_pairs(20, seed=3) != stand_in.stand_in_pairs(20, seed=4)
    for source, target in pairs:
        assert target.split() == source.split()[::-1]
        assert 2 <= len(source.split()) <= 8
        assert set(source.split()) <= set(stand_in.STAND_IN_WORDS)
    vocab = len(stand_in.STAND_IN_WORDS) + 4  # the words are the ids after the special ones
    for (source, _), (ids, _) in zip(pairs, stand_in.stand_in_ids(20, vocab, seed=3)):
        assert source.split() == [stand_in.STAND_IN_WORDS[i - 4] for i in ids[:-1]]
    assert toy.toy_pairs is stand_in.stand_in_pairs and toy.toy_ids is stand_in.stand_in_ids
