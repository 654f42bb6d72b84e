"""``python -m hafo.chaos --seed 1 --faults 100``: the chaos suite (see hafo.chaos.runner)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from hafo.chaos.faults import FAULT_KINDS
from hafo.chaos.runner import ChaosReport, run_chaos
from hafo.logs import configure
from hafo.stopping import cancel_on_signals


def main(argv: list[str] | None = None) -> int:
    """Run, print the per-fault table, exit 1 on any violation."""
    parser = argparse.ArgumentParser(prog="python -m hafo.chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", type=int, default=18)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--workloads", type=int, default=4)
    parser.add_argument("--gangs", type=int, default=1, help="2-member gangs beside them")
    parser.add_argument("--services", type=int, default=1,
                        help="2-replica services beside them")
    parser.add_argument("--profile", choices=("default", "fast"), default="default",
                        help="the cluster's timing profile (fast: lease TTL 1 s)")
    parser.add_argument("--keep", metavar="DIR", help="run in DIR and keep every log")
    parser.add_argument("--kinds", metavar="KIND,...",
                        help="draw the faults from these kinds only (default: all of "
                        f"{', '.join(FAULT_KINDS)})")
    args = parser.parse_args(argv)
    only = [k.strip() for k in args.kinds.split(",") if k.strip()] if args.kinds else None
    unknown = sorted(set(only or ()) - set(FAULT_KINDS))
    if unknown or (args.kinds is not None and not only):
        parser.error(f"--kinds: unknown fault kinds {', '.join(unknown) or '(none given)'}")
    configure("console", level="warning")

    async def run() -> ChaosReport:
        task = asyncio.ensure_future(run_chaos(
            args.seed, args.faults, nodes=args.nodes, workloads=args.workloads, gangs=args.gangs,
            services=args.services, only_kinds=only, profile=args.profile,
            base_dir=Path(args.keep) if args.keep else None, keep=bool(args.keep)))
        with cancel_on_signals(task):  # SIGTERM, SIGINT: tear the cluster down, by pid
            return await task

    try:
        report = asyncio.run(run())
    except asyncio.CancelledError:
        print("interrupted; cluster stopped", file=sys.stderr)
        return 130
    except (TimeoutError, OSError) as exc:  # the cluster never came up, or a port was taken
        print(f"hafo.chaos: {exc}; cluster stopped", file=sys.stderr)
        return 2
    print(report.table())
    for overlap in report.overlaps:
        print(f"overlap: {overlap}")
    for sighting in report.concurrent[:20]:
        print(f"concurrent: {sighting}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
