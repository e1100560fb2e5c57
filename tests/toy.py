"""What the tests share: the tiny training profile and the made-up sentence pairs, as ids or
as words: the smoke runs' stand-in (code/stand_in.py), so that one generator makes them (a
plain module, imported by name, so that no test module imports another)."""

import profiles
import stand_in

TINY = profiles.PROFILES["tiny"]
toy_ids = stand_in.stand_in_ids  # toy_ids(n, vocab, seed=0)
toy_pairs = stand_in.stand_in_pairs  # toy_pairs(n=60, seed=0)


def quiet(message):
    pass
