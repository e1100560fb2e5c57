"""Train the Transformer on Multi30k German->English (§5 of the paper).

    python code/train.py --profile quick --out runs/quick          # 2 CPU cores, a few minutes
    python code/train.py --profile base --out runs/base --device cuda
    python code/train.py --profile quick --out runs/quick --max-steps 600 --resume
    torchrun --nproc-per-node 8 code/train.py --profile base --out runs/base   # 8 GPUs

Writes OUT/checkpoint.pt (every --checkpoint-every steps and at the end, atomically, all
that is needed to resume), the weight snapshots OUT/checkpoint-<step>.pt (the last
--keep-checkpoints, for averaging), OUT/tokenizer.json, OUT/metrics.json and OUT/train.log.
Under torchrun every process trains on its own share of each batch list with
DistributedDataParallel (NCCL on GPUs, gloo on CPUs); only rank 0 writes files.
The data come from $MULTI30K_DIR (or --data-dir) when set, otherwise they are downloaded
once and verified by SHA-256.
"""

import argparse
import dataclasses
import os
import pathlib
import sys

import torch
from tqdm import tqdm

import annotated_transformer as at


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--profile",
        choices=sorted(at.PROFILES),
        default="quick",
        help="quick: small model for a CPU (what CI runs); base: the paper's base model for a GPU",
    )
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        required=True,
        help="folder for checkpoint, tokenizer, metrics, log",
    )
    parser.add_argument(
        "--data-dir",
        type=pathlib.Path,
        default=None,
        help="local Multi30k copy (default: $MULTI30K_DIR, else download and cache)",
    )
    parser.add_argument("--max-steps", type=int, help="stop after this many updates in all")
    parser.add_argument(
        "--checkpoint-every", type=int, help="write a checkpoint every this many updates"
    )
    parser.add_argument(
        "--keep-checkpoints", type=int, help="how many weight snapshots to keep for averaging"
    )
    parser.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    parser.add_argument(
        "--amp", choices=["bf16"], default=None, help="train under bfloat16 autocast"
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument(
        "--seed", type=int, help="random seed (data order, initialisation, dropout)"
    )
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cpu, cuda or cuda:N (default: cuda when available)",
    )
    recipe = parser.add_argument_group("model and recipe (each overrides the profile)")
    for flag, kind, meaning in (
        ("N", int, "layers in each stack (§3.1)"),
        ("d_model", int, "model width (§3.1)"),
        ("d_ff", int, "feed-forward inner size (§3.3)"),
        ("h", int, "attention heads (§3.2.2)"),
        ("d_k", int, "query/key size per head (§3.2.2; default d_model / h)"),
        ("d_v", int, "value size per head (§3.2.2; default d_model / h)"),
        ("positions", str, "sinusoidal (§3.5) or learned (Table 3 row E)"),
        ("dropout", float, "P_drop, residual dropout (§5.4)"),
        ("vocab_size", int, "shared BPE vocabulary size (§5.1)"),
        ("max_tokens", int, "tokens per batch, per side, padding included (§5.1)"),
        ("warmup_steps", int, "warm-up steps of Eq. (3) (§5.3)"),
        ("lr_factor", float, "factor on the learning rate of Eq. (3)"),
        ("smoothing", float, "label smoothing epsilon_ls (§5.4)"),
    ):
        recipe.add_argument(f"--{flag.replace('_', '-')}", dest=flag, type=kind, help=meaning)
    return parser.parse_args(argv)


def config_from_args(args):
    config = at.PROFILES[args.profile]
    model_changes = {
        k: getattr(args, k)
        for k in ("N", "d_model", "d_ff", "h", "d_k", "d_v", "positions", "dropout")
        if getattr(args, k) is not None
    }
    changes = {
        k: getattr(args, k)
        for k in (
            "vocab_size",
            "max_tokens",
            "warmup_steps",
            "lr_factor",
            "smoothing",
            "seed",
            "max_steps",
            "checkpoint_every",
            "keep_checkpoints",
        )
        if getattr(args, k) is not None
    }
    return dataclasses.replace(
        config, model=dataclasses.replace(config.model, **model_changes), **changes
    )


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


def main(argv=None):
    args = parse_args(argv)
    try:
        config = config_from_args(args)
        pairs = at.load_multi30k("train", data_dir=args.data_dir)
    except (ValueError, at.DatasetError) as error:
        print(f"train.py: {error}", file=sys.stderr)
        return 2
    device = start_distributed(args.device)
    rank, world = at.distributed_rank_and_size()
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "train.log", "a") if rank == 0 else open(os.devnull, "w") as log_file:

        def log(message):
            tqdm.write(message)  # above the progress bar, not through it
            print(message, file=log_file, flush=True)

        if rank == 0:
            log(
                f"training {args.profile} on {len(pairs)} pairs, {world} process(es), "
                f"device {device}, amp {args.amp}, compile {args.compile}: {config}"
            )
        try:
            at.train(
                config,
                pairs,
                args.out,
                device=device,
                resume=args.resume,
                log=log,
                progress=True,
                amp=args.amp,
                compile=args.compile,
            )
        except (ValueError, FileNotFoundError, FileExistsError) as error:
            print(f"train.py: {error}", file=sys.stderr)
            return 2
        finally:
            if world > 1:
                torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
