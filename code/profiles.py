"""Whole runs' recipes: RunConfig (chapter 5's TrainConfig and how a run goes on) and the
PROFILES this book trains, changed field by field with apply_changes.

GENERATED FILE, DO NOT EDIT. code/export.py writes it from the cells marked
`#| export profiles` in chapters/training_runs.ipynb;
change them, then run `python code/export.py`.
"""

import dataclasses
import math
from dataclasses import dataclass, replace

from annotated_transformer import BASE, SMALL, InputError, ModelConfig, TrainConfig, numeric
from precision import AMP_CHOICES

# --------------------------------------------------------------------------------------
# Training runs that survive (ours), from chapters/training_runs.ipynb
# --------------------------------------------------------------------------------------

RUN_LENGTH_FIELDS = (
    *"max_steps max_seconds checkpoint_every keep_checkpoints".split(),
    *"eval_every bleu_sentences log_every".split(),
)


@dataclass(frozen=True, kw_only=True)
class RunConfig(TrainConfig):
    """A training run: the recipe of §5 (TrainConfig, chapter 5) and how the run goes on.
    The fields in RUN_LENGTH_FIELDS may change when a run is resumed; every other field
    must match.

    Attributes:
        anneal: the share of the steps after warm-up (0 to 1; 0: none) over which Eq. (3)'s
            rate is cooled down on a line to 0 at the run's last step (max_steps, or with
            max_seconds the step its pace so far plans)
        max_seconds: a time budget (0: none): the run ends at the last checkpoint that its
            pace so far puts within this many seconds of training
        checkpoint_every: save a checkpoint every this many steps
        keep_checkpoints: weight snapshots kept for averaging (§6.1 averages the last 5)
        eval_every: validation loss and BLEU every this many steps (given validation pairs)
        bleu_sentences: how many validation pairs (the first ones) are translated for BLEU
        log_every: read the loss from the device and log it every this many steps
        amp: the precision: off (float32; on a GPU with TF32 products), auto (bf16 on GPUs
            of compute capability 8.0 and up, fp16 with a gradient scaler on older ones,
            float32 on a CPU), bf16, fp16, or fastest (on a CPU, whichever of float32 and
            bf16 trains faster, timed when bf16 is native; on a GPU float32 with TF32,
            because eager bf16 starts slowly while every new shape is planned; a larger
            model may step faster in bf16: time both, or use auto)
        compile: a torch.compile backend ("inductor" is PyTorch's own) or "off" (eager)
        cuda_graphs: replay each step as a CUDA graph: one process, uncompiled, not fp16
            (unset: wherever that holds on a GPU; set on a CPU, the same step runs eagerly)
        buckets: cut every batch to a few bucketed shapes (unset: on a GPU, where each new
            shape costs cuDNN's attention a plan)
    """

    anneal: float = 0.0
    max_seconds: float = 0.0
    checkpoint_every: int = 500
    keep_checkpoints: int = 5
    eval_every: int = 500
    bleu_sentences: int = 200
    log_every: int = 10
    amp: str = "off"
    compile: str = "off"
    cuda_graphs: bool | None = None
    buckets: bool | None = None

    def rules(self):
        switch = ("True, False or None (unset)", lambda v: v is None or isinstance(v, bool))
        return super().rules() | {
            "anneal": ("a number in [0, 1]", lambda v: numeric(v) and 0 <= v <= 1),
            "max_seconds": ("a finite number >= 0", lambda v: numeric(v) and 0 <= v < math.inf),
            "amp": (f"one of {', '.join(AMP_CHOICES)}", lambda v: v in AMP_CHOICES),
            "compile": ("a torch.compile backend or 'off'", lambda v: v and isinstance(v, str)),
            "cuda_graphs": switch,
            "buckets": switch,
        }

    def defining_fields(self):
        """The fields a checkpoint must agree on to be resumed."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in RUN_LENGTH_FIELDS}


MULTI30K_STEPS = 8000  # updates of the multi30k recipe's full run
PROFILES = {
    "tiny": RunConfig(
        model=ModelConfig(N=1, d_model=32, d_ff=64, h=2, share_embeddings=True),
        vocab_size=200,
        max_tokens=200,
        warmup_steps=10,
        max_steps=6,
        checkpoint_every=3,
    ),
    "quick": RunConfig(warmup_steps=200, max_steps=300, checkpoint_every=100, eval_every=100),
    "multi30k": RunConfig(
        model=replace(SMALL, N=3, h=8, d_ff=512, share_embeddings=True),
        vocab_size=5000,
        warmup_steps=400,
        lr_factor=0.33,
        weight_decay=0.1,
        smoothing=0.2,
        max_steps=MULTI30K_STEPS,
        checkpoint_every=250,
        # eight validations: each adds to the whole command's time, most visibly on a GPU,
        # which trains this recipe in under a minute; validation never changes the weights
        eval_every=1000,
        bleu_sentences=500,
    ),
    # fifteen minutes on two CPU cores: multi30k's recipe with one layer less, half the
    # batch and label smoothing 0.1 instead of 0.2, on the reference attention (the stored
    # CPU benchmarks time it level with the fused kernel, for a 2-layer model of this width
    # and for base). As many
    # steps as fit in 885 s of training (a margin under 900 s for the pace to vary), the
    # rate cooled down to zero over the last fifth of those after warm-up, and §5.4's
    # dropout: a faster machine makes more steps, and more steps make a better model, not an
    # overfitted one. A rate factor of 0.5, not multi30k's 0.33 (chosen for 8000 steps of
    # batches twice as large): the lower val loss at two seeds each (the section "Where the
    # fifteen minutes of fast go" says what those runs can and cannot show)
    "fast": RunConfig(
        model=replace(SMALL, N=2, h=8, d_ff=512, share_embeddings=True, fused=False),
        vocab_size=5000,
        max_tokens=1000,
        warmup_steps=400,
        lr_factor=0.5,
        weight_decay=0.1,
        smoothing=0.1,
        anneal=0.2,
        amp="fastest",
        max_steps=20_000,
        max_seconds=885.0,
        checkpoint_every=100,
        keep_checkpoints=10,
        eval_every=500,
        bleu_sentences=500,
    ),
    # the base architecture on one GPU: batches 4x multi30k's and a quarter of its steps,
    # but all of its 400 warm-up steps, which a 6-layer post-LN stack needs (§5.3)
    "base": RunConfig(
        model=replace(BASE, share_embeddings=True),
        vocab_size=5000,
        max_tokens=8000,
        warmup_steps=400,
        lr_factor=0.23,
        weight_decay=0.1,
        smoothing=0.2,
        max_steps=MULTI30K_STEPS // 4,
        checkpoint_every=100,
        eval_every=100,
        bleu_sentences=500,
    ),
}


def apply_changes(config, changes):
    """`config` (a RunConfig) with some fields changed: {name: value}, where a name is a
    RunConfig field or a ModelConfig field (bare, "dropout", or "model.dropout")."""
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    train_fields = {f.name for f in dataclasses.fields(config)} - {"model"}
    model_changes, train_changes = {}, {}
    for name, value in changes.items():
        bare = name.removeprefix("model.")
        if bare in model_fields and bare not in train_fields:
            model_changes[bare] = value
        elif name in train_fields:
            train_changes[name] = value
        else:
            raise InputError(
                f"unknown field {name!r}: a change names a {type(config).__name__} field "
                f"({', '.join(sorted(train_fields))}) or a ModelConfig field "
                f"({', '.join(sorted(model_fields))})"
            )
    return replace(config, model=replace(config.model, **model_changes), **train_changes)
