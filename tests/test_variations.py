"""§6.2 Table 3: validation perplexity, the paper's rows as data, the rows scaled down for a
CPU, and the command line that trains them (code/variations.py)."""

import csv
import dataclasses
import math
import pathlib

import pytest
import torch

import annotated_transformer as at
import profiles
import script_helpers as helpers
import table3
import variations
from toy import toy_ids, toy_pairs

PAPER_BASE = at.TrainConfig(model=dataclasses.replace(at.BASE, share_embeddings=True))


def paper_scale_parameters(config, vocab=37000):
    """Parameters of the paper's model with its shared ~37000-piece vocabulary (§5.1),
    counted on the meta device: no memory, no time."""
    with torch.device("meta"):
        return at.count_parameters(at.build_model(vocab, vocab, config.model))


# ---- validation perplexity -----------------------------------------------------------


def test_validation_perplexity_is_exp_of_the_mean_unsmoothed_nll():
    torch.manual_seed(0)
    vocab = 23
    model = at.make_model(vocab, vocab, N=1, d_model=16, d_ff=32, h=2, dropout=0.3)
    data = toy_ids(17, vocab)
    model.eval()
    nll, tokens = 0.0, 0
    with torch.no_grad():
        for src, tgt in data:  # one sentence at a time: no padding at all
            src, tgt = torch.tensor([src]), torch.tensor([tgt])
            states = model(
                src,
                tgt[:, :-1],
                at.padding_mask(src, at.PAD_ID),
                at.subsequent_mask(tgt.size(1) - 1),
            )
            log_probs = model.generator(states)[0]
            nll -= log_probs.gather(1, tgt[0, 1:, None]).sum().item()
            tokens += tgt.size(1) - 1
    model.train()
    # small batches: several of them, with padding on both sides
    ppl = at.validation_perplexity(model, data, max_tokens=30)
    assert ppl == pytest.approx(math.exp(nll / tokens), rel=1e-5)
    assert model.training, "the model is returned in the mode it came in"


def test_a_uniform_model_has_the_vocabulary_size_as_perplexity():
    vocab = 31
    model = at.make_model(vocab, vocab, N=1, d_model=16, d_ff=32, h=2)
    torch.nn.init.zeros_(model.generator.projection.weight)
    assert at.validation_perplexity(model, toy_ids(9, vocab)) == pytest.approx(vocab)


def test_validation_perplexity_ignores_label_smoothing_and_padding():
    """The training loss with smoothing 0 is the same NLL, so exp(loss) is the perplexity."""
    torch.manual_seed(1)
    vocab = 19
    model = at.make_model(vocab, vocab, N=1, d_model=16, d_ff=32, h=2, dropout=0.0).eval()
    data = toy_ids(8, vocab, seed=3)
    batch = at.Batch.from_ids(data)
    with torch.no_grad():
        loss = at.forward_loss(model, batch, 0.0)[1].item() / batch.ntokens
    assert at.validation_perplexity(model, data, max_tokens=1000) == pytest.approx(
        math.exp(loss), rel=1e-5
    )
    with torch.no_grad():
        smoothed = at.forward_loss(model, batch, 0.1)[0].item()
    assert smoothed / batch.ntokens != pytest.approx(loss)


# ---- Table 3 as data -------------------------------------------------------------------


def test_table3_has_the_papers_rows():
    groups = [row.group for row in at.TABLE3_ROWS]
    assert [groups.count(g) for g in ("base", "A", "B", "C", "D", "E", "big")] == [
        1,
        4,
        2,
        7,
        4,
        1,
        1,
    ]
    assert len({row.label for row in at.TABLE3_ROWS}) == len(at.TABLE3_ROWS)
    base = at.TABLE3_ROWS[0]
    assert (base.label, base.ppl, base.bleu, base.params_m) == ("base", 4.92, 25.8, 65)


@pytest.mark.parametrize("row", at.TABLE3_ROWS, ids=lambda row: row.label)
def test_each_row_builds_a_valid_config_with_exactly_its_changes(row):
    config = profiles.apply_changes(PAPER_BASE, row.changes)
    for name, value in row.changes.items():
        where = config if name == "smoothing" else config.model
        assert getattr(where, name) == value
    unchanged = {
        f.name
        for f in dataclasses.fields(at.ModelConfig)
        if getattr(config.model, f.name) != getattr(PAPER_BASE.model, f.name)
    }
    assert unchanged <= set(row.changes)
    if row.group == "A":  # h * d_k = h * d_v = d_model: the same computation and parameters
        assert config.model.h * config.model.d_k == config.model.d_model
        assert paper_scale_parameters(config) == paper_scale_parameters(PAPER_BASE)


@pytest.mark.parametrize(
    "row", [r for r in at.TABLE3_ROWS if r.params_m], ids=lambda row: row.label
)
def test_parameter_counts_match_the_papers_with_a_vocabulary_of_about_41000(row):
    # the paper gives its vocabulary only as "about 37000": with 41 000 pieces every row comes
    # within about 0.5M of its whole-million count, but the big row, which no vocabulary fits
    config = profiles.apply_changes(PAPER_BASE, row.changes)
    ours = paper_scale_parameters(config, vocab=41_000) / 1e6
    if row.group == "big":
        assert ours - row.params_m == pytest.approx(5.3, abs=0.1)
    else:
        assert ours == pytest.approx(row.params_m, abs=0.55)


def test_the_big_row_is_counted_below_what_its_d_ff_adds_whatever_the_vocabulary():
    """big differs from (C) d_model=1024 only in d_ff (16 heads of 64 cost what 8 of 128 do):
    12 layers x (2 d_model d_ff + d_ff) more parameters, 50.4M, where the paper counts 45M."""
    rows = {row.label: row for row in at.TABLE3_ROWS}
    big, wide = rows["big"], rows["(C) d_model=1024, d_k=128, d_v=128"]
    for vocab in (32_000, 37_000, 41_000):
        counts = [
            paper_scale_parameters(profiles.apply_changes(PAPER_BASE, r.changes), vocab)
            for r in (big, wide)
        ]
        assert counts[0] - counts[1] == 12 * (2 * 1024 * 2048 + 2048)
    assert big.params_m - wide.params_m == 45


def test_smaller_d_k_has_fewer_parameters():
    """(B): only queries and keys shrink, 2 * d_model * h * (64 - d_k) per attention layer,
    of which there are 3N (encoder self, decoder self, encoder-decoder)."""
    base = paper_scale_parameters(PAPER_BASE)
    for d_k in (16, 32):
        fewer = base - paper_scale_parameters(profiles.apply_changes(PAPER_BASE, {"d_k": d_k}))
        assert fewer == 3 * 6 * 2 * 512 * 8 * (64 - d_k)


def test_learned_positions_add_one_table_per_stack():
    """(E): a trained (max_len, d_model) table for the encoder's input and one for the
    decoder's, in place of the fixed sinusoids, which have no parameters."""
    for config in (PAPER_BASE, table3.SCALES["cpu"].base):
        learned = profiles.apply_changes(config, {"positions": "learned"})
        extra = paper_scale_parameters(learned) - paper_scale_parameters(config)
        assert extra == 2 * config.model.max_len * config.model.d_model


def test_an_unknown_field_is_refused():
    with pytest.raises(ValueError, match="heads"):
        profiles.apply_changes(PAPER_BASE, {"heads": 4})


# ---- the rows at CPU scale -------------------------------------------------------------


# every row but big, a GPU model
CPU_LABELS = [r.label for r in at.TABLE3_ROWS if r.label != "big"]


def test_cpu_rows_cover_the_papers_rows_but_big():
    assert list(table3.CPU_ROWS) == CPU_LABELS


def value_of(config, name):
    """A field of a TrainConfig or of its model, with d_k and d_v resolved (None: d_model / h)."""
    if name == "smoothing":
        return config.smoothing
    value = getattr(config.model, name)
    return config.model.d_model // config.model.h if value is None else value


@pytest.mark.parametrize(
    "row", [r for r in at.TABLE3_ROWS if r.label in CPU_LABELS], ids=lambda row: row.label
)
def test_each_cpu_row_changes_the_papers_fields_in_the_papers_direction(row):
    ours, cpu_base = table3.CPU_ROWS[row.label], table3.SCALES["cpu"].base
    assert set(row.changes) <= set(ours)
    scaled, paper = (
        profiles.apply_changes(cpu_base, ours),
        profiles.apply_changes(PAPER_BASE, row.changes),
    )
    for name, value in row.changes.items():
        if isinstance(value, str):
            assert ours[name] == value
            continue
        ours_change = value_of(scaled, name) - value_of(cpu_base, name)
        paper_change = value_of(paper, name) - value_of(PAPER_BASE, name)
        assert ours_change * paper_change > 0, name
    if row.group == "A":
        assert scaled.model.h * scaled.model.d_k == scaled.model.d_model


# ---- the command line ------------------------------------------------------------------


@pytest.fixture
def toy_data(monkeypatch):
    monkeypatch.setattr(helpers, "load_multi30k", lambda split, data_dir=None: toy_pairs(40))
    monkeypatch.setenv("RAYON_NUM_THREADS", "1")
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_command_line_writes_the_csv_and_skips_finished_runs(tmp_path, toy_data, capsys):
    flags = ["--out", str(tmp_path), "--scale", "tiny", "--max-steps", "2", "--device", "cpu"]
    flags += ["--vocab-size", "60", "--seeds", "0", "1", "--rows", "base", "E", "--threads", "1"]
    assert variations.main(flags) == 0
    with open(tmp_path / "variations.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert list(rows[0]) == table3.COLUMNS
    assert [(r["row"], r["seed"]) for r in rows] == [
        ("base", "0"),
        ("base", "1"),
        ("(E) positions=learned", "0"),
        ("(E) positions=learned", "1"),
    ]
    for r in rows:
        assert r["steps"] == "2" and r["scale"] == "tiny" and r["decoding"] == "greedy"
        assert 1 < float(r["val_ppl"]) < 60 * 1.5
        assert 0 <= float(r["val_bleu"]) <= 100
    assert rows[2]["positions"] == "learned"
    assert int(rows[2]["params"]) - int(rows[0]["params"]) == 2 * 256 * 32
    assert (tmp_path / "variations.log").exists()
    capsys.readouterr()
    assert variations.main(flags) == 0  # again: nothing left to do
    assert capsys.readouterr().out.count("skipped") == 4
    with open(tmp_path / "variations.csv", newline="") as file:
        assert len(list(csv.DictReader(file))) == 4


def test_command_line_refuses_an_unknown_row(tmp_path, toy_data, capsys):
    assert variations.main(["--out", str(tmp_path), "--scale", "tiny", "--rows", "F"]) == 2
    assert "unknown row(s) F" in capsys.readouterr().err


def test_the_logged_train_py_command_rebuilds_the_variant():
    import script_helpers as helpers
    import train

    config = profiles.apply_changes(table3.SCALES["cpu"].base, {"h": 1, "d_k": 256, "d_v": 256})
    command = helpers.command_for(config)
    assert command.startswith("python code/train.py --profile quick")
    for flag in ("--h 1", "--d-k 256", "--d-v 256", "--N 3", "--vocab-size 5000"):
        assert flag in command
    args = train.parse_args(["--out", "x", *command.split()[2:]])
    assert train.config_from_args(args) == config


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--train-pairs", "0"], "--train-pairs: must be a positive integer"),  # not "all"
        (["--seeds", "0", "-1"], "--seeds: must be an integer >= 0"),
    ],
)
def test_bad_counts_are_refused_while_parsing(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        variations.parse_args(["--out", "o", *argv])
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_a_run_on_a_subset_of_the_pairs_is_not_reused_for_a_bigger_one(tmp_path, toy_data):
    flags = ["--out", str(tmp_path), "--scale", "tiny", "--max-steps", "2", "--rows", "base"]
    flags += ["--vocab-size", "60", "--seeds", "0", "--device", "cpu", "--threads", "1"]
    assert variations.main([*flags, "--train-pairs", "20"]) == 0
    assert variations.main([*flags, "--train-pairs", "30"]) == 0
    assert variations.main([*flags, "--train-pairs", "30"]) == 0  # this one is done
    with open(tmp_path / "variations.csv", newline="") as file:
        assert [r["train_pairs"] for r in csv.DictReader(file)] == ["20", "30"]


def test_the_shipped_table_has_every_column_that_identifies_a_run():
    # a finished run is recognised by these columns, so every stored row must carry them
    path = pathlib.Path(__file__).parent.parent / "results" / "table3" / "variations.csv"
    with open(path, newline="") as file:
        rows = list(csv.DictReader(file))
    assert rows and set(table3.IDENTITY) <= set(rows[0])
    empty = [(r["row"], k) for r in rows for k in table3.IDENTITY if not r[k]]
    assert set(empty) <= {("base", "changes")}  # the base row changes nothing
    assert {r["train_pairs"] for r in rows} == {"29000"}  # trained on all of Multi30k train


def test_the_charts_take_their_series_labels_and_title_from_the_caller():
    import plots

    series = ("the paper's rows", "rows of a run")
    changes = plots.table3_changes(
        ["(A)", "(B)"], [1.0, -2.0], [3.0, 4.0], series=series, title="t"
    )
    sizes = plots.ppl_vs_params(
        ["base", "(B)"], [1, 2], [3, 2], our_params=[1, 3], our_ppl=[5, 4], series=series, title="u"
    )
    for fig, title in ((changes, "t"), (sizes, "u")):
        ax = fig.axes[0]
        assert [text.get_text() for text in ax.get_legend().get_texts()] == list(series)
        assert ax.get_title() == title


def test_the_labels_of_the_parameters_chart_stay_inside_and_apart():
    import numpy as np

    import plots

    # nine rows, several of them close together: where chapter 6.2's labels used to collide
    labels = ["base", "d_k=8", "d_k=16", "N=1", "N=2", "N=4", "d_model=128 d_k=16 d_v=16"]
    labels += ["d_ff=256", "d_model=512 d_k=64 d_v=64"]  # the widest point, with a long label
    paper_params = [65, 58, 60, 36, 50, 80, 28, 53, 168]
    paper_ppl = [4.92, 5.16, 5.01, 6.11, 5.19, 4.88, 5.75, 5.12, 4.66]
    our_params = [5.2, 4.3, 4.6, 2.6, 3.9, 6.5, 2.0, 4.4, 15.2]
    our_ppl = [7.10, 7.99, 7.54, 7.43, 6.78, 9.10, 8.72, 7.30, 6.17]
    fig = plots.ppl_vs_params(
        labels, paper_params, paper_ppl, our_params=our_params, our_ppl=our_ppl
    )
    ax = fig.axes[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = {t.get_text(): t.get_window_extent(renderer) for t in ax.texts}
    assert sorted(boxes) == sorted(labels)
    frame = ax.get_window_extent(renderer)
    for name, box in boxes.items():  # inside the axes: nothing clipped, the figure not widened
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1, name
        assert frame.y0 <= box.y0 and box.y1 <= frame.y1, name
    names = list(boxes)
    for i, a in enumerate(names):  # no two labels overlap
        for b in names[i + 1 :]:
            assert not boxes[a].overlaps(boxes[b]), (a, b)
    # and no label covers a point other than its own
    points = ax.transData.transform(
        np.column_stack(
            [
                np.r_[np.divide(paper_params, 65), np.divide(our_params, 5.2)],
                np.r_[np.divide(paper_ppl, 4.92), np.divide(our_ppl, 7.10)],
            ]
        )
    )
    for k, name in enumerate(labels):
        own = points[len(labels) + k]
        for x, y in points:
            if (x, y) != tuple(own):
                assert not boxes[name].contains(x, y), name


# ---- the tables and charts of chapter 6.2 ----------------------------------------------


def made_up_results():
    """A sweep as the CSV holds it: the base row and two rows, three seeds each."""
    import pandas as pd

    runs = {"base": ([7.0, 8.0, 7.5], [35.0, 34.0, 36.0], 100)}
    runs["(B) d_k=16"] = ([7.7, 8.4, 8.25], [33.0, 33.0, 35.0], 80)
    runs["(C) N=2"] = ([6.3, 8.8, 7.5], [36.0, 34.0, 36.5], 60)
    lines = [
        {"row": row, "seed": seed, "val_ppl": ppl[seed], "val_bleu": bleu[seed], "params": n}
        for row, (ppl, bleu, n) in runs.items()
        for seed in range(3)
    ]
    return pd.DataFrame(lines)


MADE_UP_ROWS = {"base": {}, "(B) d_k=16": {"d_k": 8}, "(C) N=2": {"N": 1}}


def test_paper_table_prints_every_row_and_leaves_blank_parameter_cells_blank():
    table = table3.paper_table(at.TABLE3_ROWS)
    assert list(table.index) == [row.label for row in at.TABLE3_ROWS]
    assert table.loc["base"].tolist() == [4.92, 25.8, 65, "100K"]
    assert table.loc["(A) h=1, d_k=512, d_v=512", "params ×10⁶"] == ""
    assert table.loc["big", "steps"] == "300K"


def test_scaled_rows_describe_the_base_model_and_each_change():
    table = table3.scaled_rows(table3.SCALES["cpu"])
    assert list(table.index) == list(table3.CPU_ROWS)
    assert table.loc["base", "ours"] == "N=3 d_model=256 d_ff=512 h=8 d_k=d_v=32"
    assert table.loc["(C) N=2", "ours"] == "N=1"


def test_compare_sets_each_seed_against_the_base_run_of_the_same_seed():
    paper_rows = {row.label: row for row in at.TABLE3_ROWS}
    table = table3.compare(made_up_results(), paper_rows, MADE_UP_ROWS)
    assert list(table.index) == list(MADE_UP_ROWS)
    b = table.loc["(B) d_k=16"]
    # per seed +10%, +5%, +10% over the base run of that seed: mean 8.3, range 5 to 10
    assert b["ΔPPL %"] == pytest.approx(8.3) and (b["lowest"], b["highest"]) == pytest.approx(
        (5.0, 10.0)
    )
    assert b["ΔPPL % range"] == "5.0 to 10.0" and b["ΔBLEU"] == pytest.approx(-4 / 3, abs=0.01)
    assert (b["ours"], b["params"], b["PPL"], b["BLEU"]) == ("d_k=8", 80, 8.12, 33.67)
    assert (b["paper PPL"], b["paper params ×10⁶"]) == (5.16, 58)
    assert b["paper ΔPPL %"] == pytest.approx(round(100 * (5.16 / 4.92 - 1), 1))
    base = table.loc["base"]
    assert (base["ΔPPL %"], base["ΔBLEU"], base["ours"]) == (0, 0, "")


def test_paired_changes_set_each_seed_against_its_base_run_and_the_spread_of_the_changes():
    table = table3.paired_changes(made_up_results())
    assert list(table.index) == ["(B) d_k=16", "(C) N=2"]
    b = table.loc["(B) d_k=16"]
    # +10%, +5%, +10%: mean 8.33, sd 2.89, t = 8.33 / (2.89 / sqrt 3) = 5.0
    assert b.loc[[0, 1, 2]].tolist() == pytest.approx([10.0, 5.0, 10.0])
    assert (b["mean"], b["sd"], b["t"]) == pytest.approx((25 / 3, 5 / 3**0.5, 5.0))
    points = table3.paired_changes(made_up_results(), "val_bleu", percent=False)
    assert points.loc["(C) N=2", [0, 1, 2]].tolist() == pytest.approx([1.0, 0.0, 0.5])
    assert points.loc["(C) N=2", "t"] == pytest.approx(0.5 / (0.5 / 3**0.5))


def test_the_comparison_charts_draw_every_row_from_the_comparison_table():
    import plots

    paper_rows = {row.label: row for row in at.TABLE3_ROWS}
    table = table3.compare(made_up_results(), paper_rows, MADE_UP_ROWS)
    series = ("the paper's rows", "rows of a run")
    bars = plots.table3_comparison(table, 2.5, series, title="changes").axes[0]
    labels = [tick.get_text() for tick in bars.get_yticklabels()]
    assert labels == ["(B) d_k=16\nours: d_k=8", "(C) N=2\nours: N=1"]  # the base row left out
    assert bars.get_title() == "changes"
    sizes = plots.table3_sizes(table, series, "sizes").axes[0]
    assert sorted(text.get_text() for text in sizes.texts) == ["N=1", "base", "d_k=8"]
    assert [t.get_text() for t in sizes.get_legend().get_texts()] == list(series)


@pytest.mark.parametrize(
    "ours, label",
    [
        ("", "base"),
        ("d_k=8", "d_k=8"),
        ("d_model=128 d_k=16 d_v=16", "d_model=128"),
        ("N=1", "N=1"),
    ],
)
def test_a_size_point_is_labelled_by_what_its_row_changes(ours, label):
    import plots

    assert plots._short_change(ours) == label


def test_the_sweeps_flags_keep_its_gpu_steps_eager_and_its_recipe_the_cpu_scales():
    """Chapter 6.2 quotes the command of its GPU runs, whose steps were eager: the flags say
    so, and change nothing else of the recipe."""
    flags = variations.parse_args(["--out", "sweep", "--no-cuda-graphs", "--no-buckets"])
    assert helpers.given_changes(flags) == {"cuda_graphs": False, "buckets": False}
