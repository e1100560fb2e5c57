"""Speed, measured side by side: training steps and decoding of our Transformer against
torch.nn.Transformer, timed with torch.utils.benchmark in one process, in interleaved rounds.

    python code/benchmark.py --device cpu --threads 2 --config base small multi30k \\
        --out benchmarks/results/cpu.json
    python code/benchmark.py --device cuda --config base small --out benchmarks/results/cuda.json
    python code/benchmark.py --quick --out /tmp/smoke.json       # a tiny smoke run, seconds

train/* rows time one step.train_step_amp (forward, fused label-smoothed loss, backward,
Adam with Eq. (3)) of our model (fused and reference attention; bf16 autocast where the
hardware computes in bf16) and of torch.nn.Transformer inside our embeddings and generator. The
base and small configurations train on a batch of random ids; multi30k trains the model of that
training profile, with its recipe, at its real batch: four batches of Multi30k's training pairs
as at.batch_by_tokens cuts them (tokenizer learned once and kept in --tokenizer-cache), each
call one step on each, ours and nn.Transformer in float32 and, where bf16 is native, both in
bf16 autocast. decode/* rows time greedy and beam 4 decoding with and without the key/value
cache, never stopping early (end symbol -1). After --warmup calls per row, each round visits
the rows starting one row later (A B C, B C A, ...), one Timer.blocked_autorange each, so that
the machine's load hits every row alike. A row's time is the median over rounds; a ratio, the
ratio of medians, with the median and range of the per-round ratios. """

import argparse
import os
import sys
import time
from dataclasses import asdict

import torch
from torch.utils.benchmark import Compare, Measurement

import safe_files
import script_helpers as helpers
from benchmark_rows import (
    CONFIGS,
    NEVER,
    QUICK,
    RATIOS,
    ProfileBench,
    decoding_rows,
    measure,
    peak_memory,
    profile_data,
    profile_rows,
    ratio,
    side_by_side,
    summarise,
    training_rows,
)
from flops import bf16_peak_flops, forward_flops, training_flops
from hardware import hardware_description
from precision import native_bf16

SCHEMA = 3  # 3: profile configurations (real batches), updates per call


def run_config(bench, device, args, *, log):
    """Build, warm up, time and summarise every row of one configuration. Returns its JSON
    record and, for Compare, one Measurement per row holding its per-round times."""
    bf16 = args.bf16 == "on" or (args.bf16 == "auto" and native_bf16(device))
    why_not = "--bf16 off" if args.bf16 == "off" else "no native bf16 (CPU: AVX-512 BF16, AMX)"
    peak = bf16_peak_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    if isinstance(bench, ProfileBench):
        data = profile_data(bench, args.tokenizer_cache, data_dir=args.data_dir)
        groups = {"training step": lambda: profile_rows(data, device, bf16)}
        bf16_rows = ["train/ours-fused-bf16", "train/torch-bf16"]
        per_call = sum(data.step_flops())
        record = {
            "config": {**asdict(bench), "recipe": asdict(data.config)},
            "data": data.record,
            # for the real tokens: the mean step of the chosen batches, and all of them
            "flops": {"training_step": per_call / len(data.chosen), "per_call": per_call},
        }
    else:
        mode = None if args.compile_mode == "default" else args.compile_mode
        groups = {
            "training step": lambda: training_rows(
                bench, device, bf16, compile=args.compile, mode=mode
            )
        }
        if not args.no_decoding:
            groups["decoding"] = lambda: decoding_rows(bench, device)
        bf16_rows = ["train/ours-fused-bf16"]
        shape = {"src_len": bench.seq, "tgt_len": bench.seq}
        record = {
            "config": {**asdict(bench), "model": asdict(bench.model)},
            "flops": {
                "forward": forward_flops(bench.model, bench.vocab, bench.batch, **shape),
                "training_step": training_flops(bench.model, bench.vocab, bench.batch, **shape),
            },
        }
    rows, table = {}, []
    for group, build in groups.items():  # one at a time: only one group's models in memory
        built = build()
        title = f"{bench.name}: {group}"
        measured = measure(
            built, args.rounds, args.warmup, min_seconds=args.min_seconds, title=title, log=log
        )
        for row, measurements in zip(built, measured):
            rows[row.key] = summarise(
                row, measurements, peak_memory(row.work, device), peak_flops=peak
            )
            table.append(Measurement(1, rows[row.key]["times_s"], measurements[0].task_spec))
        del built, measured
    record["rows"] = rows
    record["ratios"] = {label: ratio(rows, a, b) for a, b, label in RATIOS if {a, b} <= set(rows)}
    record["skipped"] = {} if bf16 else dict.fromkeys(bf16_rows, why_not)
    return record, table


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    helpers.add_device_flag(parser)
    helpers.add_threads_flag(parser)
    add("--config", nargs="+", choices=list(CONFIGS), help="configurations (default: base)")
    add("--rounds", type=helpers.positive_int_flag, help="interleaved rounds per row (default 7)")
    add("--warmup", type=helpers.non_negative_int, default=1,
        help="untimed calls per row before the rounds")  # fmt: skip
    add(
        "--min-seconds", type=helpers.non_negative_float, default=0.2, help="min_run_time per round"
    )
    add("--bf16", choices=["auto", "on", "off"], default="auto", help="the bf16 autocast row")
    add("--compile", action="store_true",
        help="GPU: also our model under torch.compile, eager and as a CUDA graph")  # fmt: skip
    add("--compile-mode", choices=["default", "max-autotune-no-cudagraphs"], default="default",
        help="torch.compile's mode for --compile (max-autotune-no-cudagraphs: it times several "
        "kernels for each matrix product and keeps the fastest; minutes)")  # fmt: skip
    add("--no-decoding", action="store_true", help="time the training step alone")
    add("--quick", action="store_true",
        help=f"smoke run: {' and '.join(QUICK)} unless --config is given, 2 rounds unless "
        "given, no minimum")  # fmt: skip
    helpers.add_tokenizer_cache_flag(parser)
    helpers.add_data_dir_flag(parser)
    add("--out", type=helpers.given_path, help="write the results here (JSON)")
    args = parser.parse_args(argv)
    if args.quick:
        args.config, args.min_seconds = args.config or QUICK, 0.0
    args.config = args.config or ["base"]
    args.rounds = args.rounds or (2 if args.quick else 7)
    return args


@helpers.user_errors_exit_2("benchmark.py")
def main(argv=None, log=None):
    """Measure every configuration asked for, print the table and ratios, write the JSON;
    returns the exit code (2 on a user's error, with one line on stderr)."""
    args = parse_args(argv)
    if args.out:  # a folder that cannot be made fails now, not after minutes of measuring
        args.out.parent.mkdir(parents=True, exist_ok=True)
    log = log or (lambda message: print(message, file=sys.stderr, flush=True))
    device, threads = torch.device(args.device), torch.get_num_threads()
    helpers.set_threads(args.threads)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    command = ["python code/benchmark.py", *(sys.argv[1:] if argv is None else argv)]
    names = "device", "rounds", "warmup", "min_seconds", "bf16", "compile", "compile_mode"
    settings = {k: vars(args)[k] for k in names}
    settings.update(
        decode_end_symbol=NEVER, tf32=torch.backends.cuda.matmul.fp32_precision == "tf32"
    )
    results = {
        "schema": SCHEMA,
        "command": " ".join(command),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": settings,
        "hardware": {
            "description": hardware_description(device),
            "cpu_count": os.cpu_count(),
            "bf16_native": native_bf16(device),
            "gpu": gpu,
            "gpu_bf16_peak_flops": bf16_peak_flops(gpu) if gpu else None,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "load_average_start": list(os.getloadavg()),
        },
        "runs": {},
    }
    table = []
    try:
        for name in args.config:
            results["runs"][name], measurements = run_config(CONFIGS[name], device, args, log=log)
            table += measurements
        results["hardware"]["load_average_end"] = list(os.getloadavg())
    finally:
        torch.set_num_threads(threads)  # main() may be called in-process (the tests do)
    report(results, table)
    if args.out:
        safe_files.write_json(args.out, results)
        print(f"wrote {args.out}")
    return 0


def report(results, table):
    """Print the machine, Compare's table of median times, and the ratios."""
    hw = results["hardware"]
    load = hw["load_average_start"][0], hw["load_average_end"][0]
    print(f"{hw['description']}; load average {load[0]:.2f} before, {load[1]:.2f} after")
    print(f"{results['created']}: {results['command']}")
    compare = Compare(table)
    compare.highlight_warnings()  # (! x%): the per-round times spread x% (interquartile range)
    compare.print()
    for name, run in results["runs"].items():
        data = run.get("data")  # profile configurations: real batches
        mean = f" (mean of {len(data['batches'])} batches of {data['corpus']})" if data else ""
        print(f"{name}: {run['flops']['training_step'] / 1e9:,.3f} GFLOP per training step{mean}")
        for precision, pair in side_by_side(run).items():
            ours, theirs = pair["ours"], pair["torch.nn.Transformer"]
            print(f"  target tokens/s, {precision}: ours {ours:,.0f}, nn.Transformer {theirs:,.0f}")
        width = max(map(len, run["ratios"]), default=0)
        for label, r in run["ratios"].items():
            spread = f"per round {r['paired_min']:.3f}..{r['paired_max']:.3f}"
            print(f"  {label:<{width}} {r['ratio']:6.3f}  ({spread})")
        for key, reason in run["skipped"].items():
            print(f"  skipped {key}: {reason}")


if __name__ == "__main__":
    sys.exit(main())
