"""What every chapter does first, kept out of the model module: seeds, print precision
and the plot style. Imported by each chapter's setup cell."""

import random

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
import torch


def setup_page(seed=0):
    """Fix every random seed a chapter uses and set one look for printed tensors and figures."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_printoptions(precision=4, sci_mode=False)
    sns.set_theme(context="notebook", style="whitegrid")
    plt.rcParams.update({"figure.figsize": (6.4, 4.0), "figure.dpi": 100, "savefig.bbox": "tight"})
