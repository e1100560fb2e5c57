"""code/scoring.py and code/compare.py: the book's one rule for comparing translators. Stored
hypotheses score as the table says; paired tests are sacreBLEU's, checked against BLEU
computed directly and against cases whose answer is known (a system against itself, the
references against a damaged copy); mean and SD by hand."""

import json
import math

import pytest
import sacrebleu

import compare
import scoring
import script_helpers as helpers

REFERENCES = [
    "A dog runs across the grass.",
    "Two men are playing football in a park.",
    "A woman in a red coat is reading a book.",
    "Children are swimming in the lake.",
    "A man rides a bicycle down the street.",
    "Three girls are dancing on a stage.",
    "An old man sits on a bench.",
    "A black cat sleeps on the sofa.",
] * 5  # 40 sentences: enough for the tests to tell a real difference from none


def damaged(sentences):
    """Every sentence with its last two words dropped."""
    return [" ".join(s.split()[:-2]) + "." for s in sentences]


def store(folder, hypotheses, settings=(("val", "greedy", "averaged"),)):
    for split, decoding, weights in settings:
        scoring.write_hypotheses(
            folder, hypotheses, split=split, decoding=decoding, weights=weights
        )
    return folder


def test_hypotheses_are_stored_a_line_each_and_read_back(tmp_path):
    lines = ["A dog.", "", "Ünïcode — fine."]
    path = scoring.write_hypotheses(
        tmp_path, lines, split="test2016", decoding="beam", weights="last"
    )
    assert path == tmp_path / "hypotheses" / "test2016.beam.last.txt"
    assert (
        path.read_text(encoding="utf-8") == "A dog.\n\nÜnïcode — fine.\n"
    )  # sacrebleu -i reads it
    assert (
        scoring.read_hypotheses(tmp_path, split="test2016", decoding="beam", weights="last")
        == lines
    )
    assert scoring.stored_settings(tmp_path) == [("test2016", "beam", "last")]


@pytest.mark.parametrize(
    "setting, named",
    [
        ({"split": "test", "decoding": "beam", "weights": "last"}, "split='test'"),
        ({"split": "val", "decoding": "beam 4", "weights": "last"}, "decoding='beam 4'"),
        ({"split": "val", "decoding": "beam", "weights": "avg"}, "weights='avg'"),
    ],
)
def test_a_setting_outside_the_protocol_is_named(tmp_path, setting, named):
    with pytest.raises(scoring.ScoringError, match=named):
        scoring.hypotheses_path(tmp_path, **setting)


def test_a_hypothesis_with_a_line_break_is_refused(tmp_path):
    with pytest.raises(scoring.ScoringError, match="line break"):
        store(tmp_path, ["two\nlines"])
    assert not (tmp_path / "hypotheses" / "val.greedy.averaged.txt").exists()


def test_missing_hypotheses_say_which_command_makes_them(tmp_path):
    with pytest.raises(scoring.ScoringError, match="python code/evaluate.py"):
        scoring.read_hypotheses(tmp_path, split="val", decoding="beam", weights="averaged")


def test_paired_tests_report_sacrebleus_scores_and_their_difference():
    worse = damaged(REFERENCES)
    row = scoring.paired_tests(REFERENCES, ("damaged", worse), [("perfect", REFERENCES)])[0]
    direct = {
        name: sacrebleu.corpus_bleu(h, [REFERENCES]).score
        for name, h in (("damaged", worse), ("perfect", REFERENCES))
    }
    assert direct["perfect"] == pytest.approx(100.0) and direct["damaged"] < 70
    assert row["system BLEU"] == round(direct["perfect"], 2)
    assert row["baseline BLEU"] == round(direct["damaged"], 2)
    assert row["difference"] == pytest.approx(direct["perfect"] - direct["damaged"], abs=0.01)
    # a difference of 30+ BLEU on 40 sentences: both tests reject "no difference"
    assert row["bootstrap p"] < 0.01 and row["randomisation p"] < 0.01


def test_two_systems_equal_in_total_are_no_difference():
    # each sentence twice; one system damages the first copy, the other the second: the
    # same corpus statistics, different sentences, so only the tests' shuffles differ
    twice = [s for s in REFERENCES[:8] for _ in (0, 1)] * 3
    first = [damaged([s])[0] if i % 2 == 0 else s for i, s in enumerate(twice)]
    second = [damaged([s])[0] if i % 2 == 1 else s for i, s in enumerate(twice)]
    row = scoring.paired_tests(twice, ("first", first), [("second", second)])[0]
    assert row["difference"] == 0 and first != second
    assert row["bootstrap p"] > 0.2 and row["randomisation p"] > 0.5  # far from 0.05


def test_paired_tests_need_one_hypothesis_per_reference_and_distinct_names():
    with pytest.raises(scoring.ScoringError, match="one hypothesis per reference"):
        scoring.paired_tests(REFERENCES, ("a", REFERENCES), [("b", REFERENCES[:-1])])
    with pytest.raises(scoring.ScoringError, match="distinct names"):
        scoring.paired_tests(REFERENCES, ("a", REFERENCES), [("a", REFERENCES)])


def test_compare_runs_tests_every_setting_all_runs_stored(tmp_path):
    both = (("val", "greedy", "averaged"), ("test2016", "beam", "averaged"))
    base = store(tmp_path / "base", damaged(REFERENCES), both)
    other = store(tmp_path / "other", REFERENCES, both + (("val", "beam", "last"),))
    rows = scoring.compare_runs({"val": REFERENCES, "test2016": REFERENCES}, base, [other])
    assert [(r["split"], r["decoding"], r["weights"]) for r in rows] == [
        ("val", "greedy", "averaged"),
        ("test2016", "beam", "averaged"),
    ]  # val first; the setting only one run stored is left out
    assert all(r["difference"] > 30 for r in rows)


def test_mean_and_sd_are_the_sample_statistics():
    mean, sd = scoring.mean_and_sd([40.92, 40.21, 40.25])
    assert mean == pytest.approx((40.92 + 40.21 + 40.25) / 3)
    by_hand = math.sqrt(sum((x - mean) ** 2 for x in (40.92, 40.21, 40.25)) / 2)  # n - 1
    assert sd == pytest.approx(by_hand)
    assert math.isnan(scoring.mean_and_sd([41.0])[1])
    with pytest.raises(scoring.ScoringError):
        scoring.mean_and_sd([])


def test_compare_command_prints_both_tests_and_the_spread(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        helpers, "load_multi30k", lambda split, data_dir=None: [("de", t) for t in REFERENCES]
    )
    base = store(tmp_path / "base", damaged(REFERENCES))
    seeds = [
        store(tmp_path / f"s{i}", damaged(REFERENCES[: 8 * i]) + REFERENCES[8 * i :])
        for i in (1, 2)
    ]
    out = tmp_path / "rows.json"
    assert compare.main([str(base), *map(str, seeds), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "(paired bootstrap)" in printed and "(approximate randomisation)" in printed
    rows = json.loads(out.read_text())
    expected = [
        sacrebleu.corpus_bleu(s, [REFERENCES]).score
        for s in (damaged(REFERENCES[: 8 * i]) + REFERENCES[8 * i :] for i in (1, 2))
    ]
    assert [r["system BLEU"] for r in rows] == [round(e, 2) for e in expected]
    mean, sd = scoring.mean_and_sd([round(e, 2) for e in expected])
    assert f"{mean:.2f} ± {sd:.2f} (mean ± SD)" in printed


def test_compare_of_a_folder_without_hypotheses_says_what_to_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        helpers, "load_multi30k", lambda split, data_dir=None: [("de", t) for t in REFERENCES]
    )
    base = store(tmp_path / "base", REFERENCES)
    (tmp_path / "old").mkdir()
    assert compare.main([str(base), str(tmp_path / "old")]) == 2
    assert "score each with python code/evaluate.py" in capsys.readouterr().err


def test_holm_corrects_a_family_as_worked_by_hand():
    # p-values 0.01, 0.04, 0.03, 0.5 (m = 4): sorted 0.01 x 4 = 0.04, 0.03 x 3 = 0.09,
    # 0.04 x 2 = 0.08 -> kept at 0.09 (never below the previous), 0.5 x 1 = 0.5
    assert scoring.holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert scoring.holm([0.3, 0.6]) == [0.6, 0.6]  # capped at 1 and monotone
    assert scoring.holm([0.9, 0.8]) == [1.0, 1.0]
