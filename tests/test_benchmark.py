"""The benchmark suite (code/benchmark.py): its FLOP formula against PyTorch's flop counter,
its nn.Transformer baseline, the targets it checks, and a smoke run end to end. Tiny sizes
only, and no timed assertions: speed depends on the machine and is never tested."""

import json
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
    assert benchmark.bf16_peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert benchmark.bf16_peak_flops("NVIDIA H100 PCIe") == 756e12
    assert benchmark.bf16_peak_flops("NVIDIA H200") == 989e12
    assert benchmark.bf16_peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert benchmark.bf16_peak_flops("Some Future GPU") is None


def fake_results(ratios, device="cpu", threads=2):
    rows = {key: {} for a, b, _ in ratios for key in (a, b)}
    return {
        "settings": {"device": device},
        "hardware": {"threads": threads},
        "runs": {
            "base": {
                "rows": rows,
                "ratios": {
                    f"{a} / {b}": {
                        "numerator": a,
                        "denominator": b,
                        "ratio": r,
                        "paired_min": r * 0.9,
                        "paired_max": r * 1.1,
                    }
                    for a, b, r in ratios
                },
            }
        },
    }


def test_targets_are_checked_with_their_margins():
    results = fake_results(
        [
            ("train/ours-fused", "train/torch", 0.84),
            ("decode/greedy-cache", "decode/greedy-nocache", 0.20),
            ("decode/beam-cache", "decode/greedy-nocache", 0.5),
        ]
    )
    checks = {c["target"]: c for c in benchmark.targets(results)}
    train = checks["training step / nn.Transformer's, float32"]
    assert not train["reached"] and train["margin"] == pytest.approx(1.2)  # missed by 20%
    assert train["per_round"] == pytest.approx([0.756, 0.924])
    assert checks["greedy with cache / greedy without"]["reached"]
    assert checks["beam 4 with cache / greedy without"]["reached"]
    assert len(checks) == 3  # no bf16 row measured, no bf16 target reported
    assert benchmark.targets({"runs": {}}) == []  # targets are about the base configuration


def test_quick_run_writes_json_with_every_row(tmp_path):
    out = tmp_path / "results" / "quick.json"
    torch.set_num_threads(2)
    benchmark.main(["--quick", "--threads", "1", "--out", str(out)], log=lambda _: None)
    assert torch.get_num_threads() == 2  # main() restores the thread count it changed
    results = json.loads(out.read_text())
    assert {"schema", "command", "created", "settings", "hardware", "runs", "targets"} <= set(
        results
    )
    assert {"cpu", "threads", "torch", "gpu", "cpu_bf16_native", "load_average"} <= set(
        results["hardware"]
    )
    assert results["hardware"]["threads"] == 1
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
    assert expected <= set(run["rows"])
    assert ("train/ours-fused-bf16" in run["rows"]) != ("train/ours-fused-bf16" in run["skipped"])
    for row in run["rows"].values():
        assert len(row["times_s"]) == results["settings"]["rounds"] == 2
        assert row["median_s"] > 0 and row["tokens_per_s"] > 0
        assert {"method", "peak_bytes", "added_bytes"} <= set(row["memory"])
    assert run["rows"]["train/torch"]["flops"] == run["flops"]["training_step"]
    ratio = run["ratios"]["greedy: with cache / without"]
    assert ratio["numerator"] == "decode/greedy-cache"
    assert ratio["paired_min"] <= ratio["paired_median"] <= ratio["paired_max"]


def test_ladder_and_bf16_rows_run_on_a_cpu(tmp_path):
    # the GPU's ladder of speed switches, minus torch.compile (minutes to compile on a CPU):
    # the code paths, not the speed
    out = tmp_path / "ladder.json"
    argv = ["--quick", "--threads", "1", "--rounds", "1", "--ladder", "on", "--no-compile"]
    argv += ["--bf16", "on"]
    benchmark.main([*argv, "--out", str(out)], log=lambda _: None)
    run = json.loads(out.read_text())["runs"]["tiny"]
    ladder = [key for key in run["rows"] if key.startswith("ladder/")]
    assert ladder == [key for key, _, _ in benchmark.LADDER[:-1]]
    assert "train/ours-fused-bf16" in run["rows"]
    first = run["rows"][ladder[0]]
    assert first["tokens"] == run["rows"][ladder[-1]]["tokens"]  # the same corpus each row
