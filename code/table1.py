"""Table 1 of "Attention Is All You Need", measured: the four layer types of §4, their
floating-point operations, sequential operations and maximum path lengths, each measured on
the layers themselves (the path lengths by a search over the connection graphs that autograd
reads off the layers).

Helpers for chapters/04_why_self_attention.ipynb. Not part of the Transformer module: these
are minimal layers made to be compared, each mapping a (batch, n, d) sequence to another.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
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

    def at_once(self, x, previous):
        """The same arithmetic with every h_{t-1} given in advance (previous, the shape of x):
        all n steps in one call, which the recurrence itself does not allow."""
        return torch.tanh(self.w(previous) + self.u(x))


class ConvolutionalLayer(nn.Module):
    """A 1-D convolution of kernel width k, padded to keep the length. O(k n d^2). Centred (k
    odd), output i reads inputs i - (k - 1) / 2 to i + (k - 1) / 2; causal, as in ByteNet's
    decoder and WaveNet, it reads inputs i, i - dilation, ..., i - (k - 1) dilation."""

    def __init__(self, d, k, dilation=1, *, causal=False):
        super().__init__()
        if not causal and k % 2 == 0:
            raise ValueError(f"a centred kernel needs an odd width k, got {k}")
        self.past = dilation * (k - 1) if causal else 0  # zeros before the sequence
        padding = 0 if causal else dilation * (k // 2)
        self.conv = nn.Conv1d(d, d, k, dilation=dilation, padding=padding, bias=False)

    def forward(self, x):
        x = x.transpose(1, 2)  # (batch, d, n)
        if self.past:
            x = F.pad(x, (self.past, 0))
        return self.conv(x).transpose(1, 2)


# ---- complexity: operations per layer --------------------------------------------------------


def analytic_flops(layer_type, n, d, *, k=3, r=3):
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
        inputs = {_storage(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for tensor in tree_leaves(out):
            # a view (unfold's windows, a transpose) shares its input's memory: nothing new
            if isinstance(tensor, torch.Tensor) and _storage(tensor) not in inputs:
                self.largest = max(self.largest, tensor.untyped_storage().nbytes())
        return out


def _storage(tensor):
    return tensor.untyped_storage().data_ptr()


def largest_intermediate_bytes(module, x):
    """Bytes of the largest tensor any operation of module(x) allocates: the memory a layer
    must hold at once (the n x n score matrix of self-attention, for instance). Views, which
    share the memory of the tensor they view, allocate nothing and are not counted."""
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


def connections(module, n, d=2):
    """Which inputs each output of module reads, read off autograd: an (n, n) boolean matrix,
    True at (i, j) when output position i depends on input position j, that is when the
    gradient of output i (its d features weighted at random) with respect to input j is
    nonzero. One backward pass: copy b of a batch of n copies of one random input carries the
    gradient of output b."""
    x = torch.randn(1, n, d).repeat(n, 1, 1).requires_grad_()
    outputs = module(x)[torch.arange(n), torch.arange(n)]  # output b of copy b: (n, d)
    (outputs * torch.randn(d)).sum().backward()
    return x.grad.abs().sum(-1) > 0


def layer_graph(layer_type, n, layer=0, *, k=3, r=3):
    """The connection graph of layer `layer` (0, 1, ...) of a stack of one layer type, as
    connections reads it off the layer itself: output i reads input j directly. The
    recurrent "layer" is one step of the recurrence, in which h_i reads h_{i-1} and x_i; the
    dilated convolution is causal with dilation k^layer (so L layers see k^L positions back)."""
    if layer_type == "recurrent":
        offset = torch.arange(n)[:, None] - torch.arange(n)[None, :]  # i - j
        return (offset == 0) | (offset == 1)
    make = {
        "self-attention": lambda: SelfAttentionLayer(),
        "convolutional": lambda: ConvolutionalLayer(2, k),
        "dilated convolutional": lambda: ConvolutionalLayer(2, k, k**layer, causal=True),
        "restricted self-attention": lambda: RestrictedSelfAttentionLayer(r),
    }
    if layer_type not in make:
        raise ValueError(f"unknown layer type {layer_type!r}")
    with torch.random.fork_rng():  # the page's random numbers stay as they were
        torch.manual_seed(0)
        return connections(make[layer_type](), n)


def stacked_path_length(graph, n, limit=100_000):
    """Breadth-first search through a stack of layers, graph(layer) being the (n, n)
    connection graph of layer `layer` (0, 1, ...): stack layers until one more connects no
    new pair of positions, and return how many that took. As each position reads itself, it
    is the longest, over all pairs the stack connects, of the fewest layers between them.
    The set of inputs each position depends on is kept as the bits of an integer."""
    depends = [1 << i for i in range(n)]  # after 0 layers, position i knows only itself
    edges = {}  # the (output, input) pairs of each distinct graph
    for layers in range(limit):
        reads = graph(layers)
        if id(reads) not in edges:
            if not bool(reads.diagonal().all()):
                raise ValueError(f"layer {layers}: every position must read itself")
            edges[id(reads)] = reads, reads.nonzero().tolist()
        stacked = [0] * n
        for i, j in edges[id(reads)][1]:
            stacked[i] |= depends[j]
        if stacked == depends:
            return layers
        depends = stacked
    raise RuntimeError(f"positions still being connected after {limit} layers")


def max_path_length(layer_type, n, k=3, *, r=3):
    """The maximum path length of Table 1 for n positions: how many layers (recurrence steps)
    a stack of this layer type needs until every output depends on every input it can depend
    on, found by stacked_path_length over the layers' connection graphs (layer_graph)."""
    graphs = {}

    def graph(layer):
        key = layer if layer_type == "dilated convolutional" else 0  # the others repeat
        if key not in graphs:
            graphs[key] = layer_graph(layer_type, n, layer, k=k, r=r)
        return graphs[key]

    return stacked_path_length(graph, n)
