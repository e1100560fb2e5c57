"""Compare translators scored by evaluate.py, on their stored hypotheses, with sacreBLEU's own
paired tests (chapter 6.1's protocol, code/scoring.py).

    python code/compare.py results/multi30k results/fast
    python code/compare.py results/multi30k results/fast results/fast-seed1 results/fast-seed2 \
        --split test2016 --decoding beam --weights averaged --json comparison.json

The first folder is the baseline; each other one is tested against it, for every setting
(set, decoding, weights) that all of them stored: both scores, the difference (the other
minus the baseline), each score's 95% bootstrap interval, and the p-values of paired
bootstrap resampling (1000 resamples, as Moses' script computes it) and approximate
randomisation (10 000 trials, two-sided), computed by sacrebleu.significance on the same
sentences. With several folders (runs of one
recipe at several seeds), it also prints their mean and SD. The references are Multi30k's,
read from --data-dir ($MULTI30K_DIR, else the verified download).
"""

import argparse
import sys

import safe_files
import scoring
import script_helpers as helpers


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("baseline", type=helpers.given_path, help="an evaluate.py --out folder")
    parser.add_argument(
        "systems", type=helpers.given_path, nargs="+", help="folders to test against it"
    )
    parser.add_argument("--split", choices=scoring.SPLITS, help="only this set")
    parser.add_argument("--decoding", choices=scoring.DECODINGS, help="only this decoding")
    parser.add_argument("--weights", choices=scoring.WEIGHTS, help="only these weights")
    parser.add_argument("--json", type=helpers.given_path, metavar="FILE", help="also write rows")
    helpers.add_data_dir_flag(parser)
    return parser.parse_args(argv)


@helpers.user_errors_exit_2("compare.py")
def main(argv=None):
    args = parse_args(argv)
    try:
        return compare(args)
    except scoring.ScoringError as error:  # a folder not scored by the protocol, and so on
        print(f"compare.py: {error}", file=sys.stderr)
        return 2


def compare(args):
    references = {
        split: [target for _, target in helpers.load_multi30k(split, data_dir=args.data_dir)]
        for split in scoring.SPLITS
    }
    rows = scoring.compare_runs(references, args.baseline, args.systems)
    wanted = {"split": args.split, "decoding": args.decoding, "weights": args.weights}
    rows = [r for r in rows if all(v is None or r[k] == v for k, v in wanted.items())]
    if not rows:
        raise scoring.ScoringError(f"no stored setting matches {wanted}")
    print(f"baseline {args.baseline}; difference = system minus baseline (sacreBLEU, cased)")
    for row in rows:
        print(
            f"{row['split']:9} {row['decoding']:7} {row['weights']:9} {row['system']}: "
            f"{row['system BLEU']:6.2f} (±{row['system 95% CI ±']:.2f}) against "
            f"{row['baseline BLEU']:6.2f} (±{row['baseline 95% CI ±']:.2f}): "
            f"{row['difference']:+.2f}, p = {row['bootstrap p']:.4f} (paired bootstrap), "
            f"{row['randomisation p']:.4f} (approximate randomisation)"
        )
    if len(args.systems) > 1:
        settings = sorted({(r["split"], r["decoding"], r["weights"]) for r in rows})
        for split, decoding, weights in settings:
            same = [
                r
                for r in rows
                if (r["split"], r["decoding"], r["weights"]) == (split, decoding, weights)
            ]
            mean, sd = scoring.mean_and_sd(r["system BLEU"] for r in same)
            gap, gap_sd = scoring.mean_and_sd(r["difference"] for r in same)
            print(
                f"{split:9} {decoding:7} {weights:9} over {len(same)} systems: "
                f"{mean:.2f} ± {sd:.2f} (mean ± SD); difference {gap:+.2f} ± {gap_sd:.2f}"
            )
    if args.json is not None:
        safe_files.write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
