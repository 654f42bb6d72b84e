"""A multi-node training gang loses a node: how soon does it train again, and what is lost?

Side by side in one run, on this machine, the same 3-node gloo DDP job
(``examples/ddp_train.py``, one process per node, a checkpoint every 10 steps):

(a) hafo: a local cluster of 3 nodes and a spare (``hafo.io/spare``), the job submitted as a
    gang (``nodes: 3``, started by real torchrun through hafo's rendezvous environment). One
    member's node is powered off (its whole process tree SIGKILLed at once). Measured from
    the power cut: etcd expired the node's lease (the floor of any lease-based detector),
    the controller placed the new epoch, every member's process was started (the agents'
    reports), and the gang trained again (its first step); the steps lost (last step before
    the cut minus the step it resumed from); and the job's own start-up (the last member
    started to the first step: torchrun, torch imports, rendezvous, checkpoint load),
    reported separately.
(a') the same, with tiered checkpoints (``--tiers``: a snapshot every step into the node's
    RAM and a peer node's, durable every 10 steps as in (a)): the lost rank restores from its
    peer's RAM, the survivors from their own; the steps lost and the job's start-up beside (a).
(a'') hafo warm (``warm: true``, ``examples/warm_train.py`` under the SDK's ``run_warm``, one
    process per node, tiers as in (a')): the survivors park and are handed the next epoch in
    their processes, and the standby that waited on the spare (imports done, model built)
    becomes the lost rank and fetches its snapshot from its peer's RAM. Each warm trial runs
    on a fresh cluster, so that its gang has a standby (here no node but the labelled spare
    is one: a gang whose standby was used gets the next on a spare that is free).
(b) plain ``torchrun --nnodes 2:3 --max-restarts 3`` with its c10d rendezvous on node 1, no
    hafo (``benchmarks/gang_baseline.py``): a worker node lost, then the rendezvous host
    lost.

    python benchmarks/gang_failover.py [--trials 3] [--no-tiers] [--no-warm] [--no-baseline]

With ``--soak MINUTES``: instead, the warm gang and plain torchrun each lose a node every
``--every-s`` seconds (default 60) for that long, and the effective training time ratio of
each is printed (``benchmarks/gang_soak.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_main import run_main
from gang_baseline import BaselineResult, run_torchrun_baseline
from gang_soak import soak_hafo, soak_torchrun

from hafo.local.cluster import LocalCluster
from hafo.local.progress import overlaps
from hafo.logs import configure
from hafo.model.views import workload_view
from hafo.stats import percentile
from hafo.store import read_events

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def gang_spec(tiers: bool = False) -> dict[str, Any]:
    """The DDP example as a 3-node gang; with ``tiers``, snapshots every step."""
    return {"name": "ddp-tiers" if tiers else "ddp", "nodes": 3, "gpus": 1, "stop_grace": 15,
            "command": [TORCHRUN, str(ROOT / "examples" / "ddp_train.py"), "--steps", "0",
                        "--every", "10", "--sleep", "0.05", *(["--tiers"] if tiers else [])],
            "env": {"HAFO_DDP_TIMEOUT": "15"}}


def warm_spec() -> dict[str, Any]:
    """The warm example as a 3-node gang: survivors kept, a standby on the spare, snapshots
    every step, durable every 10 steps."""
    return {"name": "ddp-warm", "nodes": 3, "gpus": 1, "stop_grace": 15, "warm": True,
            "command": [sys.executable, str(ROOT / "examples" / "warm_train.py"), "--steps",
                        "0", "--every", "10", "--sleep", "0.05"],
            "env": {"HAFO_DDP_TIMEOUT": "15"}}


def _rank0(lines: list[dict[str, Any]], event: str, epoch: int | None = None
           ) -> list[dict[str, Any]]:
    return [x for x in lines if x.get("event") == event and x.get("rank", 0) == 0
            and (epoch is None or x["epoch"] == epoch)]


async def hafo_trial(cluster: LocalCluster, wid: str) -> dict[str, float]:
    """Power off rank 1's node; measure until the gang trains again."""
    snapshot = await cluster.wait_for(
        lambda s: workload_view(s, wid)["state"] == "running", 120, what="gang running")
    view = workload_view(snapshot, wid)
    epoch = int(view["epoch"])
    await cluster.wait_for(lambda s: len(_rank0(cluster.progress_log(wid), "step", epoch)) >= 25,
                           60, what="training steadily")
    victim = view["members"][1]["node"]
    expiry = cluster.watch_expiry(victim, snapshot.revision + 1)
    cut = time.time()
    cluster.power_off(victim)
    lost_at = max(x["step"] for x in cluster.progress_log(wid)
                  if x.get("event") == "step" and x["epoch"] == epoch)
    expired = await asyncio.wait_for(expiry, 30)

    def trained(_: Any) -> bool:
        return any(x["epoch"] > epoch for x in _rank0(cluster.progress_log(wid), "step"))

    await cluster.wait_for(trained, 120, what="gang training again")
    lines = cluster.progress_log(wid)
    new_epoch = min(x["epoch"] for x in _rank0(lines, "step") if x["epoch"] > epoch)
    first = min(x["t"] for x in _rank0(lines, "step", new_epoch))

    def launched(s: Any) -> list[float]:  # the members' (a standby is none of them)
        nodes = {m["node"] for m in workload_view(s, wid)["members"]}
        return [st.started_at for (w, node), st in s.statuses.items()
                if w == wid and node in nodes and st.epoch == new_epoch and st.started_at]

    # a warm gang trains before every agent reported it
    snapshot = await cluster.wait_for(lambda s: len(launched(s)) >= 3, 30,
                                      what="every member reported running")
    placed = min(e.ts for e in await read_events(cluster.store, cluster.keys, 0)
                 if e.workload == wid and e.ts > cut and e.kind in ("failover", "restarted"))
    launches = launched(snapshot)
    if len(launches) != 3:
        raise AssertionError(f"members of epoch {new_epoch} launched: {launches}")
    start = max(launches)
    resumed = _rank0(lines, "start", new_epoch)[0]["resumed_from"]
    tiers = [x.get("tier") for x in lines if x.get("event") == "start"
             and x["epoch"] == new_epoch]
    found = overlaps(lines)
    if found:
        raise AssertionError(f"two epochs of the gang alive at once: {found}")
    # the node comes back (empty of work) for the next trial; the gang stays where it is
    cluster.start_node(victim)
    await cluster.wait_ready(60)
    return {"expiry": expired - cut, "placed": placed - cut, "launched": start - cut,
            "training": first - cut, "startup": first - start,
            "steps_lost": float(lost_at - resumed),
            "from_peer": float(tiers.count("peer")), "from_disk": float(tiers.count("disk"))}


async def run_hafo(trials: int, ttl: int, keep: str | None = None, tiers: bool = False,
                   warm: bool = False) -> list[dict[str, float]]:
    """``trials`` power cuts; a warm gang gets a fresh cluster per trial (its standby)."""
    results: list[dict[str, float]] = []
    label = " warm" if warm else " tiers" if tiers else ""
    while len(results) < trials:
        cluster = LocalCluster(nodes=3, controllers=1, gpus_per_node=1, lease_ttl=ttl,
                               base_dir=Path(f"{keep}-{len(results)}") if keep else None,
                               keep=bool(keep))
        try:
            cluster.start()
            cluster.add_node("spare-1", labels={"zone": "local", "hafo.io/spare": "true"})
            cluster.start_node("spare-1")
            await cluster.wait_ready(60)
            wid = await cluster.submit(warm_spec() if warm else gang_spec(tiers))
            for _ in range(1 if warm else trials):
                result = await hafo_trial(cluster, wid)
                results.append(result)
                print(f"hafo{label} trial {len(results)}: " + ", ".join(
                    f"{k} {v:.2f}" for k, v in result.items()), flush=True)
        finally:
            await cluster.close_store()
            cluster.stop()
    return results


def _p50(results: list[dict[str, float]], key: str) -> float:
    return percentile([r[key] for r in results], 50)


def report(results: list[dict[str, float]], ttl: int,
           baselines: list[BaselineResult], tiered: list[dict[str, float]],
           warmed: list[dict[str, float]]) -> None:
    training = _p50(results, "training")
    print(f"\n(a) hafo, 3-node gang, one node powered off ({len(results)} trials, p50):")
    launched = _p50(results, "launched")
    print(f"    lease expired        {_p50(results, 'expiry'):6.2f} s  (the floor)")
    print(f"    new epoch placed     {_p50(results, 'placed'):6.2f} s")
    print(f"    every member started {launched:6.2f} s  = {launched / ttl:.2f} x TTL ({ttl} s); "
          f"{launched - _p50(results, 'expiry'):+.2f} s after the expiry (goal: TTL + 3 s)")
    print(f"    job start-up         {_p50(results, 'startup'):6.2f} s  (torchrun, torch "
          "imports, rendezvous, checkpoint load: the job's own)")
    print(f"    training again       {training:6.2f} s  = {training / ttl:.2f} x TTL; steps "
          f"lost p50 {_p50(results, 'steps_lost'):.0f} (a checkpoint every 10 steps)")
    if tiered:
        warm = _p50(tiered, "training")
        print(f"(a') hafo with tiered checkpoints ({len(tiered)} trials, p50):")
        print(f"    every member started {_p50(tiered, 'launched'):6.2f} s")
        print(f"    job start-up         {_p50(tiered, 'startup'):6.2f} s  (restore from RAM: "
              f"{_p50(tiered, 'from_peer'):.0f} rank from a peer's, "
              f"{_p50(tiered, 'from_disk'):.0f} from disk)")
        print(f"    training again       {warm:6.2f} s  = {warm / ttl:.2f} x TTL; steps lost "
              f"p50 {_p50(tiered, 'steps_lost'):.0f} max "
              f"{max(r['steps_lost'] for r in tiered):.0f} (a snapshot every step)")
    if warmed:
        again = _p50(warmed, "training")
        print(f"(a'') hafo warm: survivors kept, a standby on the spare ({len(warmed)} trials):")
        print(f"    every member running {_p50(warmed, 'launched'):6.2f} s  (handed over)")
        print(f"    job start-up         {_p50(warmed, 'startup'):6.2f} s  (rendezvous and "
              f"restore in the kept processes: {_p50(warmed, 'from_peer'):.0f} rank from a "
              "peer's RAM)")
        print(f"    training again       {again:6.2f} s  = {again / ttl:.2f} x TTL, max "
              f"{max(r['training'] for r in warmed):.2f} s (goal: TTL + 1.5 s = {ttl + 1.5:g} s); "
              f"{training / again:.2f}x faster than (a); steps lost p50 "
              f"{_p50(warmed, 'steps_lost'):.0f} max "
              f"{max(r['steps_lost'] for r in warmed):.0f}")
    print("(b) plain torchrun --nnodes 2:3 --max-restarts 3, c10d rendezvous on node 1:")
    for base in baselines:
        if base.time_to_train is None:
            print(f"    {base.scenario:<17} never trained again ({base.detail})")
        else:
            print(f"    {base.scenario:<17} training again {base.time_to_train:6.2f} s "
                  f"= {base.time_to_train / training:.1f} x hafo; steps lost "
                  f"{base.steps_lost}; {base.detail}")


def soak(minutes: float, every: float, ttl: int, baseline: bool) -> int:
    """The warm gang and plain torchrun, a node lost every ``every`` seconds."""
    if every <= 15:
        raise ValueError("--every-s must be above 15 (a node comes back 10 s after its cut)")
    warm = asyncio.run(soak_hafo(minutes, every, ttl))
    with tempfile.TemporaryDirectory(prefix="gang-soak-") as base:
        torchrun = soak_torchrun(minutes, every, Path(base)) if baseline else None
    print(f"\nA node powered off every {every:g} s for {minutes:g} min; effective training "
          "time = useful steps x step time / wall:")
    print(f"  hafo warm   {warm['ratio']:6.1%}  ({warm['useful_steps']:.0f} steps x "
          f"{warm['step_time'] * 1000:.0f} ms / {warm['wall']:.0f} s; {warm['cuts']:.0f} cuts, "
          f"{warm['warm_starts']:.0f} warm starts; goal >= 90%, torchft 81.2%)")
    if torchrun is not None:
        print(f"  torchrun    {torchrun['ratio']:6.1%}  ({torchrun['useful_steps']:.0f} steps x "
              f"{torchrun['step_time'] * 1000:.0f} ms / {torchrun['wall']:.0f} s; "
              f"{torchrun['cuts']:.0f} cuts)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--ttl", type=int, default=3)
    parser.add_argument("--baseline-timeout", type=float, default=90.0)
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--no-tiers", action="store_true",
                        help="skip (a'), the gang with tiered checkpoints")
    parser.add_argument("--no-warm", action="store_true",
                        help="skip (a''), the warm gang")
    parser.add_argument("--keep", metavar="DIR", help="run the cluster in DIR, keep its logs")
    parser.add_argument("--soak", type=float, metavar="MINUTES",
                        help="a node lost every --every-s seconds for MINUTES, warm vs torchrun")
    parser.add_argument("--every-s", type=float, default=60.0)
    args = parser.parse_args()
    configure("console", level="warning")
    if args.soak:
        return soak(args.soak, args.every_s, args.ttl, not args.no_baseline)
    results = asyncio.run(run_hafo(args.trials, args.ttl, args.keep))
    tiered = [] if args.no_tiers else asyncio.run(
        run_hafo(args.trials, args.ttl, f"{args.keep}-tiers" if args.keep else None, True))
    warm = [] if args.no_warm else asyncio.run(
        run_hafo(args.trials, args.ttl, f"{args.keep}-warm" if args.keep else None, warm=True))
    baselines = [] if args.no_baseline else [
        run_torchrun_baseline(lost, timeout=args.baseline_timeout)
        for lost in ("worker", "rendezvous-host")]
    report(results, args.ttl, baselines, tiered, warm)
    return 0


if __name__ == "__main__":
    run_main(main)
