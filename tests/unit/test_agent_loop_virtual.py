"""The agent's loops on the in-memory store, in virtual time: registration, its hold on the
node name (a liveness key deleted by hand, a lease lost, another lease on its key), and a
hitless restart that adopts the lease of its records. No etcd, no sleeps."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from hafo.agent.daemon import Agent
from hafo.agent.fencefile import FENCE_FILE, read_deadline
from hafo.agent.lease_record import read_record
from hafo.model.cluster import Assignment, Liveness, Submission
from hafo.model.config import parse_config
from hafo.model.spec import parse_spec
from hafo.store import Put, codec
from hafo.store.memory import MemoryStore

from .virtual_time import run, stop, wait_for

TTL, HEARTBEAT = 3, 1.0


def agent_config(tmp_path: Path) -> Any:
    return parse_config({"etcd": {"endpoints": ["http://127.0.0.1:1"]},
                         "checkpoint": {"root": str(tmp_path / "ck")},
                         "timing": {"lease_ttl": TTL, "heartbeat": HEARTBEAT},
                         "node": {"name": "node-a", "state_dir": str(tmp_path / "state"),
                                  "gpus": {"simulate": {"count": 2}}}}, "agent")


async def started(agent: Agent) -> asyncio.Task[None]:
    ready = asyncio.Event()
    task = asyncio.create_task(agent.run(ready))
    await asyncio.wait_for(ready.wait(), 10.0)
    return task


async def holder(store: MemoryStore, agent: Agent) -> int | None:
    kv = await store.get(agent.keys.alive(agent.name))
    return kv.lease if kv is not None else None


def test_registration_publishes_the_node_and_keeps_the_fencing_deadline_fresh(
        tmp_path: Path) -> None:
    async def main() -> None:
        store = MemoryStore()
        agent = Agent(agent_config(tmp_path), store=store)
        task = await started(agent)
        lease = agent.keeper.lease_id
        assert lease is not None and await holder(store, agent) == lease
        node = await store.get(agent.keys.node("node-a"))
        assert node is not None
        record = codec.decode_node(node.value)
        assert (record.lease, len(record.gpus)) == (lease, 2)
        saved = read_record(agent.state_dir)
        assert saved is not None and saved.lease == lease
        loop = asyncio.get_running_loop()
        for _ in range(20):  # the guards' deadline stays ahead of now, a heartbeat at most old
            await asyncio.sleep(0.7)
            left = read_deadline(agent.state_dir / FENCE_FILE) - loop.time()
            assert TTL - 0.5 - HEARTBEAT - 0.05 <= left <= TTL - 0.5
        await stop(task)
        await agent.close()

    run(main)


def test_a_liveness_key_deleted_by_hand_is_put_back_with_the_same_lease(tmp_path: Path) -> None:
    async def main() -> None:
        store = MemoryStore()
        agent = Agent(agent_config(tmp_path), store=store)
        task = await started(agent)
        lease = agent.keeper.lease_id
        await store.delete(agent.keys.alive("node-a"))
        await store.delete(agent.keys.node("node-a"))
        loop = asyncio.get_running_loop()
        deleted = loop.time()
        assert await wait_for(lambda: holder(store, agent), 5.0) == lease
        assert await wait_for(lambda: store.get(agent.keys.node("node-a")), 5.0)
        assert loop.time() - deleted < HEARTBEAT
        assert agent.keeper.lease_id == lease and agent.registered.is_set()
        await stop(task)
        await agent.close()

    run(main)


async def registered_agent(tmp_path: Path) -> tuple[MemoryStore, Agent, asyncio.Task[None]]:
    """An agent on the in-memory store, registered and running."""
    store = MemoryStore()
    agent = Agent(agent_config(tmp_path), store=store)
    return store, agent, await started(agent)


async def new_holder(store: MemoryStore, agent: Agent, old: int) -> int | None:
    """The lease holding the agent's liveness key, if it is not ``old``."""
    lease = await holder(store, agent)
    return lease if lease not in (None, old) else None


def _lost_lease_scenario(tmp_path: Path, resumable: bool) -> None:
    async def main() -> None:
        store, agent, task = await registered_agent(tmp_path)
        old, claimed = agent.keeper.lease_id, agent.claim.claimed
        assert old is not None
        if not resumable:  # as if a controller had moved the work meanwhile
            async def refused(_workloads: object, _seen_at: int) -> bool:
                return False

            agent.claim.resume = refused  # type: ignore[method-assign]
        await store.revoke_lease(old)  # as an expiry would: its keys go with it

        new = await wait_for(lambda: new_holder(store, agent, old), 5.0)
        assert agent.keeper.lease_id == new
        saved = read_record(agent.state_dir)
        assert saved is not None and saved.lease == new and saved.claimed > 0
        assert (saved.claimed == claimed) is resumable  # the same registration, or a new one
        events = [codec.decode_event(kv.value).kind
                  for kv in (await store.get_prefix(agent.keys.events))[1]]
        assert ("node-resumed" if resumable else "node-reregistered") in events
        await stop(task)
        await agent.close()

    run(main)


def test_a_lease_lost_while_its_deadline_is_ahead_resumes_with_a_new_one(tmp_path: Path) -> None:
    """An etcd stall expires the lease: the node is held again, the registration kept."""
    _lost_lease_scenario(tmp_path, resumable=True)


def test_a_lost_lease_that_cannot_resume_fences_and_registers_again(tmp_path: Path) -> None:
    _lost_lease_scenario(tmp_path, resumable=False)


def _slow_resume_scenario(tmp_path: Path, promised: bool) -> tuple[bool, bool]:
    """The lease lost; etcd, just back from a stall, leaves the resume unanswered for three
    TTLs. Returns (resumed with the same registration, the guards' deadline ever passed
    before the resume)."""
    outcome: list[bool] = []

    async def main() -> None:
        store, agent, task = await registered_agent(tmp_path)
        old, claimed = agent.keeper.lease_id, agent.claim.claimed
        assert old is not None
        loop = asyncio.get_running_loop()
        real_resume, slow_until = agent.claim.resume, loop.time() + 3 * TTL

        async def answered_late(workloads: Any, seen_at: int) -> bool:
            if loop.time() < slow_until:
                await asyncio.sleep(0.5)
                raise TimeoutError("etcd is busy")
            return await real_resume(workloads, seen_at)

        async def every_controller(timeout: float) -> float | None:
            return 2.0 if promised else None  # each answered "recovering", or not

        agent.claim.resume = answered_late  # type: ignore[method-assign]
        agent.failsafe.confirm = every_controller  # type: ignore[method-assign]
        passed = False

        async def new_or_deadline_passed() -> int | None:
            nonlocal passed
            passed = passed or loop.time() >= read_deadline(agent.state_dir / FENCE_FILE)
            return await new_holder(store, agent, old)

        await store.revoke_lease(old)
        await wait_for(new_or_deadline_passed, 6 * TTL)
        saved = read_record(agent.state_dir)
        assert saved is not None
        outcome.extend([saved.claimed == claimed, passed])
        await stop(task)
        await agent.close()

    run(main)
    return outcome[0], outcome[1]


def test_a_slow_resume_is_covered_by_the_controllers_promises(tmp_path: Path) -> None:
    """Each controller answers "recovering" after a stall and holds its failovers meanwhile:
    the guards' deadline moves on with those promises while the resume retries, so a resume
    slower than a TTL still keeps the work (it fenced the node's work in CI's 60 s stall)."""
    assert _slow_resume_scenario(tmp_path, promised=True) == (True, False)


def test_a_slow_resume_without_promises_fences_at_the_deadline(tmp_path: Path) -> None:
    """No controller promises anything: the deadline is not moved, the guards' deadline
    passes, and the agent claims the node afresh (a new registration)."""
    assert _slow_resume_scenario(tmp_path, promised=False) == (False, True)


def test_a_lease_revoked_under_the_agent_resumes_at_once_not_at_the_next_keepalive(
        tmp_path: Path) -> None:
    """etcd before 3.5.11: a raft leader that stalled revokes, as it resumes, the leases it
    saw no keepalive for, although the new leader renewed them (etcd-io/etcd#15247). The
    agent learns it from its liveness key's deletion and holds the node again within a
    fraction of a heartbeat, before a controller acts on the node's absence."""
    async def main() -> None:
        store, agent, task = await registered_agent(tmp_path)
        old, claimed = agent.keeper.lease_id, agent.claim.claimed
        assert old is not None
        loop = asyncio.get_running_loop()
        acked = agent.keeper.last_ack
        while agent.keeper.last_ack == acked:  # just after a keepalive: the next is 1 s away
            await asyncio.sleep(0.01)
        await store.revoke_lease(old)
        revoked = loop.time()

        await wait_for(lambda: new_holder(store, agent, old), 5.0)
        assert loop.time() - revoked < HEARTBEAT / 4
        saved = read_record(agent.state_dir)
        assert saved is not None and saved.claimed == claimed  # resumed, not claimed anew
        await stop(task)
        await agent.close()

    run(main)


def test_another_lease_on_the_liveness_key_displaces_the_agent(tmp_path: Path) -> None:
    async def main() -> None:
        store = MemoryStore()
        agent = Agent(agent_config(tmp_path), store=store)
        task = await started(agent)
        ours = agent.keeper.lease_id
        other, _ = await store.grant_lease(TTL)  # an operator's copy of the agent, say
        await store.put(agent.keys.alive("node-a"),
                        codec.encode(Liveness(node="node-a", lease=other, since=0.0).to_dict()),
                        lease=other)
        # displaced: it fences its work and waits while the other lease holds the name
        await wait_for(lambda: _true(agent.claim.waiting_for == other), 5.0)
        assert not agent.registered.is_set()
        await asyncio.sleep(TTL + 2.0)  # the other lease expires (nobody keeps it)
        assert other not in await store.live_leases()

        async def reclaimed() -> bool:  # with its own lease, kept alive meanwhile
            return await holder(store, agent) == ours and agent.registered.is_set()

        assert await wait_for(reclaimed, 10.0)
        assert agent.claim.waiting_for is None
        events = [codec.decode_event(kv.value) for kv in
                  (await store.get_prefix(agent.keys.events))[1]]
        assert [e.kind for e in events].count("duplicate-node") == 1
        await stop(task)
        await agent.close()

    run(main)


async def _true(value: bool) -> bool:
    return value


def test_a_restarted_agent_adopts_the_lease_of_its_records(tmp_path: Path) -> None:
    async def main() -> None:
        store = MemoryStore()
        first = Agent(agent_config(tmp_path), store=store)
        task = await started(first)
        lease = first.keeper.lease_id
        await stop(task)  # killed: no goodbye, the lease is left to run out
        await asyncio.sleep(1.0)
        second = Agent(agent_config(tmp_path), store=store)
        task = await started(second)
        assert second.keeper.lease_id == lease and await holder(store, second) == lease
        saved = read_record(second.state_dir)
        assert saved is not None and saved.lease == lease
        await asyncio.sleep(2 * TTL)
        assert lease in await store.live_leases()
        await stop(task)
        await second.close()
        await first.close()

    run(main)


def test_an_instance_whose_assignment_changed_before_its_launch_is_never_launched(
        tmp_path: Path) -> None:
    """The agent's copy of an assignment can lag the assignment itself (the controller just
    wrote "moving"). The agent reports ``starting`` in a txn that compares the assignment's
    revision with the epoch, and launches only if that holds: a controller that saw no
    report may place the workload elsewhere, and this instance must then never run."""
    async def main() -> None:
        store = MemoryStore()
        agent = Agent(agent_config(tmp_path), store=store)
        task = await started(agent)
        keys = agent.keys
        spec = parse_spec({"name": "job", "command": ["sleep", "60"], "gpus": 1})
        submission = Submission(id="job-0a1b2c", spec=spec, submitted_at=0.0)
        await store.put(keys.workload(submission.id), codec.encode_submission(submission))
        placed = Assignment(workload=submission.id, phase="placed", node="node-a", gpus=(0,))
        moving = dataclasses.replace(placed, phase="moving", stopping=0, cause="planned")
        # The assignment is written as placed and, before the agent's copy changes, moved on:
        # only the main key sees the move (as if the copy's update were still in flight).
        result = await store.txn([], [Put(keys.assignment(submission.id),
                                          codec.encode(placed.to_dict())),
                                      Put(keys.node_assignment("node-a", submission.id),
                                          codec.encode(placed.to_dict()))])
        epoch = result.revision
        await store.put(keys.assignment(submission.id),
                        codec.encode(dataclasses.replace(moving, stopping=epoch).to_dict()))
        await asyncio.sleep(5.0)  # many supervise cycles
        assert submission.id in agent.assignments.placed  # the copy still says "run it"
        assert not (agent.state_dir / "instances" / f"{submission.id}.{epoch}").exists()
        assert await store.get(keys.status(submission.id, "node-a")) is None
        await stop(task)
        await agent.close()

    run(main)


def test_an_instance_is_reported_starting_before_it_is_launched(tmp_path: Path) -> None:
    async def main() -> None:
        store = MemoryStore()
        agent = Agent(agent_config(tmp_path), store=store)
        task = await started(agent)
        keys = agent.keys
        launched: list[tuple[str, int, Any]] = []

        def launch(assignment: Assignment, submission: Submission, gpus: list[str],
                   service: Submission | None = None) -> None:
            report = store._kvs.get(keys.status(assignment.workload, "node-a"))
            launched.append((assignment.workload, assignment.epoch, report))

        agent.supervisor.launch = launch  # type: ignore[method-assign]
        spec = parse_spec({"name": "job", "command": ["sleep", "60"], "gpus": 1})
        submission = Submission(id="job-0a1b2c", spec=spec, submitted_at=0.0)
        await store.put(keys.workload(submission.id), codec.encode_submission(submission))
        placed = Assignment(workload=submission.id, phase="placed", node="node-a", gpus=(0,))
        result = await store.txn([], [Put(keys.assignment(submission.id),
                                          codec.encode(placed.to_dict())),
                                      Put(keys.node_assignment("node-a", submission.id),
                                          codec.encode(placed.to_dict()))])
        await wait_for(lambda: _true(bool(launched)), 5.0)
        workload, epoch, report = launched[0]
        assert (workload, epoch) == (submission.id, result.revision)
        assert report is not None, "reported before the launch"
        status = codec.decode_status(report.value)
        assert (status.epoch, status.state) == (result.revision, "starting")
        await stop(task)
        await agent.close()

    run(main)
