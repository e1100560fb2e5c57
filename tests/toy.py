"""What the tests share: the tiny training profile and the made-up sentence pairs, as ids or
as words: benchmark.py's stand-in for smoke runs, so that one generator makes them (a plain
module, imported by name, so that no test module imports another)."""

import benchmark
import profiles

TINY = profiles.PROFILES["tiny"]
toy_ids = benchmark.stand_in_ids  # toy_ids(n, vocab, seed=0)
toy_pairs = benchmark.stand_in_pairs  # toy_pairs(n=60, seed=0)


def quiet(message):
    pass
