"""The agent and its environment (docs/safety.md, "The agent and its environment"): a loop
that raises is logged and restarted, never the end of the agent; a fencing deadline that
cannot be written is not believed; the node reports why and recovers by itself. In-memory
store, virtual time."""

from __future__ import annotations

import asyncio
import errno
import itertools
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from hafo.agent import daemon
from hafo.agent.daemon import Agent
from hafo.agent.environment import StateDirFaults
from hafo.agent.fencefile import FENCE_FILE, read_deadline
from hafo.agent.instances import InstanceKey, instance_dir, write_json_atomic
from hafo.model.config import parse_config
from hafo.model.ends import InstanceEnd
from hafo.model.health import STATE_DIR
from hafo.store import codec
from hafo.store.memory import MemoryStore
from hafo.tasks import Backoff, LoopFatal, restarting

from .virtual_time import run, stop, wait_for

TTL, HEARTBEAT = 3, 1.0


def agent_config(tmp_path: Path) -> Any:
    return parse_config({"etcd": {"endpoints": ["http://127.0.0.1:1"]},
                         "checkpoint": {"root": str(tmp_path / "ck")},
                         "timing": {"lease_ttl": TTL, "heartbeat": HEARTBEAT},
                         "health": {"interval": 0.5, "hold_down": 2},
                         "node": {"name": "node-a", "state_dir": str(tmp_path / "state"),
                                  "gpus": {"simulate": {"count": 2}}}}, "agent")


async def started(agent: Agent) -> asyncio.Task[None]:
    ready = asyncio.Event()
    task = asyncio.create_task(agent.run(ready))
    await asyncio.wait_for(ready.wait(), 10.0)
    return task


async def record(store: MemoryStore, agent: Agent) -> Any:
    kv = await store.get(agent.keys.node(agent.name))
    return codec.decode_node(kv.value) if kv is not None else None


# -- hafo.tasks.restarting --------------------------------------------------------------------


def test_backoff_doubles_from_its_first_delay_up_to_its_cap_jittered_down() -> None:
    backoff = Backoff(first=0.1, cap=5.0, jitter=0.5)
    assert [backoff.delay(n, rng=lambda: 0.0) for n in (1, 2, 3, 7, 8, 100)] == [
        0.1, 0.2, 0.4, 5.0, 5.0, 5.0]
    assert backoff.delay(1, rng=lambda: 1.0) == pytest.approx(0.05)


def test_a_loop_that_raises_once_is_logged_and_restarted() -> None:
    calls: list[float] = []

    async def loop() -> None:
        calls.append(asyncio.get_running_loop().time())
        if len(calls) == 1:
            raise RuntimeError("boom")
        await asyncio.sleep(3600)

    async def main() -> None:
        with capture_logs() as logs:
            task = asyncio.create_task(restarting("demo", loop))
            await asyncio.sleep(1.0)
            assert len(calls) == 2 and not task.done()
            assert 0.05 <= calls[1] - calls[0] <= 0.1 + 1e-9  # the first, jittered delay
            started = asyncio.get_running_loop().time()
            await stop(task)  # cancellation goes through at once
            assert asyncio.get_running_loop().time() == started
        failed = [e for e in logs if e["event"] == "loop failed: restarting it"]
        assert len(failed) == 1 and failed[0]["loop"] == "demo"
        assert failed[0]["log_level"] == "error" and failed[0].get("exc_info")

    run(main)


def test_a_loop_failing_over_and_over_backs_off_to_the_cap() -> None:
    calls: list[float] = []

    async def loop() -> None:
        calls.append(asyncio.get_running_loop().time())
        raise OSError(errno.EROFS, "Read-only file system")

    async def main() -> None:
        task = asyncio.create_task(restarting("demo", loop, backoff=Backoff(jitter=0.0)))
        await asyncio.sleep(30.0)
        await stop(task)
        gaps = [round(b - a, 3) for a, b in itertools.pairwise(calls)]
        assert gaps[:7] == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0] and max(gaps) == 5.0

    run(main)


def test_a_fatal_loop_failure_is_logged_and_raised() -> None:
    async def loop() -> None:
        raise LoopFatal("cannot go on")

    async def main() -> None:
        with capture_logs() as logs, pytest.raises(LoopFatal):
            await restarting("demo", loop)
        assert [e["loop"] for e in logs if e["log_level"] == "critical"] == ["demo"]

    run(main)


# -- the agent's loops ------------------------------------------------------------------------


def test_an_agent_loop_that_raises_is_restarted_and_the_agent_stays_up(tmp_path: Path) -> None:
    async def main() -> None:
        store = MemoryStore()
        agent = Agent(agent_config(tmp_path), store=store)
        task = await started(agent)
        cycle = agent.health.cycle
        calls = 0

        async def flaky() -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("a bug in a probe")
            return await cycle()

        agent.health.cycle = flaky  # type: ignore[method-assign]
        with capture_logs() as logs:
            await asyncio.sleep(5.0)
        assert not task.done() and calls > 3  # restarted, and cycling again
        failed = [e for e in logs if e["event"] == "loop failed: restarting it"]
        assert [(e["loop"], e["node"]) for e in failed] == [("health", "node-a")]
        assert agent.ready()
        await stop(task)  # and it still stops when asked
        assert task.cancelled()
        await agent.close()

    run(main)


def test_a_fence_file_that_cannot_be_written_is_not_believed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease is still renewed in etcd, but the guards read the file: the agent holds
    itself to the deadline on disk (no new instance, not ready once it passes), reports the
    node unhealthy with the path and the error, and recovers once the file can be written."""
    async def main() -> None:
        store = MemoryStore()
        agent = Agent(agent_config(tmp_path), store=store)
        task = await started(agent)
        fence = agent.state_dir / FENCE_FILE
        real_write = daemon.write_deadline

        def read_only(state_dir: Path, deadline: float) -> None:
            raise OSError(errno.EROFS, "Read-only file system", str(state_dir / ".fence.tmp"))

        monkeypatch.setattr(daemon, "write_deadline", read_only)
        on_disk = read_deadline(fence)
        await asyncio.sleep(HEARTBEAT * 1.5)  # keepalives acknowledged meanwhile
        assert agent.keeper.deadline > on_disk
        assert agent.fence_deadline() == agent.published_deadline == pytest.approx(on_disk,
                                                                                  abs=1e-5)
        loop = asyncio.get_running_loop()
        await asyncio.sleep(on_disk - loop.time() + 0.1)
        assert agent.keeper.valid() and not agent.ready()  # etcd lease fine, guards fenced
        assert agent.status()["fenced_in"] < 0
        assert "read-only file system" in agent.status()["fence_unpublished"]

        async def unhealthy() -> Any:
            node = await record(store, agent)
            return node if node is not None and not node.healthy else None

        node = await wait_for(unhealthy, 5.0)
        assert node.reason.startswith(f"state dir ({fence}: read-only file system)")
        assert not task.done()

        monkeypatch.setattr(daemon, "write_deadline", real_write)

        async def recovered() -> Any:
            node = await record(store, agent)
            return agent.ready() and node is not None and node.healthy

        assert await wait_for(recovered, 10.0)
        assert read_deadline(fence) == pytest.approx(agent.fence_deadline(), abs=1e-5)
        assert agent.fence_deadline() > loop.time()
        await stop(task)
        await agent.close()

    run(main)


def test_no_instance_starts_while_the_published_deadline_has_passed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        store = MemoryStore()
        agent = Agent(agent_config(tmp_path), store=store)
        task = await started(agent)

        def read_only(state_dir: Path, deadline: float) -> None:
            raise OSError(errno.EROFS, "Read-only file system")

        monkeypatch.setattr(daemon, "write_deadline", read_only)
        loop = asyncio.get_running_loop()
        await asyncio.sleep(agent.published_deadline - loop.time())
        announced: list[InstanceKey] = []

        async def announce(key: InstanceKey, _assignment: object = None) -> bool:
            announced.append(key)
            return False

        agent._announce_start = announce  # type: ignore[method-assign]
        agent.assignments.placed["job-0a1b2c"] = daemon.Assignment(
            workload="job-0a1b2c", phase="placed", node="node-a", gpus=(0,), epoch=7)
        await agent.supervise_once()
        assert announced == []
        await stop(task)
        await agent.close()

    run(main)


# -- the state directory ----------------------------------------------------------------------


def test_state_dir_faults_report_the_fence_until_written_again_and_others_once(
        tmp_path: Path) -> None:
    faults = StateDirFaults(tmp_path)
    assert faults.findings() == []
    faults.failed("launch files", tmp_path / "x", OSError(errno.ENOSPC, "No space left on device"))
    assert [f.detail for f in faults.findings()] == [f"{tmp_path / 'x'}: no space left on device"]
    assert faults.findings() == []  # reported once: the health hysteresis holds it
    faults.failed(StateDirFaults.FENCE, tmp_path / "fence", OSError(errno.EROFS, "Read-only"))
    assert [f.kind for f in faults.findings()] * 2 == [STATE_DIR] * 2
    assert faults.findings()[0].detail == f"{tmp_path / 'fence'}: read-only"
    assert faults.succeeded(StateDirFaults.FENCE) and faults.findings() == []


def test_the_state_dir_probe_names_the_directory_and_the_error(tmp_path: Path) -> None:
    faults = StateDirFaults(tmp_path / "missing")
    assert faults.probe() == f"{tmp_path / 'missing'}: no such file or directory"


def test_the_supervisor_keeps_in_memory_what_a_read_only_state_dir_refuses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hafo.agent import supervisor as supervisor_module
    from hafo.agent.supervisor import Supervisor

    key = InstanceKey("job-0a1b2c", 5)
    path = instance_dir(tmp_path, key)
    path.mkdir(parents=True)
    write_json_atomic(path / "state.json", {"guard_pid": 2 ** 22 + 1, "pid": None,
                                            "state": "running"})
    before = (path / "state.json").read_text()
    refused: list[str] = []

    def read_only(_path: Path, _data: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system", str(_path))

    monkeypatch.setattr(supervisor_module, "write_json_atomic", read_only)
    supervisor = Supervisor("node-a", tmp_path, tmp_path / "ck",
                            write_failed=lambda what, exc: refused.append(what))
    states = supervisor.states()
    assert states[key].state == "exited" and states[key].ended is InstanceEnd.GUARD_LOST
    assert (path / "state.json").read_text() == before and refused == ["instance record"]
    assert supervisor.states() == states and supervisor.pending_writes  # from memory
    supervisor.kill_all("lease lost")  # nothing left to kill: no error either
    monkeypatch.undo()
    assert supervisor.states() == states and not supervisor.pending_writes
    assert '"guard died"' in (path / "state.json").read_text()  # written once it could be
