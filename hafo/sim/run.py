"""``hafo sim``: run a fleet of simulated nodes until interrupted (or for ``--duration``),
crashing a fraction of them on a timer or on SIGUSR1."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time

import structlog

from hafo.sim.fleet import SimFleet
from hafo.stopping import on_signals
from hafo.store import EtcdStore, Keys

log = structlog.get_logger("hafo.sim")


async def run_sim(store: EtcdStore, keys: Keys, nodes: int, gpus_per_node: int, ttl: int,
                  heartbeat: float, kill_fraction: float, kill_after: float | None,
                  duration: float | None, prefix: str = "sim") -> int:
    """Register ``nodes`` simulated nodes and keep them alive; print one line per event."""
    fleet = SimFleet(store, keys, nodes, gpus_per_node, ttl, heartbeat, prefix)
    started = time.monotonic()
    await fleet.start()
    print(f"hafo sim: {nodes} nodes x {gpus_per_node} GPUs registered in "
          f"{time.monotonic() - started:.1f}s (lease TTL {ttl}s, heartbeat {heartbeat}s); "
          f"SIGUSR1 crashes {kill_fraction:.0%} of them", flush=True)
    kills = 0
    loop = asyncio.get_running_loop()

    def crash() -> None:
        nonlocal kills
        kills += 1
        victims = fleet.kill(kill_fraction, seed=kills)
        print(f"crashed {len(victims)} nodes ({', '.join(victims[:3])}"
              f"{', ...' if len(victims) > 3 else ''})", flush=True)

    if kill_after is not None:
        loop.call_later(kill_after, crash)
    runner = asyncio.create_task(fleet.run())
    try:
        with on_signals(crash, (signal.SIGUSR1,)):
            if duration is None:
                await runner
            else:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(runner), duration)
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await fleet.revoke_all()
        print(f"hafo sim: stopped; {sum(len(n.running) for n in fleet.nodes.values())} "
              "simulated instances were running", flush=True)
    return 0
