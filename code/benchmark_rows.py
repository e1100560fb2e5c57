"""What the benchmark (code/benchmark.py) times, and how: the configurations (CONFIGS), each
row's unit of work (a training step of our model and of torch.nn.Transformer's twin, on
random ids or a profile's real batches; decoding with and without the key/value cache), the
interleaved rounds that time them, and the ratios and throughputs compared side by side."""

import statistics
from collections import namedtuple
from dataclasses import KW_ONLY, dataclass, replace

import torch
from torch.utils.benchmark import Timer

import annotated_transformer as at
import cuda_graphs as graphs
import fast_decoding as fd
import profiles
import script_helpers as helpers
import timing
import training_runs as training
from flops import real_token_flops, training_flops
from stand_in import stand_in_pairs
from step import train_step_amp
from torch_transformer import TorchTransformer

NEVER = -1  # an end symbol no token id can equal: decoding runs its full length
# work() does a row's unit of work once: `tokens` target tokens (decoding: tokens produced),
# in `updates` training steps (None: decoding)
Row = namedtuple("Row", "key label work tokens flops updates", defaults=[None, None])


@dataclass(frozen=True)
class BenchConfig:
    """One configuration: the architecture, the vocabulary (source and target, not tied), and
    `batch` sentence pairs of `seq` tokens on each side (decoding: `seq` tokens produced)."""

    name: str
    model: at.ModelConfig
    _: KW_ONLY  # the rest by name
    vocab: int = 8000
    batch: int = 32
    seq: int = 30


@dataclass(frozen=True)
class ProfileBench:
    """A training profile's model with its recipe (profiles.PROFILES[profile]) at its real batch:
    `batches` batches of at.batch_by_tokens(lengths, max_tokens, seed) over the profile's
    training pairs, which `corpus` names: "multi30k" (Multi30k's training split, read by
    helpers.load_multi30k) or "stand-in" (a few made-up pairs, for smoke runs only)."""

    name: str
    profile: str
    corpus: str
    _: KW_ONLY  # the rest by name
    batches: int = 4


CONFIGS = {
    "base": BenchConfig("base", at.BASE),
    "small": BenchConfig("small", at.SMALL),
    # the base model at a training-sized batch: 250 pairs of 32 tokens, 8000 target tokens
    "base-8k": BenchConfig("base-8k", at.BASE, batch=250, seq=32),
    # and at the paper's batch (§5.1: about 25000 target tokens): 780 pairs of 32 tokens
    "base-25k": BenchConfig("base-25k", at.BASE, batch=780, seq=32),
    "multi30k": ProfileBench("multi30k", "multi30k", "multi30k"),
    # every code path in seconds: for --quick and the tests, not for conclusions
    "tiny": BenchConfig(
        "tiny",
        replace(profiles.PROFILES["tiny"].model, share_embeddings=False),
        vocab=64,
        batch=4,
        seq=6,
    ),
    "tiny-profile": ProfileBench("tiny-profile", "tiny", "stand-in", batches=2),
}
QUICK = ["tiny", "tiny-profile"]


def random_ids(bench, seed=0):
    """bench.batch pairs of random ids shaped like at.encode_pairs' output, no padding: a
    source of bench.seq tokens ending in </s>, a target <s> ... </s> of bench.seq + 1."""
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(4, bench.vocab, (bench.batch, bench.seq), generator=generator)
    tgt = torch.randint(4, bench.vocab, (bench.batch, bench.seq + 1), generator=generator)
    src[:, -1], tgt[:, 0], tgt[:, -1] = at.EOS_ID, at.BOS_ID, at.EOS_ID
    return src, tgt


def random_batch(bench, device, seed=0):
    """random_ids as a Batch on `device`."""
    src, tgt = (ids.to(device) for ids in random_ids(bench, seed))
    return at.Batch.from_tensors(src, tgt, bench.batch * bench.seq)


def bench_flops(bench):
    """Training FLOPs of one step on a BenchConfig's batch."""
    return training_flops(
        bench.model, bench.vocab, bench.batch, src_len=bench.seq, tgt_len=bench.seq
    )


def training_rows(bench, device, bf16, *, compile=False, mode=None):
    """Rows that run one training step of each model on the same batch, label smoothing 0.1;
    on a GPU also the step as one CUDA graph and, with `compile`, both with our model
    compiled by torch.compile (inductor: fused elementwise kernels) in this `mode` (None:
    torch.compile's default)."""
    batch = random_batch(bench, device)
    flops = bench_flops(bench)

    def ours(fused):
        torch.manual_seed(0)  # the same initial weights for every copy of our model
        return at.build_model(bench.vocab, bench.vocab, replace(bench.model, fused=fused))

    def row(key, label, model, autocast=None):
        model.to(device).train()
        optimizer, scheduler = at.make_optimizer(model, bench.model.d_model)
        scaler = torch.amp.GradScaler(device.type, enabled=False)  # bf16 needs no scaling

        def work():
            train_step_amp(
                model,
                batch,
                optimizer,
                scheduler=scheduler,
                scaler=scaler,
                smoothing=0.1,
                autocast=autocast,
            )

        return Row(key, label, work, batch.ntokens, flops, 1)

    torch.manual_seed(0)
    theirs = TorchTransformer(bench.vocab, bench.model)
    rows = [
        row("train/ours-fused", "ours, fused attention, float32", ours(True)),
        row("train/ours-reference", "ours, reference attention, float32", ours(False)),
        row("train/torch", "torch.nn.Transformer, float32", theirs),
    ]
    if bf16:
        label = "ours, fused attention, bf16 autocast"
        rows.append(row("train/ours-fused-bf16", label, ours(True), torch.bfloat16))
    if device.type != "cuda":
        return rows
    autocast = torch.bfloat16 if bf16 else None
    rows.append(graphed_row(bench, ours(True), device, autocast=autocast))
    if compile:
        key, precision = ("compiled-bf16", "bf16 autocast") if autocast else ("compiled", "float32")
        label = f"ours compiled, fused attention, {precision}"
        rows.append(row(f"train/ours-{key}", label, torch.compile(ours(True), mode=mode), autocast))
        rows.append(
            graphed_row(bench, torch.compile(ours(True), mode=mode), device, autocast=autocast)
        )
    return rows


def graphed_row(bench, model, device, *, autocast=None, eager_steps=3):
    """The same step replayed as one CUDA graph (graphs.GraphedTrainStep, the CUDA graphs page):
    capturable fused AdamW, the learning rate on the device. Its warm-up steps and the
    capture happen here, before any timing; on a CPU the step runs eagerly."""
    src, tgt = (ids.to(device) for ids in random_ids(bench))  # random_batch's, kept whole
    ntokens = bench.batch * bench.seq
    model.to(device).train()
    # max_steps: a table for the warm-up and some replays; later ones keep its last rate
    d_model = bench.model.d_model
    optimizer, schedule = graphs.make_capturable_optimizer(model, d_model, max_steps=100)
    runner = graphs.GraphedTrainStep(
        model, optimizer, schedule, smoothing=0.1, autocast=autocast, eager_steps=eager_steps
    )
    for _ in range(eager_steps + 1):  # the eager warm-up, then the capture
        runner(src, tgt, ntokens)

    def work():
        runner(src, tgt, ntokens)

    compiled = "-compiled" if hasattr(model, "_orig_mod") else ""  # a torch.compile wrapper
    key, precision = ("graphed-bf16", "bf16 autocast") if autocast else ("graphed", "float32")
    label = f"ours{compiled.replace('-', ' ')}, fused attention, {precision}, one CUDA graph"
    return Row(f"train/ours{compiled}-{key}", label, work, ntokens, bench_flops(bench), 1)


def profile_pairs(bench, *, data_dir=None):
    """The training pairs of a ProfileBench: Multi30k's training split (from `data_dir`, as
    helpers.load_multi30k reads it), or the stand-in."""
    if bench.corpus == "multi30k":
        return helpers.load_multi30k("train", data_dir=data_dir)
    if bench.corpus == "stand-in":
        return stand_in_pairs()
    raise at.InputError(f"corpus must be 'multi30k' or 'stand-in', got {bench.corpus!r}")


def spread_batches(lengths, max_tokens, count, *, seed=0):
    """`count` of the batches that at.batch_by_tokens(lengths, max_tokens, seed) cuts for an
    epoch, spread over its lengths: of those batches ordered from the shortest sentences to
    the longest, the middle one of each of `count` equal slices, so that together they stand
    for the epoch's mix of lengths (padding and attention grow with a batch's longest)."""
    # unshuffled: the same batches (the cuts come before the shuffle), in order of length
    batches = at.batch_by_tokens(lengths, max_tokens, seed, shuffle=False)
    if not 0 < count <= len(batches):
        raise at.InputError(
            f"count must be in 1..{len(batches)} (the epoch's batches), got {count}"
        )
    return [batches[(2 * i + 1) * len(batches) // (2 * count)] for i in range(count)]


@dataclass
class ProfileData:
    """What a ProfileBench's rows train on: the profile, its tokenizer, the encoded pairs,
    the chosen batches (lists of pair indices) and a description of them for the JSON."""

    config: at.TrainConfig
    tokenizer: at.Tokenizer
    corpus: at.EncodedCorpus
    _: KW_ONLY  # the rest by name
    chosen: list
    record: dict

    def step_flops(self):
        """Training FLOPs of each chosen batch, for its real tokens."""
        vocab, lengths = self.tokenizer.get_vocab_size(), self.corpus.lengths
        return [real_token_flops(self.config.model, vocab, lengths, indices=i) for i in self.chosen]


def profile_data(bench, cache=None, *, data_dir=None):
    """Read and encode a ProfileBench's pairs with a BPE vocabulary of the profile's size
    (learned once, then read from `cache`/<digest of the pairs>/), and choose its batches."""
    config = profiles.PROFILES[bench.profile]
    pairs = profile_pairs(bench, data_dir=data_dir)
    tokenizer = helpers.cached_tokenizer(pairs, config.vocab_size, cache)
    corpus = at.EncodedCorpus.from_pairs(pairs, tokenizer)
    chosen = spread_batches(corpus.lengths, config.max_tokens, bench.batches, seed=config.seed)
    epoch = len(at.batch_by_tokens(corpus.lengths, config.max_tokens, config.seed))

    def describe(indices):
        lengths = [corpus.lengths[i] for i in indices]
        return {
            "sentences": len(indices),
            "source_length": max(s for s, _ in lengths),  # padded to this, </s> included
            "target_length": max(t for _, t in lengths) - 1,  # the decoder's input
            "source_tokens": sum(s for s, _ in lengths),
            "target_tokens": corpus.target_tokens(indices),
        }

    record = {
        "corpus": "Multi30k train" if bench.corpus == "multi30k" else bench.corpus,
        "pairs": len(pairs),
        "sha256": helpers.pairs_digest(pairs),
        "vocab": tokenizer.get_vocab_size(),
        "max_tokens": config.max_tokens,
        "epoch_batches": epoch,
        "batches": [describe(indices) for indices in chosen],
    }
    return ProfileData(config, tokenizer, corpus, chosen=chosen, record=record)


def profile_rows(data, device, bf16):
    """Rows that train the profile's model, ours and nn.Transformer's twin, from the same
    seed with the profile's optimizer and label smoothing: each call one train_step_amp on
    each chosen batch, in order; in float32, and with `bf16` both again in bf16 autocast."""
    config = data.config
    model = replace(config.model, fused=True)  # training's path (the profiles' default)
    vocab = data.tokenizer.get_vocab_size()
    corpus = training.corpus_on(data.corpus, device)
    batches = [corpus.batch(indices) for indices in data.chosen]
    # counted on the host from the lengths, whatever the batches keep on their device
    tokens = sum(data.corpus.target_tokens(indices) for indices in data.chosen)
    flops = sum(data.step_flops())

    def row(key, label, build, autocast=None):
        torch.manual_seed(config.seed)
        network = build().to(device).train()
        optimizer, scheduler = at.make_optimizer(
            network,
            model.d_model,
            config.lr_factor,
            warmup_steps=config.warmup_steps,
            weight_decay=config.weight_decay,
        )
        scaler = torch.amp.GradScaler(device.type, enabled=False)  # bf16 needs no scaling

        def work():
            for batch in batches:
                train_step_amp(
                    network,
                    batch,
                    optimizer,
                    scheduler=scheduler,
                    scaler=scaler,
                    smoothing=config.smoothing,
                    autocast=autocast,
                )

        return Row(key, label, work, tokens, flops, len(batches))

    def ours():
        return at.build_model(vocab, vocab, model)

    def theirs():
        return TorchTransformer(vocab, model)

    rows = [
        row("train/ours-fused", "ours, fused attention, float32", ours),
        row("train/torch", "torch.nn.Transformer, float32", theirs),
    ]
    if bf16:
        bf = torch.bfloat16
        rows.append(row("train/ours-fused-bf16", "ours, fused attention, bf16 autocast", ours, bf))
        rows.append(row("train/torch-bf16", "torch.nn.Transformer, bf16 autocast", theirs, bf))
    return rows


def decoding_rows(bench, device):
    """Rows that decode the same sources for exactly bench.seq tokens each."""
    torch.manual_seed(0)
    model = at.build_model(bench.vocab, bench.vocab, bench.model).to(device).eval()
    batch = random_batch(bench, device, seed=1)
    steps, beam = bench.seq, {"beam_size": 4, "alpha": 0.6}

    def row(key, label, search, cache, **options):
        options.update(max_len=steps, end_symbol=NEVER, cache=cache)

        def work():
            with torch.no_grad():
                out = search(model, batch.src, batch.src_mask, **options)
            if out.shape != (bench.batch, 1 + steps):  # the fixed length the timing assumes
                raise RuntimeError(f"expected {steps} decoded tokens, got shape {out.shape}")

        return Row(key, label, work, bench.batch * steps)

    return [
        row("decode/greedy-nocache", "greedy, no cache", fd.fast_greedy_decode, False),
        row("decode/greedy-cache", "greedy, key/value cache", fd.fast_greedy_decode, True),
        row("decode/beam-nocache", "beam 4, no cache", fd.fast_beam_search, False, **beam),
        row("decode/beam-cache", "beam 4, key/value cache", fd.fast_beam_search, True, **beam),
    ]


def measure(rows, rounds, warmup, *, min_seconds, title="", log=print):
    """Warm every row up (`warmup` calls), then time `rounds` interleaved rounds, each one
    starting one row later. Returns, per row, its Measurements, one per round."""
    log(f"{title}: {len(rows)} rows, {warmup} warm-up calls each, {rounds} rounds")
    threads = torch.get_num_threads()
    timers = [
        Timer("work()", globals={"work": row.work}, label=title, num_threads=threads,
              sub_label=f"{row.key}: {row.label}", description="median")
        for row in rows
    ]  # fmt: skip
    for row in rows * warmup:  # A B C A B C ...
        row.work()

    def progress(r, found):
        medians = ", ".join(f"{found[j][-1].median:.4f}" for j in range(len(rows)))
        log(f"  round {r + 1}/{rounds}: {medians}")

    found = timing.interleaved_rounds(
        dict(enumerate(timers)),
        rounds=rounds,
        measure=lambda timer, r: timer.blocked_autorange(min_run_time=min_seconds),
        after_round=progress,
    )
    return [found[j] for j in range(len(rows))]


def peak_memory(work, device):
    """CUDA: the caching allocator's peak bytes in one call, weights included; None elsewhere."""
    if device.type != "cuda":
        return None
    torch.cuda.reset_peak_memory_stats(device)
    work()  # the allocator keeps its books on the host: no need to wait for the device
    return torch.cuda.max_memory_allocated(device)


def summarise(row, measurements, memory=None, *, peak_flops=None):
    """The JSON record of a measured row; per round, the median call of its Measurement."""
    times = [m.median for m in measurements]
    median = statistics.median(times)
    flops_per_s = row.flops / median if row.flops else None
    return {
        "label": row.label,
        "times_s": times,
        "median_s": median,
        "tokens": row.tokens,
        "tokens_per_s": row.tokens / median,
        "flops": row.flops,
        "flops_per_s": flops_per_s,
        "mfu": flops_per_s / peak_flops if flops_per_s and peak_flops else None,
        "peak_memory_bytes": memory,
        "updates": row.updates,  # training steps per call
        "seconds_per_update": median / row.updates if row.updates else None,
    }


RATIOS = [
    ("train/ours-fused", "train/torch", "training step: ours (fused) / nn.Transformer"),
    ("train/ours-reference", "train/torch", "training step: ours (reference) / nn.Transformer"),
    ("train/ours-fused-bf16", "train/torch", "training step: ours (fused, bf16) / nn.Transformer"),
    (
        "train/ours-fused-bf16",
        "train/torch-bf16",
        "training step: ours (fused, bf16) / nn.Transformer (bf16)",
    ),
    ("train/ours-fused-bf16", "train/ours-fused", "training step: ours (fused), bf16 / float32"),
    ("train/torch-bf16", "train/torch", "training step: nn.Transformer, bf16 / float32"),
    ("train/ours-fused", "train/ours-reference", "training step: fused / reference attention"),
    (
        "train/ours-graphed-bf16",
        "train/ours-fused-bf16",
        "training step: CUDA graph / eager (bf16)",
    ),
    ("train/ours-graphed", "train/ours-fused", "training step: CUDA graph / eager"),
    ("train/ours-compiled-bf16", "train/ours-fused-bf16", "training step: compiled / eager (bf16)"),
    (
        "train/ours-compiled-graphed-bf16",
        "train/ours-fused-bf16",
        "training step: compiled, CUDA graph / eager (bf16)",
    ),
    ("decode/greedy-cache", "decode/greedy-nocache", "greedy: with cache / without"),
    ("decode/beam-cache", "decode/beam-nocache", "beam 4: with cache / without"),
    ("decode/beam-cache", "decode/greedy-nocache", "beam 4 with cache / greedy without"),
]


def ratio(rows, numerator, denominator):
    """Time of row `numerator` over time of row `denominator`: ratio of the medians, and the
    median and range of the per-round ratios (a round's rows share the machine's state)."""
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


# the side-by-side view of a run's training rows: per precision, (ours, nn.Transformer)
SIDE_BY_SIDE = {
    "float32": ("train/ours-fused", "train/torch"),
    "bf16 autocast": ("train/ours-fused-bf16", "train/torch-bf16"),
}


def side_by_side(run):
    """A run's training rows side by side: {precision: {"ours": tokens/s,
    "torch.nn.Transformer": tokens/s, "time ratio": ratio(ours, nn.Transformer)}} for each
    precision in which both were measured (bf16: only where bf16 is native)."""
    rows, table = run["rows"], {}
    for precision, (ours, theirs) in SIDE_BY_SIDE.items():
        if ours in rows and theirs in rows:
            table[precision] = {
                "ours": rows[ours]["tokens_per_s"],
                "torch.nn.Transformer": rows[theirs]["tokens_per_s"],
                "time ratio": ratio(rows, ours, theirs),
            }
    return table
