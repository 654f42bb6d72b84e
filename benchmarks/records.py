"""Hot paths over model records, without etcd: decoding etcd values into records and one
reconcile cycle over a large snapshot (best of ``--repeat`` runs, CPU time of this process).

    python benchmarks/records.py --nodes 10000 --workloads 10000
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_main import run_main

from hafo.decisions.reconcile import reconcile
from hafo.model.cluster import (
    Assignment,
    CheckpointInfo,
    ClusterSnapshot,
    Gpu,
    InstanceStatus,
    Liveness,
    NodeRecord,
    Submission,
)
from hafo.model.spec import parse_spec
from hafo.store import codec

GPUS = 8


def best(repeat: int, fn: Callable[[], object]) -> float:
    """The fastest of ``repeat`` runs, in seconds of process CPU time."""
    times = []
    for _ in range(repeat):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return min(times)


def node(i: int) -> NodeRecord:
    name = f"node-{i:05d}"
    return NodeRecord(name=name, labels={"rack": f"r{i % 40}", "zone": f"z{i % 3}"},
                      gpus=tuple(Gpu(index=g, uuid=f"GPU-{name}-{g}",
                                     model="NVIDIA H100 80GB HBM3", memory_mib=81559,
                                     utilization=12.5) for g in range(GPUS)),
                      api=f"http://10.0.{i // 250}.{i % 250}:8601", lease=7000 + i)


def spec_dict(i: int) -> dict[str, object]:
    return {"name": f"w{i}", "command": ["python", "train.py", "--rank", str(i)], "gpus": 1,
            "env": {"EPOCHS": 100}, "restart": {"max_restarts": 3, "window": 600},
            "checks": [{"type": "progress", "stall_after": 60}], "priority": i % 5}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--workloads", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    n, w = args.nodes, args.workloads

    nodes = [node(i) for i in range(n)]
    specs = [parse_spec(spec_dict(i)) for i in range(w)]
    wids = [f"w{i}-{i:06x}" for i in range(w)]
    ids = [(wid, nodes[i % n].name, i % GPUS) for i, wid in enumerate(wids)]
    assignments = [Assignment(workload=wid, phase="placed", node=host, gpus=(gpu,),
                              epoch=1000 + i, restart_times=(5.0,), avoid={"node-x": 9.0})
                   for i, (wid, host, gpu) in enumerate(ids)]
    statuses = [InstanceStatus(workload=wid, node=host, epoch=1000 + i, state="running",
                               pid=4000 + i, started_at=100.0,
                               checkpoint=CheckpointInfo(step=i, epoch=1000 + i,
                                                         path=f"/ck/{wid}/ckpt-e{i}-s{i}"))
                for i, (wid, host, _gpu) in enumerate(ids)]
    subs = [Submission(id=wid, spec=spec, submitted_at=float(i))
            for i, (wid, spec) in enumerate(zip(wids, specs, strict=True))]

    node_values = [codec.encode(r.to_dict()) for r in nodes]
    status_values = [codec.encode(s.to_dict()) for s in statuses]
    assign_values = [codec.encode(a.to_dict()) for a in assignments]
    sub_values = [codec.encode_submission(s) for s in subs]

    results = {
        f"decode {n} nodes": best(args.repeat, lambda: [codec.decode_node(v)
                                                        for v in node_values]),
        f"decode {w} statuses": best(args.repeat, lambda: [codec.decode_status(v)
                                                           for v in status_values]),
        f"decode {w} assignments": best(args.repeat, lambda: [
            codec.decode_assignment(v, 1) for v in assign_values]),
        f"decode {w} submissions": best(args.repeat, lambda: [codec.decode_submission(v)
                                                               for v in sub_values]),
    }
    assert [codec.decode_node(v) for v in node_values] == nodes
    assert [codec.decode_status(v) for v in status_values] == statuses

    # Steady state: every workload placed and running, plus 10% new ones to place.
    extra = [Submission(id=f"new{i}-{i:06x}", spec=specs[i], submitted_at=1e6 + i)
             for i in range(w // 10)]
    snapshot = ClusterSnapshot(
        revision=10**6, nodes={r.name: r for r in nodes},
        alive={r.name: Liveness(node=r.name, lease=r.lease, since=0.0) for r in nodes},
        cordoned=frozenset(), workloads={s.id: s for s in [*subs, *extra]},
        assignments={a.workload: a for a in assignments},
        statuses={(s.workload, s.node): s for s in statuses})

    def cycle() -> None:
        # a fresh snapshot copy each run: cached properties are computed per snapshot
        reconcile(ClusterSnapshot(**{f: getattr(snapshot, f) for f in (
            "revision", "nodes", "alive", "cordoned", "workloads", "assignments",
            "statuses")}), now=2e6)

    results[f"reconcile {n} nodes x {w + len(extra)} workloads"] = best(args.repeat, cycle)

    # The same cycle over records decoded from their etcd values, as the controller has them.
    nodes = [codec.decode_node(v) for v in node_values]
    decoded = ClusterSnapshot(
        revision=10**6, nodes={r.name: r for r in nodes},
        alive={r.name: Liveness(node=r.name, lease=r.lease, since=0.0) for r in nodes},
        cordoned=frozenset(),
        workloads={s.id: s for s in [*(codec.decode_submission(v) for v in sub_values),
                                     *extra]},
        assignments={a.workload: a for a in (codec.decode_assignment(v, 1000 + i)
                                             for i, v in enumerate(assign_values))},
        statuses={(s.workload, s.node): s for s in (codec.decode_status(v)
                                                    for v in status_values)})
    assert decoded.assignments == snapshot.assignments and decoded.statuses == snapshot.statuses
    snapshot = decoded
    results[f"reconcile, decoded records ({n} x {w + len(extra)})"] = best(args.repeat, cycle)
    for what, seconds in results.items():
        print(f"{what:45s} {seconds * 1000:9.1f} ms")


if __name__ == "__main__":
    run_main(main)
