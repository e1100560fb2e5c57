"""Table 3 of the paper (§6.2) re-run on Multi30k: each paper row's change at each scale
(SCALES: the CPU recipe, the paper's base model on a GPU, a toy), one variant trained and
scored (run_variant), and the tables chapter 6.2 shows (paper_table, scaled_rows, compare,
paired_changes). code/variations.py runs the sweep."""

import math
import tempfile
import time
from dataclasses import dataclass, replace

import pandas as pd

import annotated_transformer as at
import fast_decoding as fd
import hardware
import profiles
import script_helpers as helpers
import training_runs as training


@dataclass(frozen=True, kw_only=True)
class Scale:
    """A base configuration, each Table 3 row's change at that size (by the paper's label;
    rows missing here are not run), and how the runs are scored."""

    name: str
    base: profiles.RunConfig
    rows: dict
    beam_size: int
    bleu_sentences: int | None  # the first this many val sentences; None: all of val
    note: str


# Each paper row's change, scaled to the CPU base (N=3, d_model=256, h=8, d_k=32, d_ff=512,
# smoothing 0.2): the same field(s), moved in the same direction by about the same factor.
CPU_ROWS = {
    "base": {},
    "(A) h=1, d_k=512, d_v=512": {"h": 1, "d_k": 256, "d_v": 256},
    "(A) h=4, d_k=128, d_v=128": {"h": 4, "d_k": 64, "d_v": 64},
    "(A) h=16, d_k=32, d_v=32": {"h": 16, "d_k": 16, "d_v": 16},
    "(A) h=32, d_k=16, d_v=16": {"h": 32, "d_k": 8, "d_v": 8},
    "(B) d_k=16": {"d_k": 8},
    "(B) d_k=32": {"d_k": 16},
    # the paper's depths 2, 4 and 8 around its 6 are a third, two thirds and four thirds of
    # it: 1, 2 and 4 around our 3
    "(C) N=2": {"N": 1},
    "(C) N=4": {"N": 2},
    "(C) N=8": {"N": 4},
    "(C) d_model=256, d_k=32, d_v=32": {"d_model": 128, "d_k": 16, "d_v": 16},
    "(C) d_model=1024, d_k=128, d_v=128": {"d_model": 512, "d_k": 64, "d_v": 64},
    "(C) d_ff=1024": {"d_ff": 256},
    "(C) d_ff=4096": {"d_ff": 1024},
    "(D) dropout=0.0": {"dropout": 0.0},
    "(D) dropout=0.2": {"dropout": 0.2},
    # the paper's base smooths with 0.1 and its rows try none and twice as much; ours
    # smooths with 0.2 (chosen on val, chapter 6.1)
    "(D) smoothing=0.0": {"smoothing": 0.0},
    "(D) smoothing=0.2": {"smoothing": 0.4},
    # a 256-row table covers every Multi30k sentence; 5000 rows would add 2.6M parameters
    # (half the base model) that are never trained
    "(E) positions=learned": {"positions": "learned", "max_len": 256},
}

SCALES = {
    "cpu": Scale(
        name="cpu",
        base=replace(profiles.PROFILES["multi30k"], max_steps=2000),
        rows=CPU_ROWS,
        beam_size=1,
        bleu_sentences=None,
        note="CPU scale: the multi30k recipe for 2000 steps, about 27 minutes of one core",
    ),
    "gpu": Scale(
        name="gpu",
        base=profiles.PROFILES["base"],
        rows={row.label: row.changes for row in at.TABLE3_ROWS},
        beam_size=4,
        bleu_sentences=None,
        note="GPU scale: the paper's base model and rows, on Multi30k",
    ),
    "tiny": Scale(
        name="tiny",
        base=replace(profiles.PROFILES["tiny"], vocab_size=300, max_tokens=300, max_steps=20),
        rows=CPU_ROWS,
        beam_size=1,
        bleu_sentences=16,
        note="tiny toy model for tests and the chapter's live check; not a result",
    ),
}

COLUMNS = [
    "row",
    "group",
    "changes",
    "seed",
    "N",
    "d_model",
    "d_ff",
    "h",
    "d_k",
    "d_v",
    "dropout",
    "smoothing",
    "positions",
    "params",
    "val_ppl",
    "val_bleu",
    "bleu_sentences",
    "decoding",
    "steps",
    "max_tokens",
    "vocab_size",
    "warmup_steps",
    "lr_factor",
    "train_pairs",
    "train_seconds",
    "cpu_seconds",
    "hardware",
    "scale",
]
# the columns that say which run a CSV row is: a run with the same ones is not repeated
IDENTITY = [
    "row",
    "changes",
    "seed",
    "steps",
    "max_tokens",
    "vocab_size",
    "warmup_steps",
    "lr_factor",
    "train_pairs",
    "scale",
    "decoding",
]


def describe(changes):
    """A row's changes as text, e.g. "h=1 d_k=128 d_v=128"; "" for the base row."""
    return " ".join(f"{k}={v}" for k, v in changes.items())


def group_of(label):
    """The paper's group (base, A to E, big) of a row, by its label (Table3Row.label)."""
    return {row.label: row.group for row in at.TABLE3_ROWS}[label]


def run_variant(
    label, changes, base, *, train_pairs, val_pairs, scale, device="cpu", log=print, tokenizer=None
):
    """Train one Table 3 variant, the TrainConfig `base` with `changes` applied
    (profiles.apply_changes), from scratch (training.train, in a temporary folder, with
    `tokenizer` or one learned from the pairs) and score it on val pairs as `scale` says:
    validation_perplexity on all of them, sacreBLEU on the first scale.bleu_sentences (all
    when None), decoding greedily (scale.beam_size 1) or with beam search. Returns the
    run's CSV row as a dict with the keys of COLUMNS."""
    config = profiles.apply_changes(base, changes)
    log(f"{label} (seed {config.seed}): {helpers.command_for(config)}")
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        model, tokenizer, _ = training.train(
            config, train_pairs, folder, tokenizer=tokenizer, device=device, log=log
        )
    train_seconds = time.perf_counter() - wall_start
    model.eval()
    ppl = at.validation_perplexity(model, at.encode_pairs(val_pairs, tokenizer), config.max_tokens)
    scored = val_pairs[: scale.bleu_sentences]
    bleu = fd.fast_evaluate_bleu(model, tokenizer, scored, beam_size=scale.beam_size)["bleu"]
    m = config.model
    row = {
        "row": label,
        "group": group_of(label),
        "changes": describe(changes),
        "seed": config.seed,
        "N": m.N,
        "d_model": m.d_model,
        "d_ff": m.d_ff,
        "h": m.h,
        "d_k": m.d_k or m.d_model // m.h,
        "d_v": m.d_v or m.d_model // m.h,
        "dropout": m.dropout,
        "smoothing": config.smoothing,
        "positions": m.positions,
        "params": at.count_parameters(model),
        "val_ppl": round(ppl, 2),
        "val_bleu": bleu,
        "bleu_sentences": len(scored),
        "decoding": at.decoding_label(scale.beam_size),
        "steps": config.max_steps,
        "max_tokens": config.max_tokens,
        "vocab_size": config.vocab_size,
        "warmup_steps": config.warmup_steps,
        "lr_factor": config.lr_factor,
        "train_pairs": len(train_pairs),
        "train_seconds": round(train_seconds, 1),
        "cpu_seconds": round(time.process_time() - cpu_start, 1),
        "hardware": hardware.hardware_description(device),
        "scale": scale.name,
    }
    log(
        f"{label}: {row['params']:,} parameters, val PPL {row['val_ppl']}, "
        f"val BLEU {row['val_bleu']}, {row['train_seconds']} s training, "
        f"{row['cpu_seconds']} s CPU in all"
    )
    return row


def paper_table(rows):
    """Table 3 as the paper prints it, one line per Table3Row (by its label): perplexity and
    BLEU on newstest2013, parameters in millions ("" where the paper leaves the cell blank)
    and training steps."""
    return pd.DataFrame(
        [
            {
                "row": row.label,
                "PPL (dev)": row.ppl,
                "BLEU (dev)": row.bleu,
                "params ×10⁶": row.params_m or "",
                "steps": f"{row.steps // 1000}K",
            }
            for row in rows
        ]
    ).set_index("row")


def scaled_rows(scale):
    """What each of the paper's rows changes at `scale` (a Scale), by the paper's label; the
    base row described by the fields of its model."""
    m = scale.base.model
    base = f"N={m.N} d_model={m.d_model} d_ff={m.d_ff} h={m.h} d_k=d_v={m.d_k or m.d_model // m.h}"
    return pd.DataFrame(
        [
            {"paper's row": label, "ours": describe(changes) or base}
            for label, changes in scale.rows.items()
        ]
    ).set_index("paper's row")


def compare(results, paper_rows, rows=CPU_ROWS):
    """The sweep beside the paper, one line per row of `rows` (labels to changes): the paper's
    perplexity, BLEU and parameters (paper_rows: Table3Row by label) and its perplexity change
    from its base row in percent; ours from `results` (the CSV as a DataFrame, three or more
    seeds a row): what we changed, parameters, mean PPL and BLEU, the mean over seeds of the
    change from the base run of the same seed (PPL in percent, BLEU in points), the range of
    the PPL change as text and its extremes (lowest, highest)."""
    base = results[results["row"] == "base"].set_index("seed")
    lines = []
    for label, changes in rows.items():
        runs = results[results["row"] == label].set_index("seed")
        row = paper_rows[label]
        change = 100 * (runs["val_ppl"] / base["val_ppl"] - 1)  # per seed, same-seed base
        lines.append(
            {
                "row": label,
                "paper PPL": row.ppl,
                "paper BLEU": row.bleu,
                "paper params ×10⁶": row.params_m or "",
                "paper ΔPPL %": round(100 * (row.ppl / paper_rows["base"].ppl - 1), 1),
                "ours": describe(changes),
                "params": int(runs["params"].iloc[0]),
                "PPL": round(runs["val_ppl"].mean(), 2),
                "BLEU": round(runs["val_bleu"].mean(), 2),
                "ΔPPL %": round(change.mean(), 1),
                "ΔPPL % range": f"{change.min():.1f} to {change.max():.1f}",
                "ΔBLEU": round((runs["val_bleu"] - base["val_bleu"]).mean(), 2),
                "lowest": change.min(),
                "highest": change.max(),
            }
        )
    return pd.DataFrame(lines).set_index("row")


def paired_changes(results, column="val_ppl", percent=True):
    """Each row's change from the base run of the same seed, seed by seed, set against its own
    spread: a DataFrame indexed by row (base excluded, in the CSV's order) with one column per
    seed, then "mean", "sd" (over the seeds) and "t", the paired t statistic mean / (sd /
    sqrt(seeds)). Changes are in percent of the base run's value with `percent`, else in the
    column's units (BLEU points)."""
    base = results[results["row"] == "base"].set_index("seed")[column]
    runs = results[results["row"] != "base"].pivot(index="row", columns="seed", values=column)
    runs = runs.loc[results.loc[results["row"] != "base", "row"].unique()]
    change = 100 * (runs / base - 1) if percent else runs - base
    table = change.copy()
    table["mean"], table["sd"] = change.mean(axis=1), change.std(axis=1)
    table["t"] = table["mean"] / (table["sd"] / math.sqrt(change.shape[1]))
    return table
