"""The CLI and the API agree (issue 17): every planned move that one refuses, the other
refuses with the same reason (``hafo migrate`` exit 5 or 4, the API 409 or 404), on the same
live cluster; neither writes a move request then. Also on a live cluster: ``hafo drain``
says what it did, ``hafo events`` follows new events (``--watch``) and filters them, a
workload's ``submitted`` event comes before its controller's events, and ``| head`` ends
``hafo`` quietly."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hafo.local.cluster import LocalCluster, demo_workload_spec
from hafo.model.cluster import ClusterSnapshot
from hafo.store import read_events
from tests.integration.helpers import api_call, running, started_cluster

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from started_cluster(tmp_path_factory.mktemp("parity"), nodes=3, controllers=1)


def env_of(cluster: LocalCluster) -> dict[str, str]:
    return {**os.environ, "HAFO_ETCD": ",".join(cluster.etcd.endpoints),
            "HAFO_CLUSTER": cluster.cluster}


def hafo(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hafo", *args], capture_output=True,
                          text=True, env=env_of(cluster), timeout=60)


def api(cluster: LocalCluster, method: str, path: str,
        body: Any = None) -> tuple[int, Any]:
    port = next(iter(cluster.controller_handles.values())).api_port
    return api_call(port, method, path, body)


def wait_for(cluster: LocalCluster, check: Callable[[ClusterSnapshot], Any], timeout: float,
             what: str) -> ClusterSnapshot:
    async def go() -> ClusterSnapshot:
        try:
            return await cluster.wait_for(check, timeout, what=what)
        finally:
            await cluster.close_store()
    return asyncio.run(go())


def snapshot_now(cluster: LocalCluster) -> ClusterSnapshot:
    async def go() -> ClusterSnapshot:
        try:
            return await cluster.snapshot()
        finally:
            await cluster.close_store()
    return asyncio.run(go())


def submit(cluster: LocalCluster, tmp_path: Path, spec: dict[str, Any]) -> str:
    path = tmp_path / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = hafo(cluster, "submit", str(path))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def placed(wid: str) -> Callable[[ClusterSnapshot], bool]:
    def check(snapshot: ClusterSnapshot) -> bool:
        assignment = snapshot.assignments.get(wid)
        return assignment is not None and assignment.phase == "placed"
    return check


def test_every_refused_move_is_refused_alike(cluster: LocalCluster, tmp_path: Path) -> None:
    single = submit(cluster, tmp_path, demo_workload_spec("parity-single"))
    gang = submit(cluster, tmp_path, {**demo_workload_spec("parity-gang"), "nodes": 2})
    service = submit(cluster, tmp_path, {**demo_workload_spec("parity-svc"), "replicas": 1})
    unplaced = submit(cluster, tmp_path, {**demo_workload_spec("parity-big"), "gpus": 64})

    def settled(s: ClusterSnapshot) -> bool:
        replicas = s.replicas.get(service, ())
        return (running(single)(s) and placed(gang)(s) and len(replicas) == 1
                and placed(replicas[0])(s) and s.assignments.get(unplaced) is not None
                and s.assignments[unplaced].phase == "pending")

    snap = wait_for(cluster, settled, 40, "every workload placed (one pending)")
    here = snap.assignments[single].node
    assert here is not None
    others = sorted(n for n in snap.nodes if n != here)
    replica = snap.replicas[service][0]
    replica_node = snap.assignments[replica].node
    assert replica_node is not None
    no_replica = next(n for n in sorted(snap.nodes) if n != replica_node)
    no_member = next((n for n in sorted(snap.nodes)
                      if n not in snap.assignments[gang].nodes), None)
    cordoned = others[0]
    done = hafo(cluster, "cordon", cordoned)
    assert done.returncode == 0, done.stderr
    wait_for(cluster, lambda s: s.node_state(cordoned) == "cordoned", 10, "cordoned")

    # (workload, --to, --from, expected status, the reason's start)
    cases: list[tuple[str, str | None, str | None, int, str]] = [
        (single, here, None, 409, f"it already runs on {here}"),
        (single, "nosuch", None, 404, "no node 'nosuch'"),
        (single, cordoned, None, 409, f"{cordoned} cannot take it (it is cordoned)"),
        (single, None, others[1], 409, f"it does not run on {others[1]}"),
        (single, None, "nosuch", 404, "no node 'nosuch'"),
        (unplaced, None, None, 409, "the workload is not running"),
        (unplaced, others[1], None, 409, "the workload is not running"),
        (gang, None, None, 409, "a gang moves one member at a time"),
        (service, None, None, 409, "it is a service: move one of its replicas"),
        (service, others[1], replica_node, 409, "a replica's replacement goes where"),
        (service, None, no_replica, 404, f"no replica of {service!r} runs on"),
        (replica, here if here != replica_node else others[1], None, 409,
         "a replica's replacement goes where"),
        ("parity-nosuch", None, None, 404, "no workload 'parity-nosuch'"),
    ]
    if no_member is not None:
        cases.append((gang, None, no_member, 409, f"no member of the gang runs on {no_member}"))
    for wid, to, member, status, reason in cases:
        argv = ["migrate", wid] + (["--to", to] if to else []) \
            + (["--from", member] if member else [])
        cli = hafo(cluster, *argv)
        body = {k: v for k, v in (("to", to), ("node", member)) if v is not None}
        code, answer = api(cluster, "POST", f"/v1/workloads/{wid}/migrate", body)
        case = f"{argv}: CLI {cli.returncode} {cli.stderr!r}; API {code} {answer}"
        assert code == status, case
        assert answer["error"].startswith(reason), case
        if status == 409:
            assert cli.returncode == 5, case
            assert cli.stderr == f"hafo: cannot move {wid}: {answer['error']}\n", case
        else:
            assert cli.returncode == 4, case
            assert cli.stderr == f"hafo: {answer['error']}\n", case
        assert cli.stdout == "", case
    after = snapshot_now(cluster)
    assert not after.moves, f"a refused move was written: {after.moves}"
    hafo(cluster, "uncordon", cordoned)
    for wid in (single, gang, service, unplaced):
        hafo(cluster, "delete", wid)


def test_drain_says_what_it_did(cluster: LocalCluster, tmp_path: Path) -> None:
    wid = submit(cluster, tmp_path, demo_workload_spec("parity-drain"))
    snap = wait_for(cluster, running(wid), 30, "running")
    node = snap.assignments[wid].node
    assert node is not None
    on_node = sorted(w for w, a in snap.assignments.items()
                     if a.phase == "placed" and node in a.nodes)
    try:
        done = hafo(cluster, "drain", node)
        assert done.returncode == 0, done.stderr
        plural = "move" if len(on_node) == 1 else "moves"
        assert done.stdout == (f"cordoned {node}; {len(on_node)} planned {plural} requested: "
                               f"{', '.join(on_node)}\n")
        again = hafo(cluster, "drain", node)  # nothing placed there any more, or moving
        assert again.returncode == 0, again.stderr
        assert again.stdout.startswith(f"cordoned {node}; ")
    finally:
        hafo(cluster, "uncordon", node)
        hafo(cluster, "delete", wid)


def test_submitted_comes_before_what_the_controller_does(cluster: LocalCluster,
                                                         tmp_path: Path) -> None:
    ids = [submit(cluster, tmp_path, {**demo_workload_spec(f"parity-order-{i}"),
                                      "gpus": 64 if i % 2 else 0})  # pending, or placed
           for i in range(6)]
    wait_for(cluster, lambda s: all(s.assignments.get(w) is not None for w in ids), 30,
             "every workload decided")

    async def events() -> list[Any]:
        try:
            return await read_events(cluster.store, cluster.keys, 0)
        finally:
            await cluster.close_store()

    log = asyncio.run(events())
    for wid in ids:
        kinds = [e.kind for e in log if e.workload == wid]
        assert kinds and kinds[0] == "submitted", (wid, kinds)
        assert "pending" in kinds or "placed" in kinds, (wid, kinds)
    for wid in ids:
        hafo(cluster, "delete", wid)


def test_events_watch_filters_and_sees_a_new_event(cluster: LocalCluster,
                                                   tmp_path: Path) -> None:
    first = submit(cluster, tmp_path, demo_workload_spec("parity-watch-1"))
    watcher = subprocess.Popen(
        [sys.executable, "-m", "hafo", "events", "--watch", "--json", "--limit", "5",
         "--kind", "submitted", "--kind", "delete-requested"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_of(cluster))
    try:
        assert watcher.stdout is not None
        shown = [json.loads(watcher.stdout.readline()) for _ in range(1)]
        assert shown[-1]["kind"] in ("submitted", "delete-requested")
        time.sleep(1.0)  # the watch is on (it starts from the revision read before)
        start = time.monotonic()
        second = submit(cluster, tmp_path, demo_workload_spec("parity-watch-2"))
        seen: list[dict[str, Any]] = []
        while not any(e.get("workload") == second for e in seen):
            line = watcher.stdout.readline()
            assert line, watcher.stderr.read() if watcher.stderr else ""
            seen.append(json.loads(line))
            assert time.monotonic() - start < 30, seen  # a bound for liveness, not a figure
        elapsed = time.monotonic() - start
        assert elapsed < 20, f"the new event took {elapsed:.1f} s"
        assert all(e["kind"] in ("submitted", "delete-requested") for e in seen), seen
        keys = [(e["ts"], e["workload"], e["kind"]) for e in shown + seen]
        assert len(keys) == len(set(keys)), "an event printed twice"
    finally:
        watcher.terminate()
        assert watcher.wait(10) == 0
    by_workload = hafo(cluster, "events", "--json", "--limit", "0", "--workload",
                       "parity-watch-1")
    assert by_workload.returncode == 0, by_workload.stderr
    events = json.loads(by_workload.stdout)
    assert events and {e["workload"] for e in events} == {first}
    for wid in (first, second):
        hafo(cluster, "delete", wid)


def test_a_closed_pipe_ends_hafo_events_quietly(cluster: LocalCluster) -> None:
    """More events than a pipe holds (64 KiB), read by ``head -1``: no "Broken pipe", no
    traceback, status 141."""
    from hafo.model.cluster import Event
    from hafo.store.events import EventLog

    async def many() -> None:
        log = EventLog(cluster.store, cluster.keys, retention=600)
        try:
            now = time.time()
            ops = [await log.put_op(Event(ts=now + i * 1e-6, kind="health", node="node-1",
                                          message=f"filler event {i} " + "x" * 100))
                   for i in range(1500)]
            await cluster.store.write_many(ops)
        finally:
            await cluster.close_store()

    asyncio.run(many())
    done = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m hafo events --json --limit 0 | head -1; '
                       'echo "status=${PIPESTATUS[0]}" >&2'],
        capture_output=True, text=True, env=env_of(cluster), timeout=60)
    assert done.stdout == "[\n"
    assert done.stderr.strip() == "status=141", done.stderr
