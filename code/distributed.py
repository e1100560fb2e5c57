"""Several processes: the DistributedDataParallel wrapper, each process's rank, and the
random states that a checkpoint stores for every process.

GENERATED FILE, DO NOT EDIT. code/export.py writes it from the cells marked
`#| export distributed` in chapters/training_runs.ipynb;
change them, then run `python code/export.py`.
"""

import warnings

import torch
from torch import nn

# --------------------------------------------------------------------------------------
# Training runs that survive (ours), from chapters/training_runs.ipynb
# --------------------------------------------------------------------------------------

def unwrap(model):
    """The EncoderDecoder inside a DistributedDataParallel or torch.compile wrapper."""
    while hasattr(model, "module") or hasattr(model, "_orig_mod"):
        model = model.module if hasattr(model, "module") else model._orig_mod
    return model


class DistributedModel(nn.parallel.DistributedDataParallel):
    """DistributedDataParallel that lends its model's generator (forward_loss reads it)."""

    @property
    def generator(self):
        return self.module.generator


def distributed_rank_and_size():
    """(rank, world size) under torchrun's process group, (0, 1) in a single process."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def gather_rng_states(device, world):
    """Every rank's random states (CPU, and its GPU's), gathered on all ranks."""
    state = {"cpu": torch.get_rng_state()}
    if torch.device(device).type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    if world == 1:
        return [state]
    states = [None] * world
    torch.distributed.all_gather_object(states, state)
    return states


def restore_rng_state(states, rank, world, *, device):
    """This rank's saved random state back in place; a different process count warns."""
    if len(states) != world:
        warnings.warn(
            f"the checkpoint was written by {len(states)} process(es) and resumes in {world}: "
            f"batches and dropout masks differ from an uninterrupted run from here on",
            stacklevel=2,
        )
    if rank >= len(states):
        return
    torch.set_rng_state(states[rank]["cpu"])
    if torch.device(device).type == "cuda":
        if "cuda" in states[rank]:
            torch.cuda.set_rng_state(states[rank]["cuda"], device)
        else:
            warnings.warn(
                "no GPU random state in the checkpoint: GPU dropout starts afresh", stacklevel=2
            )
