"""Figures for the chapters. Each helper takes tensors (or arrays), draws one figure and
returns it; the model module never imports matplotlib."""

import itertools
import textwrap

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
import torch

PAPER, OURS = "#4c72b0", "#dd8452"  # the colours of two series compared (the paper's, ours)


def _as_array(x):
    return x.detach().cpu().float().numpy() if isinstance(x, torch.Tensor) else x


def heatmap(matrix, title, xlabel, *, ylabel, figsize=(5, 4), **options):
    """A labelled heatmap of one 2-D matrix (a mask, attention weights, a table); options go
    to seaborn.heatmap (cmap, default viridis; vmin, vmax, annot, xticklabels, ...)."""
    fig, ax = plt.subplots(figsize=figsize)
    sns.heatmap(_as_array(matrix), ax=ax, **{"cmap": "viridis", "fmt": ".2f", **options})
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    return fig


def mask_plot(mask, title, query_label="query position", *, key_label="key position"):
    """A boolean mask (seq_q, seq_k): dark where attending is allowed."""
    fig = heatmap(
        _as_array(mask).astype(float),
        title,
        key_label,
        ylabel=query_label,
        cmap="Greys",
        vmin=0,
        vmax=1,
        figsize=(4.5, 4),
    )
    fig.axes[-1].set_ylabel("may attend (1) / masked (0)")
    return fig


def curves(
    x, series, title, *, xlabel, ylabel, logx=False, logy=False, styles=None, figsize=(6.4, 4)
):
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


def histograms(samples, title, xlabel, *, bins=60, figsize=(6.4, 4)):
    """Overlaid density histograms of several named samples: samples = {label: values}."""
    fig, ax = plt.subplots(figsize=figsize)
    for label, values in samples.items():
        ax.hist(_as_array(values).ravel(), bins=bins, density=True, alpha=0.5, label=label)
    ax.set(title=title, xlabel=xlabel, ylabel="density")
    ax.legend()
    return fig


def table3_changes(
    labels, paper, ours, *, series=("paper", "ours"), noise=None, ours_range=None, title=None
):
    """Table 3 as changes from the base row: for each row (labels, top to bottom) a pair of
    horizontal bars, the paper's change and ours, in percent of the base row's value, named
    by `series` (the paper's label, ours) in the legend. noise, if given, is the base row's
    range over seeds in percent (highest minus lowest), shaded on both sides of zero: a row
    that changed nothing could differ from the base run by that much either way, so bars
    inside the band are not distinguishable from the base. ours_range, if given, is a (lowest,
    highest) pair of arrays drawn as a whisker on each of our bars (the extremes over
    seeds)."""
    labels, paper, ours = list(labels), _as_array(paper), _as_array(ours)
    y = np.arange(len(labels))
    lines = max(label.count("\n") + 1 for label in labels)
    fig, ax = plt.subplots(figsize=(7, (0.2 + 0.2 * lines) * len(labels) + 1.4))
    if noise is not None:
        label = f"base row's seed range ({noise:.1f}%), each side of 0"
        ax.axvspan(-noise, noise, color="0.85", label=label)
    ax.barh(y - 0.2, paper, height=0.4, color=PAPER, label=series[0])
    whiskers = None
    if ours_range is not None:
        low, high = (np.asarray(_as_array(v), dtype=np.float64) for v in ours_range)
        whiskers = np.stack([ours - low, high - ours])
    error = {"elinewidth": 0.8, "capsize": 2}
    ax.barh(y + 0.2, ours, 0.4, color=OURS, xerr=whiskers, error_kw=error, label=series[1])
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(y, labels, fontsize=9)
    ax.grid(axis="y", visible=False)
    ax.invert_yaxis()
    ax.set(title=title, xlabel="change from the base row (%)")
    ax.legend(loc="lower right", fontsize=8)
    return fig


def ppl_vs_params(
    labels, paper_params, paper_ppl, *, our_params, our_ppl, series=("paper", "ours"), title=None
):
    """Perplexity against parameters, the paper's rows and ours (named by `series` in the
    legend), each relative to its base row (the first entry), on log-log axes; a thin line
    joins the paper's point and ours for the same row (labels). Points below 1 are better
    than the base row."""

    def relative(values):
        values = np.array(_as_array(values), dtype=np.float64)  # a copy: pandas' may be read-only
        return values / values[0]

    paper = relative(paper_params), relative(paper_ppl)
    ours = relative(our_params), relative(our_ppl)
    fig, ax = plt.subplots(figsize=(7, 4.6))
    for i in range(len(labels)):
        ax.plot([paper[0][i], ours[0][i]], [paper[1][i], ours[1][i]], color="0.75", lw=0.8)
    ax.scatter(*paper, color=PAPER, label=series[0], zorder=3)
    ax.scatter(*ours, color=OURS, marker="s", label=series[1], zorder=3)
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
    # room for the labels inside the axes: a label past the edge would widen the figure
    for values, set_limits in (
        ((*paper[0], *ours[0]), ax.set_xlim),
        ((*paper[1], *ours[1]), ax.set_ylim),
    ):
        low, high = np.log(min(values)), np.log(max(values))
        pad = 0.18 * (high - low)
        set_limits(np.exp(low - pad), np.exp(high + pad))
    _place_labels(ax, labels, ours, [(*paper[0], *ours[0]), (*paper[1], *ours[1])], fontsize=8)
    ax.set(
        title=title,
        xlabel="parameters / base row's",
        ylabel="perplexity / base row's",
    )
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    return fig


def _place_labels(ax, labels, at, points, fontsize=8):
    """Label the points `at` (xs, ys) with `labels`, each beside its point in the first of
    eight directions where its box overlaps no marker (`points`, xs and ys), no label placed
    before it and no edge of the axes: labels that overlap are unreadable, and one past the
    edge widens the figure beyond the page's column."""
    fig = ax.figure
    fig.canvas.draw()  # the axes' final limits and transforms
    scale = fig.dpi / 72  # pixels per point
    markers = ax.transData.transform(np.column_stack(points))
    box = ax.get_window_extent()
    placed = []
    directions = [(1, 0), (1, 1), (0, 1), (-1, 1), (-1, 0), (-1, -1), (0, -1), (1, -1)]
    for label, xy in zip(labels, np.column_stack(at)):
        x, y = ax.transData.transform(xy)
        width, height = 0.6 * fontsize * len(label) * scale, 1.2 * fontsize * scale
        best = None
        for dx, dy in directions:
            gap = 5 * scale
            left = x + dx * gap - (0 if dx > 0 else width if dx < 0 else width / 2)
            bottom = y + dy * gap - (0 if dy > 0 else height if dy < 0 else height / 2)
            rect = (left, bottom, left + width, bottom + height)
            inside = (
                box.x0 <= rect[0] and rect[2] <= box.x1 and box.y0 <= rect[1] and rect[3] <= box.y1
            )
            hits = sum(
                rect[0] - 4 * scale < mx < rect[2] + 4 * scale
                and rect[1] - 4 * scale < my < rect[3] + 4 * scale
                for mx, my in markers
                if abs(mx - x) > 1e-6 or abs(my - y) > 1e-6
            )
            hits += sum(
                rect[0] < r[2] and r[0] < rect[2] and rect[1] < r[3] and r[1] < rect[3]
                for r in placed
            )
            cost = hits + (0 if inside else 10)
            if best is None or cost < best[0]:
                best = (cost, rect, dx, dy)
            if cost == 0:
                break
        _, rect, dx, dy = best
        placed.append(rect)
        ax.annotate(
            label,
            xy,
            fontsize=fontsize,
            xytext=(5 * dx, 5 * dy),
            textcoords="offset points",
            ha="left" if dx > 0 else "right" if dx < 0 else "center",
            va="bottom" if dy > 0 else "top" if dy < 0 else "center",
        )


def recipe_search(trials, title, xlabel, *, start="start"):
    """A search by successive halving: one horizontal bar per trial (a DataFrame with
    columns trial, rung, budget_min, val_bleu), its score after the first rung's budget,
    the trials of later rungs marked on the same row; a vertical line at the `start`
    trial's score. A trial evaluated twice at one rung is drawn with its later
    evaluation."""
    first = trials[trials.rung == trials.rung.min()].drop_duplicates("trial", keep="last")
    first = first.sort_values("val_bleu")
    y = {trial: i for i, trial in enumerate(first.trial)}
    fig, ax = plt.subplots(figsize=(7, 0.3 * len(y) + 1.3))
    budget = first.budget_min.iloc[0]
    ax.barh(list(y.values()), first.val_bleu, color=PAPER, label=f"{budget:.0f} CPU-minutes")
    markers = itertools.cycle("oDs^")
    for (rung, minutes), later in trials[trials.rung > trials.rung.min()].groupby(
        ["rung", "budget_min"]
    ):
        ax.scatter(
            later.val_bleu,
            [y[t] for t in later.trial],
            marker=next(markers),
            color=OURS,
            zorder=3,
            label=f"{minutes:.0f} CPU-minutes (rung {rung})",
        )
    ax.axvline(float(first.val_bleu[first.trial == start].iloc[0]), color="black", lw=0.8)
    ax.set_yticks(list(y.values()), list(y), fontsize=8)
    ax.grid(axis="y", visible=False)
    ax.set(title=title, xlabel=xlabel)
    ax.legend(fontsize=8, loc="lower right")
    return fig


def time_to_bleu(runs, title, ylabel="val BLEU"):
    """Val BLEU against training hours (left) and target tokens seen (right) for several
    runs: runs = {label: list of validation records with seconds, tokens_seen, val_bleu}."""
    fig, axes = plt.subplots(1, 2, figsize=(7, 3.2), sharey=True)
    for label, records in runs.items():
        bleu = [r["val_bleu"] for r in records]
        axes[0].plot([r["seconds"] / 3600 for r in records], bleu, ".-", label=label)
        axes[1].plot([r["tokens_seen"] / 1e6 for r in records], bleu, ".-", label=label)
    axes[0].set(xlabel="training hours", ylabel=ylabel)
    axes[1].set(xlabel="target tokens seen (millions)")
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


# ---- attention maps of a trained model (the paper's Figures 3-5)


def attention_grid(
    weights, query_tokens, key_tokens, *, title, vmax=1.0, cell=0.16, width=7.0, first_layer=1
):
    """Attention weights of every head, one heatmap each, tokens as labels: weights is
    (N, h, seq_q, seq_k), panels titled "layer l, head i", or one layer's (h, seq_q, seq_k),
    panels titled "head i". As many panels side by side as fit in `width` inches (the
    book's column), layer by layer. The colour scale is shared (0 to vmax) so that heads can
    be compared; cell is the size of one token square in inches. first_layer numbers the
    first of the given layers (for a slice of a deeper model's layers)."""
    weights = _as_array(weights)
    one_layer = weights.ndim == 3
    if one_layer:
        weights = weights[None]
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
        name = f"head {head + 1}" if one_layer else f"layer {first_layer + layer}, head {head + 1}"
        ax.set_title(name, fontsize=8)
        ax.tick_params(labelsize=8, length=0)  # 8 points: readable at the column's width
    fig.suptitle(textwrap.fill(title, 90), fontsize=9)  # a long title would widen the figure
    fig.tight_layout()
    return fig


def attention_lines(weights, tokens, query, *, title, heads=None, threshold=0.05):
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


def head_heatmaps(values, title, reference=None, *, reference_label="uniform", width=7.0):
    """Per-head statistics as small heatmaps, one panel per statistic: values maps a
    statistic's name to an (N, h) array (layer by head), drawn with layers as rows and heads
    as columns, each cell annotated with its value and each panel with its own colour bar.
    reference, if given, maps a name to the value a baseline head scores (uniform attention,
    say): a dashed line on that panel's colour bar, its value in the panel's title after
    reference_label. A statistic with negative values (a signed offset) gets a diverging
    scale centred on zero."""
    reference = reference or {}
    names = list(values)
    ncols = 2 if len(names) > 1 else 1
    nrows = -(-len(names) // ncols)
    n_layers, h = np.asarray(_as_array(values[names[0]])).shape
    panel_height = 0.32 * n_layers + 0.9
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(width, panel_height * nrows + 0.5), squeeze=False
    )
    for ax in axes.flat[len(names) :]:
        ax.axis("off")
    for ax, name in zip(axes.flat, names):
        matrix = np.asarray(_as_array(values[name]), dtype=np.float64)
        if matrix.shape != (n_layers, h):
            raise ValueError(f"{name}: shape {matrix.shape}, expected {(n_layers, h)}")
        known = [v for v in (*matrix.ravel(), reference.get(name)) if v is not None and v == v]
        low, high = min(known), max(known)
        if low < 0:
            bound = max(abs(low), abs(high))
            scale = {"cmap": "coolwarm", "vmin": -bound, "vmax": bound}
        else:
            scale = {"cmap": "viridis", "vmin": low, "vmax": high if high > low else low + 1}
        # plain matplotlib: seaborn's heatmap redraws the whole figure for every panel
        image = ax.imshow(matrix, aspect="auto", interpolation="nearest", **scale)
        colours = image.cmap(image.norm(matrix))
        for (row, column), value in np.ndenumerate(matrix):
            red, green, blue, _ = colours[row, column]
            light = 0.299 * red + 0.587 * green + 0.114 * blue > 0.5  # dark text on light
            ax.text(
                column,
                row,
                f"{value:.2f}",
                ha="center",
                va="center",
                fontsize=7,
                color="black" if light else "white",
            )
        ax.set_xticks(range(h), [str(i + 1) for i in range(h)])
        ax.set_yticks(range(n_layers), [str(i + 1) for i in range(n_layers)])
        ax.grid(False)
        for spine in ax.spines.values():
            spine.set_visible(False)
        colorbar = fig.colorbar(image, ax=ax, pad=0.02)
        colorbar.outline.set_visible(False)
        marked = reference.get(name) is not None and reference[name] == reference[name]
        heading = f"{name} ({reference_label}: {reference[name]:.2f}, dashed)" if marked else name
        ax.set_title(heading, fontsize=9)
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("layer", fontsize=8)
        ax.tick_params(labelsize=8, length=0)
        colorbar.ax.tick_params(labelsize=7)
        if marked:
            colorbar.ax.axhline(reference[name], color="white", linewidth=2.5)
            colorbar.ax.axhline(reference[name], color="black", linewidth=1.2, linestyle="--")
    fig.suptitle(textwrap.fill(title, 90), fontsize=10)
    fig.tight_layout()
    return fig


# Figures of chapters 1, 2 and 4 ---------------------------------------------------------


def against_length(sizes, series, title, *, ylabel, logy=True, legend_beside=False):
    """Named series measured at the same sequence lengths (series = {label: values}) on a log
    n axis, ticked at each measured n; lines that coincide differ by their dash."""
    sizes = _as_array(sizes)
    fig, ax = plt.subplots()
    styles = itertools.cycle(["o-", "s--", "^-.", "D:", "v-"])
    for (label, values), style in zip(series.items(), styles):
        ax.plot(sizes, _as_array(values), style, label=label)
    ax.set(title=title, xlabel="sequence length n", ylabel=ylabel, xscale="log")
    ax.set_xticks(sizes, [f"{size:g}" for size in sizes])
    ax.set_xticks([], minor=True)
    if logy:
        ax.set_yscale("log")
    if legend_beside:
        ax.legend(loc="upper left", bbox_to_anchor=(1, 1))
    else:
        ax.legend()
    return fig


def connection_graphs(graphs, title):
    """One panel per named (n, n) boolean connection graph (graphs = {label: matrix}): dark
    where output i (row) reads input j (column) directly."""
    fig, axes = plt.subplots(1, len(graphs), figsize=(7, 7 / len(graphs) + 0.9))
    for ax, (label, graph) in zip(axes, graphs.items()):
        ax.imshow(_as_array(graph).astype(float), cmap="Greys", vmin=0, vmax=1)
        ax.set_title(textwrap.fill(label, 20), fontsize=8)
        ax.set(xticks=[], yticks=[])
        ax.set_xlabel("input j", fontsize=9)
    axes[0].set_ylabel("output i", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


# Figures of chapters 3.1 to 3.2.3 -------------------------------------------------------


def residual_stream_scale(rms):
    """The root-mean-square of the residual stream after each block of a deep stack, one line
    per arrangement: rms = {label: values, one per block}."""
    blocks = np.arange(1, len(next(iter(rms.values()))) + 1)
    title = "Scale of the residual stream through a deep stack"
    return curves(blocks, rms, title, xlabel="block", ylabel="root-mean-square of the stream")


def dot_product_variance(dims, measured):
    """The measured variance of q.k for each d_k against footnote 4's d_k, on log-log axes."""
    series = {"measured variance of q.k": measured, "d_k (the footnote)": dims}
    styles = {"measured variance of q.k": "o", "d_k (the footnote)": "--"}
    title = "Dot products of random unit-variance vectors"
    return curves(
        dims, series, title, xlabel="d_k", ylabel="variance", logx=True, logy=True, styles=styles
    )


def per_query_quantiles(dims, panels, logy=(), *, width=7.0):
    """Per-query statistics over d_k, one panel each: for every series its median (line),
    quartiles (dark band), 10% to 90% quantiles (light band) and mean (dotted).
    panels = {ylabel: {label: one tensor of per-query values per d_k}}; logy: the panels
    (by index) drawn on a log scale."""
    fig, axes = plt.subplots(1, len(panels), figsize=(width, 3.3), squeeze=False)
    for i, (ax, (ylabel, series)) in enumerate(zip(axes[0], panels.items())):
        for (label, values), marker in zip(series.items(), "os"):
            values = [_as_array(v) for v in values]
            q10, q25, median, q75, q90 = (
                [np.quantile(v, q) for v in values] for q in (0.1, 0.25, 0.5, 0.75, 0.9)
            )
            (line,) = ax.plot(dims, median, marker + "-", label=f"{label}, median")
            ax.fill_between(dims, q25, q75, color=line.get_color(), alpha=0.3, linewidth=0)
            ax.fill_between(dims, q10, q90, color=line.get_color(), alpha=0.12, linewidth=0)
            means = [v.mean() for v in values]
            ax.plot(dims, means, ":", color=line.get_color(), label=f"{label}, mean")
        ax.set(xscale="log", yscale="log" if i in logy else "linear", xlabel="d_k", ylabel=ylabel)
        ax.legend(fontsize=7)
    fig.suptitle(
        "Per query: median, quartiles (dark), 10% to 90% (light), mean (dotted)", fontsize=9
    )
    fig.tight_layout()
    return fig


def head_maps(weights, title):
    """One layer's attention weights (h, seq_q, seq_k), one small heatmap per head, positions
    labelled t0, t1, ..."""
    h, seq_q, seq_k = weights.shape
    query_tokens, key_tokens = [f"t{i}" for i in range(seq_q)], [f"t{i}" for i in range(seq_k)]
    return attention_grid(weights, query_tokens, key_tokens, title=title, cell=0.09)


# Figures of chapters 3.3 to 3.6 ---------------------------------------------------------


def positional_table(table):
    """A positional encoding table (positions, d_model) as a heatmap: position across,
    dimension down, -1 red to +1 blue."""
    positions, d_model = table.shape
    return heatmap(
        _as_array(table).T,
        f"Positional encoding, {positions} positions x {d_model} dimensions",
        "position",
        ylabel="dimension",
        xticklabels=10,
        yticklabels=16,
        cmap="RdBu",
        vmin=-1,
        vmax=1,
        figsize=(8, 4),
    )


def positional_dimensions(table, dimensions):
    """Some columns of a positional encoding table (positions, d_model) against position."""
    series = {f"dimension {d}": _as_array(table)[:, d] for d in dimensions}
    title = "A few dimensions of the encoding"
    fig = curves(np.arange(len(table)), series, title, xlabel="position", ylabel="value")
    fig.axes[0].legend(loc="upper left", bbox_to_anchor=(1, 1))  # beside the curves
    return fig


def rotating_pair(table, i):
    """The pair of dimensions (2i, 2i + 1) of a positional encoding table, one point per
    position: the positions walk around the unit circle."""
    pair = _as_array(table)[:, 2 * i : 2 * i + 2]
    label = f"positions 0..{len(pair) - 1}"
    fig = curves(
        pair[:, 0],
        {label: pair[:, 1]},
        "One (sin, cos) pair: positions walk around a circle",
        xlabel=f"PE(pos, {2 * i})",
        ylabel=f"PE(pos, {2 * i + 1})",
        styles={label: "o-"},
        figsize=(4.5, 4.5),
    )
    fig.axes[0].set_aspect("equal")
    return fig


def dot_products_by_offset(offsets, series):
    """Dot products PE(pos) . PE(pos + k) against the offset k, one curve per pos:
    series = {label: values}."""
    styles = dict(zip(series, itertools.cycle(["-", "--", ":", "-."])))
    title = "PE(pos) . PE(pos + k) depends on k only"
    return curves(offsets, series, title, xlabel="offset k", ylabel="dot product", styles=styles)


# Figures of chapters 6.2 and 7 ----------------------------------------------------------


def _short_change(ours):
    """A row's change at our scale without the d_k and d_v that follow a new d_model (they
    keep d_model / h); a change of d_k alone is kept, and the base row is "base"."""
    parts = ours.split()
    return " ".join([p for p in parts if not p.startswith(("d_k=", "d_v="))] or parts) or "base"


def table3_comparison(comparison, noise, series, *, title):
    """Chapter 6.2's bars: table3_changes for every row of `comparison` but the base row, a
    frame indexed by the paper's labels with the columns "ours" (what the row changes at our
    scale), "paper ΔPPL %", "ΔPPL %" and our extremes over seeds, "lowest" and "highest";
    noise is the base row's range over seeds (highest minus lowest), in percent."""
    changed = comparison.drop(index="base")
    return table3_changes(
        [f"{label}\nours: {ours}" for label, ours in zip(changed.index, changed["ours"])],
        changed["paper ΔPPL %"],
        changed["ΔPPL %"],
        series=series,
        noise=noise,
        ours_range=(changed["lowest"], changed["highest"]),
        title=title,
    )


def table3_sizes(comparison, series, title):
    """Chapter 6.2's size chart: ppl_vs_params for the base row and the rows (B) and (C) of
    `comparison` (as in table3_comparison, with the columns "paper params ×10⁶", "paper PPL",
    "params" and "PPL"), each point labelled with what the row changes at our scale."""
    sized = comparison[[label == "base" or label[1] in "BC" for label in comparison.index]]
    return ppl_vs_params(
        [_short_change(ours) for ours in sized["ours"]],
        sized["paper params ×10⁶"].to_numpy(dtype=float),
        sized["paper PPL"].to_numpy(dtype=float),
        our_params=sized["params"].to_numpy(dtype=float),
        our_ppl=sized["PPL"].to_numpy(dtype=float),
        series=series,
        title=title,
    )


def sentence_attention(sentence, kind, layer, **options):
    """Chapter 7's maps: attention_grid of one layer (counted from 1) of one sentence as
    attention_analysis.extract records it (its tokens and its weights {kind: (N, h, seq_q,
    seq_k)}), for kind encoder_self, decoder_self or encoder_decoder."""
    queries = {
        "encoder_self": sentence["source"],
        "decoder_self": sentence["target_input"],
        "encoder_decoder": sentence["target_output"],
    }[kind]
    keys = sentence["target_input"] if kind == "decoder_self" else sentence["source"]
    names = {
        "encoder_self": "encoder self-attention",
        "decoder_self": "decoder self-attention",
        "encoder_decoder": "encoder-decoder attention (rows: the token being produced)",
    }
    title = f"layer {layer}, {names[kind]}: {sentence['text']}"
    weights = sentence["attention"][kind][layer - 1 : layer]
    return attention_grid(weights, queries, keys, title=title, first_layer=layer, **options)


def head_table_figure(table, columns, title, *, reference=None, reference_label="uniform"):
    """head_heatmaps of a table with one row per head, indexed "layer.head" in order
    (1.1, 1.2, ...), and a last row "uniform" (as attention_analysis.head_table returns it):
    one panel per column. reference maps a column to its baseline; by default the uniform
    row's values."""
    heads = table.drop(index="uniform")
    layer, head = (heads.index.str.split(".").str[i].astype(int) for i in (0, 1))
    shape = (layer.max(), head.max())
    if list(zip(layer, head)) != list(itertools.product(*(range(1, n + 1) for n in shape))):
        raise ValueError(f"the rows are not every layer.head in order: {list(heads.index)}")
    values = {column: heads[column].to_numpy().reshape(shape) for column in columns}
    if reference is None:
        reference = {column: table.loc["uniform", column] for column in columns}
    return head_heatmaps(values, title, reference, reference_label=reference_label)


# Figures of chapters 5 and 6.1 ----------------------------------------------------------
