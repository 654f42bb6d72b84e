"""The examples on a live cluster: every example spec in examples/, as shipped, submitted
with `hafo submit` on `hafo dev` runs and makes progress; examples/train.py, a real PyTorch job,
moved with a checkpoint, resumes at exactly the step it stopped at."""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hafo.store import intents

from .conftest import ClusterFactory
from .helpers import running, view
from .test_dev import DevProcess, assert_all_gone, clean_env, dev_processes

__all__ = ["dev_processes"]  # the fixture, used below

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


# --- every example spec, as shipped, on the cluster the README starts ----------------------

def _checkpointed(step: int) -> Callable[[dict[str, Any]], bool]:
    return lambda v: (v["checkpoint"] or {}).get("step", 0) >= step


def _ready(replicas: int) -> Callable[[dict[str, Any]], bool]:
    return lambda v: (v["replicas"] or {}).get("ready", 0) >= replicas


#: what each example spec must show, once submitted, to count as working: its name and a
#: predicate on its `hafo workloads --json` view (real progress or readiness, not a state
#: that a crash loop also passes through)
SHIPPED: dict[str, tuple[str, Callable[[dict[str, Any]], bool], str]] = {
    "counter.yaml": ("counter", _checkpointed(10), "a checkpoint at step 10"),
    "train.yaml": ("train-mlp", _checkpointed(20), "a checkpoint at step 20"),
    "ddp.yaml": ("ddp-train", _checkpointed(10), "a gang checkpoint at step 10"),
    "warm.yaml": ("warm-train", _checkpointed(10), "a warm gang's checkpoint at step 10"),
    "service.yaml": ("web", _ready(3), "3 replicas ready"),
    "openai-service.yaml": ("llm", _ready(2), "2 replicas ready"),
}
#: example specs that cannot run on a simulated cluster, with the reason (none)
NOT_ON_A_LOCAL_CLUSTER: dict[str, str] = {}
CONFIGS = {"agent.yaml", "controller.yaml"}
SUBMIT_TIMEOUT = 90


class DevElsewhere(DevProcess):
    """`hafo dev` started outside the repository: a spec that depends on the agents' working
    directory fails here."""

    def __init__(self, cwd: Path) -> None:  # DevProcess's, in another directory
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hafo", "dev"], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, env=clean_env(), cwd=cwd,
            start_new_session=True)
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.seen: set[int] = set()
        threading.Thread(target=self._read, daemon=True).start()


def views(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    done = subprocess.run([sys.executable, "-m", "hafo", "workloads", "--json"],
                          capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return {v["name"]: v for v in json.loads(done.stdout)}


def test_every_example_spec_is_listed_here() -> None:
    specs = {p.name for p in (ROOT / "examples").glob("*.yaml")} - CONFIGS
    assert specs == set(SHIPPED) | set(NOT_ON_A_LOCAL_CLUSTER), \
        "an example spec this test does not run (or list with its reason)"
    for name, reason in NOT_ON_A_LOCAL_CLUSTER.items():
        first = (ROOT / "examples" / name).read_text().splitlines()[0]
        assert reason in first, f"examples/{name}'s first comment line must say: {reason}"


@pytest.mark.timeout(360)
def test_every_example_runs_as_shipped_on_hafo_dev(dev_processes: list[DevProcess],
                                                   tmp_path: Path) -> None:
    """`hafo dev` (its own Python first on the cluster's PATH, not activated, started outside
    the repository), then `hafo submit examples/X.yaml --wait` from the repository root for
    every example at once: each runs and makes real progress, without a restart."""
    dev = DevElsewhere(tmp_path)
    dev_processes.append(dev)
    env = dev.ready()
    started = time.monotonic()
    submits = {name: subprocess.Popen(
        [sys.executable, "-m", "hafo", "submit", f"examples/{name}", "--wait", "--timeout",
         str(SUBMIT_TIMEOUT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env, cwd=ROOT) for name in SHIPPED}
    for name, proc in submits.items():
        _, err = proc.communicate(timeout=SUBMIT_TIMEOUT + 30)
        assert proc.returncode == 0, f"hafo submit examples/{name}: {proc.returncode}\n{err}"
    waiting = dict(SHIPPED)
    deadline = time.monotonic() + 120  # a bound for liveness: torch jobs on 2 busy cores
    while waiting:
        now = views(env)
        for name, (workload, shows, _) in list(waiting.items()):
            view = now[workload]
            assert view["restarts"] == 0 and view["state"] not in ("failed", "completed"), \
                f"examples/{name}: {view['state']}, {view['restarts']} restart(s): " \
                f"{view['reason']}\n{view['stderr_tail']}"
            if shows(view):
                del waiting[name]
        if not waiting:
            break  # the last one showed progress in this round, however late it came
        assert time.monotonic() < deadline, "no progress: " + ", ".join(
            f"examples/{n} ({what})" for n, (_, _, what) in waiting.items())
        time.sleep(0.5)
    took = time.monotonic() - started
    shown = subprocess.run([sys.executable, "-m", "hafo", "show", "train-mlp", "--json"],
                           capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert json.loads(shown.stdout)["spec"]["workdir"] == str(ROOT)  # `workdir: ..` resolved
    print(f"every example running with progress {took:.1f}s after the submits")
    pids = set(dev.track())
    assert dev.stop(signal.SIGINT) == 0, dev.output
    assert_all_gone(pids)
