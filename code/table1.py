"""Table 1 of "Attention Is All You Need", measured: the four layer types of §4, their
floating-point operations, sequential operations and maximum path lengths.

Helpers for chapters/04_why_self_attention.ipynb. Not part of the Transformer module: these
are minimal layers made to be compared, each mapping a (batch, n, d) sequence to another.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

# ---- the four layer types -------------------------------------------------------------------


class SelfAttentionLayer(nn.Module):
    """softmax(X X^T / sqrt(d)) X: every position attends to every position. O(n^2 d)."""

    def forward(self, x):
        return torch.softmax(x @ x.transpose(-2, -1) / math.sqrt(x.size(-1)), dim=-1) @ x


class RestrictedSelfAttentionLayer(nn.Module):
    """Self-attention over a window of r positions centred on each query (r odd). O(r n d)."""

    def __init__(self, r):
        super().__init__()
        if r < 1 or r % 2 == 0:
            raise ValueError(f"r must be a positive odd number, got {r}")
        self.r = r

    def forward(self, x):
        half = self.r // 2
        padded = F.pad(x, (0, 0, half, half))  # (batch, n + r - 1, d)
        windows = padded.unfold(1, self.r, 1).transpose(-2, -1)  # (batch, n, r, d)
        scores = (windows @ x.unsqueeze(-1)).squeeze(-1) / math.sqrt(x.size(-1))  # (batch, n, r)
        # positions that fall outside the sequence take no part
        inside = F.pad(torch.ones(x.size(1), dtype=torch.bool), (half, half)).unfold(0, self.r, 1)
        weights = scores.masked_fill(~inside, float("-inf")).softmax(-1)
        return (weights.unsqueeze(-2) @ windows).squeeze(-2)


class RecurrentLayer(nn.Module):
    """h_t = tanh(W h_{t-1} + U x_t), stepped over time as an RNN must be. O(n d^2)."""

    def __init__(self, d):
        super().__init__()
        self.w = nn.Linear(d, d, bias=False)
        self.u = nn.Linear(d, d, bias=False)

    def forward(self, x):
        h, outputs = x.new_zeros(x.size(0), x.size(2)), []
        for t in range(x.size(1)):
            h = torch.tanh(self.w(h) + self.u(x[:, t]))
            outputs.append(h)
        return torch.stack(outputs, dim=1)


class ConvolutionalLayer(nn.Module):
    """A 1-D convolution of kernel width k (odd), padded to keep the length. O(k n d^2)."""

    def __init__(self, d, k, dilation=1):
        super().__init__()
        self.conv = nn.Conv1d(d, d, k, dilation=dilation, padding=dilation * (k // 2), bias=False)

    def forward(self, x):
        return self.conv(x.transpose(1, 2)).transpose(1, 2)


# ---- complexity: operations per layer --------------------------------------------------------


def analytic_flops(layer_type, n, d, k=3, r=3):
    """Floating-point operations (2 per multiply-add) of the layers above, counting matrix
    products only, as torch's flop counter does."""
    counts = {
        "self-attention": 4 * n * n * d,  # X X^T and weights @ X
        "recurrent": 4 * n * d * d,  # W h and U x at each of n steps
        "convolutional": 2 * k * n * d * d,  # k taps of a d x d matrix at n positions
        "restricted self-attention": 4 * r * n * d,  # scores and weighted sum over r positions
    }
    return counts[layer_type]


def count_flops(module, x):
    """Floating-point operations of module(x), counted by torch.utils.flop_counter."""
    with FlopCounterMode(display=False) as counter:
        module(x)
    return counter.get_total_flops()


class _LargestTensor(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.numel() * tensor.element_size())
        return out


def largest_intermediate_bytes(module, x):
    """Bytes of the largest tensor any operation of module(x) produces: the memory a layer
    must hold at once (the n x n score matrix of self-attention, for instance)."""
    with torch.no_grad(), _LargestTensor() as recorder:
        module(x)
    return recorder.largest


def fitted_exponent(sizes, values):
    """Slope of log(values) against log(sizes), by least squares: the exponent of a power law."""
    x = torch.tensor([math.log(s) for s in sizes], dtype=torch.float64)
    y = torch.tensor([math.log(v) for v in values], dtype=torch.float64)
    x, y = x - x.mean(), y - y.mean()
    return float((x * y).sum() / (x * x).sum())


# ---- sequential operations ----------------------------------------------------------------


def graph_depth(output):
    """Length of the longest chain of operations in the autograd graph behind `output`: the
    operations that must run one after another, however many processors there are."""
    depth, stack = {}, [(output.grad_fn, False)]
    while stack:
        node, expanded = stack.pop()
        if node is None or node in depth:
            continue
        parents = [p for p, _ in node.next_functions if p is not None]
        if expanded:
            depth[node] = 1 + max((depth[p] for p in parents), default=0)
        else:
            stack.append((node, True))
            stack.extend((p, False) for p in parents if p not in depth)
    return depth[output.grad_fn]


# ---- maximum path length -------------------------------------------------------------------


def receptive_offsets(layer_type, layer, k=3, r=3):
    """Offsets j - i of the inputs j that output i reads directly, in stacked layer `layer`
    (0, 1, ...). The recurrent "layer" is one step of the recurrence; the dilated
    convolution is causal with dilation k^layer (so L layers see k^L positions back)."""
    if layer_type == "recurrent":
        return [-1, 0]
    if layer_type == "convolutional":
        return range(-(k // 2), k // 2 + 1)
    if layer_type == "dilated convolutional":  # causal, as in ByteNet's decoder and WaveNet
        return [-step * k**layer for step in range(k)]
    if layer_type == "restricted self-attention":
        return range(-(r // 2), r // 2 + 1)
    raise ValueError(f"unknown layer type {layer_type!r}")


def max_path_length(layer_type, n, k=3, r=3, limit=100_000):
    """The longest, over all pairs of positions, of the shortest path between them through
    stacked layers: how many layers (recurrence steps) until every output position depends
    on every input position. Computed by breadth-first propagation of dependency sets."""
    if layer_type == "self-attention":
        return 1 if n > 1 else 0
    full = (1 << n) - 1
    if layer_type in ("recurrent", "dilated convolutional"):
        # causal layers carry information forwards only: output i can depend on inputs <= i
        full_of = [(1 << (i + 1)) - 1 for i in range(n)]
    else:
        full_of = [full] * n
    depends = [1 << i for i in range(n)]  # after 0 layers, position i knows only itself
    for layers in range(limit):
        if all(depends[i] == full_of[i] for i in range(n)):
            return layers
        offsets = receptive_offsets(layer_type, layers, k, r)
        depends = [_union(depends[i + o] for o in offsets if 0 <= i + o < n) for i in range(n)]
    raise RuntimeError(f"{layer_type}: positions still unconnected after {limit} layers")


def _union(masks):
    total = 0
    for mask in masks:
        total |= mask
    return total
