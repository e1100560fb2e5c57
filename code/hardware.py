"""The machine a result came from, named in one line: the CPU's model and the instruction
sets that decide its speed, or the GPU; the thread count and torch's version.

Written by hand (not generated from a page): every page and script that reports a figure
names its machine with it, from chapter 1 on.
"""

import platform

import torch


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
    whether its float32 products run in TF32 at the moment (precision.tf32_matmuls), or the CPU's
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
