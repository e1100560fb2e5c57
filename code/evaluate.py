"""Score a training run the way §6.1 does: greedy and beam search, the last weights and the
average of the last checkpoints, sacreBLEU on Multi30k val and test2016.

    python code/evaluate.py --run runs/multi30k --out results/multi30k
    python code/evaluate.py --run runs/base --out results/base --device cuda

Reads RUN/checkpoint-<step>.pt (the snapshots code/train.py keeps) and RUN/checkpoint.pt
(the training time, the loss history, the validations), and never writes there; writes,
in OUT (a folder of its own), averaged.pt (the averaged weights, stored in float16 unless
--dtype float32: half the size, and the scores are those of the stored file, which
load_checkpoint reads back into float32),
evaluation.json (the table, sacreBLEU's signature, sample translations, steps, training
time, hardware) and metrics.json (the training loss, averaged over every 10 steps, and the
validations made during training). Only val should guide choices; test2016 is reported.
"""

import argparse
import json
import pathlib
import sys

import torch

import annotated_transformer as at
import cli


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", type=cli.given_path, required=True, help="a train.py --out folder")
    parser.add_argument(
        "--out", type=cli.given_path, required=True, help="folder for the results (not the run's)"
    )
    parser.add_argument(
        "--average", type=cli.positive_int, default=5, help="snapshots to average (§6.1: 5)"
    )
    cli.add_device_flag(parser)
    parser.add_argument(
        "--batch-size", type=cli.positive_int, default=64, help="sentences per batch"
    )
    parser.add_argument(
        "--limit", type=cli.positive_int, help="score only the first LIMIT sentences of a set"
    )
    parser.add_argument(
        "--dtype",
        choices=("float16", "float32"),
        default="float16",
        help="how averaged.pt stores its weights (default: %(default)s)",
    )
    parser.add_argument(
        "--hardware", help="how to describe the training machine (default: this one)"
    )
    parser.add_argument(
        "--within-hours",
        type=cli.positive_float,
        help="score the run as it stood after this many hours of training: only the snapshots "
        "written by then (a run that kept them all, --keep-checkpoints)",
    )
    return parser.parse_args(argv)


def smoothed_history(history, every=10):
    """The loss (and, where logged, the cross-entropy) averaged over consecutive windows
    of `every` steps."""
    windows = (history[i : i + every] for i in range(0, len(history), every))
    return [
        {
            "step": window[-1]["step"],
            **{
                key: round(sum(h[key] for h in window) / len(window), 4)
                for key in ("loss", "nll")
                if key in window[0]
            },
        }
        for window in windows
    ]


@cli.user_errors_exit_2("evaluate.py")
def main(argv=None):
    args = parse_args(argv)
    snapshots = at.snapshot_paths(args.run)
    if not snapshots:
        raise FileNotFoundError(f"no checkpoint-<step>.pt in {args.run}: not a training run")
    until = None  # with --within-hours: the validation figures of the last snapshot kept
    if args.within_hours:
        kept = snapshots_within(snapshots, args.within_hours * 3600)
        snapshots, until = [path for path, _ in kept], kept[-1][1]
    cli.own_folder(args.out, args.run)
    with at.RunFolder(args.out, resume=True):
        settings = ("average", "device", "batch_size", "limit", "dtype", "hardware")
        evaluate(args.run, args.out, snapshots, until=until, **{k: vars(args)[k] for k in settings})
    return 0


def snapshots_within(snapshots, seconds):
    """The snapshots written within `seconds` of training, by the training time each records
    with its validation figures: [(path, validation figures)], oldest first."""
    kept = []
    for path in snapshots:
        validation = at.read_checkpoint(path).get("validation")
        if not validation or "seconds" not in validation:
            raise ValueError(
                f"{path} records no training time (no validation figures): --within-hours "
                f"needs a run trained with validation pairs"
            )
        if validation["seconds"] > seconds:
            break  # training time only grows with the step: no later snapshot is within
        kept.append((path, validation))
    if not kept:
        raise ValueError(f"no snapshot was written within {seconds / 3600:g} hours of training")
    return kept


def evaluate(
    run,
    out,
    snapshots,
    average=5,
    device="cpu",
    batch_size=64,
    limit=None,
    dtype="float16",
    hardware=None,
    until=None,
):
    """Score the training run in folder `run` into folder `out`: greedy and beam 4 on the
    last of `snapshots` and on the average of the last `average` (stored as out/averaged.pt
    in `dtype`), on the first `limit` sentences (all when None) of val and test2016.
    `until`, the validation figures of a snapshot, describes the run as it stood then.
    Writes out/evaluation.json and out/metrics.json."""
    run, out = pathlib.Path(run), pathlib.Path(out)
    averaged_path = out / "averaged.pt"
    averaged = at.average_checkpoints(snapshots[-average:])
    averaged["model"] = {
        name: tensor.to(getattr(torch, dtype)) if tensor.is_floating_point() else tensor
        for name, tensor in averaged["model"].items()
    }
    at.save_checkpoint(averaged_path, averaged)
    label = f"average of last {len(averaged['averaged_steps'])}"
    sets = {split: at.load_multi30k(split)[:limit] for split in ("val", "test2016")}
    rows, samples, signature = [], [], None
    for weights, path in (("last", snapshots[-1]), (label, averaged_path)):
        model, tokenizer = at.load_checkpoint(path, device)
        for split, pairs in sets.items():
            for beam_size in (1, 4):
                scores = at.evaluate_bleu(model, tokenizer, pairs, beam_size, 0.6, batch_size)
                signature = scores["signature"]
                decoding = at.decoding_label(beam_size, 0.6)
                rows.append(
                    {
                        "set": split,
                        "decoding": decoding,
                        "weights": weights,
                        "sacreBLEU": scores["bleu"],
                        "lowercased BLEU": scores["bleu_lowercase"],
                    }
                )
                print(f"{split:9} {decoding:18} {weights:18} {scores['bleu']:6.2f}", flush=True)
                if split == "test2016" and beam_size == 4 and path == averaged_path:
                    samples = [
                        {"source": s, "reference": t, "hypothesis": h}
                        for (s, t), h in zip(pairs[:10], scores["hypotheses"])
                    ]
    state = at.read_checkpoint(run / "checkpoint.pt")
    seconds = state["seconds"]  # training time, summed over resumes
    if until is not None:  # the run as it stood at its last snapshot within the hours
        seconds = until["seconds"]
        state = {
            **state,
            "step": until["step"],
            "history": [h for h in state["history"] if h["step"] <= until["step"]],
            "validations": [v for v in state.get("validations", []) if v["step"] <= until["step"]],
        }
    evaluation = {
        "run": str(run),
        "config": state["config"],
        "steps": state["step"],
        "averaged_steps": averaged["averaged_steps"],
        "train_hours": round(seconds / 3600, 2),
        "train_seconds": round(seconds, 1),
        "hardware": hardware or at.hardware_description(device),
        "signature": signature,
        "sentences": {split: len(pairs) for split, pairs in sets.items()},
        "results": rows,
        "samples": samples,
    }
    at.write_json(out / "evaluation.json", evaluation)
    metrics = {
        "every": 10,
        "history": smoothed_history(state["history"]),
        "validation": state.get("validations", []),
    }
    (out / "metrics.json").write_text(json.dumps(metrics) + "\n")
    print(f"wrote {out / 'evaluation.json'} and {out / 'metrics.json'}")


if __name__ == "__main__":
    sys.exit(main())
