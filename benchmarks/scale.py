"""Scale: one real etcd, one real controller process, N simulated nodes (``hafo.sim``).

For each fleet size: steady-state controller CPU and RSS and etcd request rates (baseline:
the same window measured before the fleet exists, an idle controller); placement
throughput for W submitted one-GPU workloads (placements committed per second); the time
from crashing 10% of the nodes at once until every workload they ran is running elsewhere,
as a ratio of the lease TTL. Goals at 10,000 nodes: controller under one core steady,
>= 2,000 placements/s, 10% mass failure fully re-placed within TTL + 5 s.

    python benchmarks/scale.py --nodes 1000 10000 --workloads 10000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_main import run_main

from hafo.local.etcd import EtcdCluster
from hafo.local.procs import free_port, kill_pid, spawn
from hafo.logs import configure
from hafo.model.cluster import Submission
from hafo.model.spec import parse_spec
from hafo.sim import SimFleet
from hafo.store import EtcdStore, Keys, Put, codec

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def etcd_counters(endpoint: str) -> tuple[float, float]:
    """(unary+stream RPCs handled, stream messages received) so far."""
    text = urllib.request.urlopen(f"{endpoint}/metrics", timeout=5).read().decode()
    handled = received = 0.0
    for line in text.splitlines():
        if line.startswith("grpc_server_handled_total"):
            handled += float(line.rsplit(" ", 1)[1])
        elif line.startswith("grpc_server_msg_received_total"):
            received += float(line.rsplit(" ", 1)[1])
    return handled, received


async def window(pid: int, endpoint: str, seconds: float) -> dict[str, float]:
    cpu0, (h0, m0), t0 = cpu_seconds(pid), etcd_counters(endpoint), time.monotonic()
    await asyncio.sleep(seconds)
    cpu1, (h1, m1), t1 = cpu_seconds(pid), etcd_counters(endpoint), time.monotonic()
    span = t1 - t0
    return {"cpu": (cpu1 - cpu0) / span, "rss": rss_mib(pid), "rpcs": (h1 - h0) / span,
            "msgs": (m1 - m0) / span}


async def wait_until(predicate: object, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():  # type: ignore[operator]
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
    return time.monotonic() - start


async def run_size(base: Path, nodes: int, workloads: int, gpus: int, ttl: int,
                   heartbeat: float) -> dict[str, float]:
    etcd = EtcdCluster(base / f"etcd-{nodes}", size=1)
    etcd.start()
    store = EtcdStore(etcd.endpoints, timeout=10.0)
    keys = Keys("scale")
    config = base / f"ctl-{nodes}.yaml"
    config.write_text(yaml.safe_dump({
        "cluster": "scale", "etcd": {"endpoints": etcd.endpoints},
        "timing": {"lease_ttl": ttl, "heartbeat": heartbeat},
        "api": {"listen": f"127.0.0.1:{free_port()}"}, "controller": {"name": "ctl-1"},
        "log": {"format": "json"}}))
    env = {**os.environ, "HAFO_LOG_LEVEL": os.environ.get("HAFO_LOG_LEVEL", "warning")}
    controller = spawn([sys.executable, "-m", "hafo", "controller", "--config", str(config)],
                       base / f"ctl-{nodes}.log", env=env)
    fleet = SimFleet(store, keys, nodes, gpus, ttl, heartbeat)
    runner: asyncio.Task[None] | None = None
    out: dict[str, float] = {}
    try:
        await asyncio.sleep(2.0)
        idle = await window(controller.pid, etcd.endpoints[0], 5.0)
        started = time.monotonic()
        await fleet.start()
        out["register"] = time.monotonic() - started
        runner = asyncio.create_task(fleet.run())
        await asyncio.sleep(3 * heartbeat + 2)
        steady = await window(controller.pid, etcd.endpoints[0], 10.0)
        out.update({f"idle_{k}": v for k, v in idle.items()})
        out.update({f"steady_{k}": v for k, v in steady.items()})
        # -- placement throughput
        spec = parse_spec({"name": "w", "command": ["true"], "gpus": 1})
        now = time.time()
        subs = [Submission(id=f"w-{i:06d}", spec=spec, submitted_at=now + i * 1e-6)
                for i in range(workloads)]
        cpu0 = cpu_seconds(controller.pid)
        submit_start = time.time()
        await store.write_many([Put(keys.workload(s.id), codec.encode_submission(s))
                                for s in subs])
        submitted = time.time()
        await wait_until(lambda: len(fleet.started) >= workloads, 600, "all placed")
        first, last = min(fleet.started.values()), max(fleet.started.values())
        out["submit_seconds"] = submitted - submit_start
        out["placed_per_s"] = workloads / max(last - first, 1e-6)
        out["end_to_end_per_s"] = workloads / (last - submit_start)
        out["placement_cpu"] = (cpu_seconds(controller.pid) - cpu0) / (last - submit_start)
        await asyncio.sleep(2.0)
        loaded = await window(controller.pid, etcd.endpoints[0], 10.0)
        out.update({f"loaded_{k}": v for k, v in loaded.items()})
        # -- mass failure
        victims = set(fleet.kill(0.1, seed=1))
        killed = time.time()
        displaced = [w for w, n in fleet.placed_on.items() if n in victims]

        def replaced() -> bool:
            return all(fleet.started.get(w, 0) > killed and fleet.placed_on.get(w) not in victims
                       for w in displaced)

        await wait_until(replaced, 120, "displaced work running again")
        out["displaced"] = len(displaced)
        out["replaced_seconds"] = max(fleet.started[w] for w in displaced) - killed
        out["rss_after"] = rss_mib(controller.pid)
        return out
    finally:
        if runner is not None:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
        kill_pid(controller.pid, signal.SIGTERM)
        try:
            controller.wait(10)
        except Exception:
            kill_pid(controller.pid)
            controller.wait(5)
        await store.close()
        etcd.stop()


async def main(sizes: list[int], workloads: int, gpus: int, ttl: int,
               heartbeat: float) -> int:
    base = Path(tempfile.mkdtemp(prefix="hafo-scale-"))
    print(f"machine: {os.cpu_count()} cores, "
          f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB; "
          f"one etcd, one controller process, the simulated fleet in this process; "
          f"lease TTL {ttl}s, heartbeat {heartbeat}s; logs in {base}", flush=True)
    for nodes in sizes:
        # room for everything even after 10% of the nodes die
        count = min(workloads, int(nodes * 0.9 * gpus * 0.95))
        r = await run_size(base, nodes, count, gpus, ttl, heartbeat)
        print(f"\n{nodes} nodes x {gpus} GPUs, {count} workloads "
              f"(registered in {r['register']:.1f}s)")
        print(f"  controller CPU  idle {r['idle_cpu']:.2f} core | steady {r['steady_cpu']:.2f} "
              f"| with {count} running {r['loaded_cpu']:.2f}   "
              f"(steady / idle {r['steady_cpu'] / max(r['idle_cpu'], 0.005):.1f}x)")
        print(f"  controller RSS  idle {r['idle_rss']:.0f} MiB | steady {r['steady_rss']:.0f} | "
              f"loaded {r['loaded_rss']:.0f} | after failover {r['rss_after']:.0f}")
        print(f"  etcd            steady {r['steady_rpcs']:.0f} RPCs/s + {r['steady_msgs']:.0f} "
              f"stream msgs/s (idle {r['idle_rpcs']:.0f} + {r['idle_msgs']:.0f})")
        print(f"  placement       {r['placed_per_s']:.0f} placements/s committed "
              f"({r['end_to_end_per_s']:.0f}/s from the first submit; submits took "
              f"{r['submit_seconds']:.1f}s; controller {r['placement_cpu']:.2f} core meanwhile)")
        goal = ttl + 5
        print(f"  10% crash       {r['displaced']:.0f} workloads running again after "
              f"{r['replaced_seconds']:.2f}s = {r['replaced_seconds'] / ttl:.2f}x TTL "
              f"(goal TTL + 5 = {goal}s: "
              f"{'met' if r['replaced_seconds'] <= goal else 'MISSED'})", flush=True)
    return 0


if __name__ == "__main__":
    configure("console", level="warning")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--workloads", type=int, default=10000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--lease-ttl", type=int, default=3)
    parser.add_argument("--heartbeat", type=float, default=1.0)
    a = parser.parse_args()
    run_main(lambda: asyncio.run(main(a.nodes, a.workloads, a.gpus, a.lease_ttl, a.heartbeat)))
