"""Eq. (3) cooled down on a line to 0 at a run's last step (`anneal`), and the planning of
that last step.

GENERATED FILE, DO NOT EDIT. code/export.py writes it from the cells marked
`#| export schedule` in chapters/training_runs.ipynb;
change them, then run `python code/export.py`.
"""

import torch

from annotated_transformer import rate
from cuda_graphs import DeviceSchedule

# --------------------------------------------------------------------------------------
# Training runs that survive (ours), from chapters/training_runs.ipynb
# --------------------------------------------------------------------------------------

class AnnealedRate:
    """anneal > 0: the rate of update k + 1 (a LambdaLR's k, as in make_optimizer) by
    annealed_rate; LambdaLR saves this object's fields, last_step among them."""

    def __init__(self, d_model, lr_factor, warmup_steps, *, share, last_step=0):
        self.d_model, self.lr_factor, self.warmup_steps = d_model, lr_factor, warmup_steps
        self.share, self.last_step = share, last_step

    def __call__(self, k):
        return annealed_rate(
            k + 1,
            self.d_model,
            self.lr_factor,
            warmup_steps=self.warmup_steps,
            last_step=self.last_step,
            share=self.share,
        )


def annealed_rate(step, d_model, lr_factor, *, warmup_steps, last_step, share=1.0):
    """Eq. (3)'s rate at `step`, times a cool-down: 1, then over the last `share` of the
    steps between warm-up and last_step a line falling to 0 at last_step (0: not planned
    yet, the ramp stays 1)."""
    ramp = 1.0
    if last_step:
        ramp = min(1.0, max(0.0, (last_step - step) / max(share * (last_step - warmup_steps), 1)))
    return rate(step, d_model, lr_factor, warmup_steps=warmup_steps) * ramp


def time_to_plan(state, config):
    """anneal > 0: plan at the first log at or past the end of warm-up and, with a time
    budget, again at every checkpoint, so that a run whose pace changes still ends at 0."""
    if not config.anneal or state.step < config.warmup_steps:
        return False
    return not state.last_step or config.max_seconds and state.step % config.checkpoint_every == 0


def plan_last_step(state, context):
    """Fix the step where an annealed rate reaches 0: max_steps, or with max_seconds the last
    checkpoint that the mean pace so far puts within the budget (rank 0's clock decides for
    all processes)."""
    config, last = context.config, context.config.max_steps
    if config.max_seconds:
        fits = int(state.step * config.max_seconds / max(state.seconds, 1e-9))
        last = min(last, max(state.step, fits - fits % config.checkpoint_every))
        if context.world > 1:
            last_tensor = torch.tensor(last, device=context.device)
            torch.distributed.broadcast(last_tensor, src=0)
            last = int(last_tensor.item())
    if last != state.last_step:
        context.log(f"step {state.step}: the rate will reach 0 at step {last}")
    set_last_step(state, last)


def set_last_step(state, last_step):
    """Tell the run's schedule (an AnnealedSchedule, or an AnnealedDeviceSchedule) where its
    rate reaches 0; the rate of the next update follows at once."""
    state.last_step = last_step
    state.scheduler.plan(last_step)


class AnnealedSchedule(torch.optim.lr_scheduler.LambdaLR):
    """make_optimizer's schedule with an AnnealedRate: plan(last_step) fixes where the rate
    reaches 0 and sets the next update's rate at once."""

    def plan(self, last_step):
        ramped = self.lr_lambdas[0]
        ramped.last_step = last_step
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base * ramped(self.last_epoch)


class AnnealedDeviceSchedule(DeviceSchedule):
    """The CUDA graphs page's DeviceSchedule with an AnnealedRate: plan(last_step) fixes where
    the rate reaches 0 and tabulates the rates again, into the table a graph reads."""

    def plan(self, last_step):
        self.rate_of_update.last_step = last_step
        self.fill()
