"""Gangs at scale: one real etcd, one real controller process, N simulated nodes (``hafo.sim``).

Nodes have 8 GPUs and a ``rack`` label (32 nodes per rack); G gangs of S nodes x 8 GPUs are
submitted at once (``--topology``: none, or ``{key: rack, mode: required|preferred}``; by
default ``both``: the whole run without topology, then again, on a fresh etcd, controller and
fleet, with ``required``). Measured, side by side in one run:

- **placement**: from the first submit until every gang runs (every member's simulated
  instance started at the gang's epoch); the controller's own decision time for it (every
  ``reconcile`` call of its cycles, timed inside the controller process, and the writes of
  the plans); and the pure decision time measured here, in-process, on the snapshot of
  that moment (registered fleet + every gang submitted, nothing placed: the snapshot read
  at the end, every node alive, the assignments and reports left out): ``reconcile()``
  timed on it (after everything is stopped), for each topology mode. Goal: 1,000 8-node
  gangs on 10,000 nodes in under 2 s of controller time.
- **failover**: 1% of the nodes crash at once (the simulator stops their keepalives, their
  leases expire); time until every gang with a member on a crashed node runs again (every
  member running at a new epoch, none on a crashed node), also as a multiple of the TTL.
- **baseline** (the physical floor): etcd's lease expiry itself, from the crash until etcd
  deleted the crashed nodes' liveness keys (seen by a watch); hafo's recovery is printed
  beside it, minus and relative to it.

The controller runs as ``python -m hafo controller`` does, through a shim in this file that
wraps ``reconcile`` and ``apply_plan`` with timers (``--as-controller``); nothing in hafo is
changed for it. Keep ~20% of the nodes free (G x S <= 0.8 N) so replacements fit;
``--spares`` sets the controller's ``placement.spares``, ``--spare-labels`` labels that many
nodes ``hafo.io/spare: "true"`` (both 0 by default: replacements go to free ordinary nodes).

The snapshots read here go through ``ReaderStore`` (gRPC's 4 MiB reply limit raised): at
10,000 nodes the state prefix is ~20 MB, which hafo's own ``EtcdStore`` refuses to read in
one range (a ``FINDING`` line says so when it happens).

    python benchmarks/gang_scale.py                       # 10,000 nodes, 1,000 gangs of 8
    python benchmarks/gang_scale.py --nodes 1000 --gangs 100 --topology none   # quick
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_main import run_main

from hafo.decisions.reconcile import reconcile
from hafo.local.etcd import EtcdCluster
from hafo.local.procs import free_port, spawn, stop_process
from hafo.logs import configure
from hafo.model.cluster import ClusterSnapshot, Liveness, Submission
from hafo.model.spec import WorkloadSpec, parse_spec
from hafo.model.views import workload_state
from hafo.sim import SimFleet
from hafo.stopping import cancel_on_signals
from hafo.store import EtcdStore, Keys, Put, StoreError, aetcd_adapter, codec
from hafo.store.client import WatchEvent, channel_options
from hafo.store.state import read_snapshot

RACK_SIZE = 32
CLUSTER = "gangscale"
POLL = 0.2  # seconds between checks of the fleet (timestamps come from the fleet itself)
MODES = ("none", "required", "preferred")


# -- the controller shim (runs in the controller process) -----------------------------------

def controller_main(cycles_path: str, argv: list[str]) -> int:
    """``hafo controller`` with ``reconcile`` and ``apply_plan`` timed: one JSON line per
    call appended to ``cycles_path`` (wall start, wall seconds, thread CPU seconds, action
    kinds)."""
    import hafo.controller.daemon as daemon
    from hafo.cli import main as hafo_main
    from hafo.decisions.plan import Plan

    out = open(cycles_path, "a", buffering=1)  # noqa: SIM115 - open for the process' life
    names = vars(daemon)  # the globals its reconcile loop calls
    plain_reconcile, plain_apply = names["reconcile"], names["apply_plan"]

    def kinds(plan: Plan) -> dict[str, int]:
        return dict(Counter(a.kind for a in plan.actions))

    def timed_reconcile(snapshot: ClusterSnapshot, now: float, **kw: Any) -> Plan:
        start, clock, cpu = time.time(), time.perf_counter(), time.thread_time()
        plan: Plan = plain_reconcile(snapshot, now, **kw)
        wall, cpu = time.perf_counter() - clock, time.thread_time() - cpu
        out.write(json.dumps({"what": "reconcile", "t": start, "wall": wall, "cpu": cpu,
                              "workloads": len(snapshot.workloads),
                              "assignments": len(snapshot.assignments),
                              "kinds": kinds(plan)}) + "\n")
        return plan

    async def timed_apply(*args: Any, **kw: Any) -> int:
        plan: Plan = args[3] if len(args) > 3 else kw["plan"]
        start, clock = time.time(), time.perf_counter()
        revision: int = await plain_apply(*args, **kw)
        out.write(json.dumps({"what": "apply", "t": start, "wall": time.perf_counter() - clock,
                              "kinds": kinds(plan)}) + "\n")
        return revision

    names["reconcile"], names["apply_plan"] = timed_reconcile, timed_apply
    return hafo_main(argv)


def read_cycles(path: Path) -> list[dict[str, Any]]:
    """The shim's records so far."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            records.append(json.loads(line))
    return records


@dataclasses.dataclass
class Window:
    """The controller's work between two wall times, from the shim's records."""

    cycles: int = 0  # reconcile calls
    decide: float = 0.0  # reconcile wall seconds, summed
    decide_cpu: float = 0.0
    decide_max: float = 0.0
    placing: int = 0  # reconcile calls that placed something
    placing_decide: float = 0.0
    placing_cpu: float = 0.0
    apply: float = 0.0  # apply_plan wall seconds, summed
    kinds: Counter[str] = dataclasses.field(default_factory=Counter)  # applied actions
    first: dict[str, float] = dataclasses.field(default_factory=dict)  # kind -> first apply end
    last: dict[str, float] = dataclasses.field(default_factory=dict)  # kind -> last apply end


def window(records: list[dict[str, Any]], start: float, end: float) -> Window:
    """Sum the controller's reconcile and apply calls that began in [start, end)."""
    w = Window()
    for r in records:
        if not start <= r["t"] < end:
            continue
        if r["what"] == "reconcile":
            w.cycles += 1
            w.decide += r["wall"]
            w.decide_cpu += r["cpu"]
            w.decide_max = max(w.decide_max, r["wall"])
            if r["kinds"].get("place"):
                w.placing += 1
                w.placing_decide += r["wall"]
                w.placing_cpu += r["cpu"]
        else:
            w.apply += r["wall"]
            done = r["t"] + r["wall"]
            for kind, n in r["kinds"].items():
                w.kinds[kind] += n
                w.first.setdefault(kind, done)
                w.last[kind] = done
    return w


# -- the fleet ---------------------------------------------------------------------------

def label_fleet(fleet: SimFleet, spare_labels: int) -> int:
    """Give every node its rack (``rNNN``, ``RACK_SIZE`` nodes each, in name order) and the
    last ``spare_labels`` nodes the spare label; returns the number of racks."""
    names = sorted(fleet.nodes)
    for i, name in enumerate(names):
        fleet.nodes[name].labels["rack"] = f"r{i // RACK_SIZE:03d}"
    for name in names[len(names) - spare_labels:] if spare_labels else ():
        fleet.nodes[name].labels["hafo.io/spare"] = "true"
    return (len(names) + RACK_SIZE - 1) // RACK_SIZE


def running_gangs(fleet: SimFleet, size: int) -> dict[str, int]:
    """gang -> the epoch at which all ``size`` of its members run on live simulated nodes."""
    counts: Counter[tuple[str, int]] = Counter()
    for node in fleet.nodes.values():
        if node.alive:
            counts.update(node.running.items())
    return {w: e for (w, e), n in counts.items() if n >= size}


def gang_spec(size: int, gpus: int, mode: str) -> WorkloadSpec:
    """One gang member per node, ``gpus`` GPUs each; ``mode`` none or a topology mode."""
    raw: dict[str, Any] = {"name": "g", "command": ["true"], "gpus": gpus, "nodes": size}
    if mode != "none":
        raw["topology"] = {"key": "rack", "mode": mode}
    return parse_spec(raw)


async def wait_until(predicate: Callable[[], bool], timeout: float,
                     runner: asyncio.Task[None] | None = None) -> bool:
    """Poll ``predicate`` every ``POLL`` seconds; False on timeout. RuntimeError if the
    fleet's ``runner`` ended (its keepalives with it: every lease would expire)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if runner is not None and runner.done():
            error = None if runner.cancelled() else runner.exception()
            raise RuntimeError(f"the simulated fleet stopped: {error!r}")
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(POLL)
    return True


async def watch_deletes(store: EtcdStore, prefix: str, revision: int,
                        seen: dict[str, float]) -> None:
    """Record when each key under ``prefix`` is deleted (name after the prefix -> wall time)."""
    async for event in store.watch_prefix(prefix, revision + 1):
        if isinstance(event, WatchEvent) and event.kind == "delete":
            seen.setdefault(event.kv.key[len(prefix):], time.time())


class ReaderStore(EtcdStore):
    """``EtcdStore`` with gRPC's 4 MiB limit on a reply raised, for ``read_snapshot`` here:
    the state prefix of 10,000 simulated nodes (8 GPUs each) is ~20 MB in one range read, which
    hafo's own store refuses ("Received message larger than max")."""

    def _new_client(self, host: str, port: int, timeout: float) -> Any:
        options = {**channel_options(self.reconnect_backoff),
                   "grpc.max_receive_message_length": 512 << 20}
        return aetcd_adapter.new_client(host, port, timeout, tls=None, username=None,
                                        password=None, options=options)


def snapshot_in_thread(endpoints: list[str], raised_limit: bool = True) -> ClusterSnapshot:
    """``read_snapshot`` on a store and event loop of its own, in the calling thread (run it
    through ``asyncio.to_thread``): decoding 20,000 keys takes about a second, which on the
    fleet's loop would make its keepalive rounds late. ``raised_limit``: through
    ``ReaderStore``, else through hafo's own ``EtcdStore``."""

    async def read() -> ClusterSnapshot:
        store = (ReaderStore if raised_limit else EtcdStore)(endpoints, timeout=30.0)
        try:
            return await read_snapshot(store, Keys(CLUSTER))
        finally:
            await store.close()

    return asyncio.run(read())


# -- pure decision time ------------------------------------------------------------------

def best_reconcile(snapshot: ClusterSnapshot, spares: int,
                   repeat: int) -> tuple[float, float, int, int]:
    """(fastest wall, its CPU seconds, gangs placed, actions) of ``repeat`` reconcile calls."""
    best = (float("inf"), 0.0, 0, 0)
    for _ in range(repeat):
        start, cpu = time.perf_counter(), time.process_time()
        plan = reconcile(snapshot, time.time(), spares=spares)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        placed = sum(1 for a in plan.actions if a.kind == "place")
        if wall < best[0]:
            best = (wall, cpu, placed, len(plan.actions))
    return best


def every_node_alive(snapshot: ClusterSnapshot, fleet: SimFleet) -> ClusterSnapshot:
    """``snapshot`` with every node of the fleet alive again (the crashed ones with the lease
    they registered with): with ``with_specs``, the snapshot of the submit, nothing placed."""
    alive = {name: snapshot.alive.get(name) or Liveness(name, node.lease, 0.0)
             for name, node in fleet.nodes.items()}
    return dataclasses.replace(snapshot, alive=MappingProxyType(alive), expiring=frozenset())


def with_specs(snapshot: ClusterSnapshot, subs: Mapping[str, Submission],
               spec: WorkloadSpec) -> ClusterSnapshot:
    """``snapshot`` with ``subs`` submitted (with ``spec``), nothing placed."""
    workloads = {wid: dataclasses.replace(s, spec=spec) for wid, s in subs.items()}
    return dataclasses.replace(snapshot, workloads=MappingProxyType(workloads),
                               assignments=MappingProxyType({}),
                               statuses=MappingProxyType({}))


# -- one run -----------------------------------------------------------------------------

@dataclasses.dataclass
class Params:
    """One run's sizes and timing."""

    nodes: int
    gangs: int
    size: int
    gpus: int
    ttl: int
    heartbeat: float
    crash: float
    spares: int
    spare_labels: int
    repeat: int
    timeout: float


async def run_mode(base: Path, p: Params, mode: str) -> dict[str, Any]:
    """Start etcd, the controller and the fleet; place the gangs, crash nodes, recover;
    stop everything. Returns the figures and the snapshots before the placement and after
    the failover (``before``, ``after``, with the submissions ``subs``)."""
    tag = f"{mode}-{p.nodes}"
    etcd = EtcdCluster(base / f"etcd-{tag}", size=1)
    etcd.start()
    store = EtcdStore(etcd.endpoints, timeout=10.0)
    keys = Keys(CLUSTER)
    config = base / f"ctl-{tag}.yaml"
    cycles_path = base / f"cycles-{tag}.jsonl"
    config.write_text(yaml.safe_dump({
        "cluster": CLUSTER, "etcd": {"endpoints": etcd.endpoints},
        "timing": {"lease_ttl": p.ttl, "heartbeat": p.heartbeat},
        "placement": {"spares": p.spares},
        "api": {"listen": f"127.0.0.1:{free_port()}"}, "controller": {"name": "ctl-1"},
        "log": {"format": "json"}}))
    env = {**os.environ, "HAFO_LOG_LEVEL": os.environ.get("HAFO_LOG_LEVEL", "warning")}
    controller: subprocess.Popen[bytes] | None = None
    runner: asyncio.Task[None] | None = None
    watcher: asyncio.Task[None] | None = None
    out: dict[str, Any] = {"mode": mode}
    try:
        controller = spawn([sys.executable, str(Path(__file__).resolve()), "--as-controller",
                            str(cycles_path), "controller", "--config", str(config)],
                           base / f"ctl-{tag}.log", env=env)
        fleet = SimFleet(store, keys, p.nodes, p.gpus, p.ttl, p.heartbeat)
        out["racks"] = label_fleet(fleet, p.spare_labels)
        started = time.monotonic()
        await fleet.start()
        out["register"] = time.monotonic() - started
        runner = asyncio.create_task(fleet.run())
        if not await wait_until(lambda: controller is not None and controller.poll() is None
                                and bool(read_cycles(cycles_path)), 60, runner):
            raise RuntimeError(f"the controller did not lead within 60 s (log: "
                               f"{base / f'ctl-{tag}.log'})")
        await asyncio.sleep(2 * p.heartbeat)
        spec = gang_spec(p.size, p.gpus, mode)
        now = time.time()
        subs = {f"g-{i:05d}": Submission(id=f"g-{i:05d}", spec=spec, submitted_at=now + i * 1e-6)
                for i in range(p.gangs)}
        # -- placement
        submit_start = time.time()
        await store.write_many([Put(keys.workload(s.id), codec.encode_submission(s))
                                for s in subs.values()])
        out["submit_seconds"] = time.time() - submit_start
        out["submitted_at"] = submit_start
        placed_all = await wait_until(lambda: len(running_gangs(fleet, p.size)) >= p.gangs,
                                      p.timeout, runner)
        running = running_gangs(fleet, p.size)
        if not placed_all:
            raise TimeoutError(f"only {len(running)} of {p.gangs} gangs ran within "
                               f"{p.timeout:.0f}s (mode {mode})")
        out["running_seconds"] = max(fleet.started[w] for w in subs) - submit_start
        out["first_running"] = min(fleet.started[w] for w in subs) - submit_start
        await asyncio.sleep(2 * p.heartbeat)
        placement = window(read_cycles(cycles_path), submit_start, time.time())
        out["placement"] = placement
        # -- crash
        epoch_before = running_gangs(fleet, p.size)
        revision, _ = await store.get_prefix(keys.leader)
        deleted: dict[str, float] = {}
        alive_prefix = keys.alive("")
        watcher = asyncio.create_task(watch_deletes(store, alive_prefix, revision, deleted))
        await asyncio.sleep(0.2)  # the watch is in place
        victims = fleet.kill(p.crash, seed=1)
        killed = time.time()
        affected = sorted({w for v in victims for w in fleet.nodes[v].desired})
        out["victims"] = len(victims)
        out["affected"] = len(affected)
        out["lost_members"] = sum(1 for v in victims for _ in fleet.nodes[v].desired)

        def recovered() -> bool:
            now_running = running_gangs(fleet, p.size)
            return all(now_running.get(w, 0) > epoch_before[w] for w in affected)

        out["recovered_all"] = await wait_until(recovered, max(60.0, 20 * p.ttl), runner)
        now_running = running_gangs(fleet, p.size)
        back = [w for w in affected if now_running.get(w, 0) > epoch_before[w]]
        out["recovered"] = len(back)
        out["recover_seconds"] = (max(fleet.started[w] for w in back) - killed) if back else None
        gone = [deleted[v] - killed for v in victims if v in deleted]
        out["expiry_first"] = min(gone) if gone else None
        out["expiry_last"] = max(gone) if len(gone) == len(victims) else None
        out["expired"] = len(gone)
        await asyncio.sleep(p.heartbeat)
        failover = window(read_cycles(cycles_path), killed, time.time())
        out["failover"] = failover
        out["failover_from"] = killed
        # -- what the controller's state says (views.workload_state), and the stuck reasons.
        # Read only now: a range read of ~20 MB keeps etcd busy for a while, and a late
        # keepalive round before the measurements would fail nodes over that did not crash.
        started = time.monotonic()
        after = await asyncio.to_thread(snapshot_in_thread, etcd.endpoints)
        out["read_snapshot"] = time.monotonic() - started
        try:  # hafo's own store, as the CLI and a (re)starting controller read it
            await asyncio.to_thread(snapshot_in_thread, etcd.endpoints, False)
            out["plain_read"] = "ok"
        except StoreError as exc:
            out["plain_read"] = str(exc)[:120]
        before = every_node_alive(after, fleet)
        states = Counter(workload_state(after, w) for w in subs)
        out["states"] = dict(states)
        dead = set(victims)
        out["on_crashed"] = sum(1 for w in subs if (a := after.assignments.get(w)) is not None
                                and any(n in dead for n in a.nodes) and a.phase == "placed")
        stuck = [w for w in affected if w not in back]
        out["stuck_reasons"] = Counter(
            (after.assignments[w].phase, after.assignments[w].reason[:160]) if w in
            after.assignments else ("none", "") for w in stuck).most_common(3)
        out["before"], out["after"], out["subs"] = before, after, subs
        return out
    finally:
        try:  # bounded: a second signal, or a task slow to stop, must not skip the rest
            for task in (runner, watcher):
                if task is not None:
                    task.cancel()
                    await asyncio.wait({task}, timeout=10)
        finally:
            if controller is not None:
                stop_process(controller, grace=10)
            etcd.stop()
            shutil.rmtree(base / f"etcd-{tag}", ignore_errors=True)  # ~150 MB; logs are kept
            with contextlib.suppress(Exception):
                await store.close()


# -- report ------------------------------------------------------------------------------

def report(p: Params, r: dict[str, Any]) -> None:
    """One line per figure."""
    mode, ttl = r["mode"], p.ttl
    topo = "no topology" if mode == "none" else f"topology rack {mode}"
    print(f"\n{p.nodes} nodes x {p.gpus} GPUs ({r['racks']} racks of {RACK_SIZE}), "
          f"{p.gangs} gangs x {p.size} nodes x {p.gpus} GPUs, {topo}; spares {p.spares} "
          f"(config) + {p.spare_labels} labelled; registered in {r['register']:.1f}s "
          f"(snapshot read at the end {r['read_snapshot']:.2f}s)")
    if r["plain_read"] != "ok":
        print(f"  FINDING              read_snapshot through hafo's EtcdStore fails at this size: "
              f"{r['plain_read']}")
    pl: Window = r["placement"]
    places = pl.kinds.get("place", 0)
    written = pl.last.get("place")
    committed = f"; last placement written at {written - r['submitted_at']:.2f}s" \
        if written is not None else ""
    print(f"  placement e2e        all {p.gangs} gangs running {r['running_seconds']:.2f}s "
          f"after the first submit (first gang {r['first_running']:.2f}s; submits took "
          f"{r['submit_seconds']:.2f}s{committed})")
    if pl.kinds.get("move") or pl.kinds.get("pending"):
        print(f"  WARNING              before the crash: {pl.kinds.get('move', 0)} gang stops, "
              f"{pl.kinds.get('pending', 0)} pending (simulated leases lost under load?): "
              "the figures below are not clean")
    goal = "met" if pl.placing_decide < 2.0 else "MISSED"
    print(f"  controller decisions {pl.placing_decide:.2f}s of reconcile (thread CPU "
          f"{pl.placing_cpu:.2f}s) in the {pl.placing} cycle(s) that placed the {places} gangs; "
          f"writing them {pl.apply:.2f}s  [goal < 2 s: {goal}]")
    print(f"  controller cycles    {pl.decide:.2f}s of reconcile (thread CPU {pl.decide_cpu:.2f}s) "
          f"in all {pl.cycles} cycles from the submit until all ran, longest "
          f"{pl.decide_max:.2f}s")
    for pure_mode, (wall, cpu, placed, _) in r["pure"].items():
        what = "no topology" if pure_mode == "none" else f"rack {pure_mode}"
        print(f"  pure decision        reconcile() in-process, {p.gangs} gangs on {p.nodes} "
              f"nodes, {what}: {wall:.2f}s (CPU {cpu:.2f}s), {placed} placed "
              f"(best of {p.repeat})")
    wall, cpu, _, actions = r["steady"]
    print(f"  steady cycle         reconcile() in-process on the snapshot after the failover "
          f"({actions} actions): {wall:.3f}s (CPU {cpu:.3f}s)")
    print(f"  crash                {r['victims']} nodes ({p.crash:.0%}) at once: "
          f"{r['affected']} gangs affected ({r['lost_members']} members lost, "
          f"{r['affected'] * p.size - r['lost_members']} survivors stopped and restarted)")
    last = r["expiry_last"]
    if last is None:
        print(f"  baseline (etcd)      only {r['expired']} of {r['victims']} liveness keys "
              f"deleted (watch)")
    else:
        print(f"  baseline (etcd)      lease expiry: liveness keys deleted "
              f"{r['expiry_first']:.2f}..{last:.2f}s after the crash "
              f"(last = {last / ttl:.2f}x TTL {ttl}s)")
    fo: Window = r["failover"]
    rec = r["recover_seconds"]
    if not r["recovered_all"]:
        print(f"  hafo recovery        ONLY {r['recovered']} of {r['affected']} affected gangs "
              f"ran again within the timeout; stuck: {r['stuck_reasons']}")
    if rec is not None:
        floor = f"; floor + {rec - last:.2f}s = {rec / last:.2f}x floor" if last else ""
        print(f"  hafo recovery        {r['recovered']} affected gangs running again "
              f"{rec:.2f}s after the crash = {rec / ttl:.2f}x TTL{floor}")
    stops = fo.first.get("move")
    replaced = fo.last.get("place")
    base = r["failover_from"]
    steps = []
    if stops is not None:
        steps.append(f"first stop decision written at {stops - base:.2f}s")
    if replaced is not None:
        steps.append(f"last new epoch written at {replaced - base:.2f}s")
    print(f"  failover controller  {fo.decide:.2f}s of reconcile (CPU {fo.decide_cpu:.2f}s) in "
          f"{fo.cycles} cycles, longest {fo.decide_max:.2f}s; writes {fo.apply:.2f}s "
          f"({dict(fo.kinds)}); {', '.join(steps)}")
    if fo.kinds.get("move", 0) > r["affected"]:
        print(f"  WARNING              {fo.kinds['move']} gang stops after the crash for "
              f"{r['affected']} affected gangs (simulated leases lost under load?)")
    print(f"  views                workload states after: {r['states']}; placed gangs with a "
          f"member on a crashed node: {r['on_crashed']}", flush=True)


def _quiet(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's exception handler, less one message: gRPC's request feeders of the keepalive
    streams in flight when the fleet is cancelled ("Task was destroyed but it is pending")."""
    task = context.get("task")
    if str(context.get("message", "")).startswith("Task was destroyed") \
            and "_consume_request_iterator" in repr(task):
        return
    loop.default_exception_handler(context)


async def main(p: Params, modes: list[str]) -> int:
    """Run each topology mode in turn, each on a fresh etcd, controller and fleet."""
    if p.gangs * p.size > p.nodes:
        raise ValueError(f"{p.gangs} gangs of {p.size} need more than {p.nodes} nodes")
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(_quiet)
    this = asyncio.current_task()
    assert this is not None
    # SIGINT, SIGTERM cancel: the finally blocks stop everything
    with cancel_on_signals(this):
        try:
            return await _run(p, modes)
        except asyncio.CancelledError:
            raise KeyboardInterrupt from None


async def _run(p: Params, modes: list[str]) -> int:
    """Each mode in turn, then its report."""
    base = Path(tempfile.mkdtemp(prefix="hafo-gang-scale-"))
    print(f"machine: {os.cpu_count()} cores; one etcd, one controller process, the simulated "
          f"fleet in this process; lease TTL {p.ttl}s, heartbeat {p.heartbeat}s; "
          f"{p.gangs * p.size / p.nodes:.0%} of the nodes used; logs in {base}", flush=True)
    for i, mode in enumerate(modes):
        pure = tuple(m for m in MODES if m in ("none", "required")) if i == 0 else (mode,)
        r = await run_mode(base, p, mode)
        # timed once everything is stopped: here, a second of pure computation would stall
        # the fleet's keepalives, and the controller's and etcd's work would skew it
        r["pure"] = {m: best_reconcile(with_specs(r["before"], r["subs"],
                                                  gang_spec(p.size, p.gpus, m)),
                                       p.spares, p.repeat) for m in pure}
        r["steady"] = best_reconcile(r["after"], p.spares, p.repeat)
        report(p, r)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--as-controller":
        sys.exit(controller_main(sys.argv[2], sys.argv[3:]))
    configure("console", level="warning")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--gangs", type=int, default=1000)
    parser.add_argument("--size", type=int, default=8, help="nodes per gang")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node and per member")
    parser.add_argument("--topology", choices=[*MODES, "both"], default="both",
                        help="rack topology of the gangs; both (default): none, then required")
    parser.add_argument("--crash", type=float, default=0.01, help="fraction of nodes crashed")
    parser.add_argument("--spares", type=int, default=0, help="controller placement.spares")
    parser.add_argument("--spare-labels", type=int, default=0,
                        help='nodes labelled hafo.io/spare: "true"')
    parser.add_argument("--lease-ttl", type=int, default=3)
    parser.add_argument("--heartbeat", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3, help="pure reconcile runs (best)")
    parser.add_argument("--timeout", type=float, default=180.0,
                        help="seconds to wait for the placement")
    a = parser.parse_args()
    params = Params(a.nodes, a.gangs, a.size, a.gpus, a.lease_ttl, a.heartbeat, a.crash,
                    a.spares, a.spare_labels, a.repeat, a.timeout)
    chosen = ["none", "required"] if a.topology == "both" else [a.topology]
    run_main(lambda: asyncio.run(main(params, chosen)))
