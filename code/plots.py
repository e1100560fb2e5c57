"""Figures for the chapters. Each helper takes tensors (or arrays), draws one figure and
returns it; the model module never imports matplotlib."""

import matplotlib.pyplot as plt
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


def attention_heads(weights, query_tokens, key_tokens, title, ncols=4, vmax=None):
    """Weights (h, seq_q, seq_k) of every head, one small heatmap each, tokens as labels."""
    weights = _as_array(weights)
    h = weights.shape[0]
    ncols = min(ncols, h)
    nrows = -(-h // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.2 * ncols, 3.0 * nrows), squeeze=False)
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
        ax.set_title(f"head {i + 1}")
        ax.tick_params(labelsize=7)
    fig.suptitle(title)
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
