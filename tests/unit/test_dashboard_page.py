"""The dashboard page as served by a controller's app: headers, self-containment, safe DOM use."""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from hafo.api.controller_app import make_controller_app
from hafo.api.dashboard import page
from hafo.model.cluster import ClusterSnapshot, Event


class FakeSource:
    """A controller with an empty cluster."""

    name = "ctl-test"
    store: Any = None  # only the mutating routes use it
    keys: Any = None
    registry = CollectorRegistry()

    def snapshot(self) -> ClusterSnapshot:
        return ClusterSnapshot(revision=1, nodes={}, alive={}, cordoned=frozenset(),
                               workloads={}, assignments={}, statuses={}, leader="ctl-test",
                               controllers=("ctl-test",))

    def ready(self) -> bool:
        return True

    def etcd_contact_age(self) -> float:
        return 0.1

    def stale_seconds(self) -> float | None:
        return None

    def not_ready_reason(self) -> str:
        return ""

    def leading(self) -> bool:
        return True

    async def recent_events(self, limit: int = 100) -> list[Event]:
        return []

    failsafe_hold = 3.5

    async def failsafe_probe(self, cluster: str | None = None) -> str:
        return "available"


def sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


async def fetch_page() -> tuple[int, dict[str, str], str]:
    async with TestClient(TestServer(make_controller_app(FakeSource()))) as client:
        resp = await client.get("/")
        return resp.status, dict(resp.headers), await resp.text()


async def test_served_with_safe_headers() -> None:
    status, headers, html = await fetch_page()
    assert status == 200
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Cache-Control"] == "no-cache"
    csp = dict(part.strip().split(" ", 1) for part in headers["Content-Security-Policy"].split(";"))
    assert csp["default-src"] == "'self'"
    assert csp["img-src"] == "'self' data:"
    assert csp["connect-src"] == "'self'"
    assert csp["frame-ancestors"] == "'none'"
    # the inline script and style are allowed by hash, and nothing else inline
    (script,) = re.findall(r"<script>(.*?)</script>", html, re.DOTALL)
    (style,) = re.findall(r"<style>(.*?)</style>", html, re.DOTALL)
    assert csp["script-src"] == sha256(script)
    assert csp["style-src"] == "'self' " + sha256(style)
    assert "unsafe" not in headers["Content-Security-Policy"]
    assert html.count("<script") == 1 and html.count("<style") == 1
    assert not re.search(r"\son[a-z]+\s*=", html), "inline event handler (blocked by the CSP)"
    assert not re.search(r"\sstyle\s*=", html), "inline style attribute (blocked by the CSP)"


async def test_head_and_same_bytes_as_the_package_file() -> None:
    async with TestClient(TestServer(make_controller_app(FakeSource()))) as client:
        head = await client.head("/")
        assert head.status == 200
        body = await (await client.get("/")).read()
    assert body == page()[0]


async def test_self_contained_no_external_reference() -> None:
    _status, _headers, html = await fetch_page()
    assert "http://" not in html and "https://" not in html
    assert "//cdn" not in html
    assert not re.search(r"""(?:src|href|action)\s*=\s*["']?//""", html), "protocol-relative URL"
    assert not re.search(r"url\(|@import|<script\s+src|<link\s+rel=.?stylesheet", html)
    assert re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)""", html) == ["data:,"]  # favicon


async def test_data_reaches_the_dom_as_text_only() -> None:
    _status, _headers, html = await fetch_page()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(",
                 "new Function", "DOMParser", "createContextualFragment"):
        assert sink not in html, f"{sink}: API data must go in through textContent/DOM APIs"
    assert "textContent" in html


async def test_polls_the_controllers_own_read_api() -> None:
    _status, _headers, html = await fetch_page()
    for path in ('"/v1/status"', '"/v1/nodes"', '"/v1/workloads"', '"/v1/queues"',
                 '"/v1/events?limit=20"'):
        assert path in html
    assert "REFRESH_MS = 2000" in html
    for hook in ('id="summary"', 'id="nodes"', 'id="workloads"', 'id="queues"', 'id="events"',
                 'id="error"',
                 'id="updated"', "dataset.loaded", "dataset.node", "dataset.workload"):
        assert hook in html


async def test_reasons_are_in_the_rows_bounded_with_the_full_text_in_the_tooltip() -> None:
    _status, _headers, html = await fetch_page()
    (script,) = re.findall(r"<script>(.*?)</script>", html, re.DOTALL)
    bound = re.search(r"var MAX_REASON = (\d+);", script)
    assert bound and 80 <= int(bound.group(1)) <= 300
    reason_line = script[script.index("function reasonLine"):]
    reason_line = reason_line[:reason_line.index("\n  }\n")]
    assert "full.slice(0, MAX_REASON - 1)" in reason_line and "line.title = full" in reason_line
    assert 'el("div", "reason"' in reason_line  # text, in the row
    # pending and failed workloads (and degraded services) show theirs; nodes too
    tones = re.search(r"var REASON_TONES = \{(.*?)\};", script, re.DOTALL)
    assert tones and all(f"{state}:" in tones.group(1) for state in ("pending", "failed",
                                                                      "degraded"))
    assert "workloadReason(w)" in script and "reasonLine(node.reason" in script
    (style,) = re.findall(r"<style>(.*?)</style>", html, re.DOTALL)
    assert re.search(r"\.reason \{[^}]*max-width", style), "a reason's width is bounded"


async def test_workload_gpus_are_allocated_of_requested() -> None:
    _status, _headers, html = await fetch_page()
    assert '<th title="allocated / requested">GPUs</th>' in html
    (script,) = re.findall(r"<script>(.*?)</script>", html, re.DOTALL)
    cell = script[script.index("function gpuCell"):]
    cell = cell[:cell.index("\n  }\n")]
    assert "w.gpus_requested" in cell and 'held + "/" + wanted' in cell
    assert "cell.dataset.allocated" in cell and "cell.dataset.requested" in cell
    assert "tr.appendChild(gpuCell(w, members, heldBy))" in script


async def test_degraded_gpus_are_filled_in_the_legend_and_counted() -> None:
    _status, _headers, html = await fetch_page()
    (style,) = re.findall(r"<style>(.*?)</style>", html, re.DOTALL)
    degraded = re.search(r"\.gpu\.degraded \{([^}]*)\}", style)
    assert degraded, "no style for a degraded GPU"
    assert "background-image: repeating-linear-gradient" in degraded.group(1), \
        "a degraded GPU is marked by a fill, not only an outline"
    assert re.search(r'data-legend="degraded"><span class="gpu small degraded"></span>'
                     r"degraded</span>", html), "no legend entry for degraded GPUs"
    (script,) = re.findall(r"<script>(.*?)</script>", html, re.DOTALL)
    assert '["degraded", g.degraded, "s-degraded"]' in script, "the GPU card counts them"
    assert "else if (gpu.degraded) { c.degraded += 1; }" in script
    assert 'square.dataset.degraded = "1"' in script


async def test_the_queues_panel_is_hidden_until_a_queue_is_declared() -> None:
    _status, _headers, html = await fetch_page()
    assert '<section class="panel" id="queues-panel" hidden>' in html
    heads = re.search(r'<table id="queues">\s*<thead>(.*?)</thead>', html, re.DOTALL)
    assert heads is not None
    assert re.findall(r"<th[^>]*>([^<]+)</th>", heads.group(1)) == [
        "Queue", "Quota", "Used", "Borrowed", "Lent", "Pending", "Share", "Cohort"]
    (script,) = re.findall(r"<script>(.*?)</script>", html, re.DOTALL)
    render = script[script.index("function renderQueues"):]
    render = render[:render.index("\n  }\n")]
    assert "panel.hidden = !queues.length" in render
    assert 'emptyRow(8, "no queues declared")' in render
    assert "tr.dataset.queue" in render and "renderQueues();" in script
    for kind in ("used", "borrowed", "lent", "pending"):
        assert f'queueCell("{kind}", use.{kind}' in render
    # a controller without the route (an older version during an upgrade): no queues, no
    # error banner
    assert 'paths[i] === "/v1/queues" && r.reason && /^HTTP 404/' in script
    (style,) = re.findall(r"<style>(.*?)</style>", html, re.DOTALL)
    assert "section.panel[hidden] { display: none; }" in style
