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


def test_wall_and_cpu_seconds_read_the_two_clocks_around_one_call(monkeypatch):
    wall, cpu, calls = iter([1.0, 4.0]), iter([10.0, 10.5]), []
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(wall))
    monkeypatch.setattr(timing.time, "thread_time", lambda: next(cpu))
    assert timing.wall_and_cpu_seconds(lambda: calls.append(1), 3) == (3.0, 0.5)
    assert calls == [1]  # once, without the round


def test_a_wait_stretches_the_wall_clock_and_not_the_threads_cpu_time():
    import time

    wall, cpu = timing.wall_and_cpu_seconds(lambda: time.sleep(0.05))
    assert wall >= 0.05 and cpu < 0.02  # the thread slept: no work done


def test_clock_readings_split_the_pairs_into_two_tables():
    found = {"A": [(1.0, 0.5), (2.0, 0.25)], "B": [(3.0, 1.5)]}
    assert timing.clock_readings(found) == (
        {"A": [1.0, 2.0], "B": [3.0]},
        {"A": [0.5, 0.25], "B": [1.5]},
    )


def test_autorange_median_runs_the_work_and_reports_seconds_per_call():
    calls = []
    seconds = timing.autorange_median(0.01)(lambda: calls.append(1))
    assert calls and 0 < seconds < 0.01  # a list append: far below the round's length


def test_the_pages_time_code_through_the_one_timer():
    """A page's cell that compares timings measures them with timing's rounds and readings
    (wall_and_cpu_rounds, interleaved_rounds, autorange_median), never with a clock or a
    Timer of its own; the exported training loop's device clock is no comparison."""
    import json
    import pathlib

    own = ("time.perf_counter", "time.thread_time", "time.process_time", "Timer(")
    chapters = pathlib.Path(__file__).resolve().parent.parent / "chapters"
    found = []
    for path in sorted(chapters.glob("*.ipynb")):
        for number, cell in enumerate(json.loads(path.read_text())["cells"], start=1):
            source = "".join(cell["source"])
            if cell["cell_type"] == "code" and not source.startswith("#| export"):
                found += [f"{path.stem}, cell {number}: {c}" for c in own if c in source]
    assert not found, found


def test_wall_and_cpu_rounds_warm_up_once_then_time_every_call_in_each_round(monkeypatch):
    ticks = iter(range(100))
    monkeypatch.setattr(timing.time, "perf_counter", lambda: 2.0 * next(ticks))
    monkeypatch.setattr(timing.time, "thread_time", lambda: 1.0 * next(ticks))
    calls = {"A": [], "B": []}
    work = {name: (lambda seen=seen: seen.append(1)) for name, seen in calls.items()}
    wall, cpu = timing.wall_and_cpu_rounds(work, rounds=3)
    assert {name: len(seen) for name, seen in calls.items()} == {"A": 4, "B": 4}  # 1 + 3
    # each reading: perf_counter, thread_time, the call, perf_counter, thread_time (ticks
    # t, t + 1, t + 2, t + 3): 2 ticks apart on each clock, the wall clock's twice as long
    assert wall == {"A": [4.0] * 3, "B": [4.0] * 3} and cpu == {"A": [2.0] * 3, "B": [2.0] * 3}
    calls = {"A": [], "B": []}
    work = {name: (lambda seen=seen: seen.append(1)) for name, seen in calls.items()}
    timing.wall_and_cpu_rounds(work, rounds=2, warm_up=False)
    assert {name: len(seen) for name, seen in calls.items()} == {"A": 2, "B": 2}
