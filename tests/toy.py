"""What the tests share: one tiny training configuration and one set of made-up sentence
pairs (a plain module, imported by name, so that no test module imports another)."""

import torch

import annotated_transformer as at

TINY = at.TrainConfig(
    model=at.ModelConfig(N=1, d_model=32, d_ff=64, h=2, share_embeddings=True),
    vocab_size=200,
    max_tokens=200,
    warmup_steps=10,
    max_steps=6,
    checkpoint_every=3,
)
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
