"""What a progress log says about a move (``hafo.local.progress.resumption``), which the demo
prints as "resumed from" and "lost" (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from hafo.local.progress import Resumption, resumption


def start(epoch: int, resumed_from: int) -> dict[str, Any]:
    return {"workload": "w", "epoch": epoch, "t": 0.0, "event": "start",
            "resumed_from": resumed_from}


def step(epoch: int, n: int, event: str = "step") -> dict[str, Any]:
    return {"workload": "w", "epoch": epoch, "t": 0.0, "event": event, "step": n}


@pytest.mark.parametrize(("lines", "expected"), [
    pytest.param([start(1, 0), *[step(1, n) for n in range(1, 35)], step(1, 30, "checkpoint"),
                  start(2, 30), step(2, 31)],
                 Resumption(1, 2, 34, 30), id="failover-after-checkpoint-30"),
    pytest.param([start(1, 0), *[step(1, n) for n in range(1, 35)]],
                 Resumption(1, 2, 34, None), id="new-epoch-not-started-yet"),
    pytest.param([start(1, 0), step(1, 5), step(2, 7)],
                 Resumption(1, 2, 5, None), id="a-step-is-not-a-start-record"),
    pytest.param([start(2, 40)], Resumption(1, 2, None, 40), id="old-epoch-never-logged"),
    pytest.param([start(1, 20), start(2, 20)], Resumption(1, 2, 20, 20),
                 id="old-epoch-died-before-its-first-step"),
    pytest.param([start(1, 0), step(1, 12), start(2, 10), step(2, 11), start(3, 10)],
                 Resumption(1, 2, 12, 10), id="later-epochs-ignored"),
    pytest.param([start(1, 0), step(1, 3), start(2, 0)], Resumption(1, 2, 3, 0),
                 id="no-checkpoint-yet-resumes-from-0"),
])
def test_resumption(lines: list[dict[str, Any]], expected: Resumption) -> None:
    assert resumption(lines, 1, 2) == expected


@pytest.mark.parametrize(("last", "resumed", "lost"), [
    (34, 30, 4), (30, 30, 0), (None, 30, None), (34, None, None), (5, 10, 0)])
def test_lost_steps(last: int | None, resumed: int | None, lost: int | None) -> None:
    assert Resumption(1, 2, last, resumed).lost == lost
