"""Where a training profile's time goes on this CPU (the training-runs page): one update split
into its parts (cutting the batch, the forward pass with the loss, the backward pass, the
optimizer with the schedule) in float32 and, where the CPU computes in bfloat16, in
bfloat16; then what a run does besides updates (learning the vocabulary, racing the two
precisions, validating, writing checkpoints), each timed once as the run does it.

    python code/budget.py --profile fast --run runs/fast --out results/fast/budget.json

--run names a finished run of the profile: its weights are validated, so that the greedy
decoding is timed on translations of a trained model's length (an untrained model writes
until the length limit). Run it on idle cores: every figure is a time.
"""

import argparse
import pathlib
import statistics
import tempfile
import time

import torch

import annotated_transformer as at
import profiles
import safe_files
import script_helpers as helpers
import timing
import training_runs as training
from cuda_graphs import bucketed_batch
from hardware import hardware_description
from precision import native_bf16
from step import train_step_amp

PARTS = ("cut", "forward", "backward", "optimizer")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", choices=sorted(profiles.PROFILES), default="fast")
    parser.add_argument("--run", type=helpers.given_path, required=True, help="a finished run")
    parser.add_argument("--out", type=helpers.given_path, required=True, help="a JSON file")
    parser.add_argument(
        "--steps", type=helpers.positive_int_flag, default=60, help="timed updates per precision"
    )
    parser.add_argument(
        "--rounds", type=helpers.positive_int_flag, default=5, help="interleaved rounds"
    )
    helpers.add_data_dir_flag(parser)
    helpers.add_threads_flag(parser)
    return parser.parse_args(argv)


class PartClock(torch.amp.GradScaler):
    """A disabled gradient scaler (float32 and bfloat16 need none) that notes the time of
    train_step_amp's calls to it: scale() once the forward pass and the loss are done,
    step() once the backward pass is. It passes everything through, as a disabled one does."""

    def __init__(self):
        super().__init__("cpu", enabled=False)
        self.times = []

    def scale(self, outputs):
        self.times.append(time.perf_counter())
        return outputs

    def step(self, optimizer, *args, **kwargs):
        self.times.append(time.perf_counter())
        return optimizer.step(*args, **kwargs)


def timed_update(state, batch_indices, corpus, *, smoothing, autocast):
    """One update by train_step_amp on a CPU, with the time of each of PARTS: the cut, the
    forward pass with the loss, the backward pass, and the optimizer with the schedule."""
    clock, started = PartClock(), time.perf_counter()
    batch = bucketed_batch(corpus, batch_indices, (1,))
    clock.times.append(time.perf_counter())
    parts = {
        "scheduler": state.scheduler,
        "scaler": clock,
        "smoothing": smoothing,
        "autocast": autocast,
    }
    train_step_amp(state.model, batch, state.optimizer, **parts)
    ends = [started, *clock.times, time.perf_counter()]
    return {part: end - start for part, start, end in zip(PARTS, ends, ends[1:])}


def update_parts(config, corpus, vocab, *, steps, rounds):
    """{precision: {part: median seconds}} over `rounds` interleaved rounds of steps/rounds
    updates each (a change of load hits both precisions alike), after 5 untimed updates."""
    autocasts = {"float32": None} | ({"bfloat16": torch.bfloat16} if native_bf16("cpu") else {})
    per_round, updates, epoch = -(-steps // rounds), [], 0
    while len(updates) < 5 + per_round * rounds:  # a small corpus: the next epochs' too
        updates += training.epoch_updates(corpus, config, epoch)
        epoch += 1
    states = {
        name: training.RunState.new(config, vocab, autocast=autocast)
        for name, autocast in autocasts.items()
    }
    times = {name: {part: [] for part in PARTS} for name in autocasts}
    for name, autocast in autocasts.items():  # untimed: the first calls allocate and plan
        for group in updates[:5]:
            timed_update(
                states[name], group[0], corpus, smoothing=config.smoothing, autocast=autocast
            )

    def round_of_updates(name, r):  # round r's updates of one precision, split into parts
        start, autocast = 5 + r * per_round, autocasts[name]
        return [
            timed_update(
                states[name], group[0], corpus, smoothing=config.smoothing, autocast=autocast
            )
            for group in updates[start : start + per_round]
        ]

    found = timing.interleaved_rounds(
        {name: name for name in autocasts}, rounds=rounds, measure=round_of_updates
    )
    for name, per_round_parts in found.items():
        for parts in (p for one_round in per_round_parts for p in one_round):
            for part, seconds in parts.items():
                times[name][part].append(seconds)
    return {
        name: {part: statistics.median(values) for part, values in parts.items()}
        for name, parts in times.items()
    }


def once(work):
    """(seconds, result) of one call."""
    started = time.perf_counter()
    result = work()
    return time.perf_counter() - started, result


def run_parts(config, pairs, val_pairs, *, run):
    """Seconds of what a run does besides updates, each once: the vocabulary, the precision
    race, one validation of the run's last weights, one snapshot and one checkpoint.pt."""
    seconds, tokenizer = once(lambda: at.train_bpe(pairs, config.vocab_size))
    corpus = at.EncodedCorpus.from_pairs(pairs, tokenizer)
    vocab = tokenizer.get_vocab_size()
    found = {"vocabulary": seconds}
    found["precision race"], _ = once(lambda: training.race_precisions(config, corpus, vocab))
    payload = at.read_checkpoint(run / "checkpoint.pt")
    model, run_tokenizer = at.translator_from(payload)
    val_corpus = at.EncodedCorpus.from_pairs(val_pairs, run_tokenizer)
    chosen = val_pairs[: config.bleu_sentences]
    found["validation"], _ = once(
        lambda: training.validate(model, val_corpus, chosen, tokenizer=run_tokenizer)
    )
    weights = {key: payload[key] for key in ("config", "tokenizer", "model")}
    with tempfile.TemporaryDirectory() as scratch:
        path = pathlib.Path(scratch) / "checkpoint.pt"
        found["snapshot"], _ = once(lambda: at.save_checkpoint(path, weights))
        found["checkpoint.pt"], _ = once(lambda: at.save_checkpoint(path, payload))
    return found, corpus, vocab, payload


def budget(config, parts, extras, *, precision, steps_made):
    """How the run's max_seconds and the reader's wait divide up, at the measured step time
    of `precision`: updates, and per run the validations and checkpoints that many updates
    bring (every eval_every and every checkpoint_every steps)."""
    step = sum(parts[precision].values())
    steps = int(config.max_seconds / step)
    validations = steps // config.eval_every + 1
    checkpoints = steps // config.checkpoint_every + 1
    return {
        "precision": precision,
        "step_seconds": round(step, 4),
        "steps_in_budget": steps,
        "steps_made_by_the_run": steps_made,
        "seconds": {
            "updates": round(steps * step, 1),
            "vocabulary": round(extras["vocabulary"], 1),
            "precision race": round(extras["precision race"], 1),
            "validations": round(validations * extras["validation"], 1),
            "checkpoints": round(checkpoints * (extras["snapshot"] + extras["checkpoint.pt"]), 1),
        },
        "validations": validations,
        "checkpoints": checkpoints,
    }


@helpers.user_errors_exit_2("budget.py")
def main(argv=None):
    args = parse_args(argv)
    helpers.set_threads(args.threads)
    config = profiles.PROFILES[args.profile]
    if not config.max_seconds:
        raise at.InputError(f"--profile {args.profile} has no time budget (max_seconds)")
    if not (args.run / "checkpoint.pt").is_file():
        raise FileNotFoundError(f"{args.run} holds no checkpoint.pt: train the profile first")
    pairs = helpers.load_multi30k("train", data_dir=args.data_dir)
    val_pairs = helpers.load_multi30k("val", data_dir=args.data_dir)
    extras, corpus, vocab, payload = run_parts(config, pairs, val_pairs, run=args.run)
    parts = update_parts(config, corpus, vocab, steps=args.steps, rounds=args.rounds)
    chosen = payload.get("precision", "float32")
    result = {
        "profile": args.profile,
        "run": str(args.run),
        "hardware": hardware_description("cpu"),
        "threads": torch.get_num_threads(),
        "update_parts_seconds": {
            name: {part: round(s, 5) for part, s in values.items()}
            for name, values in parts.items()
        },
        "once_seconds": {name: round(s, 5) for name, s in extras.items()},
        "budget": budget(config, parts, extras, precision=chosen, steps_made=payload["step"]),
        "run_training_seconds": round(payload["seconds"], 1),
    }
    safe_files.write_json(args.out, result)
    print(f"{result['hardware']}: updates in {chosen}")
    for name, values in result["update_parts_seconds"].items():
        print(f"  {name:9}", ", ".join(f"{p} {s * 1e3:.1f} ms" for p, s in values.items()))
    print(
        "  budget:", result["budget"]["seconds"], f"({result['budget']['steps_in_budget']} steps)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
