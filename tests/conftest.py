import torch

# The same numbers on every machine: CPU float32, two threads as in CI.
torch.set_num_threads(2)
