"""Precision: what a run's `amp` means on a device (float32, or bfloat16 or float16
under autocast), whether the device computes in bfloat16 natively, and TF32 products on a GPU.

GENERATED FILE, DO NOT EDIT. code/export.py writes it from the cells marked
`#| export precision` in chapters/cuda_graphs.ipynb, chapters/training_runs.ipynb;
change them, then run `python code/export.py`.
"""

import contextlib

import torch

from annotated_transformer import InputError

# --------------------------------------------------------------------------------------
# Training with CUDA graphs (ours), from chapters/cuda_graphs.ipynb
# --------------------------------------------------------------------------------------

def mixed_precision(device_type, dtype, *, cache=True):
    """torch.autocast to `dtype` on that kind of device, or no change for None (float32);
    cache=False keeps no cast copies of the weights between operations."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype, cache_enabled=cache)


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
