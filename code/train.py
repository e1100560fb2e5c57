"""Train the Transformer on Multi30k German->English (§5 of the paper).

    python code/train.py --profile quick --out runs/quick          # 2 CPU cores, a few minutes
    python code/train.py --out runs/multi30k       # the book's translator (profile multi30k)
    python code/train.py --out runs/multi30k --device cuda   # one GPU: CUDA graphs, TF32
    python code/train.py --out runs/multi30k --device cuda --amp bf16 --no-cuda-graphs
    python code/train.py --profile quick --out runs/quick --max-steps 600 --resume
    torchrun --nproc-per-node 8 code/train.py --profile base --out runs/base   # 8 GPUs

Every field of the run (RunConfig: the recipe, how long it runs, its precision, compile and
CUDA graphs) and of the architecture (ModelConfig) is a flag, generated from the
dataclasses, which overrides the profile: --d-model 256, --dropout 0.2, --pre-norm,
--amp bf16, --compile inductor, ... (see --help). --max-tokens is the batch of one update,
padding included, summed over all processes: under torchrun each of W processes takes
max_tokens / W.

Writes OUT/checkpoint.pt (every --checkpoint-every steps and at the end, atomically, all
that is needed to resume), the weight snapshots OUT/checkpoint-<step>.pt (the last
--keep-checkpoints, for averaging, each with its validation figures), OUT/tokenizer.json,
OUT/metrics.json (loss and cross-entropy per step, validation every --eval-every steps)
and OUT/train.log. Only rank 0 writes files. The data come from $MULTI30K_DIR (or
--data-dir) when set, otherwise they are downloaded once and verified by SHA-256. The BPE
vocabulary is learned from the training pairs once and kept in --tokenizer-cache for the
next run on the same pairs.
"""

import argparse
import os
import sys

import torch
from tqdm import tqdm

import distributed
import profiles
import script_helpers as helpers
import training_runs as training


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--profile",
        choices=sorted(profiles.PROFILES),
        default="multi30k",
        help="multi30k (default): the recipe chosen on validation data (hours on a CPU, about "
        "a minute on a GPU); fast: a translator in fifteen minutes of training on two CPU "
        "cores (a time budget, the rate annealed to its end); quick: a small model the "
        "chapters train live on a CPU; base: the paper's base model fitted to Multi30k, for a "
        "GPU; tiny: a toy for tests",
    )
    parser.add_argument("--out", type=helpers.given_path, required=True, help="the run's folder")
    helpers.add_data_dir_flag(parser)
    parser.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    parser.add_argument(
        "--no-validation", action="store_true", help="skip validation during training"
    )
    helpers.add_device_flag(parser)
    helpers.add_tokenizer_cache_flag(parser)
    helpers.add_config_flags(parser)
    return parser.parse_args(argv)


def config_from_args(args):
    """The profile with every config flag that was given applied (apply_changes)."""
    return profiles.apply_changes(profiles.PROFILES[args.profile], helpers.given_changes(args))


def start_distributed(device):
    """Join torchrun's process group when there is one; returns this process's device."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return device
    on_gpu = device.startswith("cuda")
    torch.distributed.init_process_group("nccl" if on_gpu else "gloo")
    if on_gpu:
        device = f"cuda:{os.environ['LOCAL_RANK']}"
        torch.cuda.set_device(device)
    return device


@helpers.user_errors_exit_2("train.py")
def main(argv=None):
    args = parse_args(argv)
    config = config_from_args(args)
    pairs = helpers.load_multi30k("train", data_dir=args.data_dir)
    val_pairs = None if args.no_validation else helpers.load_multi30k("val", data_dir=args.data_dir)
    tokenizer = None  # a resumed run reads its vocabulary from its checkpoint
    if not args.resume:  # learned once per set of pairs and size, then read
        tokenizer = helpers.cached_tokenizer(pairs, config.vocab_size, args.tokenizer_cache)
    device = start_distributed(args.device)
    rank, world = distributed.distributed_rank_and_size()
    # only rank 0 writes the log; tqdm.write puts a message above the progress bar
    with helpers.log_to(args.out / "train.log" if rank == 0 else None, echo=tqdm.write) as log:
        if rank == 0:
            log(
                f"training {args.profile} on {len(pairs)} pairs, {world} "
                f"process{'es' * (world != 1)} of "
                f"{config.max_tokens // world} tokens a side (global batch {config.max_tokens}), "
                f"device {device}: {config}"
            )
        try:
            training.train(
                config,
                pairs,
                args.out,
                tokenizer=tokenizer,
                val_pairs=val_pairs,
                device=device,
                resume=args.resume,
                log=log,
                progress=True,
            )
            if world > 1:  # every process done before any closes its connections: gloo has
                torch.distributed.barrier()  # aborted in teardown when one closed early
        finally:
            if world > 1:
                torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
