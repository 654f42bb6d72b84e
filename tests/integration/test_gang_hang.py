"""Hang detection (``hang_timeout``) of a gang on a real local cluster: the DDP example
(examples/ddp_train.py, real torchrun, gloo on the CPU) as a 2-member gang, beside a spare node.

A hang is made three ways: one rank sleeps inside a step (``--stall-how sleep``), one rank
spins on the CPU inside a step (``--stall-how spin``), and one rank's training process is
stopped with SIGSTOP. Each time hafo must name the member and rank that stalled first (the
other rank waits for it in the step's all-reduce, its progress one step ahead), stop every
member at once and restart the gang, which then trains again from its checkpoint; a second
hang on the same node moves that member off it (to the spare). A quiet gang is never judged
hung, nor a straggler. No two epochs of the gang are ever alive at once.

A straggler (``straggler_lag``) is made by the example's ``--slow-node``: its ranks on one node
sleep longer in every step, outside the collectives (as slow hardware would). hafo must name
the member on that node, stop every member and restart the gang in place, the node now
suspect; still slow there, the member is named again and moves to the spare, after which the
gang trains at its normal pace, never named again.

The example's own safety nets are set far beyond ``hang_timeout`` (gloo's collective timeout,
``HAFO_DDP_TIMEOUT``, 60 s; its watchdog twice that), so what ends the hang is hafo's
detection. The delay printed for each hang runs from when the hang began (the stall's record in
the progress log, or the SIGSTOP) to the "hung" event's time (both wall clocks of this host).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hafo.local.cluster import LocalCluster
from hafo.local.procs import descendants
from hafo.model.cluster import ClusterSnapshot, Event
from hafo.model.views import workload_view
from hafo.store import read_events

from .conftest import ClusterFactory
from .helpers import assert_never_two_copies
from .test_gangs import SPARE, _is_worker, gang_cluster, gang_story, members, training

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
HANG_TIMEOUT = 4.0
# Hang began -> "hung" event: hang_timeout, the agent's sampling (0.2 s), the controller's
# wait for the other member's report (at most 1 s) and its cycle, plus slack for 2 busy cores.
DETECTED_WITHIN = HANG_TIMEOUT + 4.0
STALL_AT = 25
STRAGGLER_LAG = 0.3
# The straggler test's slow node, named in the gang's command before it is placed: an ordinary
# node (the spare takes no ordinary work, so the 2 members get node-1 and node-2); the member
# it gets is read from the placement. Its ranks sleep SLOW_BY more per step.
SLOW_NODE = "node-2"
SLOW_BY = 0.6
# First step of an epoch -> "straggler" event: a rank reports its own time per step once it
# has MIN_OWN_TIME_STEPS (8) of them (the median: the first steps of an epoch, e.g. DDP's
# bucket rebuild, a broadcast in the second forward pass that waits for the slow rank, are
# no straggler), so the verdict comes after about 9 slow steps (~0.65 s each), then the
# agents' sampling (0.2 s) and a controller cycle. A bound, with slack for 2 busy cores.
STRAGGLER_WITHIN = 20.0
# A bound for liveness only; the assertions about time are the detection delays above.
pytestmark = pytest.mark.timeout(240)  # the timing lane's (conftest.TIMING_MODULES)


def hang_spec(name: str, *args: str, **extra: Any) -> dict[str, Any]:
    """The DDP example as a 2-member gang with ``hang_timeout``; ``args``: more of its flags;
    ``extra``: more of the spec's fields (or other values of them)."""
    return {"name": name, "nodes": 2, "gpus": 1, "stop_grace": 15,
            "hang_timeout": HANG_TIMEOUT,
            "command": [TORCHRUN, str(ROOT / "examples" / "ddp_train.py"), "--steps", "0",
                        "--every", "10", "--sleep", "0.05", *args],
            "env": {"HAFO_DDP_TIMEOUT": "60"}, **extra}


def log_lines(cluster: LocalCluster, wid: str, event: str,
              epoch: int | None = None) -> list[dict[str, Any]]:
    return [line for line in cluster.progress_log(wid) if line.get("event") == event
            and (epoch is None or line["epoch"] == epoch)]


async def events_of(cluster: LocalCluster, wid: str) -> list[Event]:
    return [e for e in await read_events(cluster.store, cluster.keys, 0) if e.workload == wid]


async def wait_event(cluster: LocalCluster, wid: str, after: int, what: str,
                     timeout: float = 60) -> Event:
    """The first of the workload's events after its first ``after`` whose message contains
    ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in (await events_of(cluster, wid))[after:] if what in e.message]
        if found:
            return found[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"no event of {wid} saying {what!r} within {timeout}s\n"
                                 f"{await gang_story(cluster, wid)}")
        await asyncio.sleep(0.1)


async def wait_log(cluster: LocalCluster, wid: str, check: Any, what: str,
                   timeout: float = 150) -> None:
    """Until ``check(progress log lines)`` holds (a bound for liveness)."""
    deadline = time.monotonic() + timeout
    while not check(cluster.progress_log(wid)):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n"
                                 f"{await gang_story(cluster, wid)}")
        await asyncio.sleep(0.2)


async def trains_past(cluster: LocalCluster, wid: str, epoch: int, step: int) -> None:
    """Until rank 0 of ``epoch`` logged a step above ``step``."""
    await wait_log(cluster, wid, lambda lines: any(
        x.get("event") == "step" and x["epoch"] == epoch and x["rank"] == 0
        and x["step"] > step for x in lines), f"epoch {epoch} past step {step}")


async def trains_on(cluster: LocalCluster, wid: str, epoch: int, steps: int = 5) -> None:
    """Until rank 0 of ``epoch`` logged ``steps`` steps."""
    await wait_log(cluster, wid, lambda lines: sum(
        1 for x in lines if x.get("event") == "step" and x["epoch"] == epoch
        and x["rank"] == 0) >= steps, f"{steps} steps of epoch {epoch}")


def worker_of(cluster: LocalCluster, snapshot: ClusterSnapshot, wid: str, node: str,
              epoch: int) -> int:
    """The host pid of the member's training process on ``node`` in ``epoch``: torchrun's
    child that runs ddp_train.py, found in the member's own process tree (the instance's
    reported pid)."""
    status = snapshot.statuses[(wid, node)]
    assert status.epoch == epoch and status.state == "running", status
    root = cluster.host_pid(node, status.pid)
    assert root is not None, f"{node} runs no process {status.pid}"
    found = [p for p in descendants(root) if _is_worker(p)]
    assert len(found) == 1, f"the training process of {wid} on {node}: {found}"
    return found[0]


async def stop_worker(cluster: LocalCluster, snapshot: ClusterSnapshot, wid: str, node: str,
                      epoch: int, case: str) -> Event:
    """SIGSTOP the member's training process on ``node`` (found in its own process tree);
    the leader's next event about a hang, its delay checked (``check_delay``)."""
    seen = len(await events_of(cluster, wid))
    os.kill(worker_of(cluster, snapshot, wid, node, epoch), signal.SIGSTOP)
    began = time.time()
    event = await wait_event(cluster, wid, seen, " hung on ")
    check_delay(case, event.ts - began, event)
    return event


def check_delay(case: str, delay: float, event: Event) -> None:
    """Print the detection delay (hang began -> the event) and check its bounds: not before
    ``hang_timeout`` (less a second: the last heartbeat may precede the hang by a step), and
    within DETECTED_WITHIN."""
    print(f"\n[hang] {case}: hang began -> {event.kind!r} event in {delay:.2f}s "
          f"(hang_timeout {HANG_TIMEOUT:g}s): {event.message}", flush=True)
    assert HANG_TIMEOUT - 1.0 <= delay <= DETECTED_WITHIN, (case, delay, event)


def restarted_after(cluster: LocalCluster, wid: str, event: Event, epoch: int) -> None:
    """Print how long after ``event`` every rank of ``epoch`` had started again."""
    starts = [x["t"] for x in log_lines(cluster, wid, "start", epoch)]
    print(f"[hang] epoch {epoch}: every rank started {max(starts) - event.ts:.2f}s after the "
          f"event", flush=True)


async def stall_once_and_recover(local_cluster: ClusterFactory, name: str, rank: int,
                                 how: str) -> None:
    """Rank ``rank`` stalls (``how``) at step STALL_AT: named, the gang restarts in place and
    trains past that step."""
    cluster = await gang_cluster(local_cluster, nodes=2)
    wid = await cluster.submit(hang_spec(name, "--stall-rank", str(rank), "--stall-at",
                                         str(STALL_AT), "--stall-how", how))
    snapshot = await cluster.wait_for(training(wid), 90, what="gang training")
    epoch = int(workload_view(snapshot, wid)["epoch"] or 0)
    before = members(snapshot, wid)
    await wait_log(cluster, wid, lambda _: bool(log_lines(cluster, wid, "stall", epoch)),
                   f"rank {rank} stalls")
    began = log_lines(cluster, wid, "stall", epoch)[0]["t"]
    hung = await wait_event(cluster, wid, 0, " hung on ")
    delay = hung.ts - began
    check_delay(f"rank {rank} stalls ({how})", delay, hung)
    assert hung.kind == "hung", hung
    # the stalled rank never reached the collectives of step STALL_AT + 1: its last heartbeat
    # said STALL_AT; the other rank's said STALL_AT + 1, and it waits in that step's all-reduce
    node = before[rank][1]
    assert f"member {rank} hung on {node}: rank {rank} made no progress" in hung.message, hung
    assert f"since step {STALL_AT}" in hung.message, hung
    assert "its process is stopped" not in hung.message, hung
    snapshot = await cluster.wait_for(training(wid, epoch), 90, what="gang trains again")
    view = workload_view(snapshot, wid)
    new = int(view["epoch"] or 0)
    assert [(r, n) for r, n, _ in members(snapshot, wid)] == [(r, n) for r, n, _ in before]
    assert view["restarts"] == 1
    await trains_past(cluster, wid, new, STALL_AT + 3)
    restarted_after(cluster, wid, hung, new)
    assert not log_lines(cluster, wid, "stall", new)  # once per checkpoint directory
    assert [e.kind for e in await events_of(cluster, wid)].count("hung") == 1
    assert_never_two_copies(cluster, wid)


async def test_a_rank_asleep_in_a_step_is_named_and_the_gang_restarts(
        local_cluster: ClusterFactory) -> None:
    await stall_once_and_recover(local_cluster, "hang-sleep", rank=1, how="sleep")


async def test_a_rank_spinning_in_a_step_is_named_and_the_gang_restarts(
        local_cluster: ClusterFactory) -> None:
    await stall_once_and_recover(local_cluster, "hang-spin", rank=0, how="spin")


async def test_a_quiet_gang_is_never_hung_and_a_stopped_rank_twice_moves_its_member(
        local_cluster: ClusterFactory) -> None:
    cluster = await gang_cluster(local_cluster, nodes=2)
    wid = await cluster.submit(hang_spec("hang-stop", straggler_lag=STRAGGLER_LAG))
    snapshot = await cluster.wait_for(training(wid), 90, what="gang training")
    epoch = int(workload_view(snapshot, wid)["epoch"] or 0)
    before = members(snapshot, wid)
    node = before[1][1]
    await trains_on(cluster, wid, epoch)

    # Quiet: 20 s of training (checkpoints every 10 steps included), never a stall reported,
    # nor a straggler named (its members' paces, with straggler_lag, stay close).
    stalls: list[Any] = []
    paces: dict[str, list[float]] = {}
    quiet_until = time.monotonic() + 20
    first_step = max(x["step"] for x in log_lines(cluster, wid, "step", epoch))
    while time.monotonic() < quiet_until:
        snapshot = await cluster.snapshot()
        for (w, n), s in snapshot.statuses.items():
            if w == wid and s.stalled is not None:
                stalls.append(s.stalled)
            if w == wid and s.pace is not None:
                paces.setdefault(n, []).append(s.pace.compute)
        await asyncio.sleep(0.25)
    view = workload_view(snapshot, wid)
    assert not stalls, stalls
    assert (view["state"], view["epoch"], view["restarts"]) == ("running", epoch, 0), view
    kinds = [e.kind for e in await events_of(cluster, wid)]
    assert "hung" not in kinds and "straggler" not in kinds, kinds
    last_step = max(x["step"] for x in log_lines(cluster, wid, "step", epoch))
    print(f"\n[hang] quiet gang: steps {first_step}..{last_step} in 20 s, no stall reported, "
          f"no straggler; paces reported (s per step): "
          f"{ {n: (min(p), max(p)) for n, p in sorted(paces.items())} }", flush=True)
    assert last_step - first_step >= 20
    assert sorted(paces) == sorted(n for _, n, _ in before), paces  # every member's pace

    # SIGSTOP of member 1's training process: named, stopped, the gang restarts in place.
    hung = await stop_worker(cluster, snapshot, wid, node, epoch, "SIGSTOP of rank 1")
    assert hung.kind == "hung", hung
    assert f"member 1 hung on {node}: rank 1 made no progress" in hung.message, hung
    assert "(its process is stopped)" in hung.message, hung
    snapshot = await cluster.wait_for(training(wid, epoch), 90, what="gang trains again")
    second = int(workload_view(snapshot, wid)["epoch"] or 0)
    assert [(r, n) for r, n, _ in members(snapshot, wid)] == [(r, n) for r, n, _ in before]
    await trains_on(cluster, wid, second)
    restarted_after(cluster, wid, hung, second)

    # The second hang on that node within restart.window: member 1 leaves it, for the spare.
    moved = await stop_worker(cluster, await cluster.snapshot(), wid, node, second,
                              "SIGSTOP of rank 1 again, same node")
    assert moved.kind == "app-failed", moved
    assert f"member 1 hung on {node}: rank 1" in moved.message, moved
    assert f"the second hang on {node}" in moved.message, moved
    snapshot = await cluster.wait_for(training(wid, second), 90, what="gang trains again")
    third = int(workload_view(snapshot, wid)["epoch"] or 0)
    now = members(snapshot, wid)
    assert now[0][:2] == before[0][:2]  # member 0 stays
    assert now[1][1] == SPARE, now  # member 1 left its node, for the spare
    await trains_on(cluster, wid, third)
    restarted_after(cluster, wid, moved, third)
    assert_never_two_copies(cluster, wid)


def first_step_at(cluster: LocalCluster, wid: str, epoch: int) -> float:
    """When ``epoch`` logged its first step (any rank; this host's wall clock)."""
    return float(min(x["t"] for x in log_lines(cluster, wid, "step", epoch)))


async def straggler_verdict(cluster: LocalCluster, wid: str, epoch: int, after: int,
                            what: str) -> Event:
    """The event of ``wid`` after its first ``after`` saying ``what``, for its straggler in
    ``epoch``; prints the time from that epoch's first step."""
    event = await wait_event(cluster, wid, after, what)
    delay = event.ts - first_step_at(cluster, wid, epoch)
    done = [x["step"] for x in log_lines(cluster, wid, "step", epoch)
            if x["rank"] == 0 and x["t"] <= event.ts]
    print(f"\n[straggler] epoch {epoch}: first step -> {event.kind!r} event in {delay:.2f}s "
          f"(rank 0's steps by then: {len(done)}): {event.message}", flush=True)
    assert 0 < delay <= STRAGGLER_WITHIN, (delay, event)
    return event


async def test_a_straggler_is_named_restarted_then_moved_to_the_spare(
        local_cluster: ClusterFactory) -> None:
    cluster = await gang_cluster(local_cluster, nodes=2)
    # hang_timeout too: a slow step (~0.7 s) is far from a hang
    wid = await cluster.submit(hang_spec(
        "straggle", "--slow-node", SLOW_NODE, "--slow-by", str(SLOW_BY),
        hang_timeout=10.0, straggler_lag=STRAGGLER_LAG))
    snapshot = await cluster.wait_for(training(wid), 90, what="gang training")
    epoch = int(workload_view(snapshot, wid)["epoch"] or 0)
    before = members(snapshot, wid)
    assert sorted(n for _, n, _ in before) == ["node-1", SLOW_NODE], before
    slow = next(r for r, n, _ in before if n == SLOW_NODE)  # the member on the slow node
    other = 1 - slow
    says = f"member {slow} straggles on {SLOW_NODE}: rank {slow} works "

    # Named: every member stopped at once, restarted in place; the node is suspect.
    await wait_log(cluster, wid, lambda _: bool(log_lines(cluster, wid, "step", epoch)),
                   f"epoch {epoch} trains")
    first = await straggler_verdict(cluster, wid, epoch, 0, " straggles on ")
    assert first.kind == "straggler", first
    assert says in first.message, first
    assert f"straggler_lag {STRAGGLER_LAG:g}s); restart 1/3 in place" in first.message, first
    snapshot = await cluster.snapshot()
    assert SLOW_NODE in snapshot.assignments[wid].suspects, snapshot.assignments[wid]
    snapshot = await cluster.wait_for(training(wid, epoch), 90, what="gang trains again")
    view = workload_view(snapshot, wid)
    second = int(view["epoch"] or 0)
    assert [(r, n) for r, n, _ in members(snapshot, wid)] == [(r, n) for r, n, _ in before]
    assert view["restarts"] == 1, view
    assert SLOW_NODE in snapshot.assignments[wid].suspects, snapshot.assignments[wid]
    agent_log = cluster.base / "logs" / f"{SLOW_NODE}.log"
    assert "a hang or straggler was blamed on this node" in agent_log.read_text(), agent_log

    # Still slow on that node: named again, a suspect already, the member moves to the spare.
    seen = len(await events_of(cluster, wid))
    await wait_log(cluster, wid, lambda _: bool(log_lines(cluster, wid, "step", second)),
                   f"epoch {second} trains")
    restarted_after(cluster, wid, first, second)
    moved = await straggler_verdict(cluster, wid, second, seen, " was suspect already ")
    assert moved.kind == "app-failed", moved
    assert says in moved.message, moved
    assert f"{SLOW_NODE} was suspect already (a hang or straggler within 600s): moving to " \
        "another node" in moved.message, moved
    snapshot = await cluster.wait_for(training(wid, second), 90, what="gang trains again")
    view = workload_view(snapshot, wid)
    third = int(view["epoch"] or 0)
    print(f"[straggler] after the move: restarts {view['restarts']}", flush=True)
    now = members(snapshot, wid)
    assert now[other][:2] == before[other][:2], now  # the other member stays
    assert now[slow][1] == SPARE, now  # the straggler's member left the slow node

    # Off the slow node the gang trains at its normal pace, never named again.
    await trains_on(cluster, wid, third)
    restarted_after(cluster, wid, moved, third)
    count = len(await events_of(cluster, wid))
    start_step = max(x["step"] for x in log_lines(cluster, wid, "step", third))
    await asyncio.sleep(10)
    snapshot = await cluster.snapshot()
    view = workload_view(snapshot, wid)
    assert (view["state"], view["epoch"]) == ("running", third), view
    later = (await events_of(cluster, wid))[count:]
    assert not [e for e in later if e.kind in ("straggler", "hung", "app-failed")], later
    kinds = [e.kind for e in await events_of(cluster, wid)]
    assert (kinds.count("straggler"), kinds.count("app-failed")) == (1, 1), kinds
    end_step = max(x["step"] for x in log_lines(cluster, wid, "step", third))
    paces = {n: s.pace for (w, n), s in snapshot.statuses.items() if w == wid}
    print(f"[straggler] after the move: steps {start_step}..{end_step} in 10 s, no straggler; "
          f"paces {paces}", flush=True)
    # at the slow pace 10 s would be under 10 / SLOW_BY steps
    assert end_step - start_step >= 2 * 10 / SLOW_BY, (start_step, end_step)
    assert_never_two_copies(cluster, wid)
