"""A trained translator's attention (chapter 7): the weights of every layer and head for
sentences the model translates, per-head statistics over a sample (what a head attends to:
itself, its neighbours, the aligned source word), the stored JSON, and the tables and
histories the chapter shows. code/attention_maps.py computes and stores them."""

import functools
import itertools
import json
import pathlib
import re
import textwrap

import pandas as pd
import torch

import annotated_transformer as at
import fast_decoding as fd

KINDS = ("encoder_self", "decoder_self", "encoder_decoder")


def display_token(tokenizer, token_id):
    """A token as a short label: the Metaspace marker dropped, specials kept as <s>, </s>."""
    if token_id == at.BOS_ID:
        return "<s>"
    if token_id == at.EOS_ID:
        return "</s>"
    if token_id == at.PAD_ID:
        return "<pad>"
    token = tokenizer.id_to_token(token_id)
    return token[1:] if token.startswith("▁") and len(token) > 1 else token


def attention_weights(model, sources, targets):
    """One teacher-forced forward pass of a padded batch on the reference attention path.
    sources: source id lists (ending in </s>); targets: target id lists (y_1 ... y_n).
    Returns, per sentence, {kind: tensor (N, h, seq_q, seq_k)} cropped to its real tokens:
    encoder_self (N, h, S, S), decoder_self (N, h, T, T), encoder_decoder (N, h, T, S),
    with S = len(source) and T = len(target); the decoder input is <s> y_1 ... y_n-1."""
    # the targets with <s> in front: Batch's decoder input is then <s> y_1 ... y_n-1
    batch = at.Batch.from_ids([(s, [at.BOS_ID] + t) for s, t in zip(sources, targets)])
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), at.use_fused_attention(model, False):
            model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)
        stacked = {
            "encoder_self": [layer.self_attn.weights for layer in model.encoder.layers],
            "decoder_self": [layer.self_attn.weights for layer in model.decoder.layers],
            "encoder_decoder": [layer.src_attn.weights for layer in model.decoder.layers],
        }
        # (N, batch, h, seq_q, seq_k) -> per sentence (N, h, seq_q, seq_k)
        stacked = {kind: torch.stack(ws).transpose(0, 1) for kind, ws in stacked.items()}
    finally:
        model.train(was_training)
    results = []
    for row, (s, t) in enumerate(zip(sources, targets)):
        S, T = len(s), len(t)
        results.append(
            {
                "encoder_self": stacked["encoder_self"][row, :, :, :S, :S],
                "decoder_self": stacked["decoder_self"][row, :, :, :T, :T],
                "encoder_decoder": stacked["encoder_decoder"][row, :, :, :T, :S],
            }
        )
    return results


def extract(model, tokenizer, sentences, *, beam_size=4, alpha=0.6):
    """Translate German `sentences` (list of str) with fd.fast_translate and return one record per
    sentence: source/target ids and display tokens, the translation, and the weights of
    every layer and head as tensors (see attention_weights). The target ids are the
    translation encoded again, ending in </s>: the tokens the model produced whenever its
    output is the usual encoding of its own text, as a trained model's nearly always is."""
    translations = fd.fast_translate(model, tokenizer, sentences, beam_size=beam_size, alpha=alpha)
    sources = [tokenizer.encode(s).ids + [at.EOS_ID] for s in sentences]
    targets = [tokenizer.encode(t).ids + [at.EOS_ID] for t in translations]
    weights = attention_weights(model, sources, targets)
    records = []
    for sentence, translation, s, t, w in zip(sentences, translations, sources, targets, weights):
        records.append(
            {
                "text": sentence,
                "translation": translation,
                "source_ids": s,
                "target_ids": t,
                "source": [display_token(tokenizer, i) for i in s],
                "target_input": [display_token(tokenizer, i) for i in [at.BOS_ID] + t[:-1]],
                "target_output": [display_token(tokenizer, i) for i in t],
                "attention": w,
            }
        )
    return records


LEXICON_PATH = pathlib.Path(__file__).resolve().parent.parent / "data" / "lexicon_de_en.tsv"


def read_lexicon(path=LEXICON_PATH):
    """A German -> English lexicon as {german: {english, ...}} from a file of
    german<TAB>english lines ('#' starts a comment line). Ours, by hand: frequent Multi30k
    content words, so that a head that tracks alignment can be scored without a word aligner
    (an output token and a source token it translates count as an aligned pair)."""
    lexicon = {}
    for line in pathlib.Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            german, english = line.split("\t")
            lexicon.setdefault(german, set()).add(english)
    return lexicon


@functools.cache
def book_lexicon():
    """The book's lexicon (LEXICON_PATH), read once, when first needed."""
    return read_lexicon()


PUNCTUATION = {".", ",", "</s>"}


def aligned_pairs(source, target_output, lexicon=None):
    """(target position, [source positions]) for each output token that translates a
    source token according to `lexicon` (the book's when None)."""
    lexicon = book_lexicon() if lexicon is None else lexicon
    pairs = []
    for t, token in enumerate(target_output):
        positions = [j for j, word in enumerate(source) if token.lower() in lexicon.get(word, ())]
        if positions:
            pairs.append((t, positions))
    return pairs


def self_attention_statistics(weights, keys):
    """Per-head statistics of self-attention weights (h, T, T) over tokens `keys`, each a
    mean over the query rows: weight on the query itself (`self`), on the previous and the
    next token, on punctuation and </s> or <s> (`punct_eos`), the weighted mean offset of
    the keys from the query (`offset`: negative = looks back), the weighted mean distance,
    the weight on keys 4 or more tokens away (`far`) and the largest weight of a row
    (`peak`: 1 is hard attention on one token). Returns a list of dicts."""
    weights = weights.float()
    T = weights.size(-1)
    position = torch.arange(T)
    offset = (position.view(1, -1) - position.view(-1, 1)).float()  # key minus query
    special = [j for j, token in enumerate(keys) if token in PUNCTUATION or token == "<s>"]
    return [
        {
            "self": head.diagonal().mean().item(),
            "previous": head.diagonal(-1).mean().item() if T > 1 else 0.0,
            "next": head.diagonal(1).mean().item() if T > 1 else 0.0,
            "punct_eos": head[:, special].sum(-1).mean().item(),
            "offset": (head * offset).sum(-1).mean().item(),
            "distance": (head * offset.abs()).sum(-1).mean().item(),
            "far": (head * (offset.abs() >= 4)).sum(-1).mean().item(),
            "peak": head.max(-1).values.mean().item(),
        }
        for head in weights
    ]


def source_attention_statistics(weights, source, target_output, *, lexicon=None):
    """Per-head statistics of encoder-decoder weights (h, T, S): weight on punctuation and
    </s> (`punct_eos`), the largest weight of a row (`peak`), and for the output tokens that
    `lexicon` pairs with a source token, how often the head's largest weight falls on that
    token (`aligned`, out of `pairs`) and its mean weight there. `diagonal` is the same hit
    rate for a head that read the source in order (key = query position scaled by S/T),
    `chance` for one that picked a source token at random; `reordered_aligned` counts the
    hits among the `reordered_pairs`, whose source token lies 3 or more tokens off that
    diagonal (German word order differs there), `reordered_chance` the random hit rate
    there. Returns a list of dicts."""
    weights = weights.float()
    _, T, S = weights.shape
    pairs = aligned_pairs(source, target_output, lexicon)
    diagonal = {t: round(t * (S - 1) / max(T - 1, 1)) for t, _ in pairs}
    reordered = [(t, js) for t, js in pairs if min(abs(j - diagonal[t]) for j in js) >= 3]
    special = [j for j, token in enumerate(source) if token in PUNCTUATION]
    return [
        {
            "pairs": len(pairs),
            "aligned": sum(argmax[t] in js for t, js in pairs),
            "diagonal": sum(diagonal[t] in js for t, js in pairs),
            "chance": sum(len(js) / S for _, js in pairs),
            "aligned_weight": sum(head[t, js].sum().item() for t, js in pairs),
            "reordered_pairs": len(reordered),
            "reordered_aligned": sum(argmax[t] in js for t, js in reordered),
            "reordered_chance": sum(len(js) / S for _, js in reordered),
            "punct_eos": head[:, special].sum(-1).mean().item(),
            "peak": head.max(-1).values.mean().item(),
        }
        for head, argmax in zip(weights, weights.argmax(-1).tolist())
    ]


def head_statistics(record, kind, weights):
    """The per-head statistics (a list of dicts) of one layer's weights of attention `kind`."""
    if kind == "encoder_decoder":
        return source_attention_statistics(weights, record["source"], record["target_output"])
    keys = record["source"] if kind == "encoder_self" else record["target_input"]
    return self_attention_statistics(weights, keys)


def measurements(records, kind):
    """The long table of attention `kind`: one row per sentence, layer and head (both numbered
    from 1, as in the paper's "layer 5 of 6"), holding that head's statistics."""
    return pd.DataFrame(
        [
            {"layer": layer + 1, "head": head + 1, **row}
            for record in records
            for layer, weights in enumerate(record["attention"][kind])
            for head, row in enumerate(head_statistics(record, kind, weights))
        ]
    )


# the encoder-decoder hit counts (and weights) and the number of pairs each is a rate over
PER_PAIR = {
    "pairs": ["aligned", "diagonal", "chance", "aligned_weight"],
    "reordered_pairs": ["reordered_aligned", "reordered_chance"],
}


def statistics(records):
    """The statistics above for every kind, layer and head: the numbers behind chapter 7's
    claims about what a head does (Figures 3-5). Means over the records, except for
    encoder-decoder attention's pair counts (totals) and its hit counts, aligned_weight and
    chance (rates per pair; 0 without pairs). Returns {kind: [{"layer", "head", ...}, ...]},
    rounded to 3 decimals."""
    records = list(records)  # an iterator would be spent after the first kind
    return {kind: summarise(measurements(records, kind), kind) for kind in KINDS}


def summarise(table, kind):
    """Group a long table of one kind by head: means over sentences, or per pair (PER_PAIR)."""
    if table.empty:
        return []
    by_head = table.groupby(["layer", "head"])
    summary = by_head.mean()
    if kind == "encoder_decoder":
        totals = by_head.sum()
        for count, counted in PER_PAIR.items():
            summary[count] = totals[count]
            summary[counted] = totals[counted].div(totals[count].clip(lower=1), axis=0)
    rows = summary.reset_index().to_dict("records")
    return [{name: round(value, 3) for name, value in row.items()} for row in rows]


def uniform_like(record):
    """The record with every weight matrix replaced by uniform attention over the keys each
    query may see (all of them; the decoder's self-attention only up to itself): the
    baseline a head's statistics are read against. One layer, one head."""
    attention = {}
    for kind, weights in record["attention"].items():
        q, k = weights.shape[-2:]
        allowed = torch.ones(q, k)
        if kind == "decoder_self":
            allowed = torch.tril(allowed)
        attention[kind] = (allowed / allowed.sum(-1, keepdim=True)).view(1, 1, q, k)
    return {**record, "attention": attention}


def to_json(records, decimals=3, **metadata):
    """The records as a JSON-ready dict: tensors become nested lists rounded to `decimals`."""
    sentences = []
    for record in records:
        entry = {k: v for k, v in record.items() if k != "attention"}
        entry["attention"] = {
            kind: torch.round(record["attention"][kind].float(), decimals=decimals).tolist()
            for kind in KINDS
        }
        sentences.append(entry)
    return {**metadata, "kinds": list(KINDS), "sentences": sentences}


def load(path):
    """Read a JSON written by this script; the weights come back as tensors (N, h, q, k)."""
    data = json.loads(pathlib.Path(path).read_text())
    for entry in data["sentences"]:
        entry["attention"] = {k: torch.tensor(v) for k, v in entry["attention"].items()}
    return data


# ---- reading the stored JSON, for chapter 7's tables

# the per-head statistics of self-attention, in the order chapter 7 draws them
SELF_STATISTICS = ["self", "previous", "next", "punct_eos", "offset", "distance", "far", "peak"]


def listing(sentences, width=86):
    """The stored sentences as text: for each, its source, our model's translation, the
    reference and what it was chosen to show, wrapped at `width` characters."""
    wrap = textwrap.TextWrapper(width=width, subsequent_indent=" " * 14)
    blocks = []
    for number, s in enumerate(sentences):
        lines = [f"{number}. {'source:':<11}{s['text']}"]
        for name, text in (("our model", s["translation"]), ("reference", s["reference"])):
            lines.append(f"   {name + ':':<11}{text}")
        lines.append(f"   shows:     {s['shows']}")
        blocks.append("\n".join(wrap.fill(line) for line in lines))
    return "\n\n".join(blocks)


def link_table(sentences):
    """One line per marked link of the stored sentences: the link as text, its kind, the
    sentence's index, the query position, the distance between the two words, the weight
    uniform attention gives (1/S), the weight from the first word on the second in every
    head (columns "layer.head"), then the best head, its weight, how many heads put more
    than half on the link and the mean over all heads."""
    rows = []
    for s in sentences:
        for query, key, kind in s["links"]:
            weights = s["attention"]["encoder_self"][:, :, query, key]  # (N, h)
            row = {"link": f"{s['source'][query]} → {s['source'][key]}", "kind": kind}
            row.update(sentence=s["index"], query=query, distance=abs(key - query))
            row["uniform"] = round(1 / len(s["source"]), 2)
            for (layer, head), weight in zip(
                itertools.product(*map(range, weights.shape)), weights.flatten()
            ):
                row[f"{layer + 1}.{head + 1}"] = round(weight.item(), 2)
            rows.append(row)
    links = pd.DataFrame(rows)
    heads = head_columns(links)
    links["best head"] = links[heads].idxmax(axis=1)
    links["its weight"] = links[heads].max(axis=1)
    links["heads > 0.5"] = (links[heads] > 0.5).sum(axis=1)
    links["mean of heads"] = links[heads].mean(axis=1).round(2)
    return links


def head_columns(table):
    """The columns of a table named for a head, "layer.head" (as link_table's)."""
    return [c for c in table.columns if re.fullmatch(r"\d+\.\d+", str(c))]


def head_table(data, kind):
    """The stored per-head statistics of attention `kind` (data: what `load` returns) as a
    table indexed "layer.head", with a last row "uniform": uniform attention's values (its
    alignment hit rates left blank: a uniform row has no largest weight)."""
    table = pd.DataFrame(data["statistics"][kind])
    table.index = [f"{r.layer}.{r.head}" for r in table.itertuples()]
    table.loc["uniform"] = pd.Series(data["uniform"][kind])
    if kind == "encoder_decoder":
        table.loc["uniform", ["aligned", "reordered_aligned"]] = float("nan")
    return table.drop(columns=["layer", "head"])


def top_words(sentence, layer, heads):
    """For each output token of a stored sentence (rows), the source token on which each of
    `heads` ("layer.head" names, of encoder-decoder attention in `layer`, counted from 1)
    puts its largest weight, and that weight, as text such as "Mann 0.92"."""
    weights = sentence["attention"]["encoder_decoder"][layer - 1]  # (h, T, S)
    columns = {}
    for name in heads:
        rows = weights[int(name.split(".")[1]) - 1]
        columns[f"head {name}"] = [f"{sentence['source'][r.argmax()]} {r.max():.2f}" for r in rows]
    return pd.DataFrame(columns, index=sentence["target_output"])


def link_history(data):
    """The largest weight any head gives each marked link, one column per stored snapshot
    (its step, or "average"), rounded to 2 decimals."""
    history = pd.DataFrame(
        {
            snapshot.get("label", snapshot["step"]): {
                f"{link['link']} ({link['kind']})": torch.tensor(link["weights"]).max().item()
                for link in snapshot["links"]
            }
            for snapshot in data["snapshots"]
        }
    ).round(2)
    history.columns.name = "step"
    return history


def strongest_head(statistics, kind, column):
    """The head ("layer.head") with the largest `column` among the statistics of `kind`; a
    column named with a leading "-" ("-offset") picks the smallest."""
    pick, name = (min, column[1:]) if column.startswith("-") else (max, column)
    row = pick(statistics[kind], key=lambda r: r[name])
    return f"{row['layer']}.{row['head']}"


# the claims chapter 7 makes about a head: the kind of attention, and the statistic whose
# largest value ("-" in front: smallest) singles the head out
CLAIMS = [
    ("encoder_self", "self"),
    ("encoder_self", "offset"),
    ("encoder_self", "-offset"),
    ("decoder_self", "previous"),
    ("decoder_self", "self"),
    ("encoder_decoder", "aligned"),
]
SHORT = {"encoder_self": "encoder", "decoder_self": "decoder", "encoder_decoder": "enc-dec"}


def claim_history(data, claims=CLAIMS):
    """For each claim (kind, statistic), the statistic of the head that the stored (last)
    statistics single out, in every snapshot, one column per snapshot; and, last, the
    reading-order baseline of encoder-decoder alignment ("diagonal", the same for every
    head)."""
    chosen = {
        f"{SHORT[kind]} {head}, {column.lstrip('-')}": (kind, head, column.lstrip("-"))
        for kind, column in claims
        for head in [strongest_head(data["statistics"], kind, column)]
    }
    chosen["enc-dec, diagonal baseline"] = ("encoder_decoder", "1.1", "diagonal")
    history = {}
    for name, (kind, head, column) in chosen.items():
        layer, h = (int(x) for x in head.split("."))
        history[name] = [
            next(
                r[column]
                for r in snapshot["statistics"][kind]
                if (r["layer"], r["head"]) == (layer, h)
            )
            for snapshot in data["snapshots"]
        ]
    labels = [snapshot.get("label", snapshot["step"]) for snapshot in data["snapshots"]]
    table = pd.DataFrame(history, index=labels).T
    table.columns.name = "step"
    return table
