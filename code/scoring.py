"""The book's one rule for scoring and comparing translators (chapter 6.1).

Every translator the book sets beside another is scored by `code/evaluate.py` the same way:
greedy decoding and beam 4 at the length penalty that val chooses from ALPHA_GRID (chosen
with the averaged weights, then used for every beam row), the averaged weights and the last
weights where the run kept them, on Multi30k val and test2016, with sacreBLEU (cased, 13a).
Every hypothesis is stored, one line per sentence, in OUT/hypotheses/, so that anyone can
score them again (`sacrebleu REFERENCE -i HYPOTHESES`) and test a difference between two
runs on the very same sentences: `code/compare.py` runs sacreBLEU's own paired tests
(paired bootstrap resampling and approximate randomisation), and gives mean and SD over
seeds where a recipe has several runs. No torch here: comparing stored runs is instant.
"""

import math
import pathlib
import statistics

import sacrebleu
from sacrebleu.significance import PairedTest

import safe_files

# one grid for every run: 0.6 (§6.1's value) to 1.5; a run's alpha is the best on val
ALPHA_GRID = (0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5)
SPLITS = ("val", "test2016")
DECODINGS = ("greedy", "beam")
# beam 4 at §6.1's own alpha, stored for test2016 and the averaged weights only, never used
# to choose anything: the baseline of the paired test of what val's choice of alpha is worth
PAPER_ALPHA, PAPER_BEAM = 0.6, "beam-0.6"
WEIGHTS = ("averaged", "last")
BOOTSTRAP_RESAMPLES = 1000  # sacreBLEU's defaults for its two paired tests
RANDOMISATION_TRIALS = 10000
TEST_SEED = 12345  # sacreBLEU's own default seed: the same resamples on every machine


class ScoringError(ValueError):
    """A stored run cannot be compared as asked; the message says what to run."""


def hypotheses_path(folder, *, split, decoding, weights):
    """Where a scored run keeps one setting's hypotheses: FOLDER/hypotheses/
    <split>.<greedy|beam|beam-0.6>.<averaged|last>.txt, one detokenized sentence a line."""
    for name, value, allowed in (
        ("split", split, SPLITS),
        ("decoding", decoding, (*DECODINGS, PAPER_BEAM)),
        ("weights", weights, WEIGHTS),
    ):
        if value not in allowed:
            raise ScoringError(f"{name}={value!r}: use one of {', '.join(allowed)}")
    return pathlib.Path(folder) / "hypotheses" / f"{split}.{decoding}.{weights}.txt"


def write_hypotheses(folder, hypotheses, *, split, decoding, weights):
    """Store one setting's hypotheses, a line each, written whole or not at all."""
    if any("\n" in line for line in hypotheses):
        raise ScoringError("a hypothesis holds a line break: one sentence a line is the format")
    path = hypotheses_path(folder, split=split, decoding=decoding, weights=weights)
    path.parent.mkdir(parents=True, exist_ok=True)
    safe_files.write_text(path, "".join(line + "\n" for line in hypotheses))
    return path


def read_hypotheses(folder, *, split, decoding, weights):
    """One setting's stored hypotheses, a list of str."""
    path = hypotheses_path(folder, split=split, decoding=decoding, weights=weights)
    if not path.is_file():
        raise ScoringError(
            f"{path} does not exist: score the run by the protocol first "
            f"(python code/evaluate.py --run RUN --out {folder})"
        )
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def stored_settings(folder):
    """The (split, decoding, weights) settings whose hypotheses a scored run holds."""
    return [
        (split, decoding, weights)
        for split in SPLITS
        for decoding in DECODINGS
        for weights in WEIGHTS
        if hypotheses_path(folder, split=split, decoding=decoding, weights=weights).is_file()
    ]


def corpus_bleu(hypotheses, references):
    """Cased sacreBLEU (13a) of hypotheses against one reference each, as the runs score."""
    return sacrebleu.BLEU().corpus_score(list(hypotheses), [list(references)]).score


def paired_tests(references, baseline, systems):
    """sacreBLEU's paired tests of each of `systems` against `baseline`, on the same
    sentences: baseline and systems are (name, hypotheses). Returns a row per system with
    both scores, the difference (system minus baseline), the half-width of each score's 95%
    bootstrap interval, and the p-values of paired bootstrap resampling (1000 resamples;
    as Moses' script, the size of the difference against its spread under resampling) and
    of approximate randomisation (10 000 trials, two-sided)."""
    names = [baseline[0]] + [name for name, _ in systems]
    if len(set(names)) != len(names):
        raise ScoringError(f"systems need distinct names, got {names}")
    sizes = {name: len(hyps) for name, hyps in [baseline, *systems]}
    if set(sizes.values()) != {len(references)}:
        raise ScoringError(
            f"every system needs one hypothesis per reference ({len(references)}), got {sizes}"
        )
    refs = [list(references)]
    named = [(baseline[0], list(baseline[1]))] + [(n, list(h)) for n, h in systems]
    tests = {}
    for kind, samples in (("bs", BOOTSTRAP_RESAMPLES), ("ar", RANDOMISATION_TRIALS)):
        test = PairedTest(
            named, {"BLEU": sacrebleu.BLEU()}, refs, test_type=kind, n_samples=samples
        )
        _, results = test()
        tests[kind] = results["BLEU"]
    base = tests["bs"][0]
    rows = []
    for i, name in enumerate(names[1:], start=1):
        bootstrap, randomisation = tests["bs"][i], tests["ar"][i]
        rows.append(
            {
                "system": name,
                "baseline": baseline[0],
                "system BLEU": round(bootstrap.score, 2),
                "baseline BLEU": round(base.score, 2),
                "difference": round(bootstrap.score - base.score, 2),
                "system 95% CI ±": round(bootstrap.ci, 2),
                "baseline 95% CI ±": round(base.ci, 2),
                "bootstrap p": round(bootstrap.p_value, 4),
                "randomisation p": round(randomisation.p_value, 4),
            }
        )
    return rows


def compare_runs(references_by_split, baseline, systems, *, settings=None):
    """Paired tests of scored runs against a baseline run, for each setting (split, decoding,
    weights) that every one of them stored (or the `settings` given): rows as
    paired_tests', each with its setting. baseline and systems are folders of evaluate.py."""
    folders = [pathlib.Path(baseline), *map(pathlib.Path, systems)]
    if settings is None:
        common = set(stored_settings(folders[0]))
        for folder in folders[1:]:
            common &= set(stored_settings(folder))
        settings = sorted(common, key=lambda s: (SPLITS.index(s[0]), s[1], s[2]))
    if not settings:
        raise ScoringError(
            f"no setting has stored hypotheses in all of {', '.join(map(str, folders))}: "
            f"score each with python code/evaluate.py"
        )
    rows = []
    for split, decoding, weights in settings:
        setting = {"split": split, "decoding": decoding, "weights": weights}
        named = [(str(folder), read_hypotheses(folder, **setting)) for folder in folders]
        for row in paired_tests(references_by_split[split], named[0], named[1:]):
            rows.append({**setting, **row})
    return rows


def mean_and_sd(values):
    """Mean and sample standard deviation (n - 1) of the scores of runs of one recipe at
    several seeds; SD is nan for a single run."""
    values = [float(v) for v in values]
    if not values:
        raise ScoringError("mean_and_sd needs at least one value")
    sd = statistics.stdev(values) if len(values) > 1 else math.nan
    return statistics.fmean(values), sd


def holm(p_values):
    """Holm's step-down correction of a family of p-values (Holm, 1979): the smallest is
    multiplied by the family's size m, the next by m - 1, and so on, each kept at least as
    large as the one before it and at most 1. A test passes at level a when its corrected
    p-value is below a; the chance that any true null of the family is rejected stays <= a."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    corrected, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        corrected[i] = running
    return corrected
