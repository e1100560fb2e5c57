"""Training runs that survive (ours): the code of chapters/training_runs.ipynb.

GENERATED FILE, DO NOT EDIT. code/export.py writes it from the cells marked
`#| export` in chapters/training_runs.ipynb; change the page, then run `python code/export.py`.
"""

import copy
import functools
import itertools
import math
import pathlib
import statistics
import time
import typing
from dataclasses import dataclass, field

import torch
from tokenizers import Tokenizer
from torch import nn
from tqdm import tqdm

from annotated_transformer import (
    CHECKPOINT_FORMAT,
    EncodedCorpus,
    InputError,
    batch_by_tokens,
    build_model,
    check_device,
    load_tokenizer,
    make_optimizer,
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
from distributed import (
    DistributedModel,
    distributed_rank_and_size,
    gather_rng_states,
    restore_rng_state,
    unwrap,
)
from fast_decoding import fast_evaluate_bleu
from hardware import hardware_description
from precision import AMP_OF_PRECISION, PRECISIONS, autocast_dtype, native_bf16, tf32_matmuls
from profiles import RunConfig
from run_folder import RunFolder, snapshot_paths
from safe_files import atomic_file, write_json
from schedule import (
    AnnealedDeviceSchedule,
    AnnealedRate,
    AnnealedSchedule,
    plan_last_step,
    time_to_plan,
)
from step import train_step_amp
from timing import interleaved_rounds, seconds_of_one_call

# --------------------------------------------------------------------------------------
# Training runs that survive (ours), from chapters/training_runs.ipynb
# --------------------------------------------------------------------------------------

def race_precisions(config, corpus, vocab, *, rounds=5):
    """float32 (None) or bfloat16, whichever trains this recipe faster on this CPU: a
    scratch model in each takes one warm-up update, then `rounds` rounds in which the two
    take turns (interleaved_rounds), one timed update each on the same batch of the run's
    first epoch; the faster median wins, so that a moment's slowdown decides nothing.
    Without native bfloat16, float32, untimed. The random state is left as it was."""
    if not native_bf16("cpu"):
        return None
    plan = epoch_updates(corpus, config, epoch=0)[: rounds + 1]
    batches = [corpus.batch(indices) for indices, *_ in plan]
    with torch.random.fork_rng():
        runs = {
            autocast: RunState.new(config, vocab, autocast=autocast)
            for autocast in (None, torch.bfloat16)
        }

        def update(autocast, i):  # on the i-th batch; a short epoch repeats its batches
            run, batch = runs[autocast], batches[i % len(batches)]
            parts = {"scheduler": run.scheduler, "scaler": run.scaler}
            train_step_amp(
                run.model,
                batch,
                run.optimizer,
                **parts,
                smoothing=config.smoothing,
                autocast=autocast,
            ).tolist()  # read back: the update is done when the clock stops

        for autocast in runs:  # one untimed warm-up update each, on batch 0; round r on batch r + 1
            update(autocast, 0)
        seconds = interleaved_rounds(
            {autocast: functools.partial(update, autocast) for autocast in runs},
            rounds=rounds,
            measure=lambda work, r: seconds_of_one_call(work, r + 1),
        )
    return min(seconds, key=lambda autocast: statistics.median(seconds[autocast]))


def corpus_on(corpus, device):
    """The EncodedCorpus with its two tables on `device`; the lengths stay on the host, which
    needs them to know each batch's shape. Batches are then cut where the model is."""
    moved = copy.copy(corpus)
    moved.src, moved.tgt = corpus.src.to(device), corpus.tgt.to(device)
    return moved


@dataclass(kw_only=True)
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
    validations: list = field(default_factory=list)  # per evaluation: step, seconds, figures

    @classmethod
    def new(cls, config, vocab, device="cpu", *, autocast=None, cuda_graphs=False):
        """A fresh run: the model initialised with config.seed, AdamW with Eq. (3) (the
        capturable one of the CUDA graphs page when asked), and the gradient scaler
        (active only for float16 autocast)."""
        torch.manual_seed(config.seed)
        model = build_model(vocab, vocab, config.model).to(device)
        d_model, lr_factor = config.model.d_model, config.lr_factor
        anneal = getattr(config, "anneal", 0)  # chapter 5's TrainConfig does not anneal
        adam = {"warmup_steps": config.warmup_steps, "weight_decay": config.weight_decay}
        if cuda_graphs:
            optimizer, scheduler = make_capturable_optimizer(
                model, d_model, lr_factor, max_steps=config.max_steps, **adam
            )
        else:
            optimizer, scheduler = make_optimizer(model, d_model, lr_factor, **adam)
        if anneal:  # one rate function, whichever schedule applies it
            ramped = AnnealedRate(d_model, lr_factor, config.warmup_steps, share=anneal)
            if cuda_graphs:
                scheduler = AnnealedDeviceSchedule(optimizer, ramped, max_steps=config.max_steps)
            else:
                scheduler = AnnealedSchedule(optimizer, ramped)
        scaler = torch.amp.GradScaler(torch.device(device).type, enabled=autocast == torch.float16)
        return cls(model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler)


@dataclass(kw_only=True)
class RunContext:
    """What stays fixed while a run trains: its recipe, folder, data and processes."""

    config: RunConfig
    out: pathlib.Path
    tokenizer: Tokenizer
    corpus: EncodedCorpus
    val: tuple | None  # (EncodedCorpus of all val pairs, the pairs BLEU translates)
    device: str
    autocast: torch.dtype | None
    rank: int = 0
    world: int = 1
    log: typing.Callable = print
    cuda_graphs: bool = False  # steps replayed as CUDA graphs (the CUDA graphs page)
    bucketed: bool = False  # batches cut to bucketed shapes (the CUDA graphs page) on a GPU
    hardware: str = ""  # the machine, as hardware_description names it, and the precision


def epoch_updates(corpus, config, epoch, *, world=1):
    """One epoch's updates, each a list of `world` batches (index lists), one per process,
    of max_tokens / world tokens a side; the order depends only on (seed, epoch)."""
    batches = batch_by_tokens(corpus.lengths, config.max_tokens // world, config.seed + epoch)
    return [batches[i : i + world] for i in range(0, len(batches) - world + 1, world)]


def validate(model, corpus, pairs, *, tokenizer):
    """The validation figures logged during training and stored with each snapshot: the
    loss over the whole corpus (its tables where the model is) and BLEU of greedy
    translations of `pairs` (6.1's evaluate_bleu), decoded on the fast path; the mode is
    restored. On a GPU all `pairs` are decoded as one batch: a batch's time there is its
    number of decoding steps, hardly its width."""
    model = unwrap(model)
    training, loss = model.training, validation_loss(model, corpus)
    greedy = {"beam_size": 1}  # in translate's batches on a CPU
    if corpus.src.device.type == "cuda":
        greedy["batch_size"] = len(pairs)
    bleu = fast_evaluate_bleu(model, tokenizer, pairs, **greedy)
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


def checkpoint_to_resume(path, config, precision=None, *, cuda_graphs=False):
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
        out, config, latest = context.out, context.config, state.validations[-1:]
        weights = {
            "config": config.defining_fields(),
            "precision": PRECISIONS[context.autocast],
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
        resumable["validations"] = state.validations  # "validation": this step's, above
        for name in ("optimizer", "scheduler", "scaler"):
            resumable[name] = getattr(state, name).state_dict()
        save_checkpoint(out / "checkpoint.pt", {**weights, **resumable, "rng": rng})
        metrics = {"config": config.defining_fields(), "hardware": context.hardware}
        metrics |= {"seconds": round(state.seconds, 1), "history": state.history}
        # unindented: json's C encoder, a few times faster for a history of thousands of steps
        write_json(out / "metrics.json", {**metrics, "validations": state.validations}, indent=None)
    if context.world > 1:
        torch.distributed.barrier()


def resume_or_start(context, payload):
    """A fresh RunState, or the checkpointed one restored; each rank's own dropout stream."""
    vocab = context.tokenizer.get_vocab_size()
    state = RunState.new(
        context.config,
        vocab,
        context.device,
        autocast=context.autocast,
        cuda_graphs=context.cuda_graphs,
    )
    if payload is not None:
        for name in ("model", "optimizer", "scheduler", "scaler"):
            if payload[name]:  # a float32 or bfloat16 run's scaler saved nothing
                getattr(state, name).load_state_dict(payload[name])
        for name in ("step", "epoch", "position", "tokens_seen", "seconds", "history"):
            setattr(state, name, payload[name])
        if context.config.anneal and state.step >= context.config.warmup_steps:
            plan_last_step(state, context)  # again: max_steps or max_seconds may have changed
        state.validations = payload["validations"]
        restore_rng_state(payload["rng"], context.rank, context.world, device=context.device)
        if context.rank == 0:
            context.log(f"resumed from {context.out / 'checkpoint.pt'} at step {state.step}")
    elif context.rank > 0:
        torch.manual_seed(context.config.seed + 1_000_003 * context.rank)  # its own dropout
    return state


def tokenizer_for_run(config, pairs, out, *, tokenizer, payload, rank, world):
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


def record_validate_save(state, context, pending, *, done=False):
    """Every log_every steps: read the losses; every eval_every steps (with validation
    data): validate; every checkpoint_every steps: save. The last step (`done`) does all
    three."""
    config = context.config
    record_losses(state, pending, context.world)
    if context.val and context.rank == 0 and (state.step % config.eval_every == 0 or done):
        val_corpus, val_pairs = context.val
        figures = validate(state.model, val_corpus, val_pairs, tokenizer=context.tokenizer)
        when = {"step": state.step, "seconds": round(state.seconds, 1)}
        state.validations.append({**when, "tokens_seen": state.tokens_seen, **figures})
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


def train_epoch(state, context, model, *, bar, buckets=(1,), runner=None):
    """The rest of the current epoch, or up to the run's end: max_steps, the step that
    plan_last_step fixed, or max_seconds.
    `model` is state.model, wrapped in DistributedDataParallel under several processes and
    compiled when asked; buckets: what each batch's lengths and rows are rounded up to
    (bucketed_batch); runner: a GraphedTrainStep that makes the updates instead of
    train_step_amp (one process). Returns whether the run has ended."""
    config, pending, started = context.config, [], device_clock(context.device)
    every = [config.log_every, config.checkpoint_every] + [config.eval_every] * bool(context.val)
    updates = epoch_updates(context.corpus, config, state.epoch, world=context.world)[
        state.position :
    ]
    rows, cuts = epoch_rows(updates, context.rank, context.device)
    for group, cut in zip(updates, cuts):
        ntokens = sum(context.corpus.target_tokens(indices) for indices in group)  # host lengths
        if runner is None:
            batch = bucketed_batch(context.corpus, group[context.rank], buckets, rows=rows[cut])
            lr = state.optimizer.param_groups[0]["lr"]
            losses = train_step_amp(
                model,
                batch,
                state.optimizer,
                scheduler=state.scheduler,
                scaler=state.scaler,
                smoothing=config.smoothing,
                ntokens=ntokens / context.world,
                autocast=context.autocast,
            )
        else:  # the optimizer reads a device tensor; the host keeps the table it was filled from
            lr = state.scheduler.rates[state.step]
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
            record_validate_save(state, context, pending, done=done)
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
    *,
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
    autocast, cuda_graphs, bucketed = run_options(config, device, world)
    check_run(out_dir, train_pairs)
    out, measure = pathlib.Path(out_dir), autocast == "fastest"
    with RunFolder(out, resume, owner=rank == 0), tf32_matmuls(device):
        precision, path = None if measure else PRECISIONS[autocast], out / "checkpoint.pt"
        payload = (
            checkpoint_to_resume(path, config, precision, cuda_graphs=cuda_graphs)
            if resume
            else None
        )
        tokenizer = tokenizer_for_run(
            config, train_pairs, out, tokenizer=tokenizer, payload=payload, rank=rank, world=world
        )
        corpus = EncodedCorpus.from_pairs(train_pairs, tokenizer)
        if measure:
            autocast = resolve_fastest(
                config, corpus, tokenizer.get_vocab_size(), payload=payload, log=log
            )
        val = None
        if val_pairs:
            val_corpus = corpus_on(EncodedCorpus.from_pairs(val_pairs, tokenizer), device)
            val = val_corpus, val_pairs[: config.bleu_sentences]
        corpus = corpus_on(corpus, device)
        machine = f"{world} x " * (world > 1) + hardware_description(device)
        context = RunContext(
            config=config,
            out=out,
            tokenizer=tokenizer,
            corpus=corpus,
            val=val,
            device=device,
            autocast=autocast,
            rank=rank,
            world=world,
            log=log,
            cuda_graphs=cuda_graphs,
            bucketed=bucketed,
            hardware=f"{machine}, {PRECISIONS[autocast]}",
        )
        if rank == 0:
            log(f"on {context.hardware}; steps as CUDA graphs {cuda_graphs}, buckets {bucketed}")
        state = resume_or_start(context, payload)  # before any capture: graphs keep addresses
        runner = None
        if cuda_graphs:
            runner = GraphedTrainStep(
                state.model,
                state.optimizer,
                state.scheduler,
                smoothing=config.smoothing,
                autocast=autocast,
            )
        model = DistributedModel(state.model) if world > 1 else state.model
        compiled = config.compile != "off"
        if compiled:  # dynamic: one graph for every batch shape, not one compile per shape
            model = torch.compile(model, backend=config.compile, dynamic=True)
        # few shapes: cuDNN's attention plans each once; compiled, no dimension is ever 1 (a
        # size the compiler specialises, and compiles again for); on a CPU, exact batches
        buckets = BUCKETS if context.bucketed else (8,) if compiled else (1,)
        last = state.last_step or config.max_steps
        bar = tqdm(total=last, initial=state.step, unit="step", disable=not progress or rank)
        ended = state.step >= last
        while not ended:
            ended = train_epoch(state, context, model, bar=bar, buckets=buckets, runner=runner)
        bar.close()
    return state.model, tokenizer, state.history


def run_options(config, device, world):
    """(autocast, cuda_graphs, bucketed) as a run of `config` on `device` with `world` processes
    uses them: autocast the autocast dtype, None (float32) or "fastest" (on a CPU, to be timed);
    an unset cuda_graphs on for one uncompiled GPU process not in float16, unset buckets on
    a GPU. Graphs asked for where they cannot run are refused."""
    on_gpu = torch.device(device).type == "cuda"
    fastest = config.amp == "fastest" and not on_gpu
    autocast = "fastest" if fastest else autocast_dtype(config.amp, device)
    graphs_fit = world == 1 and config.compile == "off" and autocast is not torch.float16
    if config.cuda_graphs and not graphs_fit:
        raise InputError(
            "cuda_graphs=True captures the step of one process, uncompiled, in float32 or "
            "bfloat16: drop compile, run one process, and use amp='bf16' or 'off' (float16 "
            "needs a gradient scaler, which reads the device at every step)"
        )
    graphs = on_gpu and graphs_fit if config.cuda_graphs is None else config.cuda_graphs
    return autocast, graphs, on_gpu if config.buckets is None else config.buckets


def check_run(out_dir, train_pairs):
    """Refuse what train cannot do, before anything is written."""
    if str(out_dir).strip() in ("", "."):  # pathlib.Path("") is "." too
        raise InputError(
            f"out_dir={str(out_dir)!r} is the working directory: pass a folder of the run's "
            f"own, e.g. runs/quick"
        )
    if not train_pairs:
        raise InputError("train_pairs is empty: pass (source, target) sentence pairs")


def resolve_fastest(config, corpus, vocab, *, payload, log):
    """amp="fastest" on a CPU: the checkpoint's precision when resuming (a run keeps the
    precision it was measured to need), else race_precisions' answer; logged with the reason."""
    if payload:
        names = {name: dtype for dtype, name in PRECISIONS.items()}
        autocast, how = names[payload["precision"]], "the checkpoint"
    else:
        autocast = race_precisions(config, corpus, vocab)
        how = "timed: the faster here" if native_bf16("cpu") else "bfloat16 is emulated here"
    log(f"amp fastest: {PRECISIONS[autocast]} ({how})")
    return autocast
