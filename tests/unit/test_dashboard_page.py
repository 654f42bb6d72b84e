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

    async def failsafe_probe(self) -> str:
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
    for path in ('"/v1/status"', '"/v1/nodes"', '"/v1/workloads"', '"/v1/events?limit=20"'):
        assert path in html
    assert "REFRESH_MS = 2000" in html
    for hook in ('id="summary"', 'id="nodes"', 'id="workloads"', 'id="events"', 'id="error"',
                 'id="updated"', "dataset.loaded", "dataset.node", "dataset.workload"):
        assert hook in html
