"""Attention weights of a trained model, for the paper's Figures 3-5 (chapter 7).

    python code/attention_maps.py --checkpoint results/multi30k/averaged.pt \\
        --out results/multi30k/attention.json --also runs/multi30k/checkpoint-00*.pt

For each of a few Multi30k validation sentences (chosen for German word order: separable
verbs, verb-final subordinate clauses, relative and possessive pronouns, compounds) the
model first translates the sentence (beam search, §6.1), then runs one teacher-forced
forward pass on its own translation on the reference attention path, so the decoder's
weights show what the model attended to while producing that output. The JSON holds, per
sentence, the source and target tokens and every layer x head weight matrix of encoder
self-attention, decoder self-attention and encoder-decoder attention, rounded to 3
decimals. It also stores per-head statistics over the first 300 validation sentences
(`attention_analysis.statistics`), the same numbers for uniform attention as a baseline,
and, for each snapshot given with --also and for the last, the statistics and the weights
of the marked links, to show which findings hold from one snapshot to the next.

Row i of the decoder's matrices is the query at decoder input position i (the tokens
`target_input`: <s> y_1 ... y_n-1); that position produces `target_output[i]`
(y_1 ... y_n, the last usually </s>). Columns are keys: source tokens (`source`, ending in
</s>) for encoder self-attention and encoder-decoder attention, `target_input` for
decoder self-attention.
"""

import argparse
import json
import sys

import annotated_transformer as at
import safe_files
import script_helpers as helpers
from attention_analysis import extract, statistics, to_json, uniform_like

# Multi30k validation sentences (index into the split), what each is meant to show, and the
# source-side links to measure: (from word, to word, kind), the verb and its separated
# particle (Figure 3's "making ... more difficult") or a pronoun and its antecedent (Figure 4).
SENTENCES = [
    ("val", 500, "separable verb 'zieht ... an' (puts on)", [("zieht", "an", "verb-particle")]),
    (
        "val",
        953,
        "separable verb 'nehmen ... auf' across 6 words; 'seine' refers to 'Sohn'",
        [("nehmen", "auf", "verb-particle"), ("seine", "Sohn", "pronoun-antecedent")],
    ),
    ("val", 192, "separable 'auf ... zu' (towards)", [("rennt", "zu", "verb-particle")]),
    ("val", 26, "separable 'lächelt ... zu' (smiles at)", [("lächelt", "zu", "verb-particle")]),
    (
        "val",
        157,
        "verb-final clause after 'während'; 'er' refers to 'Mann'",
        [("er", "Mann", "pronoun-antecedent")],
    ),
    (
        "val",
        593,
        "verb-final clause; possessive 'seine' (his) refers to 'Mann'",
        [("seine", "Mann", "pronoun-antecedent")],
    ),
    (
        "val",
        774,
        "relative pronoun 'das' refers to 'Kind'; verb-final 'trägt'",
        [("das", "Kind", "pronoun-antecedent")],
    ),
    ("val", 868, "verb-final 'Schlagzeug spielt' (plays drums)", []),
]


def find_links(tokens, links):
    """Resolve (from word, to word, kind) to token positions: the first token equal to each
    word (a word the tokenizer split is not found and its link is dropped)."""
    resolved = []
    for word_from, word_to, kind in links:
        if word_from in tokens and word_to in tokens:
            resolved.append([tokens.index(word_from), tokens.index(word_to), kind])
    return resolved


def analyse(checkpoint, chosen, sample, *, beam_size=4, alpha=0.6):
    """One snapshot: the chosen sentences' records (their links resolved) and their links'
    weights, and the head statistics over the `sample` sentences with the uniform-attention
    baseline. Returns a dict: checkpoint, step, label (the step, or "average" for weights
    averaged over snapshots, whose step is their last), config, records, links, statistics,
    uniform."""
    payload = at.read_checkpoint(checkpoint)  # also its step, configuration and averaged steps
    model, tokenizer = at.translator_from(payload)
    records = extract(
        model, tokenizer, [de for *_, de, _ in chosen], beam_size=beam_size, alpha=alpha
    )
    for record, (split, i, why, links, _, en) in zip(records, chosen):
        resolved = find_links(record["source"], links)
        record.update(split=split, index=i, shows=why, reference=en, links=resolved)
    sample_records = [
        record
        for start in range(0, len(sample), 50)
        for record in extract(
            model, tokenizer, sample[start : start + 50], beam_size=beam_size, alpha=alpha
        )
    ]
    uniform = statistics(map(uniform_like, sample_records))
    return {
        "checkpoint": str(checkpoint),
        "step": payload.get("step"),
        "label": "average" if payload.get("averaged_steps") else str(payload.get("step")),
        "config": payload["config"],
        "records": records,
        "links": link_weights(records),
        "statistics": {"sentences": len(sample_records), **statistics(sample_records)},
        "uniform": {kind: rows[0] for kind, rows in uniform.items()},
    }


def link_weights(records):
    """For each marked link, the encoder self-attention weight from its first word to its
    second in every layer and head: [{"sentence", "link", "kind", "weights" (N x h)}]."""
    return [
        {
            "sentence": record["index"],
            "link": f"{record['source'][query]} → {record['source'][key]}",
            "kind": kind,
            "weights": record["attention"]["encoder_self"][:, :, query, key]
            .round(decimals=3)
            .tolist(),
        }
        for record in records
        for query, key, kind in record["links"]
    ]


@helpers.user_errors_exit_2("attention_maps.py")
def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    helpers.add_checkpoint_flag(parser)
    parser.add_argument("--out", type=helpers.given_path, required=True)
    parser.add_argument(
        "--also",
        type=helpers.given_path,
        nargs="*",
        default=[],
        help="earlier snapshots of the same run: their link weights and head statistics are "
        "stored too, to show which findings hold from one snapshot to the next",
    )
    helpers.add_data_dir_flag(parser)
    parser.add_argument("--beam-size", type=helpers.positive_int_flag, default=4)
    parser.add_argument("--alpha", type=helpers.non_negative_float, default=0.6)
    parser.add_argument(
        "--sample",
        type=helpers.positive_int_flag,
        default=300,
        help="validation sentences for the head statistics",
    )
    args = parser.parse_args(argv)
    helpers.set_threads(1)
    splits = {
        split: helpers.load_multi30k(split, data_dir=args.data_dir) for split, *_ in SENTENCES
    }
    chosen = [(split, i, why, links, *splits[split][i]) for split, i, why, links in SENTENCES]
    val = splits.get("val") or helpers.load_multi30k("val", data_dir=args.data_dir)
    sample = [de for de, _ in val[: args.sample]]
    options = {"beam_size": args.beam_size, "alpha": args.alpha}
    paths = [*args.also, args.checkpoint]
    for path in paths:  # before minutes of decoding, not after
        if not path.is_file():
            raise FileNotFoundError(f"no checkpoint at {path}; train one with code/train.py")
    analyses = [analyse(checkpoint, chosen, sample, **options) for checkpoint in paths]
    drawn = analyses[-1]  # --checkpoint: the snapshot whose weights are stored
    fields = ("checkpoint", "step", "label", "links", "statistics")
    snapshots = [{field: analysis[field] for field in fields} for analysis in analyses]
    records = drawn["records"]
    data = to_json(
        records,
        statistics=drawn["statistics"],
        uniform=drawn["uniform"],
        snapshots=snapshots,
        checkpoint=drawn["checkpoint"],
        step=drawn["step"],
        config=drawn["config"],
        decoding=at.decoding_label(args.beam_size, args.alpha),
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with safe_files.atomic_file(args.out) as file:
        file.write(json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n")
    size = args.out.stat().st_size
    print(f"wrote {args.out} ({size / 1e6:.2f} MB): {len(records)} sentences, step {data['step']}")
    for record in records:
        print(f"  {record['text']}\n    -> {record['translation']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
