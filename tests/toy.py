"""What the tests share: the tiny training profile and one generator of made-up sentence
pairs, as ids or as words (a plain module, imported by name, so that no test module imports
another)."""

import torch

import annotated_transformer as at
import training_runs as training

TINY = training.PROFILES["tiny"]
WORDS = "a man woman dog runs sits on the red blue big small ball street grass".split()


def toy_ids(n, vocab, seed=0):
    """n (source ids, target ids) pairs as encode_pairs returns them: 2 to 8 random ids from
    4..vocab-1 ending in </s>, and the same ids reversed between <s> and </s>."""
    generator = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(n):
        length = int(torch.randint(2, 9, (1,), generator=generator))
        ids = torch.randint(4, vocab, (length,), generator=generator).tolist()
        pairs.append((ids + [at.EOS_ID], [at.BOS_ID] + ids[::-1] + [at.EOS_ID]))
    return pairs


def toy_pairs(n=60, seed=0):
    """The pairs of toy_ids as sentences of WORDS: a 'translation' that reverses the words."""
    pairs = []
    for src, tgt in toy_ids(n, len(WORDS) + 4, seed):
        source, target = ([WORDS[i - 4] for i in ids if i >= 4] for ids in (src, tgt))
        pairs.append((" ".join(source), " ".join(target)))
    return pairs


def quiet(message):
    pass
