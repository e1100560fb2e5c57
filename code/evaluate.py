"""Score a training run the way §6.1 does: greedy and beam search, the last weights and the
average of the last checkpoints, sacreBLEU on Multi30k val and test2016.

    python code/evaluate.py --run runs/multi30k --out results/multi30k
    python code/evaluate.py --run runs/base --out results/base --device cuda

Reads RUN/checkpoint-<step>.pt (the snapshots code/train.py keeps), RUN/checkpoint.pt and
RUN/train.log, and never writes there; writes, in OUT (a folder of its own), averaged.pt
(the averaged weights, stored in float16 unless --dtype float32: half the size, and the
scores are those of the stored file, which load_checkpoint reads back into float32),
evaluation.json (the table, sacreBLEU's signature, sample translations, steps, training
time, hardware) and metrics.json (the training loss, averaged over every 10 steps, and the
validations made during training). Only val should guide choices; test2016 is reported.
"""

import argparse
import json
import pathlib
import re
import sys

import torch

import annotated_transformer as at
import cli


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", type=pathlib.Path, required=True, help="a train.py --out folder")
    parser.add_argument(
        "--out", type=pathlib.Path, required=True, help="folder for the results (not the run's)"
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


def training_seconds(log_path):
    """Training time from train.log: the last 'step N: ..., S s' of each (resumed) segment;
    None without a log (runs started from Python rather than code/train.py)."""
    if not pathlib.Path(log_path).is_file():
        return None
    total, segment = 0.0, 0.0
    for line in pathlib.Path(log_path).read_text().splitlines():
        if line.startswith("training ") or line.startswith("resumed "):
            total, segment = total + segment, 0.0
        found = re.match(r"step \d+: .*, (\d+) s, checkpoint written", line)
        if found:
            segment = float(found.group(1))
    return total + segment


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
        return evaluate(args, snapshots, until)


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


def evaluate(args, snapshots, until=None):
    averaged_path = args.out / "averaged.pt"
    averaged = at.average_checkpoints(snapshots[-args.average :])
    dtype = getattr(torch, args.dtype)
    averaged["model"] = {
        name: tensor.to(dtype) if tensor.is_floating_point() else tensor
        for name, tensor in averaged["model"].items()
    }
    at.save_checkpoint(averaged_path, averaged)
    average = f"average of last {len(averaged['averaged_steps'])}"
    sets = {split: at.load_multi30k(split)[: args.limit] for split in ("val", "test2016")}
    rows, samples, signature = [], [], None
    weights = (("last", snapshots[-1]), (average, averaged_path))
    for label, path in weights:
        model, tokenizer = at.load_checkpoint(path, args.device)
        for split, pairs in sets.items():
            for beam_size in (1, 4):
                scores = at.evaluate_bleu(model, tokenizer, pairs, beam_size, 0.6, args.batch_size)
                signature = scores["signature"]
                decoding = at.decoding_label(beam_size, 0.6)
                rows.append(
                    {
                        "set": split,
                        "decoding": decoding,
                        "weights": label,
                        "sacreBLEU": scores["bleu"],
                        "lowercased BLEU": scores["bleu_lowercase"],
                    }
                )
                print(f"{split:9} {decoding:18} {label:18} {scores['bleu']:6.2f}", flush=True)
                if split == "test2016" and beam_size == 4 and path == averaged_path:
                    samples = [
                        {"source": s, "reference": t, "hypothesis": h}
                        for (s, t), h in zip(pairs[:10], scores["hypotheses"])
                    ]
    state = at.read_checkpoint(args.run / "checkpoint.pt")
    # checkpoints since format 2 keep the training time across resumes; older runs: the log
    seconds = state.get("seconds") or training_seconds(args.run / "train.log")
    if until is not None:  # the run as it stood at its last snapshot within the hours
        seconds = until["seconds"]
        state = {
            **state,
            "step": until["step"],
            "history": [h for h in state["history"] if h["step"] <= until["step"]],
            "validations": [v for v in state.get("validations", []) if v["step"] <= until["step"]],
        }
    evaluation = {
        "run": str(args.run),
        "config": state["config"],
        "steps": state["step"],
        "averaged_steps": averaged["averaged_steps"],
        "train_hours": seconds and round(seconds / 3600, 2),
        "train_seconds": seconds and round(seconds, 1),
        "hardware": args.hardware or at.hardware_description(args.device),
        "signature": signature,
        "sentences": {split: len(pairs) for split, pairs in sets.items()},
        "results": rows,
        "samples": samples,
    }
    (args.out / "evaluation.json").write_text(json.dumps(evaluation, indent=1) + "\n")
    metrics = {
        "every": 10,
        "history": smoothed_history(state["history"]),
        "validation": state.get("validations", []),
    }
    (args.out / "metrics.json").write_text(json.dumps(metrics) + "\n")
    print(f"wrote {args.out / 'evaluation.json'} and {args.out / 'metrics.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
