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
