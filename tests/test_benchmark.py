"""The benchmark suite (code/benchmark.py): its FLOP formula against PyTorch's flop counter,
its nn.Transformer baseline, its interleaved rounds and ratios, its flags, and a smoke run end
to end. Tiny sizes only, and no timed assertions: speed depends on the machine."""

import json
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import annotated_transformer as at
import benchmark

TINY = benchmark.CONFIGS["tiny"]


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
    expected = benchmark.forward_flops(config, 50, batch, src_len, tgt_len)
    assert counted_flops(model, inputs, backward=False) == expected["total"]
    # training = forward + a backward of two products per forward product = 3x forward
    assert counted_flops(model, inputs, backward=True) == benchmark.training_flops(
        config, 50, batch, src_len, tgt_len
    )


def test_flop_formula_on_the_fused_path():
    # The counter knows the CUDA kernels of scaled_dot_product_attention, but has no formula
    # for the CPU's fused kernel: there it misses exactly the attention part, nothing else.
    config = replace(TINY.model, fused=True)
    torch.manual_seed(0)
    model = at.build_model(50, 50, config)
    parts = benchmark.forward_flops(config, 50, 3, 7, 5)
    counted = counted_flops(model, tiny_inputs(), backward=False)
    assert counted in (parts["total"], parts["total"] - parts["attention"])


def test_flop_formula_parts_for_the_base_model():
    # the familiar rule of thumb: a forward pass costs about 2 FLOPs per weight and token
    parts = benchmark.forward_flops(at.BASE, 8000, 32, 30, 30)
    assert parts["total"] == sum(v for k, v in parts.items() if k != "total")
    assert parts["feed_forward"] == 6 * 2 * 2 * (32 * 30) * 512 * 2048 * 2
    per_token = parts["total"] / (32 * 30)
    weights = at.count_parameters(at.make_model(8000, 8000)) - 2 * 8000 * 512  # no embeddings
    assert 2 * weights * 0.98 < per_token < 2 * weights * 1.1  # attention adds a little


def test_the_baseline_has_the_configured_sizes():
    config = TINY.model
    baseline = benchmark.TorchTransformer(TINY.vocab, config)
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
    bench = benchmark.CONFIGS[name]
    c = bench.model
    ours = at.count_parameters(at.build_model(bench.vocab, bench.vocab, c))
    theirs = at.count_parameters(benchmark.TorchTransformer(bench.vocab, c))
    assert theirs - ours == 12 * c.N * c.d_model + 4 * c.d_model
    assert (theirs - ours) / ours < 0.005 or name == "tiny"


def test_the_baseline_masks_padding_and_the_future():
    torch.manual_seed(0)
    # training mode without dropout: the same function as eval, without nn.Transformer's
    # inference fast path (nested tensors, which warn that they are a prototype)
    baseline = benchmark.TorchTransformer(50, replace(TINY.model, dropout=0.0)).train()
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
    for name, peak in benchmark.BF16_PEAK_FLOPS.items():
        assert benchmark.bf16_peak_flops(f"NVIDIA {name}") == peak, name
    assert benchmark.bf16_peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert benchmark.bf16_peak_flops("NVIDIA H100 PCIe") == 756e12
    assert benchmark.bf16_peak_flops("NVIDIA H200") == 989e12
    assert benchmark.bf16_peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert benchmark.bf16_peak_flops("Some Future GPU") is None


def test_rounds_visit_the_rows_in_rotated_order():
    # every call of every row, in order: warm-up A B C, then rounds A B C, B C A, C A B,
    # each row's measurement a run of calls (the Timer's untimed sizing call, then its block)
    calls = []
    rows = [benchmark.Row(key, key, lambda key=key: calls.append(key), 1) for key in "ABC"]
    measured = benchmark.measure(rows, rounds=3, warmup=1, min_seconds=0.0, log=lambda _: None)
    visits = [key for i, key in enumerate(calls) if i == 0 or calls[i - 1] != key]
    assert visits == list("ABC" + "ABC" + "BCA" + "CAB")
    assert [len(m) for m in measured] == [3, 3, 3]  # one Measurement per row and round
    assert all(m.median > 0 for per_row in measured for m in per_row)


def test_ratio_of_medians_lies_within_the_per_round_range():
    # rounds are paired: if a <= r * b in every round, median(a) <= r * median(b)
    rows = {"a": {"times_s": [1.0, 4.0, 2.0, 9.0]}, "b": {"times_s": [2.0, 2.0, 8.0, 3.0]}}
    r = benchmark.ratio(rows, "a", "b")
    assert r["ratio"] == pytest.approx(3.0 / 2.5)
    assert r["paired_min"] == 0.25 and r["paired_max"] == 3.0 and r["paired_median"] == 1.25
    assert r["paired_min"] <= r["ratio"] <= r["paired_max"]


def test_bf16_rows_train_on_a_cpu():
    # the code path, not the speed: autocast bf16 on a CPU that may only emulate it
    rows = benchmark.training_rows(TINY, torch.device("cpu"), bf16=True)
    assert [row.key for row in rows][-1] == "train/ours-fused-bf16"
    for row in rows:
        row.work()
        assert row.tokens == TINY.batch * TINY.seq
        assert row.flops == benchmark.training_flops(TINY.model, TINY.vocab, 4, 6, 6)


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


def test_quick_run_writes_json_with_every_row_and_ratio(tmp_path, capsys):
    out = tmp_path / "results" / "quick.json"
    torch.set_num_threads(2)
    assert benchmark.main(["--quick", "--threads", "1", "--out", str(out)], log=print) == 0
    assert torch.get_num_threads() == 2  # main() restores the thread count it changed
    results = json.loads(out.read_text())
    assert results["schema"] == benchmark.SCHEMA
    assert {"schema", "command", "created", "settings", "hardware", "runs"} == set(results)
    hardware = results["hardware"]
    torch.set_num_threads(1)  # as during the run: the description names the thread count
    assert hardware["description"] == at.hardware_description("cpu")
    assert hardware["threads"] == 1 and hardware["torch"] == torch.__version__
    assert len(hardware["load_average_start"]) == len(hardware["load_average_end"]) == 3
    assert hardware["gpu"] is None and hardware["gpu_bf16_peak_flops"] is None
    assert results["settings"]["rounds"] == 2 and results["settings"]["decode_end_symbol"] == -1
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
    assert run["flops"]["forward"] == benchmark.forward_flops(TINY.model, 64, 4, 6, 6)
    assert run["rows"]["decode/beam-cache"]["tokens"] == 4 * 6
    labels = [label for a, b, label in benchmark.RATIOS if {a, b} <= set(run["rows"])]
    assert list(run["ratios"]) == labels and len(labels) >= 6
    for label, r in run["ratios"].items():
        a, b = (run["rows"][key]["median_s"] for key in (r["numerator"], r["denominator"]))
        assert r["ratio"] == pytest.approx(a / b)
        assert r["paired_min"] <= min(r["ratio"], r["paired_median"])
        assert max(r["ratio"], r["paired_median"]) <= r["paired_max"]
        assert label in printed
