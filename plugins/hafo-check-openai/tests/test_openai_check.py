"""The ``openai`` check against a real tiny OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from hafo_check_openai import OpenAICheck, make_check, sum_metric

from hafo.checks.api import ENTRY_POINT_GROUP, CheckContext, CheckOptionError


@dataclass
class FakeServer:
    """What the fake server answers; tests change it between probes."""

    health_status: int = 200
    completion_status: int = 200
    models: list[str] = field(default_factory=lambda: ["tiny-llm"])
    metrics: str = (
        "# HELP vllm:num_requests_waiting Number of requests waiting.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="tiny-llm"} 3.0\n'
    )
    api_key: str | None = None
    completions: list[dict[str, Any]] = field(default_factory=list)
    base_url: str = ""

    def app(self) -> web.Application:
        """The aiohttp application serving the OpenAI-compatible subset the check uses."""

        @web.middleware
        async def auth(request: web.Request, handler: Any) -> web.StreamResponse:
            if self.api_key is not None and request.path.startswith("/v1/") and (
                    request.headers.get("Authorization") != f"Bearer {self.api_key}"):
                return web.json_response({"error": "bad key"}, status=401)
            result: web.StreamResponse = await handler(request)
            return result

        async def health(_: web.Request) -> web.Response:
            return web.Response(status=self.health_status,
                                text="" if self.health_status == 200 else "engine dead")

        async def models(_: web.Request) -> web.Response:
            return web.json_response(
                {"object": "list", "data": [{"id": m, "object": "model"} for m in self.models]})

        async def completions(request: web.Request) -> web.Response:
            body = await request.json()
            self.completions.append(body)
            if self.completion_status != 200:
                return web.json_response({"error": {"message": "CUDA error: an illegal memory "
                                                                "access was encountered"}},
                                         status=self.completion_status)
            return web.json_response({"id": "cmpl-1", "object": "text_completion",
                                      "model": body["model"],
                                      "choices": [{"index": 0, "text": "pong",
                                                   "finish_reason": "length"}]})

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(text=self.metrics, content_type="text/plain")

        app = web.Application(middlewares=[auth])
        app.router.add_get("/health", health)
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", completions)
        app.router.add_get("/metrics", metrics)
        return app


@pytest.fixture
async def server() -> AsyncIterator[FakeServer]:
    """A fake inference server on 127.0.0.1, on an ephemeral port."""
    fake = FakeServer()
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    fake.base_url = f"http://{host}:{port}"
    try:
        yield fake
    finally:
        await runner.cleanup()


def ctx(tmp_path: Path, env: dict[str, str] | None = None) -> CheckContext:
    """A probe context for a workload on this machine."""
    return CheckContext(workload="llm", node="node-a", epoch=1, pid=None, started_at=None,
                        checkpoint_dir=tmp_path, env=env or {})


async def probe(check: OpenAICheck, c: CheckContext) -> Any:
    """One probe, bounded in time as the agent bounds it."""
    return await asyncio.wait_for(check.probe(c), timeout=5)


async def test_healthy_server_passes_and_discovers_the_model(server: FakeServer,
                                                             tmp_path: Path) -> None:
    check = make_check({"base_url": server.base_url, "max_queue": 32})
    result = await probe(check, ctx(tmp_path))
    assert result.ok, result.detail
    assert "queue 3" in result.detail and "tiny-llm" in result.detail
    assert server.completions == [{"model": "tiny-llm", "prompt": "ping", "max_tokens": 1,
                                   "temperature": 0}]


async def test_health_503_fails(server: FakeServer, tmp_path: Path) -> None:
    server.health_status = 503
    result = await probe(make_check({"base_url": server.base_url}), ctx(tmp_path))
    assert not result.ok
    assert result.detail.startswith("health 503")
    assert server.completions == []


async def test_completion_500_fails_with_the_body(server: FakeServer, tmp_path: Path) -> None:
    server.completion_status = 500
    result = await probe(make_check({"base_url": server.base_url, "model": "tiny-llm"}),
                         ctx(tmp_path))
    assert not result.ok
    assert result.detail.startswith("completion returned 500: ")
    assert "illegal memory access" in result.detail


async def test_queue_over_max_fails_summed_over_label_sets(server: FakeServer,
                                                            tmp_path: Path) -> None:
    server.metrics = (
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="a b{c}"} 40.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="a b{c}"} 17.0\n'
        'vllm:num_requests_waiting_total{engine="1"} 999\n'
        "vllm:num_requests_running 4\n"
    )
    check = make_check({"base_url": server.base_url, "max_queue": 32})
    result = await probe(check, ctx(tmp_path))
    assert not result.ok
    assert result.detail == "queue 57 > max_queue 32"
    assert server.completions == []  # the queue is judged before a request is added to it


async def test_tgi_and_custom_queue_metrics(server: FakeServer, tmp_path: Path) -> None:
    server.metrics = "# TYPE tgi_queue_size gauge\ntgi_queue_size 5\nmy_queue 9\n"
    tgi = await probe(make_check({"base_url": server.base_url, "max_queue": 4,
                                  "probe_request": False}), ctx(tmp_path))
    assert (tgi.ok, tgi.detail) == (False, "queue 5 > max_queue 4")
    custom = await probe(make_check({"base_url": server.base_url, "max_queue": 10,
                                     "queue_metric": "my_queue", "probe_request": False}),
                         ctx(tmp_path))
    assert custom.ok and "queue 9" in custom.detail
    missing = await probe(make_check({"base_url": server.base_url, "max_queue": 10,
                                      "queue_metric": "absent", "probe_request": False}),
                          ctx(tmp_path))
    assert not missing.ok and "no queue metric" in missing.detail


async def test_api_key_from_the_workload_env(server: FakeServer, tmp_path: Path) -> None:
    server.api_key = "s3cret"
    check = make_check({"base_url": server.base_url + "/v1/", "api_key_env": "VLLM_API_KEY"})
    good = await probe(check, ctx(tmp_path, {"VLLM_API_KEY": "s3cret"}))
    assert good.ok, good.detail
    wrong = await probe(make_check({"base_url": server.base_url, "model": "tiny-llm",
                                    "api_key_env": "VLLM_API_KEY"}),
                        ctx(tmp_path, {"VLLM_API_KEY": "nope"}))
    assert not wrong.ok and wrong.detail.startswith("completion returned 401")
    unset = await probe(check, ctx(tmp_path))
    assert not unset.ok and "VLLM_API_KEY" in unset.detail


async def test_no_model_listed_and_health_only(server: FakeServer, tmp_path: Path) -> None:
    server.models = []
    result = await probe(make_check({"base_url": server.base_url}), ctx(tmp_path))
    assert not result.ok and result.detail.startswith("models listed no model id")
    health_only = await probe(make_check({"base_url": server.base_url, "probe_request": False}),
                              ctx(tmp_path))
    assert health_only.ok and server.completions == []


async def test_unreachable_server_fails_with_a_reason(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = await probe(make_check({"base_url": f"http://127.0.0.1:{port}"}), ctx(tmp_path))
    assert not result.ok and f"127.0.0.1:{port}" in result.detail


@pytest.mark.parametrize(("options", "bad_field"), [
    ({}, "base_url"),
    ({"base_url": ""}, "base_url"),
    ({"base_url": "127.0.0.1:8000"}, "base_url"),
    ({"base_url": "http://h:1", "max_queue": -1}, "max_queue"),
    ({"base_url": "http://h:1", "max_queue": True}, "max_queue"),
    ({"base_url": "http://h:1", "probe_request": "yes"}, "probe_request"),
    ({"base_url": "http://h:1", "health_path": "health"}, "health_path"),
    ({"base_url": "http://h:1", "queue_metric": "not a name"}, "queue_metric"),
    ({"base_url": "http://h:1", "modle": "x"}, "modle"),
    ({"base_url": "http://h:1", "health_path": None, "probe_request": False}, "probe_request"),
])
def test_bad_options_name_the_field(options: dict[str, Any], bad_field: str) -> None:
    with pytest.raises(CheckOptionError) as err:
        make_check(options)
    assert err.value.field == bad_field


def test_sum_metric_parses_prometheus_text() -> None:
    text = ('# HELP x y\nq{a="1"} 2\nq{a="}\\"{"} 3.5 1700000000\nq_other 100\nq NaN\n'
            "qq 1\n")
    assert sum_metric(text, "q") == 5.5
    assert sum_metric(text, "absent") is None


def test_registered_as_entry_point() -> None:
    eps = entry_points(group=ENTRY_POINT_GROUP).select(name="openai")
    if not eps:
        pytest.skip("hafo-check-openai is not installed")
    assert next(iter(eps)).load() is make_check


async def test_a_named_port_is_resolved_through_the_instances_ports(server: FakeServer,
                                                                   tmp_path: Path) -> None:
    port = int(server.base_url.rsplit(":", 1)[1])
    check = make_check({"port": "http"})
    named = CheckContext(workload="llm", node="node-a", epoch=1, pid=None, started_at=None,
                         checkpoint_dir=tmp_path, ports={"http": port})
    result = await probe(check, named)
    assert result.ok, result.detail
    missing = await probe(check, ctx(tmp_path))  # an instance without that port
    assert not missing.ok and "no port named 'http'" in missing.detail
    assert (await probe(make_check({"port": port}), ctx(tmp_path))).ok


@pytest.mark.parametrize(("options", "field"), [
    ({"port": 0}, "port"), ({"port": "HTTP"}, "port"), ({"port": True}, "port"),
    ({"port": 80, "base_url": "http://x"}, "port"), ({"port": 80, "host": ""}, "host"),
])
def test_bad_port_options_name_the_option(options: dict[str, Any], field: str) -> None:
    with pytest.raises(CheckOptionError) as err:
        make_check(options)
    assert err.value.field == field
