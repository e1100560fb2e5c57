"""Figures for the chapters. Each helper takes tensors (or arrays), draws one figure and
returns it; the model module never imports matplotlib."""

import itertools
import textwrap

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
import torch
from matplotlib.patches import FancyBboxPatch


def _as_array(x):
    return x.detach().cpu().float().numpy() if isinstance(x, torch.Tensor) else x


def heatmap(
    matrix,
    title,
    xlabel,
    ylabel,
    xticklabels="auto",
    yticklabels="auto",
    cmap="viridis",
    vmin=None,
    vmax=None,
    annot=False,
    figsize=(5, 4),
):
    """A labelled heatmap of one 2-D matrix (a mask, attention weights, a table)."""
    fig, ax = plt.subplots(figsize=figsize)
    sns.heatmap(
        _as_array(matrix),
        ax=ax,
        cmap=cmap,
        vmin=vmin,
        vmax=vmax,
        annot=annot,
        fmt=".2f",
        square=False,
        xticklabels=xticklabels,
        yticklabels=yticklabels,
        cbar=True,
    )
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    return fig


def mask_plot(mask, title, query_label="query position", key_label="key position"):
    """A boolean mask (seq_q, seq_k): dark where attending is allowed."""
    fig = heatmap(
        _as_array(mask).astype(float),
        title,
        key_label,
        query_label,
        cmap="Greys",
        vmin=0,
        vmax=1,
        figsize=(4.5, 4),
    )
    fig.axes[-1].set_ylabel("may attend (1) / masked (0)")
    return fig


def attention_heads(weights, query_tokens, key_tokens, title, ncols=4, vmax=None, panel=1.75):
    """Weights (h, seq_q, seq_k) of every head, one small heatmap each, tokens as labels.
    Each panel is `panel` inches square, so four side by side fit the book's column."""
    weights = _as_array(weights)
    h = weights.shape[0]
    ncols = min(ncols, h)
    nrows = -(-h // ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(panel * ncols, (panel + 0.5) * nrows), squeeze=False
    )
    for i, ax in enumerate(axes.flat):
        if i >= h:
            ax.axis("off")
            continue
        sns.heatmap(
            weights[i],
            ax=ax,
            cmap="viridis",
            vmin=0,
            vmax=vmax or 1,
            cbar=False,
            xticklabels=key_tokens,
            yticklabels=query_tokens,
            square=True,
        )
        ax.set_title(f"head {i + 1}", fontsize=9)
        ax.tick_params(labelsize=7, length=0)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def curves(x, series, title, xlabel, ylabel, logx=False, logy=False, styles=None, figsize=(6.4, 4)):
    """Line plot of several named series over the same x: series = {label: ys}."""
    fig, ax = plt.subplots(figsize=figsize)
    for label, ys in series.items():
        ax.plot(_as_array(x), _as_array(ys), (styles or {}).get(label, "-"), label=label)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.legend()
    return fig


def histograms(samples, title, xlabel, bins=60, figsize=(6.4, 4)):
    """Overlaid density histograms of several named samples: samples = {label: values}."""
    fig, ax = plt.subplots(figsize=figsize)
    for label, values in samples.items():
        ax.hist(_as_array(values).ravel(), bins=bins, density=True, alpha=0.5, label=label)
    ax.set(title=title, xlabel=xlabel, ylabel="density")
    ax.legend()
    return fig


# ---- the paper's Figures 1 and 2, redrawn, each box named after the code that implements it.
# Coordinates are inches: the axes fill the figure, so 1 data unit = 1 inch and a drawing
# 6.8 units wide is 700 px in the book's column. Labels 8 pt, code names 7 pt monospace.

_FILL = {"embed": "#fbd3cf", "attn": "#fde0b4", "norm": "#f4f5c2", "ffn": "#cfe8f3"}
_FILL |= {"linear": "#e2dbf2", "softmax": "#d4eecf"}
_CODE = {"fontsize": 7, "family": "monospace", "color": "#333333", "zorder": 3}
_ARROW = {"arrowstyle": "-|>", "lw": 1.0, "color": "black", "shrinkA": 0, "shrinkB": 0}
_LABEL_H, _CODE_H = 0.145, 0.12  # inches per line of an 8 pt label and of 7 pt code


def _canvas(width, height):
    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set(xlim=(0, width), ylim=(0, height))
    ax.axis("off")
    return fig, ax


def _label(ax, x, y, text, code="", ha="center", size=8):
    """text over its code name (monospace, smaller), the pair centred on height y; returns
    the pair's height."""
    n, m = text.count("\n") + 1, (code.count("\n") + 1) if code else 0
    label = n * _LABEL_H * size / 8
    top = y + (label + m * _CODE_H) / 2
    ax.text(x, top - label / 2, text, ha=ha, va="center", fontsize=size, zorder=3)
    if code:
        ax.text(x, top - label - m * _CODE_H / 2, code, ha=ha, va="center", **_CODE)
    return label + m * _CODE_H


def _box(ax, x, bottom, text, code, fill, width=1.8, layers=1):
    """A box centred on x, resting on bottom; layers > 1 adds copies behind it, offset up
    and right, as the paper draws h parallel heads. Returns the top of the stack."""
    height = 0.12 + (text.count("\n") + 1) * _LABEL_H + (code.count("\n") + 1) * _CODE_H
    for i in reversed(range(layers)):
        corner = (x - width / 2 + 0.06 * i, bottom + 0.06 * i)
        ax.add_patch(plt.Rectangle(corner, width, height, fc=_FILL[fill], ec="k", lw=0.8, zorder=2))
    _label(ax, x, bottom + height / 2, text, code)
    return bottom + height + 0.06 * (layers - 1)


def _line(ax, *points):
    ax.plot(*zip(*points), color="black", lw=1.0, zorder=1, solid_joinstyle="miter")


def _arrow(ax, *points):
    """A line through points with an arrowhead at the last one."""
    if len(points) > 2:
        _line(ax, *points[:-1])
    ax.annotate("", xy=points[-1], xytext=points[-2], zorder=1, arrowprops=_ARROW)


def _column(ax, x, y, boxes, width=1.8, gap=0.22, into=True, out=0.0):
    """Boxes (text, code, fill) stacked upwards from y, joined by arrows, with an arrow into
    the first (unless not into) and one of length out above the last; returns the (bottom,
    top) of each."""
    spans, bottom = [], y + gap if into else y
    for text, code, fill in boxes:
        if spans or into:
            _arrow(ax, (x, spans[-1][1] if spans else y), (x, bottom))
        spans.append((bottom, _box(ax, x, bottom, text, code, fill, width)))
        bottom = spans[-1][1] + gap
    if out:
        _arrow(ax, (x, spans[-1][1]), (x, spans[-1][1] + out))
    return spans


def _sublayer(ax, x, y, side, text, code, fill, inputs="qkv"):
    """One sub-layer and its residual connection, from the line at (x, y) upwards: the
    sub-layer box, then Add & Norm, which also takes a skip line that goes around the box on
    `side` (-1 left, +1 right). inputs: "qkv" splits the line into V, K, Q arrows, "q" takes
    only the query from below (the caller brings V and K), "" one arrow (feed-forward).
    Returns the top of the Add & Norm box and the bottom of the sub-layer box."""
    x_in = x + 0.55 if inputs == "q" else x
    bottom = y + (0.32 if inputs else 0.22)
    if inputs == "qkv":
        _line(ax, (x, y), (x, bottom - 0.12))
        _line(ax, (x - 0.55, bottom - 0.12), (x + 0.55, bottom - 0.12))
        for dx in (-0.55, 0, 0.55):
            _arrow(ax, (x + dx, bottom - 0.12), (x + dx, bottom))
    else:
        _arrow(ax, (x_in, y), (x_in, bottom))
    top = _box(ax, x, bottom, text, code, fill)
    norm = _box(ax, x, top + 0.2, "Add & Norm", "SublayerConnection", "norm")
    _arrow(ax, (x, top), (x, top + 0.2))
    mid, skip = (top + 0.2 + norm) / 2, x + side * 1.06
    _arrow(ax, (x_in, y + 0.1), (skip, y + 0.1), (skip, mid), (x + side * 0.9, mid))
    return norm, bottom


def _stack(ax, x, side, inputs, embedding, layer, sublayers):
    """One side of Figure 1 from the bottom: inputs, embedding, + positional encoding (the
    sinusoid drawn on `side`), then the N× block of sub-layers; returns the bottoms of the
    sub-layer boxes and the block's top line."""
    ha = "left" if side > 0 else "right"
    height = _label(ax, x, 0.25, *inputs)
    _arrow(ax, (x, 0.25 + height / 2), (x, 0.55))
    top = _box(ax, x, 0.55, *embedding, "embed")
    plus, wave = (x, top + 0.23), (x + side * 0.38, top + 0.23)
    _arrow(ax, (x, top), (x, plus[1] - 0.09))
    _arrow(ax, (wave[0] - side * 0.11, wave[1]), (x + side * 0.09, plus[1]))
    for center, radius in ((plus, 0.09), (wave, 0.11)):
        ax.add_patch(plt.Circle(center, radius, facecolor="white", edgecolor="black", lw=1))
    _line(ax, (x - 0.09, plus[1]), (x + 0.09, plus[1]))
    _line(ax, (x, plus[1] - 0.09), (x, plus[1] + 0.09))
    t = np.linspace(-1, 1, 40)
    _line(ax, *zip(wave[0] + 0.08 * t, wave[1] + 0.05 * np.sin(np.pi * t)))
    pe = ("Positional\nEncoding", "PositionalEncoding")
    _label(ax, wave[0] + side * 0.15, wave[1] - 0.03, *pe, ha=ha)
    y = plus[1] + 0.3
    _line(ax, (x, plus[1] + 0.09), (x, y))
    bottoms = []
    for sublayer in sublayers:
        y, bottom = _sublayer(ax, x, y, side, *sublayer)
        bottoms.append(bottom)
    corner, size = (x - 1.2, plus[1] + 0.24), (2.4, y + 0.08 - plus[1] - 0.24)
    style = {"boxstyle": "round,pad=0,rounding_size=0.1", "fc": "#efefef", "ec": "#777777"}
    ax.add_patch(FancyBboxPatch(corner, *size, zorder=0, **style))
    middle = (plus[1] + y) / 2
    ax.text(x + side * 1.27, middle, layer, rotation=90, ha="center", va="center", **_CODE)
    ax.text(x + side * 1.36, middle, "N×", ha=ha, va="center", fontsize=10)
    return bottoms, y


def architecture_figure():
    """Figure 1 of the paper: the encoder (left) and decoder (right), with the residual
    connections around every sub-layer and the encoder's output feeding K and V of every
    decoder layer's second attention."""
    fig, ax = _canvas(6.8, 7.25)
    xe, xd = 1.65, 5.1
    attention = ("Multi-Head Attention", "MultiHeadedAttention", "attn")
    masked = ("Masked\nMulti-Head Attention", "MultiHeadedAttention\n+ subsequent_mask", "attn")
    memory = ("Multi-Head Attention", "MultiHeadedAttention\n(src_attn)", "attn", "q")
    ffn = ("Feed Forward", "PositionwiseFeedForward", "ffn", "")
    src = ("Inputs", "src"), ("Input Embedding", "Embeddings"), "EncoderLayer"
    tgt = ("Outputs\n(shifted right)", "tgt"), ("Output Embedding", "Embeddings"), "DecoderLayer"
    _, enc_top = _stack(ax, xe, -1, *src, [attention, ffn])
    (_, cross, _), dec_top = _stack(ax, xd, +1, *tgt, [masked, memory, ffn])
    # the encoder's output, the memory z, goes up, across and down into V and K
    high, gap, low = enc_top + 0.25, (xe + xd) / 2, cross - 0.14
    _line(ax, (xe, enc_top), (xe, high), (gap, high), (gap, low), (xd, low))
    for dx in (-0.55, 0):
        _arrow(ax, (xd + dx, low), (xd + dx, cross))
    _label(ax, gap - 0.08, (high + low) / 2, "z", "memory", ha="right")
    out = [("Linear", "Generator.projection", "linear"), ("Softmax", "log_softmax", "softmax")]
    top = _column(ax, xd, dec_top, out, gap=0.2, out=0.2)[-1][1]
    _label(ax, xd, top + 0.32, "Output Probabilities")
    note = ("Add & Norm is post-LN, as in the paper:", "LayerNorm(x + Dropout(Sublayer(x)))")
    _label(ax, 0.1, top + 0.1, *note, ha="left")
    return fig


def attention_figure():
    """Figure 2 of the paper: scaled dot-product attention (left), and multi-head attention
    (right), h heads drawn as stacked layers."""
    fig, ax = _canvas(6.8, 4.1)
    # left: Q and K meet in the first MatMul, V comes up the right side into the second
    x, xv = 1.2, 2.32
    boxes = [
        ("MatMul", "query @ key.transpose(-2, -1)", "linear"),
        ("Scale", "/ math.sqrt(d_k)", "norm"),
        ("Mask (opt.)", "masked_fill(~mask, -inf)", "embed"),
        ("SoftMax", "softmax(dim=-1)", "softmax"),
        ("MatMul", "weights @ value", "linear"),
    ]
    last = _column(ax, x, 0.6, boxes, into=False, out=0.18)[-1][0]
    for dx, name, code in ((-0.45, "Q", "query"), (0.45, "K", "key"), (xv - x, "V", "value")):
        _label(ax, x + dx, 0.22, name, code)
    for dx in (-0.45, 0.45):
        _arrow(ax, (x + dx, 0.38), (x + dx, 0.6))
    _arrow(ax, (xv, 0.38), (xv, last - 0.1), (x + 0.45, last - 0.1), (x + 0.45, last))
    code = "attention or\nF.scaled_dot_product_attention"
    _label(ax, x, 3.78, "Scaled Dot-Product Attention", code, size=9)
    # right: V, K, Q each through h linear maps, h attentions side by side, Concat, W^O
    x = 4.65
    heads = ((-1.3, "V", "value", "w_v"), (0, "K", "key", "w_k"), (1.3, "Q", "query", "w_q"))
    for dx, name, code, weight in heads:
        _label(ax, x + dx, 0.22, name, code)
        _arrow(ax, (x + dx, 0.38), (x + dx, 0.6))
        top = _box(ax, x + dx, 0.6, "Linear", weight, "linear", width=0.95, layers=3)
        _arrow(ax, (x + dx, top), (x + dx, 1.48))
    ax.text(x - 0.65, 1.29, "split_heads", ha="center", va="center", **_CODE)
    code = "attend: attention or\nF.scaled_dot_product_attention"
    top = _box(ax, x, 1.48, "Scaled Dot-Product Attention", code, "attn", 2.9, layers=3)
    ax.text(x + 1.62, (1.48 + top) / 2 + 0.06, "h", fontsize=11, style="italic", va="center")
    boxes = [("Concat", "transpose(1, 2).reshape", "norm"), ("Linear", "w_o", "linear")]
    _column(ax, x, top, boxes, out=0.18)
    _label(ax, x, 3.78, "Multi-Head Attention", "MultiHeadedAttention(h, d_model)", size=9)
    return fig


def table3_changes(
    labels, paper, ours, noise=None, ours_range=None, title="Table 3: change from the base row"
):
    """Table 3 as changes from the base row: for each row (labels, top to bottom) a pair of
    horizontal bars, the paper's change and ours, in percent of the base row's value. noise,
    if given, shades +-noise percent around zero: how far our base row moves between seeds
    alone, so bars inside the band are not distinguishable from the base. ours_range, if
    given, is a (lowest, highest) pair of arrays drawn as a whisker on each of our bars (the
    extremes over seeds)."""
    labels, paper, ours = list(labels), _as_array(paper), _as_array(ours)
    y = torch.arange(len(labels)).numpy()
    lines = max(label.count("\n") + 1 for label in labels)
    fig, ax = plt.subplots(figsize=(7, (0.2 + 0.2 * lines) * len(labels) + 1.4))
    if noise is not None:
        ax.axvspan(-noise, noise, color="0.85", label=f"our base row's seed spread (±{noise:.1f}%)")
    ax.barh(y - 0.2, paper, height=0.4, color="#4c72b0", label="paper (WMT EN-DE, 100K steps)")
    whiskers = None
    if ours_range is not None:
        low, high = (np.asarray(_as_array(v), dtype=np.float64) for v in ours_range)
        whiskers = np.stack([ours - low, high - ours])
    ax.barh(
        y + 0.2,
        ours,
        height=0.4,
        color="#dd8452",
        xerr=whiskers,
        error_kw={"elinewidth": 0.8, "capsize": 2},
        label="ours (Multi30k DE-EN, 2000 steps)",
    )
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(y, labels, fontsize=9)
    ax.grid(axis="y", visible=False)
    ax.invert_yaxis()
    ax.set(title=title, xlabel="change from the base row (%)")
    ax.legend(loc="lower right", fontsize=8)
    return fig


def ppl_vs_params(labels, paper_params, paper_ppl, our_params, our_ppl, title=None):
    """Perplexity against parameters, the paper's rows and ours, each relative to its base
    row (the first entry), on log-log axes; a thin line joins the paper's point and ours for
    the same row (labels). Points below 1 are better than the base row."""

    def relative(values):
        values = np.array(_as_array(values), dtype=np.float64)  # a copy: pandas' may be read-only
        return values / values[0]

    paper = relative(paper_params), relative(paper_ppl)
    ours = relative(our_params), relative(our_ppl)
    fig, ax = plt.subplots(figsize=(7, 4.6))
    for i, label in enumerate(labels):
        ax.plot([paper[0][i], ours[0][i]], [paper[1][i], ours[1][i]], color="0.75", lw=0.8)
        ax.annotate(
            label, (ours[0][i], ours[1][i]), fontsize=7, xytext=(4, 3), textcoords="offset points"
        )
    ax.scatter(*paper, color="#4c72b0", label="paper (WMT EN-DE, 100K steps)", zorder=3)
    ax.scatter(
        *ours, color="#dd8452", marker="s", label="ours (Multi30k DE-EN, 2000 steps)", zorder=3
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis, values, ticks in (
        (ax.xaxis, (*paper[0], *ours[0]), (0.1, 0.2, 0.3, 0.5, 0.7, 1, 1.5, 2, 3, 5, 10)),
        (ax.yaxis, (*paper[1], *ours[1]), (0.5, 0.6, 0.7, 0.8, 0.9, 1, 1.1, 1.2, 1.3, 1.5, 2)),
    ):  # plain numbers, not powers of ten, on the log axes
        axis.set_ticks([t for t in ticks if min(values) / 1.1 <= t <= max(values) * 1.1])
        axis.set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
        axis.set_minor_formatter(plt.matplotlib.ticker.NullFormatter())
    ax.axhline(1, color="0.6", linewidth=0.8)
    ax.axvline(1, color="0.6", linewidth=0.8)
    ax.set(
        title=title or "Perplexity against model size",
        xlabel="parameters / base row's",
        ylabel="perplexity / base row's",
    )
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    return fig


def recipe_search(trials, start="start"):
    """The recipe search: one horizontal bar per trial (a DataFrame with columns trial,
    rung, budget_min, val_bleu), its val BLEU after the first rung's budget, the trials of
    later rungs marked on the same row; a vertical line at the starting recipe's score. A
    trial evaluated twice at one rung is drawn with its later evaluation."""
    first = trials[trials.rung == trials.rung.min()].drop_duplicates("trial", keep="last")
    first = first.sort_values("val_bleu")
    y = {trial: i for i, trial in enumerate(first.trial)}
    fig, ax = plt.subplots(figsize=(7, 0.3 * len(y) + 1.3))
    budget = first.budget_min.iloc[0]
    ax.barh(list(y.values()), first.val_bleu, color="#4c72b0", label=f"{budget:.0f} CPU-minutes")
    markers = itertools.cycle("oDs^")
    for (rung, minutes), later in trials[trials.rung > trials.rung.min()].groupby(
        ["rung", "budget_min"]
    ):
        ax.scatter(
            later.val_bleu,
            [y[t] for t in later.trial],
            marker=next(markers),
            color="#dd8452",
            zorder=3,
            label=f"{minutes:.0f} CPU-minutes (rung {rung})",
        )
    ax.axvline(float(first.val_bleu[first.trial == start].iloc[0]), color="black", lw=0.8)
    ax.set_yticks(list(y.values()), list(y), fontsize=8)
    ax.grid(axis="y", visible=False)
    ax.set(title="Recipe search on Multi30k val", xlabel="greedy val BLEU (500 sentences)")
    ax.legend(fontsize=8, loc="lower right")
    return fig


def time_to_bleu(runs, title="Validation BLEU during training"):
    """Val BLEU against training hours (left) and target tokens seen (right) for several
    runs: runs = {label: list of validation records with seconds, tokens_seen, val_bleu}."""
    fig, axes = plt.subplots(1, 2, figsize=(7, 3.2), sharey=True)
    for label, records in runs.items():
        bleu = [r["val_bleu"] for r in records]
        axes[0].plot([r["seconds"] / 3600 for r in records], bleu, ".-", label=label)
        axes[1].plot([r["tokens_seen"] / 1e6 for r in records], bleu, ".-", label=label)
    axes[0].set(xlabel="training hours", ylabel="greedy val BLEU")
    axes[1].set(xlabel="target tokens seen (millions)")
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


# ---- attention maps of a trained model (the paper's Figures 3-5)


def attention_grid(
    weights, query_tokens, key_tokens, title, vmax=1.0, cell=0.16, width=7.0, first_layer=1
):
    """Weights (N, h, seq_q, seq_k) of every layer and head: one heatmap each, tokens as
    labels, as many side by side as fit in `width` inches (the book's column), layer by
    layer. The colour scale is shared (0 to vmax) so that heads can be compared; cell is the
    size of one token square in inches. first_layer numbers the first of the given layers
    (for a slice of a deeper model's layers)."""
    weights = _as_array(weights)
    n_layers, h, seq_q, seq_k = weights.shape
    if (len(query_tokens), len(key_tokens)) != (seq_q, seq_k):
        raise ValueError(
            f"{len(query_tokens)} query and {len(key_tokens)} key tokens for weights of shape "
            f"{tuple(weights.shape)}: pass one token per row and per column"
        )
    if h > 1:  # at least two panels side by side: a single column of heads runs for pages
        cell = min(cell, (width / 2 - 0.9) / seq_k)
    panel_width, panel_height = max(1.6, cell * seq_k + 0.9), max(1.6, cell * seq_q + 0.9)
    ncols = max(1, min(h, int(width // panel_width)))
    nrows = n_layers * -(-h // ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(panel_width * ncols, panel_height * nrows), squeeze=False
    )
    for ax in axes.flat:
        ax.axis("off")  # panels left empty in a layer's last row stay blank
    rows_per_layer = nrows // n_layers
    for layer, head in itertools.product(range(n_layers), range(h)):
        ax = axes[layer * rows_per_layer + head // ncols, head % ncols]
        ax.axis("on")
        sns.heatmap(
            weights[layer, head],
            ax=ax,
            cmap="viridis",
            vmin=0,
            vmax=vmax,
            cbar=False,
            square=True,
            xticklabels=key_tokens,
            yticklabels=query_tokens if head % ncols == 0 else False,
        )
        ax.set_title(f"layer {first_layer + layer}, head {head + 1}", fontsize=8)
        ax.tick_params(labelsize=7, length=0)
    fig.suptitle(textwrap.fill(title, 90), fontsize=9)  # a long title would widen the figure
    fig.tight_layout()
    return fig


def attention_lines(weights, tokens, query, title, heads=None, threshold=0.05):
    """The paper's way of drawing self-attention (Figures 3-5): the sentence twice, queries
    on top and keys below, a line from query to key for each weight above threshold, its
    opacity the weight, one colour per head. weights is one layer's (h, seq, seq); query is
    the position whose row is drawn (Figure 3), or None for every row (Figures 4 and 5,
    usually with heads=[one head])."""
    weights = _as_array(weights)
    h, seq, _ = weights.shape
    if len(tokens) != seq:
        raise ValueError(f"{len(tokens)} tokens for attention over {seq} positions")
    heads = list(range(h)) if heads is None else list(heads)
    queries = range(seq) if query is None else [query]
    colours = sns.color_palette("tab10", h)
    # at most 7 inches, the book's column: long sentences get narrower token spacing
    fig, ax = plt.subplots(figsize=(min(7.0, max(6.0, 0.55 * seq)), 3.2))
    for head in heads:
        for q in queries:
            for k in range(seq):
                w = float(weights[head, q, k])
                if w > threshold:
                    ax.plot([q, k], [1, 0], color=colours[head], alpha=min(1.0, w), lw=2.5)
    for y, va in ((1, "bottom"), (0, "top")):
        for i, token in enumerate(tokens):
            bold = query is not None and i == query and y == 1
            ax.text(
                i,
                y + (0.04 if y else -0.04),
                token,
                rotation=90,
                ha="center",
                va=va,
                fontsize=8,
                fontweight="bold" if bold else "normal",
            )
    handles = [plt.Line2D([], [], color=colours[head], lw=2.5) for head in heads]
    ax.legend(
        handles,
        [f"head {head + 1}" for head in heads],
        fontsize=7,
        ncol=min(len(heads), 8),
        loc="upper center",
        bbox_to_anchor=(0.5, 0.02),
        frameon=False,
    )
    ax.set(xlim=(-0.7, seq - 0.3), ylim=(-1.0, 1.75), title=title)
    ax.axis("off")
    return fig
