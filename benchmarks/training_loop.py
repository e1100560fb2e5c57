"""Tokens per second of the training loop, before and after its rewrite, in one run.

    python benchmarks/training_loop.py --threads 2 --rounds 5 --steps 5
    python benchmarks/training_loop.py --variants before fast fast+compile --profile

"before" is the loop as it was at commit 95793e5 (each batch padded from Python lists,
LabelSmoothing's explicit target matrix, the loss read back every step); its module is
taken from git. The other variants use the current module's train_step on the same
batches of the quick profile: "fast" (corpus as tensors, fused loss, no per-step read),
"fast+compile" (the forward pass and loss under torch.compile, lengths bucketed to 8),
"fast+bf16" (bfloat16 autocast). Variants alternate round by round, so that all of them
see the same machine conditions; each round times --steps updates after one warm-up round.
"""

import argparse
import importlib.util
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "code"))
import annotated_transformer as at  # noqa: E402

BEFORE = "95793e5"


def load_module_at(revision):
    source = subprocess.run(
        ["git", "show", f"{revision}:code/annotated_transformer.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = pathlib.Path(tempfile.mkdtemp()) / "annotated_transformer_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("annotated_transformer_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_variants(names, config, vocab, corpus, data):
    """name -> function(indices) running one update; each variant has its own model."""
    variants = {}
    for name in names:
        if name == "before":
            old = load_module_at(BEFORE)
            torch.manual_seed(config.seed)
            model = old.build_model(vocab, vocab, config.model)
            optimizer, scheduler = old.make_optimizer(
                model, config.model.d_model, config.lr_factor, config.warmup_steps
            )
            criterion = old.LabelSmoothing(vocab, old.PAD_ID, config.smoothing)

            def step(indices, old=old, m=model, o=optimizer, s=scheduler, c=criterion):
                batch = old.Batch.from_ids([data[i] for i in indices])
                old.run_step(m, c, batch, o, s)

        else:
            amp = torch.bfloat16 if "bf16" in name else None
            run = at.build_training(config, vocab, "cpu", amp)
            compiled = "compile" in name
            loss_fn = torch.compile(at.forward_loss) if compiled else at.forward_loss

            def step(indices, run=run, amp=amp, loss_fn=loss_fn, multiple=8 if compiled else 1):
                batch = corpus.batch(indices, multiple_of=multiple)
                out = at.train_step(
                    run.model, batch, run.optimizer, run.scheduler, run.scaler,
                    config.smoothing, None, amp, loss_fn,
                )  # fmt: skip
                return out

        variants[name] = step
    return variants


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="updates per variant per round")
    parser.add_argument("--variants", nargs="+", default=["before", "fast"])
    parser.add_argument("--profile", action="store_true", help="torch.profiler table per variant")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = at.PROFILES["quick"]
    pairs = at.load_multi30k("train")
    tokenizer = at.train_bpe(pairs, config.vocab_size)
    data = at.encode_pairs(pairs, tokenizer)
    corpus = at.EncodedCorpus(data)
    vocab = tokenizer.get_vocab_size()
    batches = at.batch_by_tokens(corpus.lengths, config.max_tokens, seed=config.seed)
    variants = make_variants(args.variants, config, vocab, corpus, data)
    rates = {name: [] for name in variants}
    for round_ in range(args.rounds + 1):  # round 0 warms up (and compiles)
        chunk = batches[round_ * args.steps : (round_ + 1) * args.steps]
        tokens = corpus.target_tokens([i for indices in chunk for i in indices])
        for name, step in variants.items():
            start = time.perf_counter()
            for indices in chunk:
                step(indices)
            if round_:
                rates[name].append(tokens / (time.perf_counter() - start))
    print(f"{at.hardware_description()}; quick profile, {args.rounds} rounds of {args.steps} steps")
    base = statistics.median(rates[args.variants[0]])
    for name, values in rates.items():
        median = statistics.median(values)
        print(
            f"{name:14} {median:8,.0f} target tokens/s (rounds {min(values):,.0f}-"
            f"{max(values):,.0f}), {median / base:.2f}x {args.variants[0]}"
        )
    if args.profile:
        from torch.profiler import profile

        for name, step in variants.items():
            with profile() as prof:
                step(batches[-1])
            print(f"\n{name}: one step of {len(batches[-1])} pairs")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
