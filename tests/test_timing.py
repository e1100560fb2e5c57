"""code/timing.py: interleaved rounds, each starting one variant later."""

import timing


def test_each_round_measures_every_variant_once_starting_one_later():
    order, seen = [], []
    found = timing.interleaved_rounds(
        {"A": "a", "B": "b", "C": "c"},
        rounds=3,
        measure=lambda work, r: order.append((work, r)) or 10 * r,
        after_round=lambda r, so_far: seen.append((r, sum(map(len, so_far.values())))),
    )
    assert order == [("a", 0), ("b", 0), ("c", 0), ("b", 1), ("c", 1), ("a", 1)] + [
        ("c", 2),
        ("a", 2),
        ("b", 2),
    ]
    assert found == {"A": [0, 10, 20], "B": [0, 10, 20], "C": [0, 10, 20]}
    assert seen == [(0, 3), (1, 6), (2, 9)]


def test_seconds_of_one_call_times_the_work_on_the_round_it_is_given(monkeypatch):
    clock, rounds = iter([5.0, 7.5]), []
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    assert timing.seconds_of_one_call(rounds.append, 4) == 2.5 and rounds == [4]
