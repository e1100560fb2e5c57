"""Choose the Multi30k recipe on validation data, by successive halving on a CPU.

    python code/recipe_search.py --out runs/search                     # every rung
    python code/recipe_search.py --out runs/search --rungs 0           # only the first
    python code/recipe_search.py --out runs/search --csv results/search/trials.csv

Every trial is the starting recipe (START, the quick profile changed as below) with one
group of settings changed (TRIALS). Rung k trains each surviving trial until it has used
BUDGETS_MINUTES[k] minutes of CPU time in all (a trial promoted to the next rung resumes
its own checkpoint: Eq. (3) does not depend on the run's length, so this is the same as a
longer run from the start), then scores it on Multi30k val: cross-entropy on all 1014
pairs and greedy sacreBLEU on the first 500. The best third (at least one) of a rung goes
on to the next. Several searches with disjoint --trials may run at once (one per core),
sharing OUT; run the later rungs with every trial once the first is complete. Only val
is ever looked at: test2016 is not loaded.

Time is CPU time of this process (time.process_time), one thread by default, so that a
trial's budget does not depend on what else the machine is doing; each row also records
the wall time. Everything resumes: run it again and finished work is skipped. Each
evaluation is appended to OUT/trials.csv (and copied to --csv).
"""

import argparse
import json
import sys
import time

import annotated_transformer as at
import hardware
import profiles
import safe_files
import script_helpers as helpers
import training_runs as training
from recipe_trials import BUDGETS_MINUTES, START, TRIALS

COLUMNS = (
    "trial", "rung", "budget_min", "step", "cpu_seconds", "wall_seconds", "tokens_seen",
    "epochs", "val_loss", "val_ppl", "val_bleu", "bleu_sentences", "params", "changes",
    "command", "hardware",
)  # fmt: skip


def folder_name(trial):
    return "".join(c if c.isalnum() else "-" for c in trial).strip("-")


def epoch_tokens(pairs, tokenizer):
    """Target tokens in one pass over the training pairs, with this trial's vocabulary."""
    corpus = at.EncodedCorpus.from_pairs(pairs, tokenizer)
    return corpus.target_tokens(range(len(corpus)))


def spent(folder):
    state = folder / "search.json"
    return json.loads(state.read_text()) if state.exists() else {"cpu_seconds": 0.0}


def train_until(folder, config, budget, *, tokenizer, pairs, val_pairs, log):
    """Train a trial into `folder` in chunks of eval_every steps until it has used `budget`
    CPU seconds; returns the CPU seconds used."""
    state = spent(folder)
    while state["cpu_seconds"] < budget:
        resume = (folder / "checkpoint.pt").exists()
        step = at.read_checkpoint(folder / "checkpoint.pt")["step"] if resume else 0
        chunk = profiles.apply_changes(config, {"max_steps": step + config.eval_every})
        start = time.process_time()
        training.train(
            chunk, pairs, folder, tokenizer=tokenizer, val_pairs=val_pairs, resume=resume, log=log
        )
        state["cpu_seconds"] += time.process_time() - start
        safe_files.write_json(folder / "search.json", state)
    return state["cpu_seconds"]


def record(row, path, extra_csv):
    """Add a row to the table, re-read first: several searches may share it (disjoint
    --trials, one thread each, on a machine with several cores)."""
    rows = [
        r
        for r in helpers.read_csv(path)
        if (r["trial"], r["rung"]) != (row["trial"], str(row["rung"]))
    ]
    helpers.write_csv(path, [*rows, row], COLUMNS)
    if extra_csv:  # the same table, as atomically
        extra_csv.parent.mkdir(parents=True, exist_ok=True)
        helpers.write_csv(extra_csv, [*rows, row], COLUMNS)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=helpers.given_path, required=True, help="the search's folder")
    parser.add_argument(
        "--rungs", type=helpers.non_negative_int, nargs="*", help="which rungs (default: all)"
    )
    parser.add_argument(
        "--trials", nargs="*", choices=list(TRIALS), help="a subset of TRIALS (default: all)"
    )
    parser.add_argument(
        "--budgets",
        type=helpers.positive_float,
        nargs="*",
        help="CPU minutes per rung (default: %(default)s)",
    )
    # one thread: a trial's budget is CPU seconds, which buy less training when threads
    # wait for each other, and searches with disjoint --trials run side by side, one a core
    helpers.add_threads_flag(parser, default=1)
    parser.add_argument("--csv", type=helpers.given_path, help="also copy the table here")
    helpers.add_data_dir_flag(parser)
    return parser.parse_args(argv)


@helpers.user_errors_exit_2("recipe_search.py")
def main(argv=None):
    args = parse_args(argv)
    helpers.set_threads(args.threads)
    pairs = helpers.load_multi30k("train", data_dir=args.data_dir)
    val_pairs = helpers.load_multi30k("val", data_dir=args.data_dir)
    tokenizer_for = helpers.tokenizers(pairs, args.out)  # one vocabulary per size, on disk
    with helpers.log_to(args.out / "search.log", echo=None) as log:
        alive = list(args.trials or TRIALS)
        for rung, minutes in enumerate(args.budgets or BUDGETS_MINUTES):
            if args.rungs is not None and rung not in args.rungs:
                continue
            scores = {}
            for trial in alive:
                row = rung_row(
                    args,
                    trial,
                    rung,
                    minutes=minutes,
                    data=(pairs, val_pairs),
                    tokenizer_for=tokenizer_for,
                    log=log,
                )
                scores[trial] = (float(row["val_bleu"]), -float(row["val_loss"]))
            alive = sorted(alive, key=scores.get, reverse=True)[: max(1, len(alive) // 3)]
            log(f"rung {rung} done; promoted: {alive}")
    return 0


def rung_row(args, trial, rung, *, minutes, data, tokenizer_for, log):
    """The table's row of `trial` at `rung`: read back when the table has it, otherwise
    trained to the rung's budget, scored and recorded."""
    table = args.out / "trials.csv"
    done = [r for r in helpers.read_csv(table) if r["trial"] == trial and int(r["rung"]) == rung]
    if done:
        return done[0]
    pairs, val_pairs = data
    config = profiles.apply_changes(START, TRIALS[trial])
    wall = time.perf_counter()
    folder = args.out / "trials" / folder_name(trial)
    tokenizer = tokenizer_for(config.vocab_size)
    cpu = train_until(
        folder, config, minutes * 60, tokenizer=tokenizer, pairs=pairs, val_pairs=val_pairs, log=log
    )
    payload = at.read_checkpoint(folder / "checkpoint.pt")  # its format is checked on resume
    last = payload["validations"][-1]
    model, _ = at.translator_from(payload)
    row = {
        "trial": trial,
        "rung": rung,
        "budget_min": f"{minutes:g}",  # 20, not 20.0
        "step": last["step"],
        "cpu_seconds": round(cpu, 1),
        "wall_seconds": round(time.perf_counter() - wall, 1),
        "tokens_seen": last["tokens_seen"],
        "epochs": round(last["tokens_seen"] / epoch_tokens(pairs, tokenizer), 2),
        **{k: last[k] for k in ("val_loss", "val_ppl", "val_bleu")},
        "bleu_sentences": last["bleu_sentences"],
        "params": at.count_parameters(model),
        "changes": json.dumps(TRIALS[trial]),
        "command": helpers.command_for(config),
        "hardware": hardware.hardware_description(),
    }
    record(row, table, args.csv)
    log(f"rung {rung} {trial}: {row}")
    return row


if __name__ == "__main__":
    sys.exit(main())
