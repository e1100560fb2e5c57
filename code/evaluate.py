"""Score a training run by the book's one rule (code/scoring.py, chapter 6.1): greedy and
beam search, the last weights and the average of the last checkpoints, sacreBLEU on
Multi30k val and test2016, every hypothesis stored.

    python code/evaluate.py --run runs/multi30k --out results/multi30k
    python code/evaluate.py --run runs/base --out results/base --device cuda
    python code/evaluate.py --run runs/fast --out results/fast --average 10
    python code/evaluate.py --stored results/multi30k     # a stored average, its run gone

Reads RUN/checkpoint-<step>.pt (the snapshots code/train.py keeps) and RUN/checkpoint.pt
(the training time, the loss history, the validations), and never writes there; writes,
in OUT (a folder of its own), averaged.pt (the averaged weights, stored in float16 unless
--dtype float32: half the size, and the scores are those of the stored file, which
load_checkpoint reads back into float32),
evaluation.json (the table, sacreBLEU's signature, sample translations, steps, training
time, hardware) and metrics.json (the training loss, averaged over every 10 steps, and the
validations made during training). Only val should guide choices; test2016 is reported.
Beam 4 runs at each length penalty of scoring.ALPHA_GRID (or --alpha) with the averaged
weights on val; the best is kept, every beam row is decoded at that one, as §6.1 chose its
alpha "after experimentation on the development set", and averaged.pt records it, so that
translate.py decodes by the same rule. Every row's hypotheses go to OUT/hypotheses/
(scoring.hypotheses_path), for code/compare.py's paired tests, and so does test2016 decoded at
§6.1's alpha of 0.6 with the averaged weights (scoring.PAPER_BEAM: not a row of the table,
the baseline against which chapter 6.1 tests what val's choice of alpha is worth).
With --stored FOLDER instead of --run: score FOLDER/averaged.pt, whose run folder is gone,
by the same rule (the averaged weights only), keeping what FOLDER/evaluation.json records of
the run (its steps, training time, hardware, config).
"""

import argparse
import json
import pathlib
import sys

import torch

import annotated_transformer as at
import fast_decoding as fd
import run_folder
import safe_files
import scoring
import script_helpers as helpers
from hardware import hardware_description


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", type=helpers.given_path, help="a train.py --out folder")
    source.add_argument(
        "--stored",
        type=helpers.given_path,
        help="a results folder whose averaged.pt and evaluation.json outlived their run: "
        "score the averaged weights again, by the same rule, into the same folder",
    )
    parser.add_argument(
        "--out",
        type=helpers.given_path,
        help="folder for the results (not the run's); required with --run",
    )
    helpers.add_data_dir_flag(parser)
    parser.add_argument(
        "--average",
        type=helpers.positive_int_flag,
        default=5,
        help="snapshots to average (§6.1: 5)",
    )
    helpers.add_device_flag(parser)
    parser.add_argument(
        "--batch-size", type=helpers.positive_int_flag, default=64, help="sentences per batch"
    )
    parser.add_argument(
        "--limit",
        type=helpers.positive_int_flag,
        help="score only the first LIMIT sentences of a set",
    )
    parser.add_argument(
        "--alpha",
        dest="alphas",
        type=helpers.non_negative_floats,
        default=scoring.ALPHA_GRID,
        help="the length penalties of beam search to try on val, separated by commas (default: "
        "the book's one grid, 0.6 to 1.5); the one whose averaged weights score best is kept",
    )
    parser.add_argument(
        "--dtype",
        choices=("float16", "float32"),
        default="float16",
        help="how averaged.pt stores its weights (default: %(default)s)",
    )
    parser.add_argument(
        "--hardware",
        help="how to describe the training machine (default: what the run recorded, else "
        "this machine)",
    )
    parser.add_argument(
        "--within-hours",
        type=helpers.positive_float,
        help="score the run as it stood after this many hours of training: only the snapshots "
        "written by then (a run that kept them all, --keep-checkpoints)",
    )
    args = parser.parse_args(argv)
    if args.run and args.out is None:
        parser.error("--run needs --out, a folder for the results")
    if args.stored and (args.out or args.within_hours):
        parser.error("--stored scores into its own folder: leave out --out and --within-hours")
    return args


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


@helpers.user_errors_exit_2("evaluate.py")
def main(argv=None):
    args = parse_args(argv)
    settings = ("alphas", "device", "batch_size", "limit", "data_dir")
    if args.stored:
        with run_folder.RunFolder(args.stored, resume=True):
            rescore(args.stored, **{k: vars(args)[k] for k in settings})
        return 0
    snapshots = run_folder.snapshot_paths(args.run)
    if not snapshots:
        raise FileNotFoundError(f"no checkpoint-<step>.pt in {args.run}: not a training run")
    until = None  # with --within-hours: the validation figures of the last snapshot kept
    if args.within_hours:
        kept = snapshots_within(snapshots, args.within_hours * 3600)
        snapshots, until = [path for path, _ in kept], kept[-1][1]
    helpers.own_folder(args.out, args.run)
    with run_folder.RunFolder(args.out, resume=True):
        settings += ("average", "dtype", "hardware")
        evaluate(args.run, args.out, snapshots, until=until, **{k: vars(args)[k] for k in settings})
    return 0


def snapshots_within(snapshots, seconds):
    """The snapshots written within `seconds` of training, by the training time each records
    with its validation figures: [(path, validation figures)], oldest first."""
    kept = []
    for path in snapshots:
        validation = at.read_checkpoint(path).get("validation")
        if not validation or "seconds" not in validation:
            raise at.InputError(
                f"{path} records no training time (no validation figures): --within-hours "
                f"needs a run trained with validation pairs"
            )
        if validation["seconds"] > seconds:
            break  # training time only grows with the step: no later snapshot is within
        kept.append((path, validation))
    if not kept:
        raise at.InputError(f"no snapshot was written within {seconds / 3600:g} hours of training")
    return kept


def choose_alpha(model, tokenizer, pairs, *, alphas, batch_size=64):
    """The length penalty, of `alphas`, under which beam 4 scores best on `pairs` (val; the
    first of equals), every alpha's score and length ratio (hypotheses' length over the
    references'), and the chosen alpha's figures (fast_evaluate_bleu's, which score_table
    reuses): (alpha, [{"alpha", "sacreBLEU", "length ratio"}], figures)."""
    scores, figures_at = [], {}
    for alpha in alphas:
        figures = figures_at[alpha] = fd.fast_evaluate_bleu(
            model,
            tokenizer,
            pairs,
            beam_size=4,
            alpha=alpha,
            batch_size=batch_size,
        )
        scores.append(
            {"alpha": alpha, "sacreBLEU": figures["bleu"], "length ratio": figures["length_ratio"]}
        )
        print(
            f"val       beam 4, alpha {alpha:<4g} averaged  {figures['bleu']:6.2f} "
            f"(length ratio {figures['length_ratio']:.3f})",
            flush=True,
        )
    best = max(scores, key=lambda score: score["sacreBLEU"])  # max keeps the first of equals
    return best["alpha"], scores, figures_at[best["alpha"]]


def score_table(translators, sets, *, alpha, batch_size, out, decoded=None):
    """Greedy and beam 4 (length penalty `alpha`) for each (label, (model, tokenizer)) of
    `translators` on each split of `sets`, every row's hypotheses stored in `out`
    (scoring.write_hypotheses; "last" is stored as last, any other label as averaged):
    (rows of the table, sacreBLEU's signature, the samples: the first 10 test2016
    translations, beam 4, of the last of `translators`). decoded: {split: figures} of beam 4
    at `alpha` that choose_alpha already made with the last of `translators`, reused."""
    rows, samples, signature = [], [], None
    for number, (label, (model, tokenizer)) in enumerate(translators, start=1):
        known = decoded if number == len(translators) and decoded else {}
        for split, pairs in sets.items():
            for beam_size in (1, 4):
                scores = known.get(split) if beam_size == 4 else None
                scores = scores or fd.fast_evaluate_bleu(
                    model,
                    tokenizer,
                    pairs,
                    beam_size=beam_size,
                    alpha=alpha,
                    batch_size=batch_size,
                )
                signature = scores["signature"]
                decoding = at.decoding_label(beam_size, alpha)
                rows.append(
                    {
                        "set": split,
                        "decoding": decoding,
                        "weights": label,
                        "sacreBLEU": scores["bleu"],
                        "lowercased BLEU": scores["bleu_lowercase"],
                        "length ratio": scores["length_ratio"],
                    }
                )
                scoring.write_hypotheses(
                    out,
                    scores["hypotheses"],
                    split=split,
                    decoding="greedy" if beam_size == 1 else "beam",
                    weights="last" if label == "last" else "averaged",
                )
                print(f"{split:9} {decoding:18} {label:18} {scores['bleu']:6.2f}", flush=True)
                if split == "test2016" and beam_size == 4:
                    beam_on_test = scores["hypotheses"]
                    samples = [
                        {"source": s, "reference": t, "hypothesis": h}
                        for (s, t), h in zip(pairs[:10], beam_on_test)
                    ]
        if label != "last" and "test2016" in sets:
            reuse = beam_on_test if alpha == scoring.PAPER_ALPHA else None
            store_paper_beam(
                model, tokenizer, sets["test2016"], batch_size=batch_size, out=out, decoded=reuse
            )
    return rows, signature, samples


def store_paper_beam(model, tokenizer, pairs, *, batch_size, out, decoded=None):
    """test2016 decoded with beam 4 at §6.1's alpha (scoring.PAPER_BEAM), stored beside the
    table's rows but not among them: the baseline of the paired test of what val's choice of
    alpha is worth (chapter 6.1), never a candidate. decoded: those translations, when the
    table's beam rows already ran at that alpha (not decoded again)."""
    sources = [source for source, _ in pairs]
    hypotheses = (
        decoded
        if decoded is not None
        else fd.fast_translate(
            model,
            tokenizer,
            sources,
            beam_size=4,
            alpha=scoring.PAPER_ALPHA,
            batch_size=batch_size,
        )
    )
    scoring.write_hypotheses(
        out, hypotheses, split="test2016", decoding=scoring.PAPER_BEAM, weights="averaged"
    )


def scored_sets(limit=None, data_dir=None):
    """Multi30k val and test2016 (the first `limit` pairs of each when given)."""
    return {
        split: helpers.load_multi30k(split, data_dir=data_dir)[:limit] for split in scoring.SPLITS
    }


def rescore(folder, *, alphas, device="cpu", batch_size=64, limit=None, data_dir=None):
    """Score folder/averaged.pt by the protocol (its run and last weights are gone): the alpha
    val chooses from `alphas`, greedy and beam on val and test2016, hypotheses stored, the
    alpha recorded in averaged.pt; folder/evaluation.json keeps its record of the run."""
    folder = pathlib.Path(folder)
    averaged_path, evaluation_path = folder / "averaged.pt", folder / "evaluation.json"
    for path in (averaged_path, evaluation_path):
        if not path.is_file():
            raise FileNotFoundError(f"--stored needs {path}; score a run with --run instead")
    record = json.loads(evaluation_path.read_text())
    sets = scored_sets(limit, data_dir)
    at.check_device(device)  # before the file is read
    payload = at.read_checkpoint(averaged_path)  # read once: scored, then written with its alpha
    model, tokenizer = translator = at.translator_from(payload, device)
    alpha, alpha_on_val, on_val = choose_alpha(
        model, tokenizer, sets["val"], alphas=alphas, batch_size=batch_size
    )
    label = f"average of last {len(record['averaged_steps'])}"
    rows, signature, samples = score_table(
        ((label, translator),),
        sets,
        alpha=alpha,
        batch_size=batch_size,
        out=folder,
        decoded={"val": on_val},
    )
    # the weights written back unchanged, with the alpha val chose, which translate.py reads
    at.save_checkpoint(averaged_path, {**payload, "alpha": alpha})
    for split, decoding, weights in scoring.stored_settings(folder):
        if weights == "last":  # decoded by another rule, and not in the new table
            scoring.hypotheses_path(
                folder, split=split, decoding=decoding, weights=weights
            ).unlink()
    kept = {k: v for k, v in record.items() if k not in ("alpha", "alpha_on_val", "results")}
    evaluation = {
        **kept,
        "signature": signature,
        "sentences": {split: len(pairs) for split, pairs in sets.items()},
        "alpha": alpha,
        "alpha_on_val": alpha_on_val,
        "last weights": "not kept: the run's snapshots were not stored with the book",
        "results": rows,
        "samples": samples,
    }
    safe_files.write_json(evaluation_path, evaluation)
    print(f"wrote {evaluation_path} and {folder / 'hypotheses'}")


def trained_on(run):
    """The machine and precision the run recorded in its metrics.json (train writes them),
    or None for a run that recorded none."""
    metrics = pathlib.Path(run) / "metrics.json"
    return json.loads(metrics.read_text()).get("hardware") if metrics.exists() else None


def run_state(run, until):
    """The run's checkpoint.pt state and its training seconds; with `until` (the validation
    figures of a snapshot), the run as it stood at that snapshot."""
    state = at.read_checkpoint(pathlib.Path(run) / "checkpoint.pt")
    if until is None:
        return state, state["seconds"]  # training time, summed over resumes
    return {
        **state,
        "step": until["step"],
        "history": [h for h in state["history"] if h["step"] <= until["step"]],
        "validations": [v for v in state.get("validations", []) if v["step"] <= until["step"]],
    }, until["seconds"]


def evaluate(
    run,
    out,
    snapshots,
    *,
    average=5,
    alphas=scoring.ALPHA_GRID,
    device="cpu",
    batch_size=64,
    limit=None,
    dtype="float16",
    hardware=None,
    until=None,
    data_dir=None,
):
    """Score the training run in folder `run` into folder `out`: greedy and beam 4 on the
    last of `snapshots` and on the average of the last `average` (stored as out/averaged.pt
    in `dtype`, with the alpha val chose), on the first `limit` sentences (all when None)
    of val and test2016; beam 4 with the one of `alphas` that scores best on val with the
    averaged weights. `until`, the validation figures of a snapshot, describes the run as
    it stood then. Writes out/evaluation.json, out/metrics.json and out/hypotheses/."""
    run, out = pathlib.Path(run), pathlib.Path(out)
    averaged_path = out / "averaged.pt"
    averaged = at.average_checkpoints(snapshots[-average:])

    def stored(name, tensor):  # tied weights stay one tensor (at.once_per_tensor)
        return tensor.to(getattr(torch, dtype)) if tensor.is_floating_point() else tensor

    averaged["model"] = at.once_per_tensor(averaged["model"], stored)
    at.save_checkpoint(averaged_path, averaged)
    label = f"average of last {len(averaged['averaged_steps'])}"
    sets = scored_sets(limit, data_dir)
    # the stored tensors, still in memory, as load_checkpoint would read them back
    model, tokenizer = translator = at.translator_from(averaged, device)
    alpha, alpha_on_val, decoded = alphas[0], None, None
    if len(alphas) > 1:  # test2016 is only ever decoded at the alpha val chose
        alpha, alpha_on_val, on_val = choose_alpha(
            model, tokenizer, sets["val"], alphas=alphas, batch_size=batch_size
        )
        decoded = {"val": on_val}
    # the payload is still in memory: write it again with the alpha, no need to read it back
    at.save_checkpoint(averaged_path, {**averaged, "alpha": alpha})
    translators = (("last", at.load_checkpoint(snapshots[-1], device)), (label, translator))
    rows, signature, samples = score_table(
        translators, sets, alpha=alpha, batch_size=batch_size, out=out, decoded=decoded
    )
    state, seconds = run_state(run, until)
    evaluation = {
        "run": str(run),
        "config": state["config"],
        "steps": state["step"],
        "averaged_steps": averaged["averaged_steps"],
        "train_hours": round(seconds / 3600, 2),
        "train_seconds": round(seconds, 1),
        "hardware": hardware or trained_on(run) or hardware_description(device),
        "signature": signature,
        "sentences": {split: len(pairs) for split, pairs in sets.items()},
        "alpha": alpha,
        **({"alpha_on_val": alpha_on_val} if alpha_on_val else {}),
        "results": rows,
        "samples": samples,
    }
    safe_files.write_json(out / "evaluation.json", evaluation)
    metrics = {
        "hardware": evaluation["hardware"],
        "every": 10,
        "history": smoothed_history(state["history"]),
        "validations": state.get("validations", []),
    }
    safe_files.write_json(out / "metrics.json", metrics)
    print(f"wrote {out / 'evaluation.json'}, {out / 'metrics.json'} and {out / 'hypotheses'}")


if __name__ == "__main__":
    sys.exit(main())
