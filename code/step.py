"""One update as the training runs make it: chapter 5's train_step in mixed precision
(train_step_amp), and the same update as a function of tensors that a CUDA graph can
capture (capturable_step).

GENERATED FILE, DO NOT EDIT. code/export.py writes it from the cells marked
`#| export step` in chapters/cuda_graphs.ipynb;
change them, then run `python code/export.py`.
"""

import torch

from annotated_transformer import PAD_ID, Batch, InputError, forward_loss, padding_mask
from precision import mixed_precision

# --------------------------------------------------------------------------------------
# Training with CUDA graphs (ours), from chapters/cuda_graphs.ipynb
# --------------------------------------------------------------------------------------

def train_step_amp(
    model,
    batch,
    optimizer,
    *,
    scheduler,
    scaler,
    smoothing,
    ntokens=None,
    autocast=None,
    captured=False,
):
    """train_step (chapter 5) in mixed precision, for one process's share of an update: the
    loss averaged over `ntokens` target tokens (the batch's own by default). autocast: the
    dtype the forward pass computes in (torch.bfloat16 or torch.float16; None: float32);
    scaler: a torch.amp.GradScaler, disabled unless autocast is float16; captured: the step
    is recorded in a CUDA graph (capturable_step). Returns [loss, nll] summed over the
    batch, on the device."""
    with mixed_precision(batch.src.device.type, autocast, cache=not captured):
        loss, nll = forward_loss(model, batch, smoothing)
    scaler.scale(loss / (batch.ntokens if ntokens is None else ntokens)).backward()
    scale = scaler.get_scale() if scaler.is_enabled() else None
    scaler.step(optimizer)  # float16: skipped when a gradient overflowed,
    scaler.update()  # and then the scale is lowered
    optimizer.zero_grad(set_to_none=not captured)  # captured: the same buffers every replay
    if scale is None or scaler.get_scale() >= scale:  # Eq. (3) counts the updates made
        scheduler.step()
    return torch.stack([loss.detach(), nll])


def capturable_step(model, optimizer, schedule, *, smoothing, autocast=None):
    """CUDA graphs: train_step_amp as a function of tensors alone, that a CUDA graph can
    capture. step(src, tgt, ntokens, causal): source ids (batch, S), target ids with <s> and
    </s> (batch, T + 1), the real target tokens (a number, or a tensor on the device), and
    subsequent_mask(T) on the device; returns [loss, nll] summed over the batch."""
    if autocast == torch.float16:
        raise InputError("float16 needs a gradient scaler, which reads the device: use bf16")
    no_scaler = torch.amp.GradScaler(enabled=False)  # float32 and bfloat16 need none

    def step(src, tgt, ntokens, causal):
        tgt_in, tgt_y = tgt[:, :-1], tgt[:, 1:]
        # target_mask, its causal part made once per length, outside the step
        masks = {"src_mask": padding_mask(src, PAD_ID)}
        masks["tgt_mask"] = padding_mask(tgt_in, PAD_ID) & causal
        batch = Batch(src, tgt_in, tgt_y, ntokens=ntokens, **masks)
        parts = {"scheduler": schedule, "scaler": no_scaler, "smoothing": smoothing}
        return train_step_amp(model, batch, optimizer, **parts, autocast=autocast, captured=True)

    return step
