"""Every stored result of a run or a measurement names the machine that made it, as
hardware.hardware_description does: a GPU, or a CPU with the instruction sets that
decide its speed here (AVX2, AVX-512, AVX-512 BF16, AMX) or the plain statement that they
were not recorded, and the torch version (and, on a CPU, the threads)."""

import csv
import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
STORED = [ROOT / "results", ROOT / "benchmarks" / "results"]
# files that hold no run or measurement of this book's code
EXEMPT = {
    "results/paper_table2.csv": "the paper's own Table 2",
    "results/multi30k/attention.json": "the attention of the shipped weights: no timing, "
    "and the weights' file names the run (results/multi30k/evaluation.json)",
}


def stored_files():
    return sorted(
        path
        for folder in STORED
        for path in folder.rglob("*")
        if path.suffix in (".json", ".csv") and path.is_file()
    )


def descriptions(path):
    """The machine descriptions a stored file carries (one per row of a table)."""
    if path.suffix == ".csv":
        with open(path, newline="") as file:
            return [row.get("hardware") for row in csv.DictReader(file)]
    data = json.loads(path.read_text())
    hardware = data.get("hardware")
    return [hardware["description"] if isinstance(hardware, dict) else hardware]


def names_the_machine(description):
    if not description or "torch" not in description:
        return False
    if "NVIDIA" in description:
        return True
    instruction_sets = re.search(r"\((AVX|[^)]*instruction sets not recorded)", description)
    return bool(instruction_sets) and "thread" in description


def test_the_rule_on_known_descriptions():
    assert names_the_machine("Intel(R) Xeon(R) Processor (AVX2/AVX-512/AMX), 2 threads, torch 2.13")
    assert names_the_machine("AMD EPYC (instruction sets not recorded), 1 thread, torch 2.13.0+cpu")
    assert names_the_machine("NVIDIA H100 80GB HBM3, TF32 products, torch 2.11.0+cu130")
    assert not names_the_machine("AMD EPYC (2-core VM, no GPU), trained on 1 thread")
    assert not names_the_machine("AMD EPYC, 1 threads, torch 2.13.0+cpu")


@pytest.mark.parametrize("path", stored_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_stored_result_names_its_machine(path):
    name = str(path.relative_to(ROOT))
    if name in EXEMPT:
        return
    found = descriptions(path)
    assert found and all(names_the_machine(d) for d in found), (name, sorted(set(map(str, found))))


def test_the_readme_quotes_the_scores_the_stored_runs_hold():
    """The README's headline figures are the one rule's, read here from the stored runs:
    the shipped translator at the alpha val chose, and fast's mean and SD over three seeds."""
    import statistics

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    shipped = json.loads((ROOT / "results" / "multi30k" / "evaluation.json").read_text())
    alpha = shipped["alpha"]
    beam = {r["set"]: r["sacreBLEU"] for r in shipped["results"] if r["decoding"] != "greedy"}
    assert f"It scores {beam['test2016']:.2f} sacreBLEU on test2016 (beam 4, α {alpha}" in readme
    assert f"val {beam['val']:.2f})" in readme and f"(α = {alpha}, which" in readme
    scores = []
    for name in ("fast", "fast-seed1", "fast-seed2"):
        run = json.loads((ROOT / "results" / name / "evaluation.json").read_text())
        averaged = [r for r in run["results"] if r["weights"] != "last"]
        scores += [
            r["sacreBLEU"] for r in averaged if r["set"] == "test2016" and r["decoding"] != "greedy"
        ]
    mean, sd = statistics.fmean(scores), statistics.stdev(scores)
    assert f"score {mean:.2f} ±\n  {sd:.2f} sacreBLEU on test2016" in readme


@pytest.mark.parametrize("run, profile", [("multi30k", "multi30k"), ("fast", "fast")])
def test_the_stored_runs_were_trained_with_the_profiles_of_their_names(run, profile):
    """Chapter 6.1 describes the profiles through the configs its stored runs recorded: each
    recorded field (those that define a run; the run-length fields are not recorded) is the
    profile's, the model's fields too."""
    import dataclasses

    import profiles

    recorded = json.loads((ROOT / "results" / run / "evaluation.json").read_text())["config"]
    expected = dataclasses.asdict(profiles.PROFILES[profile])
    assert {"model", "lr_factor", "smoothing", "max_tokens"} <= recorded.keys()
    assert recorded == {name: expected[name] for name in recorded}
