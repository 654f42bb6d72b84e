"""Shared checks for cluster tests."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hafo.agent.procid import start_time
from hafo.local.cluster import LocalCluster
from hafo.local.procs import pid_alive
from hafo.local.progress import overlaps
from hafo.model.cluster import ClusterSnapshot
from hafo.model.views import workload_view


def view(snapshot: ClusterSnapshot, wid: str) -> dict[str, Any]:
    """The workload's contract view."""
    return workload_view(snapshot, wid)


def running(wid: str, not_on: str | None = None) -> Any:
    """Predicate: the workload runs (on another node than ``not_on``)."""
    def check(snapshot: ClusterSnapshot) -> bool:
        v = workload_view(snapshot, wid)
        return bool(v["state"] == "running" and v["node"] is not None and v["node"] != not_on)
    return check


@dataclass(frozen=True)
class HostProcess:
    """A node's process as the host sees it. A node numbers its processes in a PID namespace
    of its own (``hafo.local.nodeinit``): the pid its agent reports, or its workload logs, is
    not the host's. This is the host's pid of that process and its start time read on the
    host, which tell it from any later holder of either number."""

    node: str
    pid: int  # as the node numbers it
    host: int  # as the host numbers it
    start: int  # field 22 of the host's /proc/<host>/stat

    def alive(self) -> bool:
        """The very same process still runs (not a zombie)."""
        return pid_alive(self.host) and start_time(self.host) == self.start


def find_node_process(cluster: LocalCluster, node: str, pid: int | None) -> HostProcess | None:
    """The live process ``pid`` of node ``node`` (as the node numbers it), seen from the
    host, or None if the node runs no such process now."""
    host = cluster.host_pid(node, pid)
    start = start_time(host) if host else None
    if not pid or not host or start is None:
        return None
    return HostProcess(node, pid, host, start)


def node_process(cluster: LocalCluster, node: str, pid: int | None) -> HostProcess:
    """As ``find_node_process``, failing the test if the node runs no such process."""
    found = find_node_process(cluster, node, pid)
    assert found is not None, f"{node} runs no process {pid}"
    return found



def assert_never_two_copies(cluster: LocalCluster, wid: str) -> None:
    """Logged lifetimes of the workload's epochs never overlap."""
    found = overlaps(cluster.progress_log(wid))
    assert not found, f"epochs alive at the same time: {found}"


async def start_with_workload(factory: Any, **kwargs: Any) -> tuple[LocalCluster, str,
                                                                   ClusterSnapshot]:
    """A started local cluster running one built-in workload: (cluster, id, snapshot)."""
    from hafo.local.cluster import demo_workload_spec

    cluster = await factory.start(**kwargs)
    wid = await cluster.submit(demo_workload_spec())
    snapshot = await cluster.wait_for(running(wid), 20, what="running")
    return cluster, wid, snapshot


def started_cluster(base_dir: Path, **kwargs: Any) -> Iterator[LocalCluster]:
    """A ready local cluster for a module-scoped fixture; stopped after, leaving no process."""
    local = LocalCluster(base_dir=base_dir, **kwargs)
    local.start()

    async def ready() -> None:
        try:
            await local.wait_ready(45)
        finally:
            await local.close_store()

    try:
        asyncio.run(ready())
        yield local
    finally:
        local.stop()
        assert not local.leftover_pids()


def api_call(port: int, method: str, path: str, body: Any = None,
             token: str | None = None) -> tuple[int, Any]:
    """One JSON call of a controller's API on 127.0.0.1:``port`` (``token``: the bearer
    token, if any): the status and the decoded body, errors included."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                     method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def api_until(port: int, path: str, check: Any, timeout: float = 20.0) -> Any:
    """GET ``path`` until ``check(body)`` holds (a controller's cache follows etcd a moment
    later); the body."""
    deadline = time.monotonic() + timeout
    while True:
        code, body = api_call(port, "GET", path)
        if code == 200 and check(body):
            return body
        assert time.monotonic() < deadline, f"{path} never satisfied: {code} {body}"
        time.sleep(0.05)
