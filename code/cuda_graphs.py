"""Training with CUDA graphs (ours): the code of chapters/cuda_graphs.ipynb.

GENERATED FILE, DO NOT EDIT. code/export.py writes it from the cells marked
`#| export` in chapters/cuda_graphs.ipynb; change the page, then run `python code/export.py`.
"""

import typing
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from annotated_transformer import BOS_ID, EOS_ID, Batch, InputError, make_optimizer, subsequent_mask
from step import capturable_step

# --------------------------------------------------------------------------------------
# Training with CUDA graphs (ours), from chapters/cuda_graphs.ipynb
# --------------------------------------------------------------------------------------

BUCKETS = (8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256)


def bucket(n, buckets=BUCKETS):
    """CUDA graphs: the smallest of `buckets` (ascending) that holds n; past the largest, the
    next multiple of the largest, so that any n has a bucket."""
    for size in buckets:
        if n <= size:
            return size
    return -(-n // buckets[-1]) * buckets[-1]


def bucketed_ids(corpus, indices, buckets=BUCKETS, *, rows=None):
    """CUDA graphs: the source ids (size, S) and target ids (size, T + 1) of these pairs of an
    EncodedCorpus, cut from its tables where they are: the longest source rounded up to a
    bucket S, the longest target without <s> to a bucket T, the number of pairs to a bucket
    `size`. The rows added are fillers that add nothing to the loss: a source of one </s>,
    a target of <s> alone, so that every query has a real key to attend to. rows: the
    indices as a tensor on the tables' device, when the caller has them there. The one cut
    of the training loop: buckets=(1,) rounds nothing (chapter 5's corpus.batch, exactly),
    (8,) rounds every size up to a multiple of 8 (for torch.compile: no size of 1)."""
    if rows is None:
        rows = torch.tensor(indices, device=corpus.src.device)
    real, size = len(indices), bucket(len(indices), buckets)
    sides = []
    for side, table, first in ((0, corpus.src, EOS_ID), (1, corpus.tgt, BOS_ID)):
        longest = max(corpus.lengths[i][side] for i in indices) - side  # target: less <s>
        length = bucket(longest, buckets) + side
        cut = table.narrow(1, 0, min(length, table.size(1))).index_select(0, rows)
        cut = F.pad(cut, (0, length - cut.size(1), 0, size - real), value=corpus.pad_id)
        cut[real:, 0].fill_(first)  # the fillers' one real token
        sides.append(cut)
    return sides


def bucketed_batch(corpus, indices, buckets=BUCKETS, *, rows=None):
    """CUDA graphs: the Batch of bucketed_ids; its ntokens counts the real target tokens."""
    src, tgt = bucketed_ids(corpus, indices, buckets, rows=rows)
    return Batch.from_tensors(src, tgt, corpus.target_tokens(indices), pad_id=corpus.pad_id)


class DeviceSchedule:
    """CUDA graphs: a learning-rate schedule kept on the device, where a captured step can
    set it. rate_of_update(k), a host function, gives the rate of update k + 1 (the function
    that make_optimizer's LambdaLR calls); fill() tabulates it on the host (`rates`) and
    copies the table to the device, in place, for updates 1 to max_steps + 1. `steps` counts
    the updates made and `lr`, the tensor the optimizer reads, holds the next update's rate
    (as the LambdaLR keeps it); step() advances both on the device. Past max_steps, where a
    run never goes, the rate stays the table's last (a replay cannot raise an error). A fill
    evaluates the function max_steps + 1 times (about half a microsecond each)."""

    def __init__(self, optimizer, rate_of_update, *, max_steps):
        self.lr = optimizer.param_groups[0]["lr"]
        if not all(group["lr"] is self.lr for group in optimizer.param_groups):
            raise ValueError("every parameter group must read the same learning-rate tensor")
        self.rate_of_update, self.max_steps = rate_of_update, max_steps
        self.table = torch.empty(max_steps + 1, dtype=torch.float32, device=self.lr.device)
        self.steps = torch.zeros(1, dtype=torch.long, device=self.lr.device)
        self.fill()

    def fill(self):
        self.rates = [self.rate_of_update(k) for k in range(self.max_steps + 1)]
        self.table.copy_(torch.tensor(self.rates))  # in place: a graph reads this table
        self.step(advance=False)

    def step(self, advance=True):
        if advance:
            self.steps += 1
        entry = self.steps.clamp(max=self.max_steps)
        self.lr.copy_(self.table.index_select(0, entry).squeeze(0))

    def state_dict(self):
        return {"steps": int(self.steps.item())}

    def load_state_dict(self, state):
        self.steps.fill_(state["steps"])
        self.step(advance=False)


def make_capturable_optimizer(
    model, d_model, lr_factor=1.0, *, max_steps, warmup_steps=4000, weight_decay=0.0
):
    """CUDA graphs: make_optimizer's AdamW and Eq. (3) for a step that can be captured: fused
    (one kernel updates every parameter), capturable on a GPU (its step counts stay there
    too), its learning rate a float32 tensor on the parameters' device that a DeviceSchedule
    sets from make_optimizer's own rate function, for max_steps updates. Returns
    (optimizer, schedule)."""
    device = next(model.parameters()).device
    optimizer, scheduler = make_optimizer(
        model,
        d_model,
        lr_factor,
        warmup_steps=warmup_steps,
        weight_decay=weight_decay,
        fused=True,
        capturable=device.type == "cuda",
    )
    lr = torch.zeros((), dtype=torch.float32, device=device)  # the fused kernel reads a float
    for group in optimizer.param_groups:
        group["lr"] = lr
    return optimizer, DeviceSchedule(optimizer, scheduler.lr_lambdas[0], max_steps=max_steps)


@dataclass(kw_only=True)
class StaticStep:
    """CUDA graphs: a batch shape's input buffers, its output, and its graph once captured."""

    src: torch.Tensor
    tgt: torch.Tensor
    ntokens: torch.Tensor
    causal: torch.Tensor
    sums: torch.Tensor
    graph: typing.Any = None
    eager_steps: int = 0


class GraphedTrainStep:
    """CUDA graphs: a training step replayed as one CUDA graph per batch shape, for one
    process. runner(src, tgt, ntokens), with ids as bucketed_ids cuts them and the real
    target tokens (a number from the host), returns [loss, nll] summed over the batch, on the
    device, as train_step does. On a GPU the first `eager_steps` batches of a shape run
    eagerly on a side stream (warm-up, and real updates), the next is captured, and every
    later one is copied into the shape's buffers and replayed. A graph keeps the addresses of
    the parameters, gradients and optimizer state: load checkpoints before the first step.
    On a CPU (or `meta`) every batch runs the same step eagerly."""

    def __init__(self, model, optimizer, schedule, *, smoothing, autocast=None, eager_steps=3):
        if eager_steps < 1:  # the optimizer's state must exist before a capture
            raise InputError(f"eager_steps must be at least 1, got {eager_steps}")
        self.step = capturable_step(
            model, optimizer, schedule, smoothing=smoothing, autocast=autocast
        )
        self.device, self.eager_steps = schedule.lr.device, eager_steps
        self.graphed = self.device.type == "cuda"
        self.shapes, self.masks = {}, {}
        if self.graphed:
            self.stream = torch.cuda.Stream(self.device)  # warm-up and capture, one stream
            self.pool = torch.cuda.graph_pool_handle()  # one memory pool for every graph

    def causal(self, length):
        """subsequent_mask(length) on the device, made once per target length."""
        if length not in self.masks:
            self.masks[length] = subsequent_mask(length, self.device)
        return self.masks[length]

    def static(self, src, tgt):
        """The buffers of this batch shape, made at its first batch."""
        key = (*src.shape, tgt.size(1))
        if key not in self.shapes:
            ntokens, sums = torch.zeros((), device=self.device), torch.zeros(2, device=self.device)
            causal = self.causal(tgt.size(1) - 1)
            inputs = {"src": torch.empty_like(src), "tgt": torch.empty_like(tgt)}
            self.shapes[key] = StaticStep(**inputs, ntokens=ntokens, causal=causal, sums=sums)
        return self.shapes[key]

    def __call__(self, src, tgt, ntokens):
        if not self.graphed:
            return self.step(src, tgt, ntokens, self.causal(tgt.size(1) - 1))
        static = self.static(src, tgt)
        static.src.copy_(src)
        static.tgt.copy_(tgt)
        static.ntokens.fill_(ntokens)
        inputs = static.src, static.tgt, static.ntokens, static.causal
        if static.graph is None and static.eager_steps < self.eager_steps:
            current = torch.cuda.current_stream(self.device)
            self.stream.wait_stream(current)
            with torch.cuda.stream(self.stream), warnings.catch_warnings():
                # capturable=True warns when it runs uncaptured, as warm-up must
                warnings.filterwarnings("ignore", "This instance was constructed with capturable")
                static.sums.copy_(self.step(*inputs))
            current.wait_stream(self.stream)
            static.eager_steps += 1
            return static.sums.clone()
        if static.graph is None:  # capture records the step's kernels and runs none of them
            static.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(static.graph, pool=self.pool, stream=self.stream):
                static.sums.copy_(self.step(*inputs))
        static.graph.replay()
        return static.sums.clone()  # the next replay overwrites static.sums
