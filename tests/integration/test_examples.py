"""examples/train.py, a real PyTorch job, on a live cluster: moved with a checkpoint, it
resumes at exactly the step it stopped at; killed with its node, from its last checkpoint."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from hafo.store import intents

from .conftest import ClusterFactory
from .helpers import running, view

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]


def spec() -> dict[str, object]:
    return {"name": "train-mlp", "command": [sys.executable, "-u", "examples/train.py",
                                             "--every", "20", "--sleep", "0.01"],
            "gpus": 1, "stop_grace": 20, "workdir": str(ROOT)}


def outputs(cluster: object, node: str) -> str:
    state = cluster.node_handles[node].state_dir  # type: ignore[attr-defined]
    return "\n".join(p.read_text() for p in sorted(state.glob("**/output.log"))
                     + sorted(state.glob("logs/*.log")))


async def test_pytorch_job_resumes_exactly_after_a_planned_move(
        local_cluster: ClusterFactory) -> None:
    cluster = await local_cluster.start(nodes=2, controllers=1)
    wid = await cluster.submit(spec())
    snapshot = await cluster.wait_for(
        lambda s: running(wid)(s) and (view(s, wid)["checkpoint"] or {}).get("step", 0) >= 40,
        90, what="training with checkpoints")
    source = view(snapshot, wid)["node"]
    await intents.migrate(cluster.store, cluster.keys, wid)
    snapshot = await cluster.wait_for(running(wid, not_on=source), 60, what="moved")
    target = view(snapshot, wid)["node"]
    await cluster.wait_for(lambda s: "starting at step" in outputs(cluster, target), 60,
                           what="resumed output")
    stopped = re.findall(r"step (\d+): checkpointed for a planned move", outputs(cluster, source))
    resumed = re.findall(r"starting at step (\d+)", outputs(cluster, target))
    assert stopped and resumed and resumed[-1] == stopped[-1] and int(stopped[-1]) > 40
