"""Training runs that survive (ours): the code of chapters/training_runs.ipynb.

GENERATED FILE, DO NOT EDIT. code/export.py writes it from the cells marked
`#| export` in chapters/training_runs.ipynb; change the page, then run `python code/export.py`.
"""

import contextlib
import copy
import dataclasses
import itertools
import math
import os
import pathlib
import platform
import socket
import statistics
import time
import typing
import warnings
from dataclasses import dataclass, field, replace

import torch
from tokenizers import Tokenizer
from torch import nn
from tqdm import tqdm

from annotated_transformer import (
    BASE,
    CHECKPOINT_FORMAT,
    SMALL,
    EncodedCorpus,
    InputError,
    ModelConfig,
    TrainConfig,
    batch_by_tokens,
    build_model,
    check_device,
    evaluate_bleu,
    forward_loss,
    load_tokenizer,
    make_optimizer,
    numeric,
    rate,
    read_checkpoint,
    save_checkpoint,
    train_bpe,
    validation_loss,
)
from cuda_graphs import (
    BUCKETS,
    GraphedTrainStep,
    bucketed_batch,
    bucketed_ids,
    make_capturable_optimizer,
)
from fast_decoding import fast_decode_batch
from safe_files import atomic_file, write_json

# --------------------------------------------------------------------------------------
# Training runs that survive (ours), from chapters/training_runs.ipynb
# --------------------------------------------------------------------------------------

AMP_CHOICES = ("auto", "bf16", "fp16", "off", "fastest")
PRECISIONS = {None: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
AMP_OF_PRECISION = {"float32": "off", "bfloat16": "bf16", "float16": "fp16"}


def autocast_dtype(amp, device):
    """The autocast dtype that `amp` means on `device` (None: float32 throughout); for
    "fastest" on a CPU, see race_precisions."""
    if amp is None or amp in ("off", "fastest"):  # fastest on a GPU: float32 (TF32)
        return None
    if amp not in AMP_CHOICES:
        raise InputError(f"amp must be one of {', '.join(AMP_CHOICES)}, got {amp!r}")
    device = torch.device(device)
    if amp == "auto":
        if device.type != "cuda":
            return None
        return torch.bfloat16 if native_bf16(device) else torch.float16
    return torch.bfloat16 if amp == "bf16" else torch.float16


def native_bf16(device):
    """Whether `device` multiplies in bfloat16 natively: a GPU of compute capability 8.0
    (Ampere) or later, a CPU with AVX-512 BF16 or AMX. Elsewhere bfloat16 is emulated, and
    slower than float32 (torch.cuda.is_bf16_supported() says yes to an emulating T4)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 0)
    # torch's own cpuinfo, not mkldnn's check, which says yes to any AVX-512 CPU; these
    # helpers are private to torch: should they go, the answer is no
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except (AttributeError, RuntimeError):
        return False


def race_precisions(config, corpus, vocab, rounds=5):
    """float32 (None) or bfloat16, whichever trains this recipe faster on this CPU: a
    scratch model in each takes one warm-up update, then `rounds` rounds in which the two
    take turns, one timed update each on the same batch of the run's first epoch; the
    faster median wins, so that a moment's slowdown of the machine decides nothing.
    Without native bfloat16, float32, untimed. The random state is left as it was."""
    if not native_bf16("cpu"):
        return None
    plan = epoch_updates(corpus, config, epoch=0)[: rounds + 1]
    batches = [corpus.batch(indices) for indices, *_ in plan]
    seconds = {None: [], torch.bfloat16: []}
    with torch.random.fork_rng():
        runs = {amp: RunState.new(config, vocab, amp=amp) for amp in seconds}
        for i in range(rounds + 1):  # round 0 warms each up, untimed
            batch = batches[i % len(batches)]  # a short epoch repeats its batches
            for amp, run in runs.items():
                started = time.perf_counter()
                args = run.optimizer, run.scheduler, run.scaler, config.smoothing
                train_step_amp(run.model, batch, *args, amp=amp).tolist()
                if i:
                    seconds[amp].append(time.perf_counter() - started)
    return min(seconds, key=lambda amp: statistics.median(seconds[amp]))


def cpu_model():
    """The CPU's model name from /proc/cpuinfo (Linux), else what platform knows of it."""
    try:
        with open("/proc/cpuinfo") as file:
            return next(line.split(":", 1)[1].strip() for line in file if "model name" in line)
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def cpu_features():
    """The instruction sets that decide this book's CPU speeds, as /proc/cpuinfo names them
    (Linux; elsewhere none are named): AVX2, AVX-512, AVX-512 BF16, AMX."""
    names = {"avx2": "AVX2", "avx512f": "AVX-512", "avx512_bf16": "AVX-512 BF16"}
    names["amx_tile"] = "AMX"
    try:
        with open("/proc/cpuinfo") as file:
            flags = next(line.split(":", 1)[1].split() for line in file if line.startswith("flags"))
    except (OSError, StopIteration):
        return []
    return [name for flag, name in names.items() if flag in flags]


def hardware_description(device="cpu"):
    """One line naming the machine a result came from, as a reader needs it: the GPU and
    whether its float32 products run in TF32 at the moment (tf32_matmuls), or the CPU's
    model, the instruction sets of cpu_features and the threads used; and torch's version."""
    device = torch.device(device)
    if device.type == "cuda":
        tf32 = ", TF32 products" * (torch.backends.cuda.matmul.fp32_precision == "tf32")
        return f"{torch.cuda.get_device_name(device)}{tf32}, torch {torch.__version__}"
    threads, features = torch.get_num_threads(), "/".join(cpu_features()) or "no AVX2"
    return (
        f"{cpu_model()} ({features}), {threads} thread{'s' * (threads != 1)}, "
        f"torch {torch.__version__}"
    )


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


def train_step_amp(model, batch, optimizer, scheduler, scaler, smoothing, ntokens=None, amp=None):
    """train_step (chapter 5) in mixed precision, for one process's share of an update: the
    loss averaged over `ntokens` target tokens (the batch's own by default). amp: an
    autocast dtype or None; scaler: a torch.amp.GradScaler, disabled unless amp is float16.
    Returns [loss, nll] summed over the batch, on the device."""
    precision = torch.autocast(batch.src.device.type, amp) if amp else contextlib.nullcontext()
    with precision:
        loss, nll = forward_loss(model, batch, smoothing)
    scaler.scale(loss / (ntokens or batch.ntokens)).backward()
    scale = scaler.get_scale() if scaler.is_enabled() else None
    scaler.step(optimizer)  # float16: skipped when a gradient overflowed,
    scaler.update()  # and then the scale is lowered
    optimizer.zero_grad(set_to_none=True)
    if scale is None or scaler.get_scale() >= scale:  # Eq. (3) counts the updates made
        scheduler.step()
    return torch.stack([loss.detach(), nll])


def corpus_on(corpus, device):
    """The EncodedCorpus with its two tables on `device`; the lengths stay on the host, which
    needs them to know each batch's shape. Batches are then cut where the model is."""
    moved = copy.copy(corpus)
    moved.src, moved.tgt = corpus.src.to(device), corpus.tgt.to(device)
    return moved


def snapshot_paths(out_dir):
    """The weight snapshots of a run, oldest first: out_dir/checkpoint-<step>.pt."""
    return sorted(pathlib.Path(out_dir).glob("checkpoint-*.pt"))


class RunFolderBusy(FileExistsError):
    """Another live process is training in this folder."""


class RunFolder:
    """with RunFolder(out, resume): out exists, holds no finished run unless resume, is
    locked by this process (out/.lock: host and pid), and holds no stale temporary files;
    owner=False (torchrun ranks > 0) touches nothing."""

    def __init__(self, out, resume=False, owner=True):
        self.out, self.resume, self.owner = pathlib.Path(out), resume, owner
        self.lock = self.out / ".lock"

    def __enter__(self):
        if not self.owner:
            return self
        if not self.resume and (self.out / "checkpoint.pt").exists():
            raise FileExistsError(
                f"{self.out / 'checkpoint.pt'} already exists; resume it (--resume) or "
                f"start the new run in another folder, so the earlier one is kept"
            )
        self.out.mkdir(parents=True, exist_ok=True)
        me = f"{socket.gethostname()} {os.getpid()}"
        try:
            fd = os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            holder = self.lock.read_text().strip()
            host, _, pid = holder.partition(" ")
            if host != socket.gethostname() or process_alive(int(pid or 0)):
                raise RunFolderBusy(
                    f"{self.out} is in use by process {holder} (lock file {self.lock}); wait "
                    f"for it to finish or train into another folder"
                ) from None
            self.lock.write_text(me + "\n")  # the holder died: take the folder over
        else:
            with os.fdopen(fd, "w") as file:
                file.write(me + "\n")
        for stale in self.out.glob("*.tmp"):  # from a save that was killed
            stale.unlink()
        return self

    def __exit__(self, *exc):
        if self.owner:
            self.lock.unlink(missing_ok=True)


def process_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0


RUN_LENGTH_FIELDS = (
    *"max_steps max_seconds checkpoint_every keep_checkpoints".split(),
    *"eval_every bleu_sentences log_every".split(),
)


@dataclass(frozen=True)
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


@dataclass
class RunState:
    """What a run has built and done so far: all that a checkpoint saves."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    step: int = 0
    epoch: int = 0
    position: int = 0  # updates of the current epoch already made
    tokens_seen: int = 0  # target tokens, all processes
    seconds: float = 0.0  # training time over all sessions, validation excluded
    last_step: int = 0  # where an annealed rate reaches 0, once planned (plan_last_step)
    history: list = field(default_factory=list)  # per step: loss, nll, lr, tokens
    validation: list = field(default_factory=list)  # per evaluation: step, seconds, figures

    @classmethod
    def new(cls, config, vocab, device="cpu", amp=None, cuda_graphs=False):
        """A fresh run: the model initialised with config.seed, AdamW with Eq. (3) (the
        capturable one of the CUDA graphs page when asked), and the gradient scaler
        (active only for float16 autocast)."""
        torch.manual_seed(config.seed)
        model = build_model(vocab, vocab, config.model).to(device)
        d_model, decay = config.model.d_model, config.weight_decay
        make = make_capturable_optimizer if cuda_graphs else make_optimizer
        optimizer, scheduler = make(model, d_model, config.lr_factor, config.warmup_steps, decay)
        anneal = getattr(config, "anneal", 0)  # chapter 5's TrainConfig does not anneal
        if anneal and cuda_graphs:  # a DeviceSchedule anneals by itself
            scheduler.share = anneal
        elif anneal:
            ramped = AnnealedRate(d_model, config.lr_factor, config.warmup_steps, anneal)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, ramped)
        scaler = torch.amp.GradScaler(torch.device(device).type, enabled=amp == torch.float16)
        return cls(model, optimizer, scheduler, scaler)


@dataclass
class RunContext:
    """What stays fixed while a run trains: its recipe, folder, data and processes."""

    config: RunConfig
    out: pathlib.Path
    tokenizer: Tokenizer
    corpus: EncodedCorpus
    val: tuple | None  # (EncodedCorpus of all val pairs, the pairs BLEU translates)
    device: str
    amp: torch.dtype | None
    rank: int = 0
    world: int = 1
    log: typing.Callable = print
    cuda_graphs: bool = False  # steps replayed as CUDA graphs (the CUDA graphs page)
    buckets: bool = False  # batches cut to bucketed shapes (the CUDA graphs page) on a GPU
    hardware: str = ""  # the machine, as hardware_description names it, and the precision


class AnnealedRate:
    """anneal > 0: the rate of update k + 1 (a LambdaLR's k, as in make_optimizer) by
    annealed_rate; LambdaLR saves this object's fields, last_step among them."""

    def __init__(self, d_model, factor, warmup, share, last_step=0):
        self.d_model, self.factor, self.warmup = d_model, factor, warmup
        self.share, self.last_step = share, last_step

    def __call__(self, k):
        args = self.d_model, self.factor, self.warmup, self.last_step, self.share
        return annealed_rate(k + 1, *args)


def annealed_rate(step, model_size, factor, warmup, last_step, share=1.0):
    """Eq. (3)'s rate at `step`, times a cool-down: 1, then over the last `share` of the
    steps between warm-up and last_step a line falling to 0 at last_step (0: not planned
    yet, the factor stays 1)."""
    ramp = 1.0
    if last_step:
        ramp = min(1.0, max(0.0, (last_step - step) / max(share * (last_step - warmup), 1)))
    return rate(step, model_size, factor, warmup) * ramp


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
    """Tell the run's schedule, whichever kind it is, where its rate reaches 0; the rate of
    the next update follows at once."""
    state.last_step, schedule = last_step, state.scheduler
    if not isinstance(schedule, torch.optim.lr_scheduler.LambdaLR):
        return schedule.plan(last_step)
    schedule.lr_lambdas[0].last_step = last_step
    for group, base in zip(schedule.optimizer.param_groups, schedule.base_lrs):
        group["lr"] = base * schedule.lr_lambdas[0](schedule.last_epoch)


def epoch_updates(corpus, config, epoch, world=1):
    """One epoch's updates, each a list of `world` batches (index lists), one per process,
    of max_tokens / world tokens a side; the order depends only on (seed, epoch)."""
    batches = batch_by_tokens(corpus.lengths, config.max_tokens // world, config.seed + epoch)
    return [batches[i : i + world] for i in range(0, len(batches) - world + 1, world)]


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


def restore_rng_state(states, rank, world, device):
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


def validate(model, corpus, pairs, tokenizer):
    """The validation figures logged during training and stored with each snapshot: the
    loss over the whole corpus (its tables where the model is) and BLEU of greedy
    translations of `pairs` (6.1's evaluate_bleu), decoded on the fast path; the mode is
    restored. On a GPU all `pairs` are decoded as one batch: a batch's time there is its
    number of decoding steps, hardly its width."""
    model = unwrap(model)
    training, loss = model.training, validation_loss(model, corpus)
    greedy = dict(beam_size=1, decode=fast_decode_batch)  # in translate's batches on a CPU
    if corpus.src.device.type == "cuda":
        greedy["batch_size"] = len(pairs)
    bleu = evaluate_bleu(model, tokenizer, pairs, **greedy)
    model.train(training)
    return {
        "val_loss": round(loss, 4),
        "val_ppl": round(math.exp(loss), 2),
        "val_bleu": bleu["bleu"],
        "bleu_sentences": len(pairs),
    }


def differing_fields(saved, wanted, prefix=""):
    """'name: saved -> wanted' for every field, nested ones dotted, that differs."""
    found = []
    for name in sorted(set(saved) | set(wanted)):
        a, b = saved.get(name, "<absent>"), wanted.get(name, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            found += differing_fields(a, b, f"{prefix}{name}.")
        elif a != b:
            found.append(f"{prefix}{name}: {a!r} -> {b!r}")
    return found


def checkpoint_to_resume(path, config, precision=None, cuda_graphs=False):
    """The payload of out/checkpoint.pt, refused if written in another format, with another
    recipe, in another precision (a name in PRECISIONS; None: take the checkpoint's), or
    with and without CUDA graphs (whose optimizer and schedule save other states)."""
    if not pathlib.Path(path).is_file():
        raise FileNotFoundError(f"no checkpoint at {path} to resume from; start without --resume")
    payload = read_checkpoint(path)
    saved = {"checkpoint format": payload.get("format", "<absent>"), **payload["config"]}
    saved["precision"] = payload.get("precision", "<absent>")
    saved["steps as CUDA graphs"] = payload.get("cuda_graphs", False)
    wanted = {"checkpoint format": CHECKPOINT_FORMAT, **config.defining_fields()}
    wanted["precision"] = saved["precision"] if precision is None else precision
    wanted["steps as CUDA graphs"] = cuda_graphs
    differ = differing_fields(saved, wanted)
    if differ:
        hint = ""
        if saved["precision"] != wanted["precision"] and saved["precision"] in AMP_OF_PRECISION:
            hint = f" (amp={AMP_OF_PRECISION[saved['precision']]!r} trains in {saved['precision']})"
        raise InputError(
            f"{path} was written with a different configuration ({'; '.join(differ)}); "
            f"resume with the same settings{hint} or start a new run in another folder"
        )
    return payload


def save_progress(state, context):
    """Write the snapshot, checkpoint.pt and metrics.json (rank 0; every rank must call)."""
    rng = gather_rng_states(context.device, context.world)
    if context.rank == 0:
        out, config, latest = context.out, context.config, state.validation[-1:]
        weights = {
            "config": config.defining_fields(),
            "precision": PRECISIONS[context.amp],
            "cuda_graphs": context.cuda_graphs,
            "tokenizer": context.tokenizer.to_str(),
            "step": state.step,
            "validation": latest[0] if latest and latest[0]["step"] == state.step else None,
            "model": state.model.state_dict(),
        }
        save_checkpoint(out / f"checkpoint-{state.step:07d}.pt", weights)
        for old in snapshot_paths(out)[: -config.keep_checkpoints]:
            old.unlink()
        counters = ("epoch", "position", "tokens_seen", "seconds", "history")
        resumable = {name: getattr(state, name) for name in counters}
        resumable["validations"] = state.validation  # "validation": this step's, above
        for name in ("optimizer", "scheduler", "scaler"):
            resumable[name] = getattr(state, name).state_dict()
        save_checkpoint(out / "checkpoint.pt", {**weights, **resumable, "rng": rng})
        metrics = {"config": config.defining_fields(), "hardware": context.hardware}
        metrics |= {"seconds": round(state.seconds, 1), "history": state.history}
        # unindented: json's C encoder, a few times faster for a history of thousands of steps
        write_json(out / "metrics.json", {**metrics, "validation": state.validation}, indent=None)
    if context.world > 1:
        torch.distributed.barrier()


def resume_or_start(context, payload):
    """A fresh RunState, or the checkpointed one restored; each rank's own dropout stream."""
    vocab = context.tokenizer.get_vocab_size()
    state = RunState.new(context.config, vocab, context.device, context.amp, context.cuda_graphs)
    if payload is not None:
        for name in ("model", "optimizer", "scheduler", "scaler"):
            if payload[name]:  # a float32 or bfloat16 run's scaler saved nothing
                getattr(state, name).load_state_dict(payload[name])
        for name in ("step", "epoch", "position", "tokens_seen", "seconds", "history"):
            setattr(state, name, payload[name])
        if context.config.anneal and state.step >= context.config.warmup_steps:
            plan_last_step(state, context)  # again: max_steps or max_seconds may have changed
        state.validation = payload["validations"]
        restore_rng_state(payload["rng"], context.rank, context.world, context.device)
        if context.rank == 0:
            context.log(f"resumed from {context.out / 'checkpoint.pt'} at step {state.step}")
    elif context.rank > 0:
        torch.manual_seed(context.config.seed + 1_000_003 * context.rank)  # its own dropout
    return state


def tokenizer_for_run(config, pairs, out, tokenizer, payload, rank, world):
    """The checkpoint's vocabulary when resuming, else the one given, else one that rank 0
    learns from the training pairs; saved as out/tokenizer.json."""
    if payload is not None:
        saved = Tokenizer.from_str(payload["tokenizer"])
        if tokenizer is not None and tokenizer.to_str() != saved.to_str():
            raise InputError(f"{out} was trained with another tokenizer; resume without one")
        return saved
    learned = tokenizer is None
    if learned and rank == 0:
        tokenizer = train_bpe(pairs, config.vocab_size)
    elif not learned and tokenizer.get_vocab_size() > config.vocab_size:
        raise InputError(
            f"the tokenizer has {tokenizer.get_vocab_size()} tokens but config.vocab_size is "
            f"{config.vocab_size}; pass a tokenizer from train_bpe(pairs, {config.vocab_size})"
        )
    if rank == 0:  # one atomic write, whichever vocabulary it is
        with atomic_file(out / "tokenizer.json") as file:
            file.write(tokenizer.to_str(pretty=True))
    if learned and world > 1:
        torch.distributed.barrier()  # rank 0's vocabulary is on disk for every rank
    return load_tokenizer(out / "tokenizer.json") if learned else tokenizer


def record_losses(state, pending, world):
    """Read the summed [loss, nll] of the steps since the last read (all ranks' together)
    into state.history, per target token: the one point where the loop waits for the device."""
    sums = torch.stack([losses for losses, _, _ in pending])
    if world > 1:
        torch.distributed.all_reduce(sums)
    for (loss, nll), (_, lr, ntokens) in zip(sums.tolist(), pending):
        entry = {"step": len(state.history) + 1, "loss": round(loss / ntokens, 5)}
        entry.update(nll=round(nll / ntokens, 5), lr=lr, tokens=ntokens)
        state.history.append(entry)
    pending.clear()


def record_validate_save(state, context, pending, done=False):
    """Every log_every steps: read the losses; every eval_every steps (with validation
    data): validate; every checkpoint_every steps: save. The last step (`done`) does all
    three."""
    config = context.config
    record_losses(state, pending, context.world)
    if context.val and context.rank == 0 and (state.step % config.eval_every == 0 or done):
        figures = validate(state.model, *context.val, context.tokenizer)
        when = {"step": state.step, "seconds": round(state.seconds, 1)}
        state.validation.append({**when, "tokens_seen": state.tokens_seen, **figures})
        context.log(f"step {state.step}: validation {figures}")
    if state.step % config.checkpoint_every == 0 or done:
        save_progress(state, context)
        last = state.history[-1]
        if context.rank == 0:
            context.log(
                f"step {state.step}: loss {last['loss']:.3f}, nll {last['nll']:.3f}, "
                f"lr {last['lr']:.2e}, {state.seconds:.0f} s, checkpoint written"
            )


def epoch_rows(updates, rank, device):
    """This process's row numbers for every update of `updates`, in one tensor on `device`
    (one copy per epoch), and the slice of it that belongs to each update."""
    mine = [group[rank] for group in updates]
    ends = list(itertools.accumulate(len(indices) for indices in mine))
    rows = torch.tensor([i for indices in mine for i in indices]).to(device, non_blocking=True)
    return rows, [slice(end - len(indices), end) for end, indices in zip(ends, mine)]


DEVICE_WAITS = {"cuda": torch.cuda.synchronize}  # device type -> wait for its queued work


def device_clock(device):
    """time.perf_counter() once `device` has finished all the work queued on it. A GPU runs
    behind the host that queues its kernels: a clock read without waiting counts the host's
    time, not the training's. A CPU computes as it is asked, and needs no wait."""
    wait = DEVICE_WAITS.get(torch.device(device).type)
    if wait is not None:
        wait(device)
    return time.perf_counter()


def train_epoch(state, context, model, bar, buckets=(1,), runner=None):
    """The rest of the current epoch, or up to the run's end: max_steps, the step that
    plan_last_step fixed, or max_seconds.
    `model` is state.model, wrapped in DistributedDataParallel under several processes and
    compiled when asked; buckets: what each batch's lengths and rows are rounded up to
    (bucketed_batch); runner: a GraphedTrainStep that makes the updates instead of
    train_step_amp (one process). Returns whether the run has ended."""
    config, pending, started = context.config, [], device_clock(context.device)
    every = [config.log_every, config.checkpoint_every] + [config.eval_every] * bool(context.val)
    updates = epoch_updates(context.corpus, config, state.epoch, context.world)[state.position :]
    rows, cuts = epoch_rows(updates, context.rank, context.device)
    for group, cut in zip(updates, cuts):
        ntokens = sum(context.corpus.target_tokens(indices) for indices in group)  # host lengths
        if runner is None:
            batch = bucketed_batch(context.corpus, group[context.rank], buckets, rows[cut])
            lr = state.optimizer.param_groups[0]["lr"]
            optimizers = state.optimizer, state.scheduler, state.scaler
            share = ntokens / context.world
            losses = train_step_amp(model, batch, *optimizers, config.smoothing, share, context.amp)
        else:  # the rate in the optimizer is a device tensor: the host computes its own copy
            args = config.model.d_model, config.lr_factor, config.warmup_steps, state.last_step
            lr = annealed_rate(state.step + 1, *args, config.anneal)
            losses = runner(*bucketed_ids(context.corpus, group[0], rows=rows[cut]), ntokens)
        pending.append((losses, lr, ntokens))
        state.step, state.position = state.step + 1, state.position + 1
        state.tokens_seen += ntokens
        bar.update()
        done = state.step == (state.last_step or config.max_steps)
        if done or any(state.step % n == 0 for n in every):
            state.seconds += device_clock(context.device) - started
            if time_to_plan(state, config):
                plan_last_step(state, context)
                bar.total = state.last_step
            last = state.last_step or config.max_steps
            done = state.step >= last or out_of_time(state, context)
            record_validate_save(state, context, pending, done)
            bar.set_postfix(loss=f"{state.history[-1]['loss']:.3f}")
            started = device_clock(context.device)  # validation and saving are not training
        if done:
            return True
    if pending:
        state.seconds += device_clock(context.device) - started
        record_losses(state, pending, context.world)
    state.epoch, state.position = state.epoch + 1, 0
    return False


def out_of_time(state, context):
    """At a checkpoint of a run with max_seconds: whether checkpoint_every more steps, at the
    run's mean pace so far, would end past it. Under several processes rank 0's clock
    decides for all, so that they stop together."""
    config = context.config
    if not config.max_seconds or state.step % config.checkpoint_every:
        return False
    late = state.seconds * (1 + config.checkpoint_every / state.step) > config.max_seconds
    if context.world > 1:  # a checkpoint waits for the device anyway
        flag = torch.tensor(float(late), device=context.device)
        torch.distributed.broadcast(flag, src=0)
        late = bool(flag.item())
    return late


def train(
    config,
    train_pairs,
    out_dir,
    tokenizer=None,
    val_pairs=None,
    device="cpu",
    resume=False,
    log=print,
    progress=False,
):
    """§5: train on (source, target) sentence pairs into out_dir; returns (model,
    tokenizer, history). With val_pairs, validates every config.eval_every steps;
    resume=True continues out_dir/checkpoint.pt exactly. Under torchrun, each process
    trains on its share of every update (DistributedDataParallel) and only rank 0 writes
    files and logs. The config's amp, compile, cuda_graphs and buckets say how the steps
    run (run_options)."""
    check_device(device)
    rank, world = distributed_rank_and_size()
    amp, cuda_graphs, buckets = run_options(config, device, world)
    check_run(out_dir, train_pairs)
    out, measure = pathlib.Path(out_dir), amp == "fastest"
    with RunFolder(out, resume, owner=rank == 0), tf32_matmuls(device):
        precision, path = None if measure else PRECISIONS[amp], out / "checkpoint.pt"
        payload = checkpoint_to_resume(path, config, precision, cuda_graphs) if resume else None
        tokenizer = tokenizer_for_run(config, train_pairs, out, tokenizer, payload, rank, world)
        corpus = EncodedCorpus.from_pairs(train_pairs, tokenizer)
        if measure:
            amp = resolve_fastest(config, corpus, tokenizer.get_vocab_size(), payload, log)
        val = None
        if val_pairs:
            val_corpus = corpus_on(EncodedCorpus.from_pairs(val_pairs, tokenizer), device)
            val = val_corpus, val_pairs[: config.bleu_sentences]
        corpus = corpus_on(corpus, device)
        where = out, tokenizer, corpus, val, device, amp, rank, world, log
        machine = f"{world} x " * (world > 1) + hardware_description(device)
        context = RunContext(config, *where, cuda_graphs, buckets, f"{machine}, {PRECISIONS[amp]}")
        if rank == 0:
            log(f"on {context.hardware}; steps as CUDA graphs {cuda_graphs}, buckets {buckets}")
        state = resume_or_start(context, payload)  # before any capture: graphs keep addresses
        step_parts = state.model, state.optimizer, state.scheduler, config.smoothing, amp
        runner = GraphedTrainStep(*step_parts) if cuda_graphs else None
        model = DistributedModel(state.model) if world > 1 else state.model
        compiled = config.compile != "off"
        if compiled:  # dynamic: one graph for every batch shape, not one compile per shape
            model = torch.compile(model, backend=config.compile, dynamic=True)
        # few shapes: cuDNN's attention plans each once; compiled, no dimension is ever 1 (a
        # size the compiler specialises, and compiles again for); on a CPU, exact batches
        buckets = BUCKETS if context.buckets else (8,) if compiled else (1,)
        last = state.last_step or config.max_steps
        bar = tqdm(total=last, initial=state.step, unit="step", disable=not progress or rank)
        ended = state.step >= last
        while not ended:
            ended = train_epoch(state, context, model, bar, buckets, runner)
        bar.close()
    return state.model, tokenizer, state.history


def run_options(config, device, world):
    """(amp, cuda_graphs, buckets) as a run of `config` on `device` with `world` processes
    uses them: amp an autocast dtype, None (float32) or "fastest" (on a CPU, to be timed);
    an unset cuda_graphs on for one uncompiled GPU process not in float16, unset buckets on
    a GPU. Graphs asked for where they cannot run are refused."""
    on_gpu = torch.device(device).type == "cuda"
    fastest = config.amp == "fastest" and not on_gpu
    amp = "fastest" if fastest else autocast_dtype(config.amp, device)
    graphs_fit = world == 1 and config.compile == "off" and amp is not torch.float16
    if config.cuda_graphs and not graphs_fit:
        raise InputError(
            "cuda_graphs=True captures the step of one process, uncompiled, in float32 or "
            "bfloat16: drop compile, run one process, and use amp='bf16' or 'off' (float16 "
            "needs a gradient scaler, which reads the device at every step)"
        )
    graphs = on_gpu and graphs_fit if config.cuda_graphs is None else config.cuda_graphs
    return amp, graphs, on_gpu if config.buckets is None else config.buckets


def check_run(out_dir, train_pairs):
    """Refuse what train cannot do, before anything is written."""
    if str(out_dir).strip() in ("", "."):  # pathlib.Path("") is "." too
        raise InputError(
            f"out_dir={str(out_dir)!r} is the working directory: pass a folder of the run's "
            f"own, e.g. runs/quick"
        )
    if not train_pairs:
        raise InputError("train_pairs is empty: pass (source, target) sentence pairs")


def resolve_fastest(config, corpus, vocab, payload, log):
    """amp="fastest" on a CPU: the checkpoint's precision when resuming (a run keeps the
    precision it was measured to need), else race_precisions' answer; logged with the reason."""
    if payload:
        names = {name: dtype for dtype, name in PRECISIONS.items()}
        amp, how = names[payload["precision"]], "the checkpoint"
    else:
        amp = race_precisions(config, corpus, vocab)
        how = "timed: the faster here" if native_bf16("cpu") else "bfloat16 is emulated here"
    log(f"amp fastest: {PRECISIONS[amp]} ({how})")
    return amp


@contextlib.contextmanager
def tf32_matmuls(device):
    """On a GPU, float32 matrix products in TF32 for the duration, the old setting restored."""
    if torch.device(device).type != "cuda":
        yield
        return
    saved = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.fp32_precision = saved
