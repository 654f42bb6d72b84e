"""The dashboard page served at ``GET /`` by every controller.

One self-contained HTML file (``static/dashboard.html``: inline CSS and vanilla JS, no external
URL), read once at import. The page polls this controller's own read API with relative URLs
(``/v1/status``, ``/v1/nodes``, ``/v1/workloads``, ``/v1/queues``, ``/v1/events``,
``/readyz``) every 2 s and inserts every value through DOM APIs, never as HTML. Its queues
panel (quota, used, borrowed, lent, pending, share, cohort of each declared queue) is hidden
while no queue is declared (or the controller has no ``/v1/queues``: a 404 counts as none).

The Content-Security-Policy allows exactly the page's inline ``<style>`` and ``<script>`` by
their SHA-256 hashes (no ``'unsafe-inline'``), fetches to this origin only, and no framing.
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from importlib import resources

from aiohttp import web

PAGE = "dashboard.html"

_INLINE = re.compile(r"<(script|style)>(.*?)</\1>", re.DOTALL)


def _hash(text: str) -> str:
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


def content_security_policy(html: str) -> str:
    """The page's CSP: its inline script and style allowed by hash, everything else 'self'."""
    scripts = [_hash(m.group(2)) for m in _INLINE.finditer(html) if m.group(1) == "script"]
    styles = [_hash(m.group(2)) for m in _INLINE.finditer(html) if m.group(1) == "style"]
    return "; ".join([
        "default-src 'self'",
        "script-src " + " ".join(scripts or ["'none'"]),
        "style-src " + " ".join(["'self'", *styles]),
        "img-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
        "object-src 'none'",
    ])


@cache
def page() -> tuple[bytes, dict[str, str]]:
    """The page's body and response headers (read from the package once)."""
    html = resources.files("hafo.api").joinpath("static").joinpath(PAGE).read_text(encoding="utf-8")
    headers = {
        "Content-Type": "text/html; charset=utf-8",
        "Content-Security-Policy": content_security_policy(html),
        "X-Content-Type-Options": "nosniff",
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }
    return html.encode("utf-8"), headers


def add_dashboard(app: web.Application) -> None:
    """Register ``GET /`` (the page) on a controller's application."""
    body, headers = page()

    async def dashboard(_request: web.Request) -> web.Response:
        return web.Response(body=body, headers=headers)

    app.router.add_get("/", dashboard)
