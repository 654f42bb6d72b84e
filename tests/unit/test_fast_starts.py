"""Starts on the paths the fast timing profile's budget counts (measured with ``python -X
importtime``):

- the guard's: a moved workload runs once its guard has imported and spawned it, so it must
  not import the spec's schema, pydantic, the checkpoint SDK or its CRC library (0.3 s
  together on a 2-core VM);
- a restarted agent's, to its first keepalive (``hafo.agent.early_renewal``): no structlog and
  rich (0.1 s), pydantic, yaml or the agent itself before it; and the ``LeaseBridge`` that
  renews on until the claim."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hafo.agent.early_renewal import LeaseBridge
from hafo.agent.fencefile import FENCE_FILE, read_deadline, write_deadline
from hafo.agent.renewal_brief import RenewalBrief

HEAVY = ("pydantic", "crc32c", "hafo.model.spec", "hafo.checkpoint", "structlog", "yaml",
         "asyncio")


EARLY_HEAVY = ("structlog", "rich", "pydantic", "yaml", "aiohttp", "hafo.agent.daemon",
               "hafo.model.config")


def loaded(code: str, names: tuple[str, ...]) -> list[str]:
    """Which of ``names`` a fresh interpreter has imported after running ``code``."""
    probe = f"{code}\nimport sys\nprint(','.join(m for m in {names!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True)
    return [m for m in done.stdout.strip().split(",") if m]


def test_the_guard_imports_none_of_the_heavy_modules() -> None:
    assert loaded("import hafo.agent.guard", HEAVY) == []


def test_a_restarted_agent_imports_nothing_heavy_before_its_first_keepalive() -> None:
    code = ("import hafo.cli\nhafo.cli.build_parser()\n"
            "import hafo.commands.agent, hafo.agent.main, hafo.agent.early_renewal")
    assert loaded(code, EARLY_HEAVY) == []


class FakeStore:
    """A store whose keepalives answer ``ttl`` (a list: one value per call, the last one
    repeated) and count."""

    def __init__(self, ttls: list[int]) -> None:
        self.ttls = ttls
        self.calls = 0
        self.closed = False

    async def keepalive(self, lease: int, timeout: float) -> int:
        assert lease == 7
        self.calls += 1
        await asyncio.sleep(0)
        return self.ttls[min(self.calls, len(self.ttls)) - 1]

    async def close(self) -> None:
        self.closed = True


def bridge_for(tmp_path: Path, store: FakeStore, limit: float = 20.0) -> LeaseBridge:
    brief = RenewalBrief(endpoints=("http://127.0.0.1:1",), heartbeat=0.05, fence_margin=0.2)
    fake: Any = store
    return LeaseBridge(tmp_path, 7, brief, lambda: fake, limit=limit)


def wait_until(check: Any, seconds: float = 5.0) -> None:
    end = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_the_bridge_renews_and_publishes_until_stopped_then_writes_nothing(
        tmp_path: Path) -> None:
    write_deadline(tmp_path, time.monotonic() + 0.5)
    store = FakeStore([1])
    bridge = bridge_for(tmp_path, store)
    bridge.start()
    wait_until(lambda: bridge.renewals >= 3)
    published = read_deadline(tmp_path / FENCE_FILE)
    assert time.monotonic() + 0.6 < published <= time.monotonic() + 0.8  # sent + 1 - 0.2
    bridge.stop()
    written = (tmp_path / FENCE_FILE).read_text()
    renewals = bridge.renewals
    time.sleep(0.3)  # six heartbeats
    assert (tmp_path / FENCE_FILE).read_text() == written
    assert bridge.renewals == renewals
    bridge.join(5)
    assert store.closed


@pytest.mark.parametrize(("ttls", "limit", "why"), [
    pytest.param([1, 1, -1], 20.0, "lease gone", id="lease-gone"),
    pytest.param([1], 0.3, "limit", id="limit"),
])
def test_the_bridge_ends_by_itself(tmp_path: Path, ttls: list[int], limit: float,
                                   why: str) -> None:
    write_deadline(tmp_path, time.monotonic() + 0.5)
    store = FakeStore(ttls)
    bridge = bridge_for(tmp_path, store, limit=limit)
    bridge.start()
    bridge.join(5)
    assert store.closed, why
    calls = store.calls
    time.sleep(0.2)
    assert store.calls == calls
    if why == "lease gone":
        assert (calls, bridge.renewals) == (3, 2)
