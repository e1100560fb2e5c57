"""Made-up sentence pairs for smoke runs and the tests: random ids, and the same ids as
words, whose "translation" reverses them. Nothing to draw conclusions from; Multi30k is the
book's data. Written by hand, so that a smoke run and the tests share one generator.
"""

import torch

import annotated_transformer as at

STAND_IN_WORDS = "a man woman dog runs sits on the red blue big small ball street grass".split()


def stand_in_ids(count, vocab, seed=0):
    """`count` made-up (source ids, target ids) pairs as at.encode_pairs returns them: 2 to 8
    random ids from 4..vocab-1 ending in </s>, and the same ids reversed between <s> and
    </s>."""
    generator = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(count):
        length = int(torch.randint(2, 9, (1,), generator=generator))
        ids = torch.randint(4, vocab, (length,), generator=generator).tolist()
        pairs.append((ids + [at.EOS_ID], [at.BOS_ID] + ids[::-1] + [at.EOS_ID]))
    return pairs


def stand_in_pairs(count=60, seed=0):
    """The pairs of stand_in_ids as sentences of STAND_IN_WORDS, for smoke runs (and the
    tests): a 'translation' that reverses the words. Nothing to draw conclusions from."""
    pairs = []
    for ids in stand_in_ids(count, len(STAND_IN_WORDS) + 4, seed):
        source, target = (" ".join(STAND_IN_WORDS[i - 4] for i in side if i >= 4) for side in ids)
        pairs.append((source, target))
    return pairs
