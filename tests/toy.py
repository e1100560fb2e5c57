"""What the tests share: the tiny training profile and one set of made-up sentence
pairs (a plain module, imported by name, so that no test module imports another)."""

import torch

import annotated_transformer as at

TINY = at.PROFILES["tiny"]
WORDS = "a man woman dog runs sits on the red blue big small ball street grass".split()


def toy_pairs(n=60, seed=0):
    """Made-up sentence pairs with varied lengths (a 'translation' that reverses words)."""
    generator = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(n):
        length = int(torch.randint(2, 9, (1,), generator=generator))
        words = [WORDS[int(i)] for i in torch.randint(len(WORDS), (length,), generator=generator)]
        pairs.append((" ".join(words), " ".join(reversed(words))))
    return pairs


def quiet(message):
    pass
