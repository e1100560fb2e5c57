"""Figures for the chapters. Each helper takes tensors (or arrays), draws one figure and
returns it; the model module never imports matplotlib."""

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
import torch


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


# ---- the paper's Figures 1 and 2, redrawn, each box named after the code that implements it


def _box(ax, x, y, text, code, color, width=3.9, height=0.62):
    ax.add_patch(
        plt.Rectangle(
            (x - width / 2, y - height / 2),
            width,
            height,
            facecolor=color,
            edgecolor="black",
            linewidth=1.0,
            zorder=2,
        )
    )
    ax.text(x, y + 0.09, text, ha="center", va="center", fontsize=8.5, zorder=3)
    ax.text(
        x,
        y - 0.17,
        code,
        ha="center",
        va="center",
        fontsize=7.5,
        family="monospace",
        color="#333333",
        zorder=3,
    )


def _arrow(ax, start, end, **style):
    ax.annotate(
        "",
        xy=end,
        xytext=start,
        zorder=1,
        arrowprops={"arrowstyle": "->", "lw": 1.2, "color": "black", **style},
    )


def _column(ax, x, y0, boxes, step=0.95):
    """Boxes stacked upwards from y0, joined by arrows; returns the y of each box."""
    ys = []
    for i, (text, code, color) in enumerate(boxes):
        y = y0 + i * step
        _box(ax, x, y, text, code, color)
        if i:
            _arrow(ax, (x, ys[-1] + 0.31), (x, y - 0.31))
        ys.append(y)
    return ys


def architecture_figure():
    """Figure 1 of the paper: the encoder (left) and decoder (right) stacks."""
    attention, norm, ffn, embed = "#fde9c9", "#f6f7c4", "#cfe8f3", "#f8d7da"
    fig, ax = plt.subplots(figsize=(10, 9.5))
    encoder = _column(
        ax,
        2.5,
        0.3,
        [
            ("Inputs (source tokens)", "src", "white"),
            ("Input embedding x sqrt(d_model)", "Embeddings", embed),
            ("+ Positional encoding, dropout", "PositionalEncoding", embed),
            ("Multi-head self-attention", "MultiHeadedAttention", attention),
            ("Add & Norm", "SublayerConnection", norm),
            ("Feed forward", "PositionwiseFeedForward", ffn),
            ("Add & Norm", "SublayerConnection", norm),
        ],
    )
    decoder = _column(
        ax,
        7.5,
        0.3,
        [
            ("Outputs (shifted right)", "tgt_in", "white"),
            ("Output embedding x sqrt(d_model)", "Embeddings (shared)", embed),
            ("+ Positional encoding, dropout", "PositionalEncoding", embed),
            (
                "Masked multi-head self-attention",
                "MultiHeadedAttention + subsequent_mask",
                attention,
            ),
            ("Add & Norm", "SublayerConnection", norm),
            ("Multi-head attention over memory", "MultiHeadedAttention (src_attn)", attention),
            ("Add & Norm", "SublayerConnection", norm),
            ("Feed forward", "PositionwiseFeedForward", ffn),
            ("Add & Norm", "SublayerConnection", norm),
            ("Linear", "Generator.projection (shared)", embed),
            ("Softmax -> output probabilities", "Generator (log_softmax)", "white"),
        ],
    )
    for x, ys, label in (
        (2.5, encoder[3:7], "EncoderLayer x N = 6\n(Encoder)"),
        (7.5, decoder[3:9], "DecoderLayer x N = 6\n(Decoder)"),
    ):
        ax.add_patch(
            plt.Rectangle(
                (x - 2.05, ys[0] - 0.5),
                4.1,
                ys[-1] - ys[0] + 1.0,
                facecolor="#f2f2f2",
                edgecolor="grey",
                zorder=0,
            )
        )
        side = x - 2.3 if x < 5 else x + 2.3
        ax.text(
            side,
            (ys[0] + ys[-1]) / 2,
            label,
            ha="right" if x < 5 else "left",
            va="center",
            fontsize=9,
        )
    # the encoder's output, the memory z, feeds every decoder layer's second attention
    _arrow(ax, (2.5, encoder[-1] + 0.31), (2.5, encoder[-1] + 0.8))
    ax.text(2.5, encoder[-1] + 0.95, "memory z", ha="center", fontsize=9)
    _arrow(ax, (3.4, encoder[-1] + 0.95), (5.55, decoder[5]), connectionstyle="arc3,rad=-0.2")
    ax.set(
        xlim=(-1.2, 11.3),
        ylim=(-0.3, decoder[-1] + 0.6),
        title="Figure 1 redrawn: the Transformer, with the code that implements each box",
    )
    ax.axis("off")
    return fig


def attention_figure():
    """Figure 2 of the paper: scaled dot-product attention (left), multi-head attention (right)."""
    fig, ax = plt.subplots(figsize=(10, 5.6))
    _column(
        ax,
        2.4,
        0.3,
        [
            ("MatMul Q K^T", "query @ key.transpose(-2, -1)", "#cfe8f3"),
            ("Scale by 1/sqrt(d_k)", "/ math.sqrt(d_k)", "#f6f7c4"),
            ("Mask (optional)", "masked_fill(~mask, -inf)", "#f8d7da"),
            ("SoftMax", "scores.softmax(dim=-1)", "#fde9c9"),
            ("MatMul with V", "weights @ value", "#cfe8f3"),
        ],
    )
    ax.text(
        2.4,
        5.1,
        "attention(query, key, value, mask)\nor F.scaled_dot_product_attention",
        ha="center",
        fontsize=9,
        family="monospace",
    )
    _column(
        ax,
        7.6,
        0.3,
        [
            ("Linear x 3 (V, K, Q)", "w_v, w_k, w_q (h heads stacked)", "#cfe8f3"),
            (
                "Scaled dot-product attention, h heads",
                "view(batch, -1, h, d_k); attention",
                "#fde9c9",
            ),
            ("Concat", "transpose(1, 2).reshape(batch, -1, h * d_v)", "#f6f7c4"),
            ("Linear", "w_o", "#cfe8f3"),
        ],
        step=1.15,
    )
    ax.text(
        7.6, 5.1, "MultiHeadedAttention(h, d_model)", ha="center", fontsize=9, family="monospace"
    )
    ax.set(
        xlim=(0, 10.2),
        ylim=(-0.2, 5.6),
        title="Figure 2 redrawn: scaled dot-product attention (left), multi-head attention (right)",
    )
    ax.axis("off")
    return fig


def table3_changes(labels, paper, ours, noise=None, title="Table 3: change from the base row"):
    """Table 3 as changes from the base row: for each row (labels, top to bottom) a pair of
    horizontal bars, the paper's change and ours, in percent of the base row's value. noise,
    if given, shades +-noise percent around zero: how far our base row moves between seeds
    alone, so bars inside the band are not distinguishable from the base."""
    labels, paper, ours = list(labels), _as_array(paper), _as_array(ours)
    y = torch.arange(len(labels)).numpy()
    lines = max(label.count("\n") + 1 for label in labels)
    fig, ax = plt.subplots(figsize=(7.5, (0.2 + 0.2 * lines) * len(labels) + 1.4))
    if noise is not None:
        ax.axvspan(-noise, noise, color="0.85", label=f"our seed spread (±{noise:.0f}%)")
    ax.barh(y - 0.2, paper, height=0.4, color="#4c72b0", label="paper (WMT EN-DE, 100K steps)")
    ax.barh(y + 0.2, ours, height=0.4, color="#dd8452", label="ours (Multi30k DE-EN, CPU)")
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
    ax.scatter(*ours, color="#dd8452", marker="s", label="ours (Multi30k DE-EN, CPU)", zorder=3)
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


# ---- attention maps of a trained model (the paper's Figures 3-5)


def attention_grid(weights, query_tokens, key_tokens, title, vmax=1.0, cell=0.22):
    """Weights (N, h, seq_q, seq_k) of every layer and head: one heatmap each, a row of
    heads per layer, tokens as labels. The colour scale is shared (0 to vmax) so that heads
    can be compared; cell is the size of one token square in inches."""
    weights = _as_array(weights)
    n_layers, h, seq_q, seq_k = weights.shape
    if (len(query_tokens), len(key_tokens)) != (seq_q, seq_k):
        raise ValueError(
            f"{len(query_tokens)} query and {len(key_tokens)} key tokens for weights of shape "
            f"{tuple(weights.shape)}: pass one token per row and per column"
        )
    width, height = max(2.2, cell * seq_k + 1.0), max(2.0, cell * seq_q + 0.9)
    fig, axes = plt.subplots(n_layers, h, figsize=(width * h, height * n_layers), squeeze=False)
    for layer in range(n_layers):
        for head in range(h):
            ax = axes[layer, head]
            sns.heatmap(
                weights[layer, head],
                ax=ax,
                cmap="viridis",
                vmin=0,
                vmax=vmax,
                cbar=False,
                square=True,
                xticklabels=key_tokens,
                yticklabels=query_tokens if head == 0 else False,
            )
            ax.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=9)
            ax.tick_params(labelsize=7, length=0)
    fig.suptitle(title)
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
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * seq), 3.2))
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
