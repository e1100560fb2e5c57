"""The paper's Figures 1 and 2, redrawn, each box named after the code that implements it.
Each function draws one figure and returns it. Coordinates are inches: the axes fill the
figure, so 1 data unit = 1 inch and a drawing 6.8 units wide is 700 px in the book's column.
Labels 8 pt, code names 7 pt monospace."""

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import FancyBboxPatch

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


def _sublayer(ax, x, y, side, *, text, code, fill, inputs="qkv"):
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


def _stack(ax, x, side, *, inputs, embedding, layer, sublayers):
    """One side of Figure 1 from the bottom: inputs, embedding (each a (text, code) pair),
    + positional encoding (the sinusoid drawn on `side`), then the N× block of sub-layers
    (_sublayer's keywords each); returns the bottoms of the sub-layer boxes and the block's
    top line."""
    ha = "left" if side > 0 else "right"
    (text, code), (name, module) = inputs, embedding
    height = _label(ax, x, 0.25, text, code)
    _arrow(ax, (x, 0.25 + height / 2), (x, 0.55))
    top = _box(ax, x, 0.55, name, module, "embed")
    plus, wave = (x, top + 0.23), (x + side * 0.38, top + 0.23)
    _arrow(ax, (x, top), (x, plus[1] - 0.09))
    _arrow(ax, (wave[0] - side * 0.11, wave[1]), (x + side * 0.09, plus[1]))
    for center, radius in ((plus, 0.09), (wave, 0.11)):
        ax.add_patch(plt.Circle(center, radius, facecolor="white", edgecolor="black", lw=1))
    _line(ax, (x - 0.09, plus[1]), (x + 0.09, plus[1]))
    _line(ax, (x, plus[1] - 0.09), (x, plus[1] + 0.09))
    t = np.linspace(-1, 1, 40)
    _line(ax, *zip(wave[0] + 0.08 * t, wave[1] + 0.05 * np.sin(np.pi * t)))
    _label(
        ax,
        wave[0] + side * 0.15,
        wave[1] - 0.03,
        "Positional\nEncoding",
        "PositionalEncoding",
        ha=ha,
    )
    y = plus[1] + 0.3
    _line(ax, (x, plus[1] + 0.09), (x, y))
    bottoms = []
    for sublayer in sublayers:
        y, bottom = _sublayer(ax, x, y, side, **sublayer)
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
    attention = {"text": "Multi-Head Attention", "code": "MultiHeadedAttention", "fill": "attn"}
    masked = {**attention, "text": "Masked\nMulti-Head Attention"}
    masked["code"] = "MultiHeadedAttention\n+ subsequent_mask"
    memory = {**attention, "code": "MultiHeadedAttention\n(src_attn)", "inputs": "q"}
    ffn = {"text": "Feed Forward", "code": "PositionwiseFeedForward", "fill": "ffn", "inputs": ""}
    _, enc_top = _stack(
        ax, xe, -1, inputs=("Inputs", "src"), embedding=("Input Embedding", "Embeddings"),
        layer="EncoderLayer", sublayers=[attention, ffn],
    )  # fmt: skip
    (_, cross, _), dec_top = _stack(
        ax, xd, +1, inputs=("Outputs\n(shifted right)", "tgt"),
        embedding=("Output Embedding", "Embeddings"), layer="DecoderLayer",
        sublayers=[masked, memory, ffn],
    )  # fmt: skip
    # the encoder's output, the memory z, goes up, across and down into V and K
    high, gap, low = enc_top + 0.25, (xe + xd) / 2, cross - 0.14
    _line(ax, (xe, enc_top), (xe, high), (gap, high), (gap, low), (xd, low))
    for dx in (-0.55, 0):
        _arrow(ax, (xd + dx, low), (xd + dx, cross))
    _label(ax, gap - 0.08, (high + low) / 2, "z", "memory", ha="right")
    out = [("Linear", "Generator.projection", "linear"), ("Softmax", "log_softmax", "softmax")]
    top = _column(ax, xd, dec_top, out, gap=0.2, out=0.2)[-1][1]
    _label(ax, xd, top + 0.32, "Output Probabilities")
    note, formula = "Add & Norm is post-LN, as in the paper:", "LayerNorm(x + Dropout(Sublayer(x)))"
    _label(ax, 0.1, top + 0.1, note, formula, ha="left")
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
    boxes = [("Concat", "transpose(1, 2).flatten(2)", "norm"), ("Linear", "w_o", "linear")]
    _column(ax, x, top, boxes, out=0.18)
    _label(ax, x, 3.78, "Multi-Head Attention", "MultiHeadedAttention(h, d_model)", size=9)
    return fig


def _tensor(ax, x, y, width, height, colors, cards=1, step=(0.09, 0.09)):
    """A tensor drawn as a rectangle whose left edge is at x and bottom at y (rows are
    positions, columns features), its columns split into len(colors) coloured blocks;
    cards > 1 draws that many copies behind it, offset by step, for a new leading axis.
    Returns the right edge and the top of the drawing."""
    for card in reversed(range(cards)):
        left, bottom = x + step[0] * card, y + step[1] * card
        color = colors[card] if cards > 1 else None
        blocks = [color] if cards > 1 else colors
        for i, fill in enumerate(blocks):
            w = width / len(blocks)
            ax.add_patch(
                plt.Rectangle((left + i * w, bottom), w, height, fc=fill, ec="k", lw=0.8, zorder=2)
            )
    return x + width + step[0] * (cards - 1), y + height + step[1] * (cards - 1)


def head_shapes_figure(h=4):
    """The shapes through multi-head attention (§3.2.2), for the queries (keys and values
    are split the same way): project, split into h heads, attend per head, concatenate,
    project with W^O. Columns of one colour belong to one head."""
    fig, ax = _canvas(6.8, 4.1)
    heads = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"][:h]
    grey, n, d_model = "#d9d9d9", 0.85, 1.2
    d_k, square = d_model / h, n

    def caption(x, y_top, y_bottom, math, shape):
        ax.text(x, y_top + 0.12, math, ha="center", va="bottom", fontsize=9, zorder=3)
        ax.text(x, y_bottom - 0.1, shape, ha="center", va="top", **_CODE)

    def step(x0, x1, y, code):
        _arrow(ax, (x0 + 0.08, y), (x1 - 0.08, y))
        ax.text((x0 + x1) / 2, y + 0.07, code, ha="center", va="bottom", **_CODE)

    def row(y, stages):
        """Tensors left to right, each after an arrow labelled with the code that makes it:
        stages of (gap before it, code, width, colours, cards, drop, math, shape)."""
        right = 0.0
        for gap, code, width, colours, cards, drop, math, shape in stages:
            x = right + gap
            if code:
                step(right, x, y + n / 2, code)
            right, top = _tensor(ax, x, y - drop, width, n, colours, cards=cards)
            caption((x + right) / 2, top, y - drop, math, shape)
        return right, top

    # top row: X -> X W^Q -> h heads
    top_mid = 2.65 + n / 2
    right, _ = row(2.65, [
        (0.25, "", d_model, [grey], 1, 0, "$X$", "(batch, n, d_model)"),
        (0.75, "w_q", d_model, heads, 1, 0, "$XW^Q$, heads side by side", "(batch, n, h·d_k)"),
        (0.95, "split_heads", d_k, heads, h, 0.1, "$Q_i = XW_i^Q$", "(batch, h, n, d_k)"),
    ])  # fmt: skip
    ax.text(right + 0.06, top_mid, "h heads", fontsize=8, va="center", style="italic")

    # bottom row: weights per head -> head_i -> Concat -> W^O
    weights = r"softmax$(Q_iK_i^\top/\sqrt{d_k})$"
    row(0.45, [
        (0.25, "", square, heads, h, 0, weights, "(batch, h, n, n)"),
        (0.7, "@ value", d_k, heads, h, 0, r"head$_i$", "(batch, h, n, d_v)"),
        (0.95, "transpose,\nflatten", d_model, heads, 1, 0, "Concat(head$_1$, …, head$_h$)",
         "(batch, n, h·d_v)"),
        (0.6, "w_o", d_model, [grey], 1, 0, "MultiHead$(Q, K, V)$", "(batch, n, d_model)"),
    ])  # fmt: skip

    # the two rows joined: the heads' queries (with K_i and V_i) go into the attention
    _arrow(ax, (5.6, top_mid), (6.6, top_mid), (6.6, 2.03), (0.1, 2.03), (0.1, 0.88), (0.25, 0.88))
    note = "each head's queries, with its $K_i$ and $V_i$ (split the same way), into attention"
    ax.text(3.35, 2.08, note, ha="center", va="bottom", fontsize=8)
    return fig
