"""code/attention_maps.py and code/attention_analysis.py: the attention weights extracted for
chapter 7 (Figures 3-5), their statistics and the tables the chapter shows."""

import json

import pytest
import torch

import annotated_transformer as at
import attention_analysis
import attention_maps

PAIRS = [
    ("Ein Mann zieht eine Jacke an.", "A man puts on a jacket."),
    ("Eine Frau singt, während ein Mann spielt.", "A woman sings while a man plays."),
    ("Ein Hund rennt durch das Gras.", "A dog runs through the grass."),
    ("Zwei Kinder spielen im Park.", "Two children play in the park."),
]
# of different lengths, so the batch is padded
SENTENCES = ["Ein Mann singt.", "Eine Frau zieht einem kleinen Hund eine Jacke an.", "Ein Hund"]


@pytest.fixture(scope="module")
def records():
    tokenizer = at.train_bpe(PAIRS, vocab_size=120)
    vocab = tokenizer.get_vocab_size()
    torch.manual_seed(0)
    model = at.make_model(vocab, vocab, N=2, d_model=32, d_ff=64, h=4, share_embeddings=True)
    sources = [tokenizer.encode(s).ids + [at.EOS_ID] for s in SENTENCES]
    model.eval()
    # greedy: an untrained model rarely ends by itself, and a beam to input length + 50
    # would make the test slow
    translations = at.translate(model, tokenizer, SENTENCES, beam_size=1)
    extracted = attention_analysis.extract(model, tokenizer, SENTENCES, beam_size=1)
    return model, tokenizer, sources, translations, extracted


def test_shapes_match_the_token_counts(records):
    model, _, _, _, extracted = records
    N, h = len(model.encoder.layers), model.encoder.layers[0].self_attn.h
    for record in extracted:
        S, T = len(record["source"]), len(record["target_output"])
        assert S == len(record["source_ids"]) and T == len(record["target_input"])
        assert record["target_input"][0] == "<s>" and record["source"][-1] == "</s>"
        assert record["attention"]["encoder_self"].shape == (N, h, S, S)
        assert record["attention"]["decoder_self"].shape == (N, h, T, T)
        assert record["attention"]["encoder_decoder"].shape == (N, h, T, S)


def test_rows_are_distributions_over_real_tokens(records):
    for record in records[-1]:
        for kind in attention_analysis.KINDS:
            weights = record["attention"][kind]
            assert (weights >= 0).all()
            sums = weights.sum(-1)  # cropped to the real keys: padding got no weight
            assert torch.allclose(sums, torch.ones_like(sums), atol=1e-5), kind


def test_padding_gets_no_weight():
    """The batch is padded to its longest sentence; what the crop removes must be zero."""
    torch.manual_seed(0)
    model = at.make_model(20, 20, N=1, d_model=16, d_ff=32, h=2).eval()
    sources, targets = [[5, 6, 7, at.EOS_ID], [5, at.EOS_ID]], [[8, 9, at.EOS_ID], [8]]
    short = attention_analysis.attention_weights(model, sources[1:], targets[1:])[0]
    batched = attention_analysis.attention_weights(model, sources, targets)[1]
    for kind in attention_analysis.KINDS:
        assert torch.allclose(short[kind], batched[kind], atol=1e-6), kind


def test_decoder_self_attention_is_lower_triangular(records):
    for record in records[-1]:
        weights = record["attention"]["decoder_self"]
        T = weights.size(-1)
        above = ~torch.tril(torch.ones(T, T, dtype=torch.bool))
        assert (weights[..., above] == 0).all()


def test_decoder_input_is_the_models_own_translation_shifted_right(records):
    _, tokenizer, sources, translations, extracted = records
    for record, source, translation in zip(extracted, sources, translations):
        assert record["translation"] == translation and record["source_ids"] == source
        assert record["target_ids"] == tokenizer.encode(translation).ids + [at.EOS_ID]
        assert record["target_input"][0] == "<s>"
        assert record["target_input"][1:] == record["target_output"][:-1]


def test_extraction_restores_the_fused_path(records):
    model = records[0]
    assert all(m.fused for m in model.modules() if isinstance(m, at.MultiHeadedAttention))


def test_json_round_trips(records, tmp_path):
    extracted = records[-1]
    data = attention_analysis.to_json(extracted, checkpoint="none", step=0)
    path = tmp_path / "attention.json"
    path.write_text(json.dumps(data))
    loaded = attention_analysis.load(path)
    assert loaded["step"] == 0 and loaded["kinds"] == list(attention_analysis.KINDS)
    for record, entry in zip(extracted, loaded["sentences"]):
        assert entry["source"] == record["source"]
        assert entry["target_output"] == record["target_output"]
        for kind in attention_analysis.KINDS:
            assert entry["attention"][kind].shape == record["attention"][kind].shape
            assert torch.allclose(entry["attention"][kind], record["attention"][kind], atol=5e-4)


def test_links_resolve_to_token_positions():
    tokens = ["Ein", "Mann", "zieht", "sich", "an", ".", "</s>"]
    links = [("zieht", "an", "verb-particle"), ("er", "Mann", "pronoun-antecedent")]
    assert attention_maps.find_links(tokens, links) == [[2, 4, "verb-particle"]]


def record_with(weights, source, target_output):
    """A record whose three kinds all hold `weights` (1, h, T, T) and tokens as given."""
    return {
        "source": source,
        "target_input": ["<s>"] + target_output[:-1],
        "target_output": target_output,
        "attention": {kind: weights for kind in attention_analysis.KINDS},
    }


def test_statistics_read_known_patterns():
    T = 5
    # head 1 attends to itself, head 2 to the previous token (the first row to itself)
    diagonal = torch.eye(T)
    previous = torch.diag(torch.ones(T - 1), -1)
    previous[0, 0] = 1.0
    weights = torch.stack([diagonal, previous]).unsqueeze(0)
    source = ["Ein", "Mann", "singt", ".", "</s>"]
    record = record_with(weights, source, ["A", "man", "sings", ".", "</s>"])
    stats = attention_analysis.statistics([record])
    own, back = stats["encoder_self"]
    assert own["self"] == 1.0 and own["previous"] == 0.0 and own["distance"] == 0.0
    assert back["previous"] == 1.0 and back["offset"] == -0.8 and back["peak"] == 1.0
    # "man" and "sings" are aligned pairs (the lexicon); the diagonal head hits both
    aligned = stats["encoder_decoder"][0]
    assert aligned["pairs"] == 2 and aligned["aligned"] == 1.0 and aligned["chance"] == 0.2


def test_lexicon_file_is_one_german_tab_english_pair_per_line():
    lines = attention_analysis.LEXICON_PATH.read_text(encoding="utf-8").splitlines()
    pairs = [tuple(line.split("\t")) for line in lines if not line.startswith("#")]
    for pair in pairs:  # two fields, none blank or padded; English lower-case, as matched
        assert len(pair) == 2 and all(word and word == word.strip() for word in pair), pair
        assert pair[1] == pair[1].lower(), pair
    assert len(set(pairs)) == len(pairs), "duplicate pairs"
    lexicon = attention_analysis.read_lexicon()
    assert attention_analysis.book_lexicon() == lexicon
    assert sorted((de, en) for de, ens in lexicon.items() for en in ens) == sorted(pairs)
    assert lexicon["Foto"] == {"picture", "photo"} and lexicon["Mann"] == {"man"}


def test_statistics_averages_heads_over_sentences_and_alignment_over_pairs():
    """Two one-head sentences, every number computed by hand."""
    first = {
        "source": ["Mann", "singt", "</s>"],
        "target_input": ["<s>", "man", "sings"],
        "target_output": ["man", "sings", "</s>"],
        "attention": {
            "encoder_self": torch.tensor([[0.5, 0.5, 0], [0, 1, 0], [0, 0, 1]]),
            "decoder_self": torch.eye(3),
            # "man" -> "singt" misses "Mann"; "sings" -> "singt" hits
            "encoder_decoder": torch.tensor([[0.2, 0.8, 0], [0, 0.6, 0.4], [0, 0, 1]]),
        },
    }
    second = {
        "source": ["seine", "x", "y", "Hund", "</s>"],
        "target_input": ["<s>", "dog"],
        "target_output": ["dog", "</s>"],
        "attention": {
            "encoder_self": torch.eye(5)[[0, 1, 2, 3, 0]],  # itself; the last row the first
            "decoder_self": torch.eye(2),
            # "dog" -> "Hund", 3 tokens off the diagonal: a reordered pair, hit
            "encoder_decoder": torch.tensor([[0, 0, 0, 1, 0], [0, 0, 0, 0.5, 0.5]]),
        },
    }
    for record in (first, second):
        record["attention"] = {k: w.view(1, 1, *w.shape) for k, w in record["attention"].items()}
    stats = attention_analysis.statistics([first, second])
    # first: self 5/6, next 1/4, punct_eos 1/3, offset = distance = 1/6, peak 5/6;
    # second: self 4/5, the </s> row 4 tokens back (offset -4/5, far 1/5), peak 1
    assert stats["encoder_self"] == [
        {"layer": 1, "head": 1, "self": 0.817, "previous": 0.0, "next": 0.125,
         "punct_eos": 0.167, "offset": -0.317, "distance": 0.483, "far": 0.1, "peak": 0.917}
    ]  # fmt: skip
    # pairs: 2 + 1; hits 1 + 1, diagonal 2 + 0, chance 2/3 + 1/5, weight 0.8 + 1 (per pair);
    # punct_eos (0.4 + 1) / 3 and 0.5 / 2, peak 2.4 / 3 and 1.5 / 2 (means over sentences)
    assert stats["encoder_decoder"] == [
        {"layer": 1, "head": 1, "pairs": 3, "aligned": 0.667, "diagonal": 0.667,
         "chance": 0.289, "aligned_weight": 0.6, "reordered_pairs": 1,
         "reordered_aligned": 1.0, "reordered_chance": 0.2, "punct_eos": 0.358, "peak": 0.775}
    ]  # fmt: skip
    assert stats["decoder_self"][0]["self"] == 1.0
    assert attention_analysis.statistics([]) == {kind: [] for kind in attention_analysis.KINDS}


def test_uniform_baseline():
    weights = torch.zeros(1, 1, 4, 4)
    record = record_with(weights, ["a", "b", "c", "</s>"], ["x", "y", "z", "</s>"])
    uniform = attention_analysis.uniform_like(record)["attention"]
    assert torch.allclose(uniform["encoder_self"], torch.full((1, 1, 4, 4), 0.25))
    assert torch.allclose(uniform["decoder_self"][0, 0, 1], torch.tensor([0.5, 0.5, 0, 0]))
    stats = attention_analysis.statistics([attention_analysis.uniform_like(record)])
    assert stats["encoder_self"][0]["self"] == 0.25


def test_attention_grid_draws_every_layer_and_head():
    import plots

    weights = torch.rand(2, 3, 4, 5).softmax(-1)
    fig = plots.attention_grid(weights, list("abcd"), list("vwxyz"), title="grid")
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == [f"layer {n}, head {h}" for n in (1, 2) for h in (1, 2, 3)]
    with pytest.raises(ValueError, match="3 query and 5 key tokens"):
        plots.attention_grid(weights, list("abc"), list("vwxyz"), title="grid")
    # a long sentence: the heads wrap into rows, so the figure keeps to the page's 7 inches
    tokens = [f"t{i}" for i in range(14)]
    fig = plots.attention_grid(
        torch.rand(2, 4, 14, 14).softmax(-1), tokens, tokens, title="wrapped"
    )
    assert fig.get_size_inches()[0] <= 7.0
    titles = [ax.get_title() for ax in fig.axes if ax.axison]
    assert titles == [f"layer {n}, head {h}" for n in (1, 2) for h in (1, 2, 3, 4)]
    # the last layer of a 3-layer model, drawn alone, keeps its number; and even a sentence
    # too long for two panels of the default size gets two panels a row, not a single column
    tokens = [f"t{i}" for i in range(30)]
    last = torch.rand(1, 4, 30, 30).softmax(-1)
    fig = plots.attention_grid(last, tokens, tokens, title="last layer", first_layer=3)
    titles = [ax.get_title() for ax in fig.axes if ax.axison]
    assert titles == [f"layer 3, head {h}" for h in (1, 2, 3, 4)]
    assert len(fig.axes) == 4 and fig.axes[1].get_position().x0 > fig.axes[0].get_position().x1
    # one layer's heads (h, seq_q, seq_k), as chapter 3.2.2 draws them: panels named by head
    fig = plots.attention_grid(
        torch.rand(3, 4, 5).softmax(-1), list("abcd"), list("vwxyz"), title=""
    )
    assert [ax.get_title() for ax in fig.axes if ax.axison] == ["head 1", "head 2", "head 3"]


def test_attention_lines_draw_one_line_per_weight_above_threshold():
    import plots

    weights = torch.zeros(2, 4, 4)
    weights[0, 1, 3], weights[1, 1, 0], weights[1, 2, 2], weights[0, 1, 2] = 0.9, 0.6, 0.9, 0.01
    one_row = plots.attention_lines(weights, list("abcd"), 1, title="row of b").axes[0]
    assert sorted((tuple(l.get_xdata()), l.get_alpha()) for l in one_row.lines) == [
        ((1, 0), pytest.approx(0.6)),
        ((1, 3), pytest.approx(0.9)),
    ]
    one_head = plots.attention_lines(weights, list("abcd"), None, title="head 2", heads=[1]).axes[0]
    assert sorted(tuple(l.get_xdata()) for l in one_head.lines) == [(1, 0), (2, 2)]


def test_averaged_weights_are_labelled_apart_from_the_snapshot_of_their_last_step(tmp_path):
    # chapter 7 draws the averaged weights beside the snapshots they average; the average
    # carries its last snapshot's step, so the step alone cannot tell the two apart
    tokenizer = at.train_bpe(PAIRS, vocab_size=120)
    vocab = tokenizer.get_vocab_size()
    config = at.ModelConfig(N=1, d_model=16, d_ff=32, h=2, share_embeddings=True)
    torch.manual_seed(0)
    model = at.build_model(vocab, vocab, config)
    payload = {
        "model": model.state_dict(),
        "config": {"model": vars(config)},
        "tokenizer": tokenizer.to_str(),
        "step": 6,
    }
    at.save_checkpoint(tmp_path / "checkpoint-0000006.pt", payload)
    at.save_checkpoint(tmp_path / "averaged.pt", {**payload, "averaged_steps": [3, 6]})
    chosen = [("val", 0, "a toy sentence", [], PAIRS[0][0], PAIRS[0][1])]
    labels = [
        attention_maps.analyse(tmp_path / name, chosen, [PAIRS[1][0]], beam_size=1)["label"]
        for name in ("checkpoint-0000006.pt", "averaged.pt")
    ]
    assert labels == ["6", "average"]


def test_head_heatmaps_draws_a_heatmap_with_colour_bar_per_statistic():
    import numpy as np

    import plots

    values = {
        "self": np.array([[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]]),
        "offset": np.array([[-1.5, 0.0, 0.5, 1.0], [-0.2, 0.2, 0.4, -0.4]]),
        "peak": np.full((2, 4), 0.5),
    }
    fig = plots.head_heatmaps(values, "heads", reference={"self": 0.25, "peak": 0.1})
    assert fig.get_size_inches()[0] <= 7.0  # the page's column
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == [
        "self (uniform: 0.25, dashed)",
        "offset",
        "peak (uniform: 0.10, dashed)",
    ]
    for ax, matrix in zip(panels, values.values()):
        # layers as rows, heads as columns, every cell written out
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "3", "4"]
        assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "2"]
        assert [t.get_text() for t in ax.texts] == [f"{v:.2f}" for v in matrix.ravel()]
        assert ax.images[0].colorbar is not None
    # the reference is a line on the colour bar, at its value
    bar = panels[0].images[0].colorbar.ax
    assert any(list(line.get_ydata()) == [0.25, 0.25] for line in bar.lines)
    # a signed statistic: a scale centred on zero; the others span their values and reference
    assert panels[1].images[0].get_clim() == (-1.5, 1.5)
    assert panels[0].images[0].get_clim() == (0.1, 0.8)
    assert panels[2].images[0].get_clim() == (0.1, 0.5)
    with pytest.raises(ValueError, match="peak: shape"):
        plots.head_heatmaps(values | {"peak": np.zeros((3, 4))}, "heads")


# ---- the tables and figures chapter 7 reads from the stored JSON ------------------------


def stored_sentence():
    """One sentence as the JSON stores it: N=2 layers of h=2 heads, a marked link from "er"
    (position 0) to "Mann" (position 2) that head 2.1 follows."""
    source = ["er", "sagt", "Mann", "</s>"]
    target_output = ["he", "says", "man", "</s>"]
    encoder = torch.full((2, 2, 4, 4), 0.25)
    encoder[1, 0, 0] = torch.tensor([0.1, 0.0, 0.9, 0.0])
    encoder[0, 1, 0] = torch.tensor([0.4, 0.0, 0.6, 0.0])
    encoder_decoder = torch.full((2, 2, 4, 4), 0.25)
    encoder_decoder[1, 1] = torch.eye(4)[[0, 1, 2, 2]] * 0.8 + 0.05
    return {
        "index": 7,
        "text": "Er sagt Mann.",
        "translation": "He says man.",
        "reference": "He says: a man.",
        "shows": "a pronoun",
        "source": source,
        "target_input": ["<s>", *target_output[:-1]],
        "target_output": target_output,
        "links": [[0, 2, "pronoun-antecedent"]],
        "attention": {
            "encoder_self": encoder,
            "decoder_self": torch.tril(torch.ones(2, 2, 4, 4)) / torch.arange(1, 5).view(4, 1),
            "encoder_decoder": encoder_decoder,
        },
    }


def stored_data(snapshots=("7000", "average")):
    """What attention_analysis.load returns for the sentence above, with its statistics and
    snapshots (the same weights in each, the encoder's self statistic raised by 0.01 a
    snapshot)."""
    sentence = stored_sentence()
    statistics = attention_analysis.statistics([sentence])
    uniform = attention_analysis.statistics([attention_analysis.uniform_like(sentence)])
    history = []
    for n, label in enumerate(snapshots):
        shifted = {kind: [dict(row) for row in rows] for kind, rows in statistics.items()}
        for row in shifted["encoder_self"]:
            row["self"] = round(row["self"] + 0.01 * n, 3)
        history.append(
            {
                "label": label,
                "step": 7000,
                "statistics": shifted,
                "links": attention_maps.link_weights([sentence]),
            }
        )
    return {
        "sentences": [sentence],
        "statistics": {"sentences": 1, **statistics},
        "uniform": {kind: rows[0] for kind, rows in uniform.items()},
        "snapshots": history,
    }


def test_listing_gives_each_sentence_with_translation_reference_and_purpose():
    text = attention_analysis.listing([stored_sentence()] * 2)
    assert text.split("\n\n")[1].splitlines() == [
        "1. source:    Er sagt Mann.",
        "   our model: He says man.",
        "   reference: He says: a man.",
        "   shows:     a pronoun",
    ]


def test_link_table_gives_every_heads_weight_and_a_summary_of_them():
    links = attention_analysis.link_table([stored_sentence()])
    heads = attention_analysis.head_columns(links)
    assert heads == ["1.1", "1.2", "2.1", "2.2"]  # not the count "heads > 0.5"
    (row,) = links.to_dict("records")
    assert (row["link"], row["kind"], row["sentence"], row["query"]) == (
        "er → Mann",
        "pronoun-antecedent",
        7,
        0,
    )
    assert (row["distance"], row["uniform"]) == (2, 0.25)
    assert [row[h] for h in heads] == [0.25, 0.6, 0.9, 0.25]
    assert (row["best head"], row["its weight"], row["heads > 0.5"]) == ("2.1", 0.9, 2)
    assert row["mean of heads"] == 0.5


def test_head_table_is_indexed_by_head_with_uniform_attention_last():
    data = stored_data()
    table = attention_analysis.head_table(data, "encoder_self")
    assert list(table.index) == ["1.1", "1.2", "2.1", "2.2", "uniform"]
    assert "layer" not in table and table.loc["uniform", "self"] == 0.25
    source = attention_analysis.head_table(data, "encoder_decoder")
    assert source.loc["uniform", ["aligned", "reordered_aligned"]].isna().all()
    assert source.loc["2.2", "aligned"] == 1.0  # "says" and "man" (the lexicon) both hit
    assert (
        attention_analysis.strongest_head(data["statistics"], "encoder_decoder", "aligned") == "2.2"
    )
    lowest = min(data["statistics"]["encoder_self"], key=lambda r: r["offset"])
    found = attention_analysis.strongest_head(data["statistics"], "encoder_self", "-offset")
    assert found == f"{lowest['layer']}.{lowest['head']}"


def test_top_words_name_each_heads_largest_weight_per_output_token():
    table = attention_analysis.top_words(stored_sentence(), 2, ["2.2"])
    assert list(table.index) == ["he", "says", "man", "</s>"]
    assert table["head 2.2"].tolist() == ["er 0.85", "sagt 0.85", "Mann 0.85", "Mann 0.85"]


def test_link_and_claim_histories_have_one_column_per_snapshot():
    data = stored_data()
    links = attention_analysis.link_history(data)
    assert list(links.columns) == ["7000", "average"] and links.columns.name == "step"
    assert links.loc["er → Mann (pronoun-antecedent)"].tolist() == [0.9, 0.9]
    claims = attention_analysis.claim_history(data)
    assert list(claims.columns) == ["7000", "average"]
    assert claims.index[-1] == "enc-dec, diagonal baseline"
    assert claims.index[0].startswith("encoder ") and claims.index[0].endswith(", self")
    assert claims.iloc[0, 1] == pytest.approx(claims.iloc[0, 0] + 0.01)


def test_sentence_attention_draws_one_layer_with_the_tokens_of_its_kind():
    import plots

    sentence = stored_sentence()
    fig = plots.sentence_attention(sentence, "decoder_self", 2)
    assert [ax.get_title() for ax in fig.axes if ax.axison] == [
        "layer 2, head 1",
        "layer 2, head 2",
    ]
    first = fig.axes[0]
    assert [t.get_text() for t in first.get_yticklabels()] == sentence["target_input"]
    assert [t.get_text() for t in first.get_xticklabels()] == sentence["target_input"]
    fig = plots.sentence_attention(sentence, "encoder_decoder", 1)
    first = fig.axes[0]
    assert [t.get_text() for t in first.get_yticklabels()] == sentence["target_output"]
    assert [t.get_text() for t in first.get_xticklabels()] == sentence["source"]


def test_head_table_figure_lays_out_heads_by_layer_and_marks_the_reference():
    import plots

    table = attention_analysis.head_table(stored_data(), "encoder_self")
    fig = plots.head_table_figure(table, ["self", "peak"], "heads")
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == [
        "self (uniform: 0.25, dashed)",
        "peak (uniform: 0.25, dashed)",
    ]
    assert panels[1].images[0].get_array().shape == (2, 2)
    assert [t.get_text() for t in panels[1].texts] == ["0.25", "0.34", "0.41", "0.25"]  # row means
    fig = plots.head_table_figure(
        table, ["self"], "heads", reference={"self": 0.5}, reference_label="baseline"
    )
    assert fig.axes[0].get_title() == "self (baseline: 0.50, dashed)"
    with pytest.raises(ValueError, match="not every layer.head in order"):
        plots.head_table_figure(table.iloc[[1, 0, 2, 3, 4]], ["self"], "heads")
