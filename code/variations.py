"""Table 3 of the paper (§6.2, model variations) on Multi30k German->English.

    python code/variations.py --out results/table3                  # every row, CPU scale
    python code/variations.py --out results/table3 --rows base A    # the base row and group A
    python code/variations.py --scale gpu --device cuda --out results/table3-gpu

Each row of the paper's Table 3 (annotated_transformer.TABLE3_ROWS) becomes one training
run that changes the same field(s) of a base configuration, scaled to the chosen --scale:

  cpu   the book's multi30k recipe (N=3, d_model=256, d_ff=512, h=8, d_k=d_v=32, dropout
        0.1, smoothing 0.2, weight decay 0.1, a 5000-piece vocabulary, 2000 tokens a
        batch) for 2000 steps; each row's change scaled to it (e.g. (A) h=1 with
        d_k=d_v=256, keeping h * d_k = d_model). A run takes about 27 minutes of one CPU
        core, or under a minute of a GPU: the same runs, only faster.
  gpu   the paper's base model (N=6, d_model=512, d_ff=2048, h=8) and its rows unchanged,
        with 8000 tokens a batch: the run the book still needs from a GPU.
  tiny  a toy model for tests and for the chapter's live check; not a result.

Every run trains from scratch for the same number of steps with the training function that
code/train.py uses (training.train; the log gives the equivalent train.py
command), then is scored on Multi30k val: perplexity per BPE token without label smoothing
(validation_perplexity) and sacreBLEU of greedy (beam 1) or beam-search translations.
Every row is trained with each of --seeds (initialisation, batch order, dropout), so that a
row's change can be set against the spread that chance alone gives. Each finished run is
appended to OUT/variations.csv at once; runs already there with the same settings are
skipped, so an interrupted sweep continues where it stopped.
"""

import argparse
import itertools
import sys
import time
from dataclasses import replace

import annotated_transformer as at
import profiles
import script_helpers as helpers
from table3 import COLUMNS, IDENTITY, SCALES, describe, group_of, run_variant


def selected_rows(scale, wanted):
    """The labels of scale's rows named in `wanted` (labels or groups: base, A, ..., E, big)."""
    labels = list(scale.rows)
    if not wanted:
        return labels
    chosen = [label for label in labels if label in wanted or group_of(label) in wanted]
    unknown = [w for w in wanted if w not in labels and w not in map(group_of, labels)]
    if unknown:
        raise at.InputError(
            f"unknown row(s) {', '.join(unknown)}; choose from the groups "
            f"{', '.join(dict.fromkeys(map(group_of, labels)))} or the labels {labels}"
        )
    return chosen


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=helpers.given_path, required=True, help="folder for the CSV")
    parser.add_argument("--scale", choices=sorted(SCALES), default="cpu", help="see above")
    parser.add_argument("--rows", nargs="*", default=[], help="labels or groups (default: all)")
    parser.add_argument(
        "--seeds",
        type=helpers.non_negative_int,
        nargs="+",
        default=[0, 1, 2],
        help="train every row with each of these seeds (default: 0 1 2)",
    )
    parser.add_argument(
        "--beam-size", type=helpers.positive_int_flag, help="1: greedy decoding for BLEU"
    )
    parser.add_argument(
        "--train-pairs",
        type=helpers.positive_int_flag,
        help="train on the first this many pairs only (tests); recorded with each row",
    )
    helpers.add_device_flag(parser)
    helpers.add_threads_flag(parser)
    helpers.add_data_dir_flag(parser)
    helpers.add_config_flags(parser)  # every TrainConfig/ModelConfig field, on the base
    return parser.parse_args(argv)


@helpers.user_errors_exit_2("variations.py")
def main(argv=None):
    args = parse_args(argv)
    helpers.set_threads(args.threads)
    scale = SCALES[args.scale]
    labels = selected_rows(scale, args.rows)
    base = profiles.apply_changes(scale.base, helpers.given_changes(args))
    # one checkpoint, at the end: a variant is trained once, from scratch, in a temporary folder
    base = replace(base, checkpoint_every=base.max_steps, keep_checkpoints=1)
    train_pairs = helpers.load_multi30k("train", data_dir=args.data_dir)[: args.train_pairs]
    val_pairs = helpers.load_multi30k("val", data_dir=args.data_dir)
    scale = replace(
        scale,
        beam_size=args.beam_size or scale.beam_size,
        bleu_sentences=args.bleu_sentences or scale.bleu_sentences,
    )
    csv_path = args.out / "variations.csv"
    rows = helpers.read_csv(csv_path)
    tokenizer_for = helpers.tokenizers(train_pairs)  # one vocabulary per size, in memory
    with helpers.log_to(args.out / "variations.log") as log:
        log(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {args.scale} scale ({scale.note}); {base}")
        for label, seed in itertools.product(labels, args.seeds):
            config = profiles.apply_changes(replace(base, seed=seed), scale.rows[label])
            planned = {
                "row": label,
                "changes": describe(scale.rows[label]),
                "seed": seed,
                "steps": config.max_steps,
                "max_tokens": config.max_tokens,
                "vocab_size": config.vocab_size,
                "warmup_steps": config.warmup_steps,
                "lr_factor": config.lr_factor,
                "scale": args.scale,
                "decoding": at.decoding_label(scale.beam_size),
                "train_pairs": len(train_pairs),
            }
            if any(all(r[k] == str(planned[k]) for k in IDENTITY) for r in rows):
                log(f"{label} (seed {seed}): already in {csv_path}, skipped")
                continue
            row = run_variant(
                label,
                scale.rows[label],
                replace(base, seed=seed),
                train_pairs=train_pairs,
                val_pairs=val_pairs,
                scale=scale,
                device=args.device,
                log=log,
                tokenizer=tokenizer_for(config.vocab_size),
            )
            rows.append({k: str(v) for k, v in row.items()})
            helpers.write_csv(csv_path, rows, COLUMNS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
