"""Interleaved timing: the one way the book's scripts and training loop time alternatives
against each other. Each round measures every variant once, each round starting one variant
later (A B C, B C A, C A B, ...), so that a change in the machine's load hits every variant
alike rather than the one that happened to run then.

Written by hand: the speed benchmark, the budget of a profile and the precision race of a
run (`training_runs.race_precisions`) time through it.
"""

import time


def interleaved_rounds(variants, *, rounds, measure, after_round=None):
    """{name: [one measurement per round]} for variants {name: work}: in round r, each
    variant's measure(work, r), in the rotated order; after_round(r, found), if given, sees
    the measurements so far after each round."""
    names = list(variants)
    found = {name: [] for name in names}
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            found[name].append(measure(variants[name], r))
        if after_round:
            after_round(r, found)
    return found


def seconds_of_one_call(work, r):
    """measure for interleaved_rounds: the wall-clock seconds of work(r)."""
    started = time.perf_counter()
    work(r)
    return time.perf_counter() - started
