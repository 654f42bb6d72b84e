"""The dashboard at ``GET /`` in a real headless Chromium (Debian's ``chromium`` package).

1. Against a fake read API served in-process: hostile strings (labels, names, messages) stay
   text, GPU squares carry their state (a degraded one marked and counted), pending and failed
   workloads show why in their rows (bounded, the whole text in the tooltip) and their GPUs as
   allocated/requested, the queues panel lists each queue's quota and usage, and when the API
   then fails the page keeps the last data and shows an error banner.
2. Against a live local cluster (etcd, 2 controllers, 2 agents, two queues in a cohort): the
   page of a controller shows the leader, every node, every running workload, a workload that
   needs more GPUs than exist as pending with its reason and ``0/N`` GPUs, a degraded GPU
   marked and counted, and the queues panel with the borrower's, the lender's and the waiting
   work's GPUs; a screenshot is taken.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from hafo.api.dashboard import add_dashboard
from hafo.local.cluster import LocalCluster, demo_workload_spec
from hafo.model.queues import QueueSpec
from hafo.model.views import workload_view
from hafo.store import intents
from tests.e2e.chromium import chromium, dump_dom, screenshot

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


# -- 1. a fake API: hostile data, GPU states, API failure ----------------------------------

HOSTILE = '<img src=x onerror="document.body.dataset.pwned=1">'
PENDING_REASON = "needs 64 free healthy GPUs on one node; the largest free is 2 on node-a"
FAILED_REASON = ("exited with code 1 on node-a: " + "Traceback: ValueError bad input " * 12
                 ).strip()
MAX_REASON = 160  # the page's MAX_REASON


def serialized(text: str, attribute: bool = False) -> str:
    """``text`` as the browser serializes the DOM: in an attribute only ``&``, ``"`` and NBSP
    are escaped, in text ``&``, ``<``, ``>`` and NBSP (HTML's serialization algorithm)."""
    out = text.replace("&", "&amp;").replace("\xa0", "&nbsp;")
    if attribute:
        return out.replace('"', "&quot;")
    return out.replace("<", "&lt;").replace(">", "&gt;")


def reason_cell(dom: str, workload: str) -> str:
    """The serialized row of ``workload`` (its ``<tr ...>`` up to the next ``</tr>``)."""
    start = dom.index(f'data-workload="{workload}"')
    return dom[start:dom.index("</tr>", start)]


def queue_row(dom: str, queue: str) -> str:
    """The serialized row of ``queue`` in the queues panel."""
    start = dom.index(f'<tr data-queue="{queue}">')
    return dom[start:dom.index("</tr>", start)]


def gpu_cell(kind: str, value: float) -> str:
    """A queue row's cell of ``kind`` as the page serializes it."""
    shown = str(round(value)) if value == round(value) else f"{value:.2f}"
    return f'data-kind="{kind}" data-value="{value:g}">{shown}</td>'


def usage(used: float = 0, borrowed: float = 0, lent: float = 0, pending: float = 0,
          share: float = 0) -> dict[str, float]:
    return {"used": used, "borrowed": borrowed, "lent": lent, "pending": pending,
            "share": share}


def fake_api_app(hits: dict[str, int]) -> web.Application:
    """The dashboard plus a read API that answers each path once, then fails with 503."""
    gpus = [
        {"index": 0, "uuid": "GPU-a-0", "model": "NVIDIA H100", "memory_mib": 81559,
         "healthy": True, "allocated_to": None},
        {"index": 1, "uuid": "GPU-a-1", "model": "NVIDIA H100", "memory_mib": 81559,
         "healthy": True, "allocated_to": "job-1"},
        {"index": 2, "uuid": "GPU-a-2", "model": "NVIDIA H100", "memory_mib": 81559,
         "healthy": False, "allocated_to": None},
        {"index": 3, "uuid": "GPU-a-3", "model": "NVIDIA H100", "memory_mib": 81559,
         "healthy": True, "degraded": True, "reason": "xid 63: row remap pending",
         "allocated_to": None},
    ]
    bodies: dict[str, Any] = {
        "/readyz": {"status": "ready", "controller": "ctl-fake"},
        "/v1/status": {"leader": "ctl-fake", "controllers": ["ctl-fake"],
                       "nodes": {"ready": 1, "cordoned": 0, "unhealthy": 0, "down": 1},
                       "workloads": {"pending": 0, "starting": 0, "running": 1, "stopping": 0,
                                     "completed": 0, "failed": 0}},
        "/v1/nodes": [
            {"name": "node-a", "state": "ready", "labels": {"zone": HOSTILE}, "gpus": gpus,
             "workloads": ["job-1"]},
            {"name": "node-b", "state": "down", "labels": {}, "gpus": [], "workloads": []},
        ],
        "/v1/workloads": [
            {"id": "job-1", "name": "<script>document.body.dataset.pwned=1</script>",
             "state": "running", "node": "node-a", "epoch": 42, "restarts": 1,
             "gpus": ["GPU-a-1"], "checkpoint": {"step": 1234, "epoch": 41, "path": "/ck"}},
            {"id": "gang-1", "name": "ddp", "state": "running", "node": "node-a", "epoch": 7,
             "restarts": 0, "gpus": ["GPU-a-0"], "checkpoint": None, "nodes": 2,
             "members": [{"rank": 0, "node": "node-a", "state": "running", "gpus": ["GPU-a-0"]},
                         {"rank": 1, "node": HOSTILE, "state": "starting", "gpus": ["GPU-x"]}]},
            {"id": "web-abcdef", "name": "web", "state": "degraded", "node": None, "epoch": None,
             "restarts": 0, "gpus": [], "checkpoint": None, "nodes": 1, "members": [],
             "replicas": {"desired": 3, "ready": 1, "current": 2, "items": [
                 {"id": "web-abcdef.0", "node": "node-a", "state": "running", "ready": True,
                  "current": True, "retiring": False, "restarts": 0, "reason": ""},
                 {"id": "web-abcdef.1", "node": HOSTILE, "state": "starting", "ready": False,
                  "current": True, "retiring": False, "restarts": 0, "reason": ""}]}},
            {"id": "big-1", "name": "big", "state": "pending", "node": None, "epoch": None,
             "restarts": 0, "gpus": [], "gpus_requested": 64, "checkpoint": None, "nodes": 1,
             "members": [], "replicas": None, "reason": PENDING_REASON},
            {"id": "crash-1", "name": "crash", "state": "failed", "node": None, "epoch": None,
             "restarts": 3, "gpus": [], "gpus_requested": 1, "checkpoint": None, "nodes": 1,
             "members": [], "replicas": None, "reason": FAILED_REASON},
        ],
        "/v1/queues": [
            {"name": "team-a", "gpus": 4, "cohort": "pool", "borrowing_limit": None,
             "lending_limit": None, "weight": 1.0, "workloads": [],
             "usage": usage(lent=2)},
            {"name": "team-b", "gpus": 4, "cohort": "pool", "borrowing_limit": 2,
             "lending_limit": None, "weight": 2.0, "workloads": ["job-1", "big-1"],
             "usage": usage(used=6, borrowed=2, pending=64, share=0.125)},
            {"name": "free", "gpus": None, "cohort": None, "borrowing_limit": None,
             "lending_limit": None, "weight": 1.0, "workloads": ["crash-1"],
             "usage": usage(used=0.43)},
        ],
        "/v1/events": [
            {"ts": time.time() - 5, "kind": "placed", "message": HOSTILE, "workload": "job-1",
             "node": "node-a", "epoch": 42},
        ],
    }

    async def answer(request: web.Request) -> web.Response:
        hits[request.path] = hits.get(request.path, 0) + 1
        if hits[request.path] > 1:
            return web.json_response({"error": "etcd unavailable"}, status=503)
        return web.json_response(bodies[request.path])

    app = web.Application()
    add_dashboard(app)
    for path in bodies:
        app.router.add_get(path, answer)
    return app


async def test_dashboard_renders_safely_and_keeps_data_when_the_api_fails(
        tmp_path: Path) -> None:
    hits: dict[str, int] = {}
    async with TestServer(fake_api_app(hits), host="127.0.0.1") as server:
        dom, _console = await dump_dom(str(server.make_url("/")), tmp_path / "chromium")
    assert hits.get("/v1/events", 0) >= 2, f"the page did not refresh: {hits}"
    assert 'data-loaded="1"' in dom, dom[-3000:]
    # the first answers are still on the page ...
    for needle in ('data-node="node-a"', 'data-node="node-b"', 'data-workload="job-1"',
                   "ctl-fake", "step 1234"):
        assert needle in dom, f"{needle} missing from the page"
    assert 'data-state="free"' in dom and 'data-state="allocated"' in dom
    assert 'data-state="unhealthy"' in dom
    assert 'data-gpus="allocated" data-count="1"' in dom
    # a gang: one line per member, rank:node and its state
    assert 'data-workload="gang-1"' in dom and 'data-members="2"' in dom
    assert "0:node-a" in dom and "1:&lt;img src=x" in dom
    # a service: how many ready, then one line per replica
    assert 'data-workload="web-abcdef"' in dom and 'data-replicas="2"' in dom
    assert "1 of 3 ready" in dom and 'data-state="degraded"' in dom
    # a pending workload: its reason in the row, and 0 of the 64 GPUs it requested
    row = reason_cell(dom, "big-1")
    assert f'<div class="reason warn" title="{PENDING_REASON}">{PENDING_REASON}</div>' in row
    assert 'data-allocated="0" data-requested="64">0/64</td>' in row
    # a failed one: its (long) reason cut to MAX_REASON characters, all of it in the tooltip
    row = reason_cell(dom, "crash-1")
    shown = FAILED_REASON[:MAX_REASON - 1] + "\u2026"
    assert f'<div class="reason bad" title="{FAILED_REASON}">{shown}</div>' in row
    assert ">0/1</td>" in row
    # a degraded GPU: marked (and still free/allocated underneath), counted on the GPU card
    assert 'class="gpu degraded" data-gpu="3" data-state="free" data-degraded="1"' in dom
    assert 'data-gpus="degraded" data-count="1"' in dom
    assert 'data-gpus="healthy" data-count="2"' in dom
    # the queues: shown (the panel is hidden without any), each row its quota and usage
    assert '<section class="panel" id="queues-panel">' in dom
    assert dom.index('data-queue="team-a"') < dom.index('data-queue="team-b"') \
        < dom.index('data-queue="free"')
    row = queue_row(dom, "team-b")
    for cell in (gpu_cell("used", 6), gpu_cell("borrowed", 2), gpu_cell("lent", 0),
                 gpu_cell("pending", 64)):
        assert cell in row, (cell, row)
    assert 'data-kind="nominal">4</td>' in row and 'data-kind="share">0.125</td>' in row
    assert ">pool</td>" in row and "borrows at most 2" in row
    assert gpu_cell("lent", 2) in queue_row(dom, "team-a")
    row = queue_row(dom, "free")
    assert 'data-kind="nominal">no quota</td>' in row and gpu_cell("used", 0.43) in row
    # ... and the failures since are announced in the banner
    assert '<div id="error" role="alert">' in dom, "error banner not shown"
    assert "HTTP 503 (etcd unavailable) on every request" in dom
    assert "Showing the data of" in dom
    # hostile strings are text, never markup
    assert "&lt;img src=x onerror=" in dom
    assert "&lt;script&gt;document.body.dataset.pwned=1&lt;/script&gt;" in dom
    assert "<img" not in dom and "data-pwned" not in dom


# -- 2. a live local cluster ------------------------------------------------------------------


def get_json(port: int, path: str) -> Any:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


async def eventually(port: int, path: str, check: Callable[[Any], bool],
                     timeout: float = 15.0) -> Any:
    """GET until ``check(body)``: a controller's cache follows etcd a moment later."""
    deadline = time.monotonic() + timeout
    while True:
        body = await asyncio.to_thread(get_json, port, path)
        if body is not None and check(body):
            return body
        assert time.monotonic() < deadline, f"{path} on {port} never satisfied: {body}"
        await asyncio.sleep(0.1)


async def test_dashboard_on_a_live_cluster(local_cluster: Any, tmp_path: Path) -> None:
    chromium()  # fail first, before minutes of cluster start, when it is missing
    cluster: LocalCluster = await local_cluster.start(nodes=2, controllers=2)
    # two teams of 2 GPUs each in one cohort (and the default queue, without a quota):
    # team-b borrows 1 of the idle team-a's quota, and its next job waits for quota
    for queue in (QueueSpec(name="team-a", gpus=2, cohort="pool"),
                  QueueSpec(name="team-b", gpus=2, cohort="pool"), QueueSpec(name="default")):
        await intents.set_queue(cluster.store, cluster.keys, queue)
    await cluster.wait_for(lambda s: len(s.queues) == 3, 15, what="the queues declared")
    borrower = await cluster.submit({**demo_workload_spec(name="b-borrow", gpus=3),
                                     "queue": "team-b"})
    await cluster.wait_for(lambda s: workload_view(s, borrower)["state"] == "running", 30,
                           what="team-b borrows")  # first: 3 GPUs on one node
    waiting = await cluster.submit({**demo_workload_spec(name="b-wait", gpus=2),
                                    "queue": "team-b"})
    ids = [await cluster.submit(demo_workload_spec(name="train-a", gpus=1)),
           await cluster.submit(demo_workload_spec(name="train-b", gpus=2)), borrower]
    # more GPUs than the cluster has (2 nodes of 4): pending, with the controller's reason
    big = await cluster.submit(demo_workload_spec(name="too-big", gpus=64))

    def running_with_checkpoints(snapshot: Any) -> bool:
        views = [workload_view(snapshot, wid) for wid in ids]
        return all(v["state"] == "running" and v["checkpoint"] for v in views)

    snapshot = await cluster.wait_for(running_with_checkpoints, 30, what="both running")
    leader = snapshot.leader
    assert leader is not None
    # faults on GPUs no workload holds (nothing moves), so the page shows every GPU state:
    # xid 48 (double-bit ECC) drains the GPU, xid 63 (row remap pending) marks it degraded
    busy = {(v["node"], g) for v in (workload_view(snapshot, w) for w in ids) for g in v["gpus"]}
    free = [(n, g.index) for n in sorted(snapshot.nodes) for g in snapshot.nodes[n].gpus
            if (n, g.uuid) not in busy]
    cluster.inject_fault(*free[0], xid=48)
    cluster.inject_fault(*free[1], xid=63)

    standby = next(n for n in cluster.controller_handles if n != leader)
    port = cluster.controller_handles[standby].api_port  # any controller serves the page
    await eventually(port, "/v1/workloads", lambda ws: sorted(
        w["id"] for w in ws if w["state"] == "running") == sorted(ids))
    await eventually(port, "/v1/nodes", lambda ns: any(
        not g["healthy"] for n in ns for g in n["gpus"]) and any(
        g.get("degraded") for n in ns for g in n["gpus"]))
    await eventually(port, "/v1/status", lambda s: s["leader"] == leader)
    pending = await eventually(port, "/v1/workloads", lambda ws: any(
        w["id"] == big and w["state"] == "pending" and w["reason"] not in (
            "", "waiting for the controller") for w in ws))
    reason = next(w["reason"] for w in pending if w["id"] == big)
    assert any(w["id"] == waiting and w["state"] == "pending" for w in pending)
    await eventually(port, "/v1/queues", lambda qs: {q["name"]: q["usage"]["pending"]
                                                     for q in qs} == {"team-a": 0,
                                                                      "team-b": 2,
                                                                      "default": 64})
    url = f"http://127.0.0.1:{port}/"

    dom, console = await dump_dom(url, tmp_path / "chromium")
    assert not console, f"the page logged: {console}"  # no failed request, no error
    assert 'data-loaded="1"' in dom, dom[-3000:]
    assert '<div id="error" role="alert" hidden=""></div>' in dom, "error banner shown"
    assert re.search(f'id="leader"[^>]*>{leader}</div>', dom), "leader missing"
    assert f"served by {standby}" in dom
    for node in cluster.node_handles:
        assert f'data-node="{node}"' in dom, f"node {node} missing"
    for wid in ids:
        assert f'data-workload="{wid}" data-state="running"' in dom, f"workload {wid} missing"
    assert 'data-state="allocated"' in dom and 'data-state="unhealthy"' in dom
    assert 'class="gpu degraded"' in dom and 'data-gpus="unhealthy" data-count="1"' in dom
    assert 'data-gpus="allocated" data-count="6"' in dom
    # the degraded GPU: striped (data-degraded) and counted on the GPU card
    assert dom.count('data-degraded="1"') == 1
    assert 'data-gpus="degraded" data-count="1"' in dom
    assert 'data-gpus="healthy" data-count="6"' in dom  # 8 - 1 unhealthy - 1 degraded
    # the pending workload: its reason in its row (not only a tooltip) and 0 of 64 GPUs
    row = reason_cell(dom, big)
    assert 'data-state="pending"' in row
    shown = reason if len(reason) <= MAX_REASON else reason[:MAX_REASON - 1] + "\u2026"
    assert f'<div class="reason warn" title="{serialized(reason, attribute=True)}">' \
           f"{serialized(shown)}</div>" in row, (reason, row)
    assert 'data-allocated="0" data-requested="64">0/64</td>' in row
    # the queues panel: team-b uses 3 of its 2 (1 borrowed from team-a's idle quota) and its
    # next job waits for 2; team-a lends 1; default has no quota (its jobs: 3, and 64 waiting)
    assert '<section class="panel" id="queues-panel">' in dom
    row = queue_row(dom, "team-b")
    for cell in ('data-kind="nominal">2</td>', gpu_cell("used", 3), gpu_cell("borrowed", 1),
                 gpu_cell("lent", 0), gpu_cell("pending", 2), ">pool</td>"):
        assert cell in row, (cell, row)
    row = queue_row(dom, "team-a")
    for cell in ('data-kind="nominal">2</td>', gpu_cell("used", 0), gpu_cell("borrowed", 0),
                 gpu_cell("lent", 1), gpu_cell("pending", 0), ">pool</td>"):
        assert cell in row, (cell, row)
    row = queue_row(dom, "default")
    assert 'data-kind="nominal">no quota</td>' in row and gpu_cell("used", 3) in row
    assert gpu_cell("pending", 64) in row

    shot = tmp_path / "dashboard.png"
    await screenshot(url, shot, "dashboard")
