"""Replicated services end to end: a real HAProxy (examples/haproxy.cfg) driven by
``hafo lb haproxy`` (``run_haproxy_lb``, in-process) in front of examples/http_service.py
replicas on a local cluster of 4 nodes, under load from ``hafo.local.loadgen`` through
HAProxy's frontend: a node's power loss, a rolling update and a drain; and the ``openai``
check plugin as the readiness check of examples/fake_openai.py.

One cluster (4 nodes, 1 controller, lease TTL 3 s) and one HAProxy serve the whole module;
each test submits its own service, runs its own ``hafo lb`` task and deletes the service
(waiting for its processes to exit) when it ends. Timings are printed (``pytest -s``)."""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from benchmarks.haproxy_setup import BACKEND, Haproxy, have_haproxy, left_rotation, service_spec
from hafo.lb.haproxy import run_haproxy_lb
from hafo.local.cluster import LocalCluster
from hafo.local.loadgen import LoadResult, run_load
from hafo.model.cluster import ClusterSnapshot
from hafo.model.endpoints import endpoints_of
from hafo.model.views import workload_view
from hafo.store import EtcdStore, intents
from tests.integration.helpers import find_node_process, started_cluster

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]
NODES = 4
CONCURRENCY = 4
RATE = 150.0  # requests per second through HAProxy, in all
SERIAL = itertools.count(1)  # service names: web1, web2, ...


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    if not have_haproxy():
        pytest.skip("haproxy is not installed (scripts/install-test-deps.sh installs it)")
    yield from started_cluster(tmp_path_factory.mktemp("svc"), nodes=NODES, controllers=1)


@pytest.fixture(scope="module")
def haproxy() -> Iterator[Haproxy]:
    if not have_haproxy():
        pytest.skip("haproxy is not installed")
    proxy = Haproxy()
    try:
        proxy.start()
        yield proxy
    finally:
        proxy.stop()


@dataclass
class Service:
    """A submitted service with ``hafo lb haproxy`` driving HAProxy's backend for it."""

    cluster: LocalCluster
    haproxy: Haproxy
    name: str
    wid: str = ""
    lb_stop: asyncio.Event = field(default_factory=asyncio.Event)
    lb_task: asyncio.Task[int] | None = None
    lb_store: EtcdStore | None = None

    async def submit(self, spec: dict[str, Any]) -> str:
        self.wid = await self.cluster.submit(spec)
        return self.wid

    def start_lb(self) -> None:
        self.lb_store = EtcdStore(self.cluster.etcd.endpoints)
        self.lb_task = asyncio.create_task(run_haproxy_lb(
            self.lb_store, self.cluster.keys, self.name, BACKEND, self.haproxy.socket,
            stop=self.lb_stop))

    def endpoints(self, snapshot: ClusterSnapshot) -> list[Any]:
        return list(endpoints_of(snapshot, self.wid).endpoints)

    def ready(self, snapshot: ClusterSnapshot) -> list[Any]:
        return [e for e in self.endpoints(snapshot) if e.ready]

    async def wait_ready(self, count: int, timeout: float, *, current: bool = False
                         ) -> ClusterSnapshot:
        """Until ``count`` replicas are ready (all on the current spec, with ``current``)
        and, with ``count`` replicas, the service says it is running."""
        def check(snapshot: ClusterSnapshot) -> bool:
            view = workload_view(snapshot, self.wid)
            items = view["replicas"]["items"] if view["replicas"] else []
            ready = [r for r in items if r["ready"] and (r["current"] or not current)]
            return len(ready) >= count and (not current or (
                view["state"] == "running" and all(r["current"] for r in items)))
        return await self.cluster.wait_for(check, timeout, what=f"{count} ready replicas")

    async def wait_rotation(self, snapshot: ClusterSnapshot, timeout: float = 10.0) -> None:
        """Until HAProxy's rotation is exactly the ready endpoints of ``snapshot``."""
        wanted = {(e.address, e.ports["http"]) for e in self.ready(snapshot)}
        deadline = time.monotonic() + timeout
        while (got := await self.haproxy.in_rotation(BACKEND)) != wanted:
            assert time.monotonic() < deadline, (
                f"rotation {got} != ready endpoints {wanted}: "
                f"{await self.haproxy.servers(BACKEND)}, lb {self.lb_task}")
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        """Stop the lb, delete the service and wait until every replica process exited."""
        self.lb_stop.set()
        if self.lb_task is not None:
            try:
                await asyncio.wait_for(self.lb_task, 5)
            except Exception:  # teardown: the test's own failure matters more
                self.lb_task.cancel()
        if self.wid:
            snapshot = await self.cluster.snapshot()
            procs = [p for r in snapshot.replicas.get(self.wid, ())
                     if (s := snapshot.current_status(r)) is not None
                     and (p := find_node_process(self.cluster, s.node, s.pid)) is not None]
            await intents.delete(self.cluster.store, self.cluster.keys, self.wid)
            deadline = time.monotonic() + 15
            while any(p.alive() for p in procs) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert not any(p.alive() for p in procs), f"replicas still running: {procs}"
        if self.lb_store is not None:
            await self.lb_store.close()
        await self.cluster.close_store()


@pytest.fixture
async def service(cluster: LocalCluster, haproxy: Haproxy) -> AsyncIterator[Service]:
    svc = Service(cluster, haproxy, name=f"web{next(SERIAL)}")
    try:
        yield svc
    finally:
        await svc.close()


async def load(haproxy: Haproxy, stop: asyncio.Event, duration: float = 40.0) -> LoadResult:
    return await run_load(haproxy.url, concurrency=CONCURRENCY, duration=duration, rate=RATE,
                          stop=stop, timeout=5.0)


def show(what: str, result: LoadResult) -> None:
    failures = [(round(s.start - result.started, 2), s.outcome) for s in result.failures]
    print(f"\n{what}: {result.summary()}\n  per replica: {result.per_replica}"
          f"\n  failures (s after start, outcome): {failures}")


async def started_service(svc: Service, **spec: Any) -> ClusterSnapshot:
    """Submit ``svc`` (3 replicas), start its lb, and wait for HAProxy to serve all three."""
    await svc.submit(service_spec(svc.name, **spec))
    svc.start_lb()
    snapshot = await svc.wait_ready(3, 30)
    await svc.wait_rotation(snapshot)
    return snapshot


async def test_node_power_loss_under_load(service: Service) -> None:
    cluster = service.cluster
    snapshot = await started_service(service)
    victim = service.ready(snapshot)[0]
    target = (victim.address, victim.ports["http"])
    stop = asyncio.Event()
    loading = asyncio.create_task(load(service.haproxy, stop))
    try:
        await asyncio.sleep(1.5)  # steady load first
        cut = time.monotonic()
        cluster.power_off(victim.node)

        async def ready_again() -> float:
            await cluster.wait_for(
                lambda s: len([e for e in service.ready(s) if e.node != victim.node]) == 3, 30,
                what="3 ready replicas again, none on the dead node")
            return time.monotonic() - cut

        out_after, ready_after = await asyncio.gather(
            left_rotation(service.haproxy, BACKEND, target, cut, timeout=15), ready_again())
        await service.wait_rotation(await cluster.snapshot())
        await asyncio.sleep(1.0)  # the new replica serves
    finally:
        stop.set()
        result = await loading
        cluster.start_node(victim.node)
        await cluster.wait_ready(30)
    failed = result.failed_between(cut - 1, cut + 60)
    show("power loss", result)
    print(f"  out of rotation after {out_after}s (lease TTL {cluster.lease_ttl}s), "
          f"3 ready again after {ready_after:.2f}s, failed requests {len(failed)}")
    assert out_after is not None and out_after <= cluster.lease_ttl + 3
    assert ready_after <= cluster.lease_ttl + 10
    # a request in flight on the powered-off replica may fail; refused connections are
    # retried elsewhere (retries 2, option redispatch 1)
    assert len(failed) <= CONCURRENCY + 2, failed
    assert result.failed == len(failed)
    assert result.succeeded > 300
    final = await cluster.snapshot()
    assert victim.node not in {e.node for e in service.ready(final)}


async def test_rolling_update_under_load_fails_no_request(service: Service) -> None:
    before = await started_service(service, env={"VERSION": "1"})
    old = {e.replica for e in service.endpoints(before)}
    stop = asyncio.Event()
    loading = asyncio.create_task(load(service.haproxy, stop))
    try:
        await asyncio.sleep(1.0)
        started = time.monotonic()
        assert await service.submit(service_spec(service.name, env={"VERSION": "2"})) == \
            service.wid
        after = await service.wait_ready(3, 40, current=True)
        took = time.monotonic() - started
        await service.wait_rotation(after)
        await asyncio.sleep(1.0)  # every new replica answers some requests
    finally:
        stop.set()
        result = await loading
    show("rolling update", result)
    new = {e.replica for e in service.endpoints(after)}
    print(f"  update of 3 replicas took {took:.2f}s; old {sorted(old)} new {sorted(new)}")
    assert result.failed == 0, result.failures
    assert len(new) == 3 and not new & old
    assert all(after.workloads[r].spec.env.get("VERSION") == "2" for r in new)
    assert new <= set(result.per_replica), result.per_replica
    assert set(result.per_replica) <= old | new


async def test_drain_under_load_fails_no_request(service: Service) -> None:
    cluster = service.cluster
    snapshot = await started_service(service)
    node = service.ready(snapshot)[0].node
    assert node is not None
    stop = asyncio.Event()
    loading = asyncio.create_task(load(service.haproxy, stop))
    try:
        await asyncio.sleep(1.0)
        started = time.monotonic()
        moved = await intents.drain(cluster.store, cluster.keys, node)
        assert len(moved) == 1

        def drained(s: ClusterSnapshot) -> bool:
            eps = service.endpoints(s)
            return len([e for e in eps if e.ready]) == 3 and all(e.node != node for e in eps)
        after = await cluster.wait_for(drained, 30, what=f"the replica off {node}")
        took = time.monotonic() - started
        await service.wait_rotation(after)
        await asyncio.sleep(1.0)
    finally:
        stop.set()
        result = await loading
        await intents.set_cordon(cluster.store, cluster.keys, node, False)
    show("drain", result)
    print(f"  drain of {node} took {took:.2f}s")
    assert result.failed == 0, result.failures
    assert all(e.node != node for e in service.endpoints(after))
    # the old replica's submission goes first, its assignment a cycle later
    await cluster.wait_for(lambda s: not [w for w, a in s.assignments.items()
                                          if a.holds_node and node in a.nodes], 10,
                           what=f"no assignment on {node}")
    assert len(set(result.per_replica)) >= 4  # the moved replica's successor served too


async def test_openai_check_is_the_readiness_of_fake_openai(service: Service) -> None:
    pytest.importorskip("hafo_check_openai")
    cluster = service.cluster
    await service.submit({
        "name": service.name, "replicas": 1, "workdir": str(ROOT),
        "command": [sys.executable, "-u", "examples/fake_openai.py", "--host", "127.0.0.1",
                    "--startup-delay", "0.5", "--drain-timeout", "2"],
        "ports": {"http": 0}, "stop_grace": 5, "update": {"drain_delay": 0.5},
        "checks": [{"type": "openai", "port": "http", "interval": 0.3, "timeout": 2,
                    "failure_threshold": 1, "liveness": False}]})
    snapshot = await service.wait_ready(1, 30)
    endpoint = service.ready(snapshot)[0]
    url = f"http://{endpoint.address}:{endpoint.ports['http']}"
    async with aiohttp.ClientSession() as session, \
            session.post(url + "/admin/break") as resp:
        assert resp.status == 200
    broke = time.monotonic()
    snapshot = await cluster.wait_for(
        lambda s: not any(e.ready for e in service.endpoints(s)), 10,
        what="the broken replica not ready")
    print(f"\nopenai: not ready {time.monotonic() - broke:.2f}s after /admin/break")
    [broken] = service.endpoints(snapshot)
    assert broken.replica == endpoint.replica and broken.state == "running"
