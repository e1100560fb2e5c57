"""Speed, measured side by side: training steps and decoding of our Transformer against
torch.nn.Transformer, in one process, with warm-up, interleaved rounds, medians and ratios.

    python code/benchmark.py --device cpu --threads 2 --config base small \\
        --out benchmarks/results/cpu.json
    python code/benchmark.py --device cuda --config base small --out benchmarks/results/cuda.json
    python code/benchmark.py --quick --out /tmp/smoke.json       # a tiny smoke run, seconds

What is timed, per configuration (base: N=6, d_model=512; small: N=2, d_model=256; both with
a vocabulary of 8000 and a batch of 32 sentences x 30 tokens on each side, no padding):

- train/*: one training step, at.train_step: forward, label-smoothed loss (fused),
  backward, Adam with the rate of Eq. (3) (at.make_optimizer). Our model on the fused and the
  reference attention path, under bf16 autocast where the hardware computes in bf16, and
  torch.nn.Transformer of the same sizes inside the same embeddings, positional encoding
  and generator (TorchTransformer below).
- decode/*: greedy decoding and beam search (beam 4, alpha 0.6) of the untrained model, with
  and without the key/value cache. An untrained model may emit </s> at once or never, so
  every sentence decodes exactly `decode_steps` (30) tokens: end_symbol is -1, which no
  token can be, and max_len is 30.
- ladder/* (CUDA; --ladder on elsewhere): the base training profile on a synthetic corpus
  with Multi30k's sentence lengths, from float32 with the reference path and fixed-length
  padding, adding one switch per row: bf16 autocast, fused attention, token-count batches,
  fused Adam, torch.compile. Each row's gain over the row above is what that switch buys.

Each measurement runs a row's work `repeat` times (enough for --min-seconds); after --warmup
calls per row, rounds visit the rows in turn, each round starting one row later
(A B C, B C A, ...), so that a change in the machine's load hits every row alike. A row's
time is the median over rounds; a ratio is reported both as the ratio of medians and as the
median of the per-round ratios. Writes every raw time to --out (JSON) and prints a table.
"""

import argparse
import ctypes
import gc
import json
import math
import os
import pathlib
import platform
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace

import torch
from torch import nn

import annotated_transformer as at
import cli

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCHEMA = 1


# ---- configurations --------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark configuration: the architecture, the vocabulary (shared by source and
    target sizes, not tied) and the batch: `batch` sentences of `seq` tokens on each side."""

    name: str
    model: at.ModelConfig
    vocab: int = 8000
    batch: int = 32
    seq: int = 30
    decode_steps: int = 30
    beam_size: int = 4
    # the ladder: a corpus of `corpus` sentence pairs, batches of at most max_tokens tokens
    corpus: int = 4096
    max_tokens: int = 8000


CONFIGS = {
    "base": BenchConfig("base", at.BASE),
    "small": BenchConfig("small", at.SMALL),
    # every code path in seconds: for --quick and the tests, not for conclusions
    "tiny": BenchConfig(
        "tiny",
        replace(at.SMALL, N=1, d_model=32, d_ff=64, h=4),
        vocab=64,
        batch=4,
        seq=6,
        decode_steps=5,
        corpus=16,
        max_tokens=64,
    ),
}

# Target lengths of the issue, checked on the base configuration (see `targets`).
TRAIN_RATIO_LIMIT = 0.70
GREEDY_CACHE_LIMIT = 0.25
BEAM_CACHE_LIMIT = 1.0
LADDER_SPEEDUP_TARGET = 5.0
MFU_TARGET = 0.40

NEVER = -1  # an end symbol no token id can equal: decoding runs its full length


# ---- FLOPs -----------------------------------------------------------------------------------


def forward_flops(config, vocab, batch, src_len, tgt_len):
    """FLOPs of one forward pass of the encoder, decoder and generator on `batch` sentence
    pairs of src_len and tgt_len tokens, by part. Matrix products only, 2*m*n*k each (one
    multiply and one add per term); softmax, LayerNorm, dropout, residual additions and the
    loss are element-wise, O(tokens * d_model), and left out, as torch's FlopCounterMode
    leaves them out. Embedding lookups are no arithmetic."""
    c = config
    d, h, N = c.d_model, c.h, c.N
    d_k, d_v = c.d_k or d // h, c.d_v or d // h
    src, tgt = batch * src_len, batch * tgt_len  # tokens through encoder and decoder

    def linear(tokens, d_in, d_out):
        return 2 * tokens * d_in * d_out

    def attention(queries, keys):
        # Q K^T and weights @ V on every head of every sentence
        return 2 * batch * h * queries * keys * (d_k + d_v)

    # W^Q, W^K, W^V and W^O of each attention module; in encoder-decoder attention the
    # queries come from the decoder, keys and values from the encoder's output (the memory)
    encoder_self = linear(src, d, h * (2 * d_k + d_v)) + linear(src, h * d_v, d)
    decoder_self = linear(tgt, d, h * (2 * d_k + d_v)) + linear(tgt, h * d_v, d)
    encoder_decoder = (
        linear(tgt, d, h * d_k) + linear(src, d, h * (d_k + d_v)) + linear(tgt, h * d_v, d)
    )
    parts = {
        "projections": N * (encoder_self + decoder_self + encoder_decoder),
        "attention": N
        * (attention(src_len, src_len) + attention(tgt_len, tgt_len) + attention(tgt_len, src_len)),
        # W_1 and W_2 of Eq. (2), in every encoder and decoder layer
        "feed_forward": N * 2 * (linear(src, d, c.d_ff) + linear(tgt, d, c.d_ff)),
        "generator": linear(tgt, d, vocab),
    }
    parts["total"] = sum(parts.values())
    return parts


def training_flops(config, vocab, batch, src_len, tgt_len):
    """FLOPs of one training step: forward, plus a backward pass that computes two products
    for each forward one (gradients of both factors), so 3x the forward's. Adam's update is
    element-wise and not counted."""
    return 3 * forward_flops(config, vocab, batch, src_len, tgt_len)["total"]


# Dense (no structured sparsity) bf16 tensor-core peaks from NVIDIA's data sheets, in FLOP/s.
# The first entry whose words all occur in the device name wins; others get no MFU.
BF16_PEAK_FLOPS = [
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM, named e.g. "NVIDIA H100 80GB HBM3"
    ("H200 NVL", 835e12),
    ("H200", 989e12),
    ("A100", 312e12),
]


def bf16_peak_flops(device_name):
    """The bf16 dense peak of a GPU from its name, or None when it is not in the table."""
    for words, peak in BF16_PEAK_FLOPS:
        if all(word.lower() in device_name.lower() for word in words.split()):
            return peak
    return None


# ---- the baseline ----------------------------------------------------------------------------


class TorchTransformer(nn.Module):
    """The baseline: torch.nn.Transformer with the sizes of a ModelConfig (post-LN, ReLU,
    batch_first), inside the same at.Embeddings, at.PositionalEncoding and at.Generator as
    our model, with the interface of at.EncoderDecoder, so at.train_step trains both alike.

    Known differences from our model: nn.MultiheadAttention has biases on its four
    projections (4 d_model per attention module), and nn.Transformer closes the encoder and
    the decoder with a LayerNorm even in post-LN (2 d_model each): 12 N d_model + 4 d_model
    more parameters. Dropout is the same: nn.Transformer also drops attention weights and
    the ReLU hidden units with the one rate it takes, which the paper does not (§5.4), so
    those are set to our attention_dropout and relu_dropout (0 by default)."""

    def __init__(self, vocab, config):
        super().__init__()
        c = config
        self.src_embed = nn.Sequential(
            at.Embeddings(c.d_model, vocab), at.PositionalEncoding(c.d_model, c.dropout, c.max_len)
        )
        self.tgt_embed = nn.Sequential(
            at.Embeddings(c.d_model, vocab), at.PositionalEncoding(c.d_model, c.dropout, c.max_len)
        )
        self.transformer = nn.Transformer(
            d_model=c.d_model,
            nhead=c.h,
            num_encoder_layers=c.N,
            num_decoder_layers=c.N,
            dim_feedforward=c.d_ff,
            dropout=c.dropout,
            activation="relu",
            batch_first=True,
            norm_first=False,
        )
        for layer in [*self.transformer.encoder.layers, *self.transformer.decoder.layers]:
            layer.self_attn.dropout = c.attention_dropout
            if hasattr(layer, "multihead_attn"):
                layer.multihead_attn.dropout = c.attention_dropout
            layer.dropout = nn.Dropout(c.relu_dropout)  # between the feed-forward's two maps
        self.generator = at.Generator(c.d_model, vocab)
        for embed in (self.src_embed, self.tgt_embed):
            nn.init.normal_(embed[0].embedding.weight, std=c.d_model**-0.5)  # as at.build_model
        nn.init.xavier_uniform_(self.generator.projection.weight)

    def forward(self, src, tgt, src_mask, tgt_mask):
        # our boolean masks are True where attending is allowed, nn.Transformer's where not
        src_padding = ~src_mask[:, 0]  # (batch, seq_src)
        tgt_padding = ~tgt_mask[:, -1]  # the last query sees every real target position
        causal = ~at.subsequent_mask(tgt.size(1))[0].to(tgt.device)
        return self.transformer(
            self.src_embed(src),
            self.tgt_embed(tgt),
            tgt_mask=causal,
            src_key_padding_mask=src_padding,
            tgt_key_padding_mask=tgt_padding,
            memory_key_padding_mask=src_padding,
            tgt_is_causal=True,
        )


# ---- hardware --------------------------------------------------------------------------------


def cpu_info():
    """(model name, set of feature flags) from /proc/cpuinfo, or what platform knows."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                if flags and name:
                    break
    except OSError:
        pass
    return name, flags


def cpu_bf16_native():
    """True when the CPU multiplies bf16 matrices natively (AVX-512 BF16 or AMX); elsewhere
    bf16 autocast converts back and forth and computes slower than float32."""
    _, flags = cpu_info()
    if flags:
        return bool(flags & {"avx512_bf16", "amx_bf16"})
    try:  # no /proc/cpuinfo: ask oneDNN, which also says yes for plain AVX-512
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def code_version():
    """The commit the code came from, "-dirty" when the working tree has changes."""
    try:
        described = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return described.stdout.strip() or None


def hardware(device):
    """What the numbers came from: CPU, threads, GPU, software versions, machine load."""
    name, _ = cpu_info()
    description = {
        "cpu": name,
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_bf16_native": cpu_bf16_native(),
        "gpu": None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "code": code_version(),
    }
    if device.type == "cuda":
        description["gpu"] = torch.cuda.get_device_name(device)
        description["gpu_bf16_peak_flops"] = bf16_peak_flops(description["gpu"])
    return description


# ---- timing and memory -----------------------------------------------------------------------


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(work, device, repeat=1):
    """Seconds per call of work(), averaged over `repeat` calls, the device drained."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeat):
        work()
    synchronize(device)
    return (time.perf_counter() - start) / repeat


def _status_kib(field_name):
    with open("/proc/self/status") as file:
        for line in file:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise KeyError(field_name)


def _reset_peak_rss():
    """Hand freed heap back to the system and reset the kernel's peak-RSS mark (VmHWM);
    False where that is not possible (not Linux, or /proc/self/clear_refs not writable)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as file:
            file.write("5")
        return True
    except OSError:
        return False


def peak_memory(work, device):
    """Memory of one call of work(). CUDA: the allocator's peak (max_memory_allocated) and
    how far it rose above what was allocated before. CPU: the process's peak resident set
    size (VmHWM, reset just before the call) and its rise above the resident size before,
    i.e. what the call itself added: activations, gradients, temporaries (the weights and
    Adam's moments already exist). Where the peak cannot be reset, only the process's
    lifetime peak (ru_maxrss) is known, and no rise is reported."""
    gc.collect()
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        work()
        synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        return {
            "method": "torch.cuda.max_memory_allocated",
            "peak_bytes": peak,
            "added_bytes": peak - before,
        }
    if sys.platform == "linux" and _reset_peak_rss():
        before = _status_kib("VmRSS")
        work()
        peak = _status_kib("VmHWM")
        return {
            "method": "VmHWM (peak RSS, reset before the call)",
            "peak_bytes": peak * 1024,
            "added_bytes": (peak - before) * 1024,
        }
    work()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    scale = 1 if sys.platform == "darwin" else 1024
    return {
        "method": "ru_maxrss (lifetime peak of the process)",
        "peak_bytes": peak * scale,
        "added_bytes": None,
    }


@dataclass
class Row:
    """One way of doing a unit of work, and its measurements."""

    key: str  # group/name, e.g. "train/ours-fused"
    label: str
    work: object  # a function of no arguments: one unit of work
    tokens: int  # target tokens per unit (decoding: tokens produced)
    flops: float | None = None  # model FLOPs per unit (training rows)
    repeat: int = 1
    times: list = field(default_factory=list)
    memory: dict | None = None


def measure(rows, device, rounds, warmup, min_seconds, log=print):
    """Warm every row up, then time `rounds` interleaved rounds; measure memory last."""
    for row in rows:
        first = min(timed(row.work, device) for _ in range(max(warmup, 1)))
        # enough calls per measurement that timer resolution and launch jitter do not matter
        row.repeat = max(1, math.ceil(min_seconds / max(first, 1e-9)))
        log(f"  warmed up {row.key}: {first * 1e3:.1f} ms per call, {row.repeat} per measurement")
    for r in range(rounds):
        for i in range(len(rows)):
            row = rows[(r + i) % len(rows)]  # each round starts one row later
            row.times.append(timed(row.work, device, row.repeat))
        log(f"  round {r + 1}/{rounds}: " + ", ".join(f"{x.times[-1]:.3f}" for x in rows))
    for row in rows:
        row.memory = peak_memory(row.work, device)


def summarize(row, peak_flops=None):
    """The JSON record of a measured row."""
    median = statistics.median(row.times)
    record = {
        "label": row.label,
        "times_s": row.times,
        "median_s": median,
        "repeat": row.repeat,
        "tokens": row.tokens,
        "tokens_per_s": row.tokens / median,
        "memory": row.memory,
        "flops": row.flops,
        "flops_per_s": row.flops / median if row.flops else None,
        "mfu": None,
    }
    if row.flops and peak_flops:
        record["mfu"] = row.flops / median / peak_flops
    return record


def ratio(rows, numerator, denominator):
    """Time of row `numerator` over time of row `denominator`: ratio of the medians, and the
    median and range of the per-round ratios (rounds are paired: same machine state)."""
    a, b = rows[numerator]["times_s"], rows[denominator]["times_s"]
    paired = [x / y for x, y in zip(a, b)]
    return {
        "numerator": numerator,
        "denominator": denominator,
        "ratio": statistics.median(a) / statistics.median(b),
        "paired_median": statistics.median(paired),
        "paired_min": min(paired),
        "paired_max": max(paired),
    }


RATIOS = [
    ("train/ours-fused", "train/torch", "training step: ours (fused) / nn.Transformer"),
    ("train/ours-reference", "train/torch", "training step: ours (reference) / nn.Transformer"),
    ("train/ours-fused-bf16", "train/torch", "training step: ours (fused, bf16) / nn.Transformer"),
    ("train/ours-fused", "train/ours-reference", "training step: fused / reference attention"),
    ("decode/greedy-cache", "decode/greedy-nocache", "greedy: with cache / without"),
    ("decode/beam-cache", "decode/beam-nocache", "beam 4: with cache / without"),
    ("decode/beam-cache", "decode/greedy-nocache", "beam 4 with cache / greedy without"),
]


# ---- the rows --------------------------------------------------------------------------------


def fixed_batch(pairs, src_len, tgt_len, device):
    """A Batch of (source ids, target ids) pairs padded to fixed lengths: src_len source
    tokens and tgt_len decoder inputs (targets carry <s> ... </s>)."""

    def padded(ids, length):
        return ids + [at.PAD_ID] * (length - len(ids))

    fixed = [(padded(s, src_len), padded(t, tgt_len + 1)) for s, t in pairs]
    return at.Batch.from_ids(fixed).to(device)


def random_pairs(n, vocab, src_len, tgt_len, generator):
    """n pairs of random ids (4..vocab-1) shaped like encode_pairs' output: source ending in
    </s> and target <s> ... </s>, src_len source tokens and tgt_len decoder inputs."""
    src = torch.randint(4, vocab, (n, src_len - 1), generator=generator).tolist()
    tgt = torch.randint(4, vocab, (n, tgt_len - 1), generator=generator).tolist()
    return [(s + [at.EOS_ID], [at.BOS_ID] + t + [at.EOS_ID]) for s, t in zip(src, tgt)]


def one_update(model, batch, optimizer, scheduler, amp):
    """One training step through the module's train_step, label smoothing 0.1 (§5.4)."""
    scaler = torch.amp.GradScaler(batch.src.device.type, enabled=False)
    dtype = at.autocast_dtype(amp, batch.src.device)
    at.train_step(model, batch, optimizer, scheduler, scaler, 0.1, amp=dtype)


def training_rows(bench, device, bf16):
    """Rows that time one training step of each model on the same fixed batch."""
    generator = torch.Generator().manual_seed(0)
    pairs = random_pairs(bench.batch, bench.vocab, bench.seq, bench.seq, generator)
    batch = fixed_batch(pairs, bench.seq, bench.seq, device)
    flops = training_flops(bench.model, bench.vocab, bench.batch, bench.seq, bench.seq)

    def step_row(key, label, model, amp=None):
        model.to(device).train()
        optimizer, scheduler = at.make_optimizer(model, bench.model.d_model)

        def work():
            one_update(model, batch, optimizer, scheduler, amp)

        return Row(key, label, work, batch.ntokens, flops)

    def ours(fused):
        torch.manual_seed(0)  # the same initial weights for every copy of our model
        return at.build_model(bench.vocab, bench.vocab, replace(bench.model, fused=fused))

    torch.manual_seed(0)
    rows = [
        step_row("train/ours-fused", "ours, fused attention, float32", ours(True)),
        step_row(
            "train/ours-reference",
            "ours, reference attention, float32",
            at.use_fused_attention(ours(True), False),
        ),
        step_row(
            "train/torch",
            "torch.nn.Transformer, float32",
            TorchTransformer(bench.vocab, bench.model),
        ),
    ]
    if bf16:
        rows.append(
            step_row(
                "train/ours-fused-bf16", "ours, fused attention, bf16 autocast", ours(True), "bf16"
            )
        )
    return rows


def decoding_rows(bench, device):
    """Rows that decode the same batch of sources for exactly bench.decode_steps tokens."""
    torch.manual_seed(0)
    model = at.build_model(bench.vocab, bench.vocab, bench.model).to(device).eval()
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(4, bench.vocab, (bench.batch, bench.seq), generator=generator).to(device)
    src_mask = at.padding_mask(src, at.PAD_ID)
    steps = bench.decode_steps

    def decoder(search, cache, **options):
        def work():
            with torch.no_grad():
                out = search(
                    model, src, src_mask, max_len=steps, end_symbol=NEVER, cache=cache, **options
                )
            if out.shape != (bench.batch, 1 + steps):  # the fixed length the timing assumes
                raise RuntimeError(f"expected {steps} decoded tokens, got shape {out.shape}")

        return work

    tokens = bench.batch * steps
    beam = {"beam_size": bench.beam_size, "alpha": 0.6}
    return [
        Row("decode/greedy-nocache", "greedy, no cache", decoder(at.greedy_decode, False), tokens),
        Row(
            "decode/greedy-cache",
            "greedy, key/value cache",
            decoder(at.greedy_decode, True),
            tokens,
        ),
        Row(
            "decode/beam-nocache",
            f"beam {bench.beam_size}, no cache",
            decoder(at.beam_search, False, **beam),
            tokens,
        ),
        Row(
            "decode/beam-cache",
            f"beam {bench.beam_size}, key/value cache",
            decoder(at.beam_search, True, **beam),
            tokens,
        ),
    ]


# Sentence lengths of Multi30k's training set in our 8000-token BPE (measured once: source
# mean 15.8, sd 5.5, 4..53 tokens with </s>; target 15.3, sd 4.8, 5..49 with </s>)
MULTI30K_LENGTHS = {"src": (15.8, 5.5, 4, 53), "tgt": (15.3, 4.8, 5, 49)}


def synthetic_corpus(n, vocab, seed=0):
    """n pairs of random ids with lengths drawn like Multi30k's (MULTI30K_LENGTHS)."""
    generator = torch.Generator().manual_seed(seed)

    def lengths(side):
        mean, sd, low, high = MULTI30K_LENGTHS[side]
        drawn = torch.randn(n, generator=generator) * sd + mean
        return drawn.round().clamp(low, high).long().tolist()

    pairs = []
    for s, t in zip(lengths("src"), lengths("tgt")):
        src = torch.randint(4, vocab, (s - 1,), generator=generator).tolist() + [at.EOS_ID]
        tgt = torch.randint(4, vocab, (t - 1,), generator=generator).tolist()
        pairs.append((src, [at.BOS_ID] + tgt + [at.EOS_ID]))
    return pairs


LADDER = [
    # each row adds one switch to the row above it
    ("ladder/fp32-reference-padded", "float32, reference attention, fixed-length padding", {}),
    ("ladder/bf16", "+ bf16 autocast", {"amp": "bf16"}),
    ("ladder/fused-attention", "+ fused attention", {"fused": True}),
    ("ladder/token-batches", "+ token-count batches", {"token_batches": True}),
    ("ladder/fused-adam", "+ fused Adam", {"fused_adam": True}),
    ("ladder/compile", "+ torch.compile", {"compile": True}),
]


def ladder_rows(bench, device, compile=True):
    """Rows that each train one pass over the same synthetic corpus with the base training
    profile's model (shared embeddings) and one more speed switch than the row above.
    Fixed-length padding pads every sentence to the corpus's longest and fills batches with
    max_tokens padded cells; token-count batches (at.batch_by_tokens) pad only to the
    longest sentence of their batch. FLOPs count real tokens only, sentence by sentence,
    so padding is work that earns no FLOPs."""
    config = replace(bench.model, share_embeddings=True)
    pairs = synthetic_corpus(bench.corpus, bench.vocab)
    lengths = [(len(s), len(t) - 1) for s, t in pairs]  # decoder input excludes </s>
    src_len, tgt_len = max(s for s, _ in lengths), max(t for _, t in lengths)
    per_batch = max(1, bench.max_tokens // max(src_len, tgt_len))
    padded = [
        fixed_batch(pairs[i : i + per_batch], src_len, tgt_len, device)
        for i in range(0, len(pairs), per_batch)
    ]
    by_tokens = [
        at.Batch.from_ids([pairs[i] for i in indices]).to(device)
        for indices in at.batch_by_tokens(lengths, bench.max_tokens, shuffle=False)
    ]
    tokens = sum(t for _, t in lengths)
    flops = sum(training_flops(config, bench.vocab, 1, s, t) for s, t in lengths)
    rows, switches = [], {}
    for key, label, switch in LADDER:
        switches = {**switches, **switch}
        if switches.get("compile") and not compile:
            continue
        torch.manual_seed(0)
        model = at.build_model(
            bench.vocab, bench.vocab, replace(config, fused=switches.get("fused", False))
        )
        model.to(device).train()
        if switches.get("fused_adam"):
            optimizer = torch.optim.Adam(
                model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9, fused=True
            )
            scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer, lambda k: at.rate(k + 1, config.d_model)
            )
        else:
            optimizer, scheduler = at.make_optimizer(model, config.d_model)
        runner = torch.compile(model) if switches.get("compile") else model
        batches = by_tokens if switches.get("token_batches") else padded
        amp = switches.get("amp")

        def work(runner=runner, batches=batches, optimizer=optimizer, scheduler=scheduler, amp=amp):
            for batch in batches:
                one_update(runner, batch, optimizer, scheduler, amp)

        rows.append(Row(key, label, work, tokens, flops))
    return rows


# ---- one configuration, targets, the table ---------------------------------------------------


def run_config(bench, device, args, log=print):
    """Build, warm up, time and summarise every row of one configuration."""
    bf16 = args.bf16 == "on" or (
        args.bf16 == "auto" and (device.type == "cuda" or cpu_bf16_native())
    )
    ladder = args.ladder == "on" or (args.ladder == "auto" and device.type == "cuda")
    skipped = {}
    if not bf16:
        skipped["train/ours-fused-bf16"] = (
            "--bf16 off"
            if args.bf16 == "off"
            else f"this CPU ({cpu_info()[0]}, {torch.backends.cpu.get_cpu_capability()}) has no "
            f"native bf16 matrix unit (AVX-512 BF16 or AMX); autocast would only emulate it"
        )
    peak = bf16_peak_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    # built one group at a time, so that only one group's models hold memory
    groups = {
        "train": lambda: training_rows(bench, device, bf16),
        "decode": lambda: decoding_rows(bench, device),
    }
    if ladder:
        groups["ladder"] = lambda: ladder_rows(bench, device, compile=not args.no_compile)
    rows = {}
    for name, build in groups.items():
        group = build()
        log(f"{bench.name}: timing {name} ({len(group)} rows, {args.rounds} rounds)")
        measure(group, device, args.rounds, args.warmup, args.min_seconds, log)
        rows.update({row.key: summarize(row, peak) for row in group})
        del group
        gc.collect()
    ratios = {label: ratio(rows, a, b) for a, b, label in RATIOS if a in rows and b in rows}
    if ladder:
        first, last = LADDER[0][0], [key for key in rows if key.startswith("ladder/")][-1]
        ratios["ladder: all switches / fp32 reference padded (time per pass)"] = ratio(
            rows, last, first
        )
    return {
        "config": {**asdict(bench), "model": asdict(bench.model)},
        "flops": {
            "forward": forward_flops(bench.model, bench.vocab, bench.batch, bench.seq, bench.seq),
            "training_step": training_flops(
                bench.model, bench.vocab, bench.batch, bench.seq, bench.seq
            ),
        },
        "rows": rows,
        "ratios": ratios,
        "skipped": skipped,
    }


def _check(target, where, measured, limit, at_least=False, per_round=None):
    """One target as a record. margin below 1 means reached: 0.9 has 10% to spare, 1.2
    missed by 20% (measured / limit for "at most" targets, limit / measured for "at least").
    per_round: the lowest and highest per-round ratio; when the limit lies between them,
    the verdict could change from one run to the next."""
    return {
        "target": target,
        "where": where,
        "measured": measured,
        "limit": limit,
        "kind": "at least" if at_least else "at most",
        "reached": measured >= limit if at_least else measured <= limit,
        "margin": limit / measured if at_least else measured / limit,
        "per_round": per_round,
    }


def targets(results):
    """The issue's targets checked on one run's results (the JSON dict), on its base
    configuration: a list of _check records, only for the rows that were measured."""
    base = results.get("runs", {}).get("base")
    if base is None:
        return []
    ratios = {(r["numerator"], r["denominator"]): r for r in base["ratios"].values()}
    device = results["settings"]["device"]
    threads = results["hardware"]["threads"]
    where = f"{device}, base, {threads} thread{'s' if threads != 1 else ''}"
    wanted = [
        (
            "greedy with cache / greedy without",
            "decode/greedy-cache",
            "decode/greedy-nocache",
            GREEDY_CACHE_LIMIT,
        ),
        (
            "beam 4 with cache / greedy without",
            "decode/beam-cache",
            "decode/greedy-nocache",
            BEAM_CACHE_LIMIT,
        ),
    ]
    if device == "cpu":
        wanted[:0] = [
            (
                "training step / nn.Transformer's, float32",
                "train/ours-fused",
                "train/torch",
                TRAIN_RATIO_LIMIT,
            ),
            (
                "training step / nn.Transformer's, bf16 autocast",
                "train/ours-fused-bf16",
                "train/torch",
                TRAIN_RATIO_LIMIT,
            ),
        ]
    checks = [
        _check(
            target,
            where,
            ratios[a, b]["ratio"],
            limit,
            per_round=[ratios[a, b]["paired_min"], ratios[a, b]["paired_max"]],
        )
        for target, a, b, limit in wanted
        if (a, b) in ratios
    ]
    ladder = [row for key, row in base["rows"].items() if key.startswith("ladder/")]
    if ladder:
        speedup = ladder[-1]["tokens_per_s"] / ladder[0]["tokens_per_s"]
        checks.append(
            _check(
                "training throughput, all switches / fp32 reference padded",
                where,
                speedup,
                LADDER_SPEEDUP_TARGET,
                at_least=True,
            )
        )
        if ladder[-1]["mfu"] is not None:
            checks.append(
                _check(
                    "MFU with all switches (of the bf16 dense peak)",
                    where,
                    ladder[-1]["mfu"],
                    MFU_TARGET,
                    at_least=True,
                )
            )
    return checks


def table(results):
    """The rows of every configuration as lines of text, rounded for reading."""
    lines = []
    for name, run in results["runs"].items():
        lines.append(f"{name}: {run['flops']['training_step'] / 1e9:,.1f} GFLOP per training step")
        lines.append(
            f"  {'row':<32} {'median':>10} {'tokens/s':>10} {'GFLOP/s':>8} {'MFU':>6} "
            f"{'+memory':>9}"
        )
        for key, row in run["rows"].items():
            memory = row["memory"] and row["memory"]["added_bytes"]
            lines.append(
                f"  {key:<32} {row['median_s'] * 1e3:>8.1f}ms {row['tokens_per_s']:>10,.0f} "
                + (f"{row['flops_per_s'] / 1e9:>8,.1f} " if row["flops_per_s"] else f"{'':>9}")
                + (f"{row['mfu']:>6.1%} " if row["mfu"] is not None else f"{'':>7}")
                + (f"{memory / 2**20:>6,.0f}MiB" if memory is not None else "")
            )
        for label, r in run["ratios"].items():
            lines.append(
                f"  {label:<58} {r['ratio']:6.3f}  (per round {r['paired_min']:.3f}.."
                f"{r['paired_max']:.3f})"
            )
        for key, reason in run["skipped"].items():
            lines.append(f"  skipped {key}: {reason}")
    for check in results["targets"]:
        verdict = "reached" if check["reached"] else "missed"
        lines.append(
            f"target {check['target']} {check['kind']} {check['limit']}: "
            f"{check['measured']:.3f}, {verdict}"
        )
    return lines


# ---- the command line ------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    cli.add_device_flag(parser)
    parser.add_argument(
        "--threads", type=cli.positive_int, help="torch CPU threads (default: torch's)"
    )
    parser.add_argument(
        "--config", nargs="+", choices=sorted(CONFIGS), default=["base"], help="configurations"
    )
    parser.add_argument(
        "--rounds", type=cli.positive_int, help="interleaved rounds per row (default 7)"
    )
    parser.add_argument(
        "--warmup", type=int, help="untimed calls per row before the rounds (default 2, at least 1)"
    )
    parser.add_argument(
        "--min-seconds",
        type=cli.non_negative_float,
        default=0.2,
        help="repeat a row's work within one measurement until it lasts this long",
    )
    parser.add_argument(
        "--bf16",
        choices=["auto", "on", "off"],
        default="auto",
        help="the bf16 autocast row: auto = on GPUs and CPUs with native bf16 matrix units",
    )
    parser.add_argument(
        "--ladder",
        choices=["auto", "on", "off"],
        default="auto",
        help="the ladder of training speed switches: auto = on CUDA only",
    )
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: the tiny configuration; 2 rounds, 1 warm-up unless given; no minimum time",
    )
    parser.add_argument("--out", type=pathlib.Path, help="write the results here (JSON)")
    args = parser.parse_args(argv)
    if args.quick:
        args.config, args.min_seconds = ["tiny"], 0.0
    args.rounds = args.rounds or (2 if args.quick else 7)
    args.warmup = (1 if args.quick else 2) if args.warmup is None else args.warmup
    if args.rounds < 1 or args.warmup < 0:
        parser.error("--rounds must be at least 1 and --warmup at least 0")
    return args


@cli.user_errors_exit_2("benchmark.py")
def main(argv=None, log=None):
    args = parse_args(argv)
    log = log or (lambda message: print(message, file=sys.stderr, flush=True))
    device = torch.device(args.device)
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return run(args, argv, device, log)
    finally:
        torch.set_num_threads(threads)  # main() may be called in-process (the tests do)


def run(args, argv, device, log):
    """Measure every configuration of `args`, print the table, write the JSON."""
    results = {
        "schema": SCHEMA,
        "command": "python code/benchmark.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": {
            "device": device.type,
            "rounds": args.rounds,
            "warmup": args.warmup,
            "min_seconds": args.min_seconds,
            "decode_end_symbol": NEVER,
            "tf32": torch.backends.cuda.matmul.allow_tf32,
        },
        "hardware": hardware(device),
        "runs": {},
    }
    for name in args.config:
        results["runs"][name] = run_config(CONFIGS[name], device, args, log)
    results["hardware"]["load_average_end"] = (
        list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    )
    results["targets"] = targets(results)
    hw = results["hardware"]
    print(f"{hw['gpu'] or hw['cpu']}, {hw['threads']} threads, torch {hw['torch']}")
    print("\n".join(table(results)))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
        print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
