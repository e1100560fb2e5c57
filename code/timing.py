"""Interleaved timing: the one way the book's scripts and training loop time alternatives
against each other. Each round measures every variant once, each round starting one variant
later (A B C, B C A, C A B, ...), so that a change in the machine's load hits every variant
alike rather than the one that happened to run then.

Written by hand: the speed benchmark, the budget of a profile, the precision race of a run
(`training_runs.race_precisions`) and every page that times code time through it.
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


def wall_and_cpu_seconds(work, r=None):
    """measure for interleaved_rounds, for work that takes no argument: (wall-clock seconds,
    this thread's CPU seconds) of one call work(). A claim about the work reads the CPU time:
    another program sharing the cores stretches the wall clock, not the work. It counts the
    calling thread only: time work on one thread (torch.set_num_threads(1))."""
    started, started_cpu = time.perf_counter(), time.thread_time()
    work()
    return time.perf_counter() - started, time.thread_time() - started_cpu


def clock_readings(found):
    """interleaved_rounds' {name: [(wall, cpu) per round]} as two tables of the same shape:
    ({name: [wall seconds]}, {name: [CPU seconds]})."""
    wall = {name: [seconds for seconds, _ in pairs] for name, pairs in found.items()}
    return wall, {name: [cpu for _, cpu in pairs] for name, pairs in found.items()}


def wall_and_cpu_rounds(calls, *, rounds, warm_up=True):
    """How the pages time calls {name: work()}: one untimed call each (unless warm_up is
    False), then `rounds` interleaved rounds of wall_and_cpu_seconds, as two tables
    ({name: [wall seconds]}, {name: [CPU seconds]}) (clock_readings)."""
    if warm_up:
        for call in calls.values():
            call()
    return clock_readings(interleaved_rounds(calls, rounds=rounds, measure=wall_and_cpu_seconds))


def autorange_median(min_run_time, *, num_threads=1):
    """A measure for interleaved_rounds: the median seconds of work() in one
    torch.utils.benchmark blocked_autorange of at least `min_run_time` seconds (a round), on
    `num_threads` threads (the Timer sets its own count: 1 unless told)."""
    from torch.utils.benchmark import Timer  # only here: the module itself needs no torch

    def measure(work, r=None):
        timer = Timer("work()", globals={"work": work}, num_threads=num_threads)
        return timer.blocked_autorange(min_run_time=min_run_time).median

    return measure
