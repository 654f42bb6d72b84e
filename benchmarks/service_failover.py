"""A service replica's node loses power under load: how long does HAProxy keep sending to it?

Side by side in one run, on this machine: a local cluster of 4 nodes (lease TTL 3 s) runs
examples/http_service.py as a 3-replica service (``ports: {http: 0}``, an http readiness
check every 0.3 s), and ONE HAProxy (examples/haproxy.cfg as shipped: ``retries 2``,
``option redispatch 1``) serves it through two frontends, each under the same load
(``hafo.local.loadgen``, 4 keep-alive workers, 100 requests/s each):

(a) hafo lb: backend ``web``, server-template slots driven by ``hafo lb haproxy``
    (``run_haproxy_lb``, in this process) from the etcd watch;
(b) polling: backend ``polling``, Patroni's reference setup (the commented example of
    examples/haproxy.cfg): ``option httpchk GET /v1/workloads/web/ready`` against each node
    agent's API port (``check port AGENTPORT``), ``default-server inter 3s fall 3 rise 2``.
    A replica's port differs from node to node and is only known once it runs, so (b)'s
    server lines are generated from the endpoints when each trial starts: one server per
    node running a replica (its address, the replica's port, the agent's port). That is the
    most (b) can know; a replica that moves to another node is not found by (b) at all (it
    serves with one server fewer until its config is regenerated).

Each trial cuts the power of one replica's node (its whole process tree SIGKILLed at once)
and measures from the cut, polling HAProxy's own ``show servers state`` every 50 ms:
- in rotation: seconds until the dead server stops being in rotation in each backend;
- failed: requests that failed through each frontend;
- expiry: etcd deleted the node's liveness key (the floor of any lease-based detector);
- 3 ready: hafo has 3 ready replicas again.
The node is powered on again after each trial; each trial starts a fresh HAProxy.

On one host a dead replica's port refuses connections at once, so HAProxy's redispatch
retries nearly every request elsewhere and (b) fails few requests too; on a real power loss
the node stops answering (no RST) and every request sent to it waits out ``timeout connect``
(2 s) before the retry: the seconds in rotation are what matters.

    python benchmarks/service_failover.py [--trials N] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_main import run_main

from benchmarks.haproxy_setup import (
    BACKEND,
    Haproxy,
    have_haproxy,
    left_rotation,
    polling_section,
    service_spec,
)
from hafo.lb.haproxy import run_haproxy_lb
from hafo.local.cluster import LocalCluster
from hafo.local.loadgen import LoadResult, run_load
from hafo.local.procs import free_port
from hafo.logs import configure
from hafo.model.cluster import ClusterSnapshot
from hafo.model.endpoints import Endpoint, endpoints_of
from hafo.stats import percentile
from hafo.store import EtcdStore

NAME = "web"
POLLING = "polling"
CONCURRENCY, RATE = 4, 100.0
POLL_TIMEOUT = 20.0  # (b) takes up to inter x fall (+ one inter): 9-12 s


@dataclass
class Trial:
    expiry: float
    ready: float
    in_rotation: dict[str, float | None]
    failed: dict[str, int]
    total: dict[str, int]


def ready_endpoints(snapshot: ClusterSnapshot, wid: str) -> list[Endpoint]:
    return [e for e in endpoints_of(snapshot, wid).endpoints if e.ready]


async def wait_rotation(proxy: Haproxy, backend: str, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(await proxy.in_rotation(backend)) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{backend}: fewer than {count} servers in rotation after "
                               f"{timeout}s: {await proxy.servers(backend)}")
        await asyncio.sleep(0.05)


async def trial(cluster: LocalCluster, wid: str, keep: bool) -> Trial:
    snapshot = await cluster.wait_for(lambda s: len(ready_endpoints(s, wid)) == 3, 30,
                                      what="3 ready replicas")
    ready = ready_endpoints(snapshot, wid)
    victim = ready[0]
    servers = [(e.node or "", e.address or "", e.ports["http"],
                cluster.node_handles[e.node or ""].api_port) for e in ready]
    polling_port = free_port()
    proxy = Haproxy(extra=polling_section(NAME, servers, polling_port, POLLING))
    store = EtcdStore(cluster.etcd.endpoints)
    stop_lb, stop_load = asyncio.Event(), asyncio.Event()
    lb: asyncio.Task[int] | None = None
    powered_off = False
    try:
        proxy.start()
        lb = asyncio.create_task(run_haproxy_lb(store, cluster.keys, NAME, BACKEND,
                                                proxy.socket, stop=stop_lb))
        await wait_rotation(proxy, BACKEND, 3, 10)
        await wait_rotation(proxy, POLLING, 3, 10)
        urls = {"hafo lb": proxy.url, "polling": f"http://127.0.0.1:{polling_port}/"}
        loads = {k: asyncio.create_task(run_load(url, concurrency=CONCURRENCY, duration=60,
                                                 rate=RATE, stop=stop_load))
                 for k, url in urls.items()}
        await asyncio.sleep(2.0)  # steady load first
        target = (victim.address or "", victim.ports["http"])
        expiry = cluster.watch_expiry(victim.node or "", (await cluster.snapshot()).revision + 1)
        await asyncio.sleep(0.2)
        cut, cut_wall = time.monotonic(), time.time()
        powered_off = True
        cluster.power_off(victim.node or "")

        async def ready_again() -> float:
            await cluster.wait_for(
                lambda s: len([e for e in ready_endpoints(s, wid) if e.node != victim.node])
                == 3, 30, what="3 ready replicas again, none on the dead node")
            return time.monotonic() - cut

        *outs, ready_after = await asyncio.gather(
            left_rotation(proxy, BACKEND, target, cut, POLL_TIMEOUT),
            left_rotation(proxy, POLLING, target, cut, POLL_TIMEOUT), ready_again())
        expired = await asyncio.wait_for(expiry, 10) - cut_wall
        await asyncio.sleep(1.0)
        stop_load.set()
        results: dict[str, LoadResult] = {k: await t for k, t in loads.items()}
        if keep:
            print(f"  haproxy config and log kept in {proxy.base}")
        return Trial(expiry=expired, ready=ready_after,
                     in_rotation=dict(zip(urls, outs, strict=True)),
                     failed={k: r.failed for k, r in results.items()},
                     total={k: r.total for k, r in results.items()})
    finally:
        stop_load.set()
        stop_lb.set()
        if lb is not None:
            await asyncio.gather(lb, return_exceptions=True)
        await store.close()
        proxy.stop(remove=not keep)
        if powered_off:
            cluster.start_node(victim.node or "")
            await cluster.wait_ready(30)


def fmt(value: float | None) -> str:
    return f">{POLL_TIMEOUT:.0f}s" if value is None else f"{value:.2f}s"


async def main(trials: int, keep: bool) -> int:
    if not have_haproxy():
        raise RuntimeError("haproxy is not installed (scripts/install-test-deps.sh)")
    cluster = LocalCluster(nodes=4, controllers=1, keep=keep)
    cluster.start()
    try:
        await cluster.wait_ready(60)
        wid = await cluster.submit(service_spec(NAME))
        results = []
        for i in range(trials):
            result = await trial(cluster, wid, keep)
            results.append(result)
            print(f"trial {i + 1:2d}: expiry {result.expiry:.2f}s  3 ready {result.ready:.2f}s"
                  + "".join(f"  | {k}: in rotation {fmt(result.in_rotation[k])}, failed "
                            f"{result.failed[k]}/{result.total[k]}" for k in result.failed),
                  flush=True)
        ttl = cluster.lease_ttl
        print(f"\nreplica node power loss under load, {trials} trial(s), lease TTL {ttl}s "
              f"(the floor: etcd expires it TTL - heartbeat to TTL after the cut), heartbeat "
              f"{cluster.heartbeat}s; {CONCURRENCY} workers x "
              f"{RATE:.0f} req/s per frontend")
        print(f"{'':10s} {'in rotation p50':>16s} {'max':>8s} {'failed':>8s} {'requests':>9s}"
              f"  {'/TTL':>5s}")
        worst: dict[str, float] = {}
        for key in ("hafo lb", "polling"):
            secs = [r.in_rotation[key] for r in results]
            known = [s if s is not None else POLL_TIMEOUT for s in secs]
            worst[key] = max(known)
            p50 = percentile(known, 50)
            print(f"{key:10s} {fmt(p50 if None not in secs else None):>16s} "
                  f"{fmt(worst[key]):>8s} {sum(r.failed[key] for r in results):8d} "
                  f"{sum(r.total[key] for r in results):9d}  {p50 / ttl:5.2f}")
        expiry = [r.expiry for r in results]
        ready = [r.ready for r in results]
        print(f"etcd expiry p50 {percentile(expiry, 50):.2f}s, 3 replicas ready again p50 "
              f"{percentile(ready, 50):.2f}s (hafo; (b) never sees the moved replica)")
        a = [r.in_rotation["hafo lb"] or POLL_TIMEOUT for r in results]
        b = [r.in_rotation["polling"] or POLL_TIMEOUT for r in results]
        ratios = [y / x for x, y in zip(a, b, strict=True) if x > 0]
        print(f"seconds in rotation, polling / hafo lb: p50 {percentile(ratios, 50):.2f}x, "
              f"min {min(ratios):.2f}x")
        await cluster.close_store()
        return 0
    finally:
        cluster.stop()


if __name__ == "__main__":
    configure("console", level="warning")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--keep", action="store_true",
                        help="keep the cluster's directory and HAProxy's config and log")
    args = parser.parse_args()
    run_main(lambda: asyncio.run(main(args.trials, args.keep)))
