"""Warm-up ablation for chapter 5 (§5.3): the paper's post-LN Transformer trained on the copy
task with Eq. (3)'s linear warm-up, against the same schedule with the warm-up shortened or
removed (the rate held at its peak from the first step instead), for a few seeds.

    OMP_NUM_THREADS=1 nohup python code/warmup_ablation.py --out results/warmup/warmup.csv &
    python code/warmup_ablation.py --out /tmp/w.csv --steps 20 --seeds 0 --arms 1:5 1:0  # smoke

An arm is N:warmup, the number of layers and the warm-up steps; the default arms are the
6-layer model with warm-ups 400 (Eq. (3) with warmup_steps = 400), 40 and 0, and the
2-layer model with none.

Every arm uses rate(step) = peak * min(1, step / warmup) * min(1, sqrt(W / step)): the same
peak and, after step W, the same inverse-square-root decay as Eq. (3) with warmup_steps = W;
only the first W steps differ. Writes one row per (arm, seed, logged step): the training
loss per token, and at the end the share of symbols of held-out sequences copied by greedy
decoding. The machine (CPU, threads, instruction sets, torch) goes into every row, so the
page can name it.
"""

import argparse
import math
import sys
import time

import torch

import annotated_transformer as at
import hardware
import script_helpers as helpers

COLUMNS = ["N", "warmup", "seed", "step", "loss", "accuracy", "d_model", "peak_lr", "hardware"]


def schedule(peak, warmup, decay_from):
    """The learning rate of update k = 1, 2, ...: linear warm-up over `warmup` steps to
    `peak` (none when warmup is 0), then flat until `decay_from`, then Eq. (3)'s decay."""

    def lrate(k):
        ramp = 1.0 if warmup == 0 else min(1.0, k / warmup)
        return peak * ramp * min(1.0, math.sqrt(decay_from / k))

    return lrate


def run_arm(args, N, warmup, *, seed, log_every):
    """Train one model (at.fit, with this schedule in place of Eq. (3)); returns its rows
    (the loss averaged over every log_every steps, the held-out accuracy at the end)."""
    generator = torch.Generator().manual_seed(1000 + seed)
    vocab = 4 + args.symbols
    corpus = at.EncodedCorpus(at.copy_task_pairs(2000, vocab, args.length, generator=generator))
    held_out = at.Batch.from_ids(at.copy_task_pairs(200, vocab, args.length, generator=generator))
    architecture = at.ModelConfig(
        N=N, d_model=args.d_model, d_ff=2 * args.d_model, h=4, dropout=0.0,
        share_embeddings=True,
    )  # fmt: skip
    config = at.TrainConfig(
        model=architecture, vocab_size=vocab, max_tokens=32 * (args.length + 1),
        warmup_steps=max(warmup, 1),  # unused: the schedule below replaces Eq. (3)
        smoothing=0.0, seed=seed, max_steps=args.steps,
    )  # fmt: skip
    model, losses = at.fit(
        config, corpus, vocab, schedule=schedule(args.peak_lr, warmup, args.decay_from)
    )
    rows = []
    for end in range(log_every, args.steps + log_every, log_every):
        step = min(end, args.steps)
        recent = losses[end - log_every : step]
        loss = sum(recent) / len(recent)
        rows.append({"N": N, "warmup": warmup, "seed": seed, "step": step, "loss": loss})
    model.eval()
    with torch.no_grad():
        output = at.greedy_decode(model, held_out.src, held_out.src_mask, max_len=args.length + 1)
    rows[-1]["accuracy"] = (output[:, 1:] == held_out.tgt_y).float().mean().item()
    return rows


def parse_arm(text):
    """An argparse type for an arm: "6:400" -> (6, 400), layers >= 1 and warm-up steps >= 0."""
    N, _, warmup = text.partition(":")
    try:
        return helpers.positive_int_flag(N), helpers.non_negative_int(warmup)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be N:warmup, layers a positive integer and warm-up steps an integer >= 0 "
            f"(e.g. 6:400), got {text!r}"
        ) from None


@helpers.user_errors_exit_2("warmup_ablation.py")
def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=helpers.given_path, required=True, help="the CSV to write")
    count, seed = helpers.positive_int_flag, helpers.non_negative_int
    parser.add_argument("--d-model", type=count, default=64)
    parser.add_argument("--peak-lr", type=helpers.positive_float, default=3e-3)
    parser.add_argument("--decay-from", type=count, default=400, help="W: Eq. (3)'s warmup_steps")
    parser.add_argument(
        "--arms", type=parse_arm, nargs="+", default=[(6, 400), (6, 40), (6, 0), (2, 0)],
        help="N:warmup pairs: layers in encoder and decoder, warm-up steps",
    )  # fmt: skip
    parser.add_argument("--seeds", type=seed, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=count, default=1000)
    parser.add_argument("--log-every", type=count, default=20)
    parser.add_argument("--symbols", type=count, default=16, help="copy-task alphabet size")
    parser.add_argument("--length", type=count, default=10, help="copy-task sequence length")
    args = parser.parse_args(argv)
    extra = {"d_model": args.d_model, "peak_lr": args.peak_lr}
    extra["hardware"] = hardware.hardware_description()  # CPU, threads, instruction sets, torch
    rows = []
    for N, warmup in args.arms:
        for seed in args.seeds:
            start = time.perf_counter()
            arm = run_arm(args, N, warmup, seed=seed, log_every=args.log_every)
            rows += [{**row, **extra} for row in arm]
            print(
                f"N {N} warmup {warmup} seed {seed}: final loss {arm[-1]['loss']:.3f}, copied "
                f"{arm[-1]['accuracy']:.1%} ({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
            helpers.write_csv(args.out, rows, COLUMNS)  # after every arm: a partial file is usable
    return 0


if __name__ == "__main__":
    sys.exit(main())
