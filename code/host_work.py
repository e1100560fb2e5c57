"""Find host work in code meant to run on an accelerator: every operation that makes a host
tensor, copies one to the device, reads a device value back, or has a shape that depends on
device values (so the host must wait for the device to learn it).

Run the code with its model and data on the "meta" device: nothing is computed, but every
operation still passes through PyTorch's dispatcher, where a TorchDispatchMode sees it, its
arguments and its results. A CUDA stream would wait at each of these; a CUDA graph could not
capture them. Zero-dimensional host tensors are allowed: they are how PyTorch passes a Python
number to a kernel, by value, without a copy.
"""

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten
READS = {aten._local_scalar_dense.default, aten.item.default}
COPIES = {aten._to_copy.default, aten.copy_.default, aten._copy_from.default}
# results whose shape the host can only know by reading the device
DATA_DEPENDENT = {
    aten.nonzero.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_consecutive.default,
}


def tensors(tree):
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def on_host(tensor):
    return tensor.device.type == "cpu"


class HostWork(TorchDispatchMode):
    """Records, as one line each, the operations that would make the host wait."""

    def __init__(self):
        super().__init__()
        self.found = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = tensors((args, kwargs))
        if func in READS and any(not on_host(t) for t in inputs):
            self.found.append(f"{func}: reads a device value on the host")
        if func in DATA_DEPENDENT:
            self.found.append(f"{func}: its shape depends on device values")
        if func in COPIES and any(on_host(t) and t.dim() > 0 for t in inputs):
            self.found.append(f"{func}: copies a host tensor")
        out = func(*args, **kwargs)
        for t in tensors(out):
            if on_host(t) and t.dim() > 0:
                self.found.append(f"{func}: makes a host tensor of shape {tuple(t.shape)}")
        return out


def host_work(fn, *args, **kwargs):
    """Run fn(*args, **kwargs) and return the host work it did, one line per operation
    (an empty list when it did none). An error raised by fn (a meta tensor's .item(), for
    one) is caught: what was recorded up to it is returned, with the error last."""
    mode = HostWork()
    try:
        with mode:
            fn(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - the error is part of the finding
        mode.found.append(f"stopped by {type(error).__name__}: {error}")
    return mode.found
