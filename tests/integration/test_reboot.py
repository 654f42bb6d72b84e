"""A node that comes back from a power cut is as safe as one that dies (issue 27, finding 1;
docs/safety.md, rule 8).

After a reboot every pid the agent recorded before the cut names another process: one of the
new agent's own threads, an unrelated process, a new guard. The agent must treat each such
record as ended by the reboot and signal none of them. First on the supervisor alone, with
records of another boot (and of an older agent, with bare pids) naming live processes; then on
local clusters whose nodes reboot for real (hafo.local.nodeinit: a fresh PID namespace, boot id
and clocks at every power-on, the state directory kept).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hafo.agent import procid
from hafo.agent.fencefile import write_deadline
from hafo.agent.instances import InstanceKey, instance_dir, write_json_atomic
from hafo.agent.supervisor import Supervisor
from hafo.local.cluster import LocalCluster, demo_workload_spec
from hafo.local.procs import kill_pid, wait_until
from hafo.model.cluster import Assignment, InstanceEnd, Submission
from hafo.model.spec import parse_spec
from tests.integration.conftest import ClusterFactory
from tests.integration.helpers import assert_never_two_copies, view

pytestmark = pytest.mark.timeout(240)

OTHER_BOOT = "00000000-0000-4000-8000-000000000000"
SLEEPER = [sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"]


def proc_state(pid: int) -> str:
    """The process's state letter (``T``: stopped; "" once gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def record(path: Path, guard: int, workload: int, boot: str | None) -> None:
    """A running instance's state as its guard wrote it (``boot`` None: an older guard's
    record, bare pids only)."""
    path.mkdir(parents=True)
    write_json_atomic(path / "launch.json", {"workload": path.name.rpartition(".")[0],
                                             "epoch": int(path.name.rpartition(".")[2])})
    data: dict[str, Any] = {"guard_pid": guard, "pid": workload, "state": "running",
                            "exit_code": None, "started_at": time.time() - 60,
                            "finished_at": None, "reason": ""}
    if boot is not None:
        for name, pid in (("guard", guard), ("workload", workload)):
            identity = procid.identify(pid)
            assert identity is not None
            data[name] = {"pid": pid, "start": identity.start, "boot": boot}
    write_json_atomic(path / "state.json", data)


@pytest.fixture
def bystanders() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Two processes hafo did not start (each leads its own process group, as a daemon)."""
    procs = [subprocess.Popen(SLEEPER, start_new_session=True) for _ in range(2)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(5)


@pytest.mark.parametrize("boot", [OTHER_BOOT, None], ids=["another-boot", "older-agent"])
def test_recorded_pids_held_by_unrelated_processes_and_a_new_guard_are_not_signalled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        bystanders: list[subprocess.Popen[bytes]], boot: str | None) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    write_deadline(state_dir, time.monotonic() + 60)
    supervisor = Supervisor("n1", state_dir, tmp_path / "ck")
    new = InstanceKey("job-0a1b2c", 9)  # the reboot's new work: a real guard
    supervisor.launch(Assignment(workload=new.workload, phase="placed", node="n1", epoch=9),
                      Submission(new.workload, parse_spec({"name": "job", "command": SLEEPER}),
                                 0.0), [])
    assert wait_until(lambda: supervisor.states()[new].state == "running", 15)
    new_guard = supervisor.states()[new].guard
    assert new_guard is not None
    # before the power cut: two instances whose numbers now belong to others
    first, second = bystanders
    old_a, old_b = InstanceKey("old-a1b2c3", 3), InstanceKey("old-d4e5f6", 4)
    record(instance_dir(state_dir, old_a), first.pid, second.pid, boot)
    record(instance_dir(state_dir, old_b), new_guard.pid, first.pid, boot)

    states = supervisor.states()
    for key in (old_a, old_b):  # as the agent's supervise cycle: stop what is not wanted
        if states[key].state != "exited":
            supervisor.stop(key, states[key], "no longer assigned to this node", urgent=True)
    time.sleep(0.5)
    for key in (old_a, old_b):
        assert states[key].state == "exited", states[key]
        if boot is not None:
            assert states[key].ended is InstanceEnd.FENCED
            assert states[key].reason == "ended by a reboot of the node"
    assert supervisor.states()[new].state == "running", "the new guard was stopped"
    assert procid.is_alive(new_guard) and proc_state(new_guard.pid) != "T"

    supervisor.kill_all("lease lost")  # the new work is fenced: nothing else
    assert [proc.poll() for proc in bystanders] == [None, None], "a bystander was killed"
    assert [proc_state(proc.pid) for proc in bystanders] != ["T", "T"]
    assert all(proc_state(proc.pid) in ("S", "R") for proc in bystanders)
    assert wait_until(lambda: not procid.is_alive(new_guard), 5)


#: An agent process whose own threads hold the numbers a record of the previous boot names.
OWN_THREADS = textwrap.dedent("""
    import json, sys, tempfile, threading, time
    from pathlib import Path
    from hafo.agent import procid
    from hafo.agent.fencefile import write_deadline
    from hafo.agent.instances import write_json_atomic
    from hafo.agent.supervisor import Supervisor

    state_dir, boot = Path(sys.argv[1]), sys.argv[2]
    stop = threading.Event()
    threads = [threading.Thread(target=stop.wait) for _ in range(2)]
    for thread in threads:
        thread.start()
    tids = [t.native_id for t in threads]
    for n, (guard, workload) in enumerate([(tids[0], tids[1]), (tids[1], tids[0])]):
        path = state_dir / "instances" / f"old-a1b2c{n}.{n + 1}"
        path.mkdir(parents=True)
        write_json_atomic(path / "launch.json", {})
        data = {"guard_pid": guard, "pid": workload, "state": "running", "reason": ""}
        if boot != "none":
            data["guard"] = {"pid": guard, "start": procid.start_time(guard), "boot": boot}
            data["workload"] = {"pid": workload, "start": procid.start_time(workload),
                                "boot": boot}
        write_json_atomic(path / "state.json", data)
    write_deadline(state_dir, time.monotonic() + 60)
    supervisor = Supervisor("n1", state_dir, state_dir / "ck")
    states = supervisor.states()
    for key, state in states.items():
        supervisor.stop(key, state, "no longer assigned", urgent=True)
    supervisor.kill_all("lease lost")
    time.sleep(0.3)
    print(json.dumps({k.dirname: s.state for k, s in supervisor.states().items()}))
    print("survived")
    stop.set()
""")


@pytest.mark.parametrize("boot", [OTHER_BOOT, "none"], ids=["another-boot", "older-agent"])
def test_recorded_pids_held_by_the_agents_own_threads_are_not_signalled(
        tmp_path: Path, boot: str) -> None:
    result = subprocess.run([sys.executable, "-c", OWN_THREADS, str(tmp_path / "state"), boot],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "survived" in result.stdout, (
        f"the agent signalled itself: rc {result.returncode}\n{result.stderr[-2000:]}")


# -- real reboots ----------------------------------------------------------------------------

def spec_of(kind: str) -> dict[str, Any]:
    spec = demo_workload_spec(name=f"reboot-{kind}", interval=0.05, every=10)
    spec["restart"] = {"max_restarts": 100, "window": 60}
    if kind == "gang-member":
        spec["nodes"] = 2
    if kind == "service-replica":
        spec["replicas"] = 2
    return spec


def watched(snapshot: Any, wid: str, kind: str) -> list[str]:
    """The workloads to watch: the workload itself, or each replica of the service."""
    return sorted(snapshot.replicas.get(wid, ())) if kind == "service-replica" else [wid]


def nodes_of(snapshot: Any, wid: str) -> set[str]:
    v = view(snapshot, wid)
    return {m["node"] for m in v["members"]} or ({v["node"]} if v["node"] else set())


def all_running(wids: list[str]) -> Any:
    return lambda s: all(view(s, w)["state"] == "running" for w in wids)


def start_bystanders(cluster: LocalCluster, node: str, count: int) -> list[int]:
    """``count`` processes on the node that hafo did not start (host pids), in its PID and
    mount namespaces, each leading its own session as a daemon does (``setsid -f``: the
    node's PID 1 adopts it)."""
    handle = cluster.node_handles[node]
    inits = [host for pid, host in handle.processes().items() if pid == 1]
    assert inits, "the node has a PID 1 of its own"

    def sleepers() -> list[int]:
        found = []
        for pid in cluster.node_pids(node):
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x00600\x00":
                    found.append(pid)
            except OSError:
                continue
        return found

    for _ in range(count):
        subprocess.run(["nsenter", "-t", str(inits[0]), "-p", "-m", "--", "setsid", "-f",
                        "sleep", "600"], stdin=subprocess.DEVNULL, check=True, timeout=10)
    assert wait_until(lambda: len(sleepers()) == count, 5), sleepers()
    return sleepers()


@pytest.mark.parametrize("kind", ["single", "gang-member", "service-replica"])
async def test_a_node_back_from_a_power_cut_signals_nothing_it_did_not_start(
        local_cluster: ClusterFactory, kind: str) -> None:
    cluster = await local_cluster.start(nodes=3, controllers=1)
    if cluster.cgroup_base is None:
        pytest.skip("simulated nodes need root for namespaces of their own")
    wid = await cluster.submit(spec_of(kind))
    snapshot = await cluster.wait_for(lambda s: bool(watched(s, wid, kind)) and all_running(
        watched(s, wid, kind))(s), 60, what="running")
    wids = watched(snapshot, wid, kind)
    node = sorted(nodes_of(snapshot, wids[0]))[0]
    epochs = {w: view(snapshot, w)["epoch"] for w in wids}
    handle = cluster.node_handles[node]
    old_boot = handle.boot()

    cluster.power_off(node)
    snapshot = await cluster.wait_for(
        lambda s: all_running(wids)(s) and all(
            view(s, w)["epoch"] != epochs[w] for w in wids if node in nodes_of(snapshot, w)),
        60, what="failed over")
    assert cluster.power_on(node)
    await cluster.wait_for(lambda s: s.node_state(node) == "ready", 30, what="node ready")
    assert handle.boot() != old_boot, "a power-on is a new boot"
    agent = handle.agent_pid()
    assert agent is not None
    bystanders = start_bystanders(cluster, node, 3)
    births = {pid: Path(f"/proc/{pid}/stat").read_text().split()[21] for pid in bystanders}
    wids_now = watched(await cluster.snapshot(), wid, kind)
    await cluster.submit(demo_workload_spec(name=f"after-{kind}"))  # new work, maybe there
    await asyncio.sleep(3 * cluster.lease_ttl)  # the old records are read and forgotten
    snapshot = await cluster.wait_for(all_running(wids_now), 30, what="still running")
    assert handle.agent_pid() == agent, (
        "the agent died after the reboot:\n" + handle.log_path.read_text()[-3000:])
    assert snapshot.node_state(node) == "ready"
    for pid in bystanders:
        assert Path(f"/proc/{pid}/stat").read_text().split()[21] == births[pid]
        assert proc_state(pid) in ("S", "R"), f"bystander {pid} was signalled"
    assert "ended by a reboot of the node" in handle.log_path.read_text(), (
        "the records of the previous boot were read and ended")
    for w in wids:
        assert_never_two_copies(cluster, w)
    for pid in bystanders:
        kill_pid(pid, signal.SIGKILL)
    assert os.path.exists(handle.state_dir), "the disk kept its state directory"
