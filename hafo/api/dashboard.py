"""The dashboard page served at ``GET /`` by every controller (placeholder, being built)."""

from __future__ import annotations

from aiohttp import web


def add_dashboard(app: web.Application) -> None:
    """Register ``GET /`` (the page) on a controller's application."""

    async def page(_request: web.Request) -> web.Response:
        return web.Response(text="<!doctype html><title>hafo</title>", content_type="text/html")

    app.router.add_get("/", page)
