"""The queues benchmark's pure parts (benchmarks/queues.py): Kueue's trace, and the metrics
(Jain's index, fair shares, usage, time-to-admission per class, reclaim time, preemption
cycles from the event log), on small hand-made runs."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from queues import (
    PROFILES,
    Held,
    Jobs,
    Preemption,
    busiest,
    fairness,
    goals,
    jain,
    lender_reclaims,
    lower_bound,
    make_trace,
    parse_args,
    percentile,
    preemption_cycles,
    preemptor_of,
    reclaim_times,
    reclaim_waits,
    sweep,
    time_to_admission,
    usage,
    water_fill,
)


def test_the_baseline_trace_is_kueues() -> None:
    prof = PROFILES["baseline"]
    trace = make_trace(prof)
    assert len(trace) == 15_000 and prof.pool == 600 and prof.nodes == 30
    assert len({i.queue for i in trace}) == 30 and len({i.cohort for i in trace}) == 5
    by_class = {c: [i for i in trace if i.cls == c] for c in ("small", "medium", "large")}
    assert [len(v) for v in by_class.values()] == [10_500, 3_000, 1_500]
    large = sorted(i.at for i in by_class["large"] if i.queue == "c0-q0")
    assert large[:2] == pytest.approx([1.2, 2.4]) and large[-1] == pytest.approx(60.0)
    assert {(i.gpus, i.runtime, i.priority) for i in by_class["medium"]} == {(5, 0.5, 100)}
    assert lower_bound(trace, prof.pool) == pytest.approx(66.0)  # 39,600 GPU-s / 600
    assert [i.at for i in trace] == sorted(i.at for i in trace)


def test_the_large_profile_and_the_time_scale() -> None:
    prof = PROFILES["large"]
    assert len(prof.queues()) == 1000 and len(make_trace(prof)) == 50_000
    scaled = make_trace(PROFILES["small"], 10.0)
    plain = make_trace(PROFILES["small"])
    assert len(plain) == 300
    plain_by_name = {i.name: i for i in plain}
    assert len(scaled) == 300
    for item in scaled:
        assert item.runtime == pytest.approx(plain_by_name[item.name].runtime * 10)
        assert item.at == pytest.approx(plain_by_name[item.name].at * 10)
    params, as_json, check = parse_args(["--profile", "small", "--json", "--check"])
    assert params.scale == 3.0 and as_json and check


def test_jain_percentile_and_water_filling() -> None:
    assert jain([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain([1.0, 0.0]) == pytest.approx(0.5)
    assert math.isnan(jain([]))
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile(list(range(100)), 99) == 98
    assert math.isnan(percentile([], 99))
    # 120 GPUs over three queues: one wants 10, the others share the rest equally
    assert water_fill(120, {"a": 10, "b": 200, "c": 200}) == pytest.approx(
        {"a": 10, "b": 55, "c": 55})
    assert water_fill(120, {"a": 10, "b": 20}) == pytest.approx({"a": 10, "b": 20})
    assert water_fill(90, {"a": 100, "b": 100}, {"a": 2.0, "b": 1.0}) == pytest.approx(
        {"a": 60, "b": 30})


def test_sweep_and_usage() -> None:
    changes = [(1.0, "a", 5.0), (2.0, "a", -5.0), (1.5, "b", 3.0)]
    assert sweep(changes, [0.0, 1.0, 1.6, 2.0]) == [
        {}, {"a": 5.0}, {"a": 5.0, "b": 3.0}, {"a": 0.0, "b": 3.0}]
    held = [Held("a", 10, 0.0, 10.0), Held("b", 10, 5.0, 15.0)]
    assert usage(held, 20, 0.0, 10.0) == pytest.approx(0.75)  # 150 of 200 GPU-seconds
    assert busiest([0.0, 0.1, 0.2, 3.0, 9.0], 1.0) == 3.0


def jobs(**kw: object) -> Jobs:
    base: dict[str, object] = dict(queue={}, cls={}, gpus={}, submitted={}, admitted={},
                                   completed={}, held=[], preemptions=[], ran={})
    base.update(kw)
    return Jobs(**base)  # type: ignore[arg-type]


def test_time_to_admission_per_class() -> None:
    j = jobs(cls={"s1": "small", "s2": "small", "l1": "large"},
             submitted={"s1": 0.0, "s2": 1.0, "l1": 0.0},
             admitted={"s1": 1.0, "s2": 4.0, "l1": 10.0})
    assert time_to_admission(j) == {"large": (1, 10.0, 10.0), "small": (2, 2.0, 3.0)}


def test_fairness_at_steady_state() -> None:
    # one cohort of two queues (nominal 10, may hold 20); both want 40 from t = 0 to 10
    queues = {"a": ("c", 10.0, 20.0, 1.0), "b": ("c", 10.0, 20.0, 1.0)}
    gpus = {"a1": 40, "b1": 40}
    common = dict(queue={"a1": "a", "b1": "b"}, gpus=gpus, submitted={"a1": 0.0, "b1": 0.0},
                  completed={"a1": 10.0, "b1": 10.0})
    fair = fairness(jobs(**common, held=[Held("a", 10, 0.0, 10.0), Held("b", 10, 0.0, 10.0)]),
                    queues, 20, [0.5 * i for i in range(20)])
    assert fair.samples == 20 and fair.jain == pytest.approx(1.0)
    assert fair.deviation == pytest.approx(0.0) and fair.usage_busy == pytest.approx(1.0)
    skewed = fairness(jobs(**common, held=[Held("a", 15, 0.0, 10.0), Held("b", 5, 0.0, 10.0)]),
                      queues, 20, [0.5 * i for i in range(20)])
    assert skewed.jain == pytest.approx(jain([1.5, 0.5])) and skewed.deviation == 5.0
    # alternating whole shares: fair on average, not per sample
    alternating = [Held("a", 20, 0.0, 5.0), Held("b", 20, 5.0, 10.0)]
    alt = fairness(jobs(**common, held=alternating), queues, 20, [0.5 * i for i in range(20)])
    assert alt.jain == pytest.approx(1.0) and alt.deviation_max == 10.0
    assert alt.jain_mean == pytest.approx(0.5)
    # demand below the pool: no steady-state sample
    idle = fairness(jobs(queue={"a1": "a"}, gpus={"a1": 5}, submitted={"a1": 0.0},
                         completed={"a1": 10.0}), queues, 20, [1.0, 2.0])
    assert idle.samples == 0 and math.isnan(idle.jain)


def test_preemptor_of_the_controllers_messages() -> None:
    assert preemptor_of("reclaimed by large-c0-q1-3-0a1b2c: queue c0-q1 takes back the "
                        "quota it lent to c0-q2") == "large-c0-q1-3-0a1b2c"
    assert preemptor_of("preempted by big-1f2e3d (priority 200)") == "big-1f2e3d"
    assert preemptor_of("node n1 is unhealthy") is None


def test_reclaim_time_is_the_lenders_submit_until_running() -> None:
    j = jobs(queue={"v": "b", "r": "a", "p": "b"}, submitted={"r": 10.0, "p": 0.0},
             preemptions=[Preemption(11.0, "v", "b", "r", "a"),
                          Preemption(12.0, "v", "b", "p", "b")],  # within b: not a reclaim
             ran={"r": [5.0, 12.5], "p": [13.0]})
    assert reclaim_times(j) == [pytest.approx(2.5)]
    assert reclaim_waits(j) == [pytest.approx(1.5)]


def test_a_lender_s_reclaim_is_one_whose_queue_was_within_its_quota_at_submit() -> None:
    """r came while its queue a held 3 of its 4 GPUs and needs 1: a lender's; s came while
    a held 3 and needs 2: it borrowed at its submit, and is left out."""
    j = jobs(queue={"v": "b", "r": "a", "s": "a", "a0": "a"}, gpus={"r": 1, "s": 2, "a0": 3},
             submitted={"a0": 0.0, "r": 10.0, "s": 10.0}, completed={"a0": 20.0},
             held=[Held("a", 3, 0.0, 20.0), Held("b", 8, 0.0, 11.0)],
             preemptions=[Preemption(11.0, "v", "b", "r", "a"),
                          Preemption(11.0, "v", "b", "s", "a")],
             ran={"a0": [0.0], "r": [12.0], "s": [13.0]})
    assert lender_reclaims(j, 4.0) == {"r": pytest.approx(2.0)}


def test_a_request_behind_its_own_queue_s_backlog_is_not_a_lender_s() -> None:
    """At r's submit its queue a ran 1 GPU of its 4, but 3 more of its GPUs waited ahead of
    r (w, submitted earlier, not completed): the queue's order counts them first, so r came
    behind its own queue's work and is left out, although the queue held room for it. Once
    w completed, a later request t of the same size is a lender's again."""
    j = jobs(queue={"v": "b", "a0": "a", "w": "a", "r": "a", "t": "a"},
             gpus={"a0": 1, "w": 3, "r": 1, "t": 1},
             submitted={"a0": 0.0, "w": 1.0, "r": 2.0, "t": 30.0},
             completed={"a0": 40.0, "w": 20.0, "r": 25.0},
             held=[Held("a", 1, 0.0, 40.0), Held("a", 3, 5.0, 20.0), Held("b", 8, 0.0, 31.0)],
             preemptions=[Preemption(3.0, "v", "b", "r", "a"),
                          Preemption(30.5, "v", "b", "t", "a")],
             ran={"a0": [0.0], "w": [5.0], "r": [21.0], "t": [31.0]})
    assert lender_reclaims(j, 4.0) == {"t": pytest.approx(1.0)}


def test_preemption_cycles_from_the_event_log() -> None:
    queue = {"a1": "a", "a2": "a", "q1": "q", "q2": "q", "z": "z"}
    there = Preemption(1.0, "a1", "a", "q1", "q")
    back = Preemption(2.0, "q1", "q", "a2", "a")
    assert preemption_cycles(jobs(queue=queue, preemptions=[there, back])) == [(there, back)]
    # a submission in one of the two queues between: the second answers a change
    assert preemption_cycles(jobs(queue=queue, submitted={"a2": 1.5},
                                  preemptions=[there, back])) == []
    # ... but one in another queue changes nothing for these two
    assert len(preemption_cycles(jobs(queue=queue, submitted={"z": 1.5},
                                      preemptions=[there, back]))) == 1
    # a completion between ends it too
    assert preemption_cycles(jobs(queue=queue, completed={"q2": 1.2},
                                  preemptions=[there, back])) == []
    # the same direction twice is no cycle
    again = Preemption(2.0, "a2", "a", "q2", "q")
    assert preemption_cycles(jobs(queue=queue, preemptions=[there, again])) == []
    # within one queue: only when the same work is swapped back
    inner = Preemption(1.0, "a1", "a", "a2", "a")
    other = Preemption(2.0, "q1", "a", "q2", "a")
    swap = Preemption(2.0, "a2", "a", "a1", "a")
    assert preemption_cycles(jobs(queue={**queue, "q1": "a", "q2": "a"},
                                  preemptions=[inner, other])) == []
    assert preemption_cycles(jobs(queue=queue, preemptions=[inner, swap])) == [(inner, swap)]


def test_goals_say_met_and_missed() -> None:
    fig = {"wall": 80.0, "lower_bound": 66.0, "usage_busy": 0.95, "jain": 0.99,
           "admissions_per_s": 150.0, "lender_reclaim_p99": 3.0, "cycles": 0}
    met = {g: ok for g, ok, _ in goals(fig, 0.5)}
    assert met["wall <= 1.25x lower bound"] and met["Jain >= 0.98"]
    assert not met[">= 200 admissions/s"]
    assert not met["reclaim p99 (lenders: submit -> running) <= checkpoint + 2 s (2.5 s)"]
    assert met["0 preemption cycles"]
    fig["lender_reclaim_p99"] = math.nan  # no lender's reclaim: not measured, not met
    assert [text for g, ok, text in goals(fig, 0.5) if g.startswith("reclaim") and not ok] \
        == ["not measured: no lender's request reclaimed"]
