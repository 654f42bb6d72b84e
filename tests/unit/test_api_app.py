"""The HTTP layer without etcd: routes vs OpenAPI, auth, JSON errors, bodies, limits, TLS."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from hafo.api import make_agent_app, make_controller_app
from hafo.api.auth import load_token, token_matches
from hafo.api.controller_app import STALE_HEADER
from hafo.api.openapi import agent_document, controller_document
from hafo.api.server import server_tls
from hafo.model.cluster import ClusterSnapshot, Event
from hafo.model.errors import ValidationError
from hafo.store import Keys, StoreUnavailable

TOKEN = "s3cret-token-0123456789"


class FakeController:
    """A controller with an empty cluster; its store is never reached by these tests except
    where a test makes it fail on purpose."""

    name = "ctl-1"
    keys = Keys("unit")

    def __init__(self, store: Any = None, snapshot_error: Exception | None = None,
                 stale: float | None = None) -> None:
        self.store = store
        self.registry = CollectorRegistry()
        self.snapshot_error = snapshot_error
        self.stale = stale

    def snapshot(self) -> ClusterSnapshot:
        if self.snapshot_error is not None:
            raise self.snapshot_error
        return ClusterSnapshot(1, {}, {}, frozenset(), {}, {}, {})

    def ready(self) -> bool:
        return self.stale is None

    def etcd_contact_age(self) -> float:
        return 0.1

    def stale_seconds(self) -> float | None:
        return self.stale

    def not_ready_reason(self) -> str:
        return f"not connected to etcd for {self.stale:.0f} s"

    def leading(self) -> bool:
        return False

    async def recent_events(self, limit: int = 100) -> list[Event]:
        return []

    failsafe_hold = 3.5

    async def failsafe_probe(self, cluster: str | None = None) -> str:
        return "available"


class DeadStore:
    """Every etcd call fails as if etcd were down."""

    def __getattr__(self, name: str) -> Any:
        async def fail(*_args: Any, **_kwargs: Any) -> Any:
            raise StoreUnavailable("etcd down")
        return fail


class FakeAgent:
    name = "node-a"

    def __init__(self) -> None:
        self.registry = CollectorRegistry()

    def ready(self) -> bool:
        return False

    def status(self) -> dict[str, Any]:
        return {"node": self.name}


@pytest.fixture
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    app = make_controller_app(FakeController(DeadStore()), token=TOKEN)
    async with TestClient(TestServer(app, host="127.0.0.1")) as test_client:
        yield test_client


def routes_of(app: web.Application) -> set[tuple[str, str]]:
    out = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource else {}
        path = info.get("path") or info.get("formatter")
        if route.method != "HEAD" and path:
            out.add((route.method.lower(), path))
    return out


def documented(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method, path) for path, ops in document["paths"].items() for method in ops}


def test_openapi_documents_exactly_the_controller_routes() -> None:
    app = make_controller_app(FakeController())
    assert routes_of(app) == documented(controller_document())


def test_openapi_documents_exactly_the_agent_routes() -> None:
    assert routes_of(make_agent_app(FakeAgent())) == documented(agent_document())


def test_contract_routes_are_all_served() -> None:
    contract = {("get", "/healthz"), ("get", "/readyz"), ("get", "/leader"),
                ("get", "/v1/status"), ("get", "/v1/nodes"), ("get", "/v1/nodes/{name}"),
                ("get", "/v1/workloads"), ("get", "/v1/workloads/{id}"), ("get", "/v1/events"),
                ("post", "/v1/workloads"), ("delete", "/v1/workloads/{id}"),
                ("post", "/v1/nodes/{name}/drain"), ("post", "/v1/nodes/{name}/uncordon"),
                ("post", "/v1/workloads/{id}/migrate"), ("get", "/metrics"),
                ("get", "/v1/queues"), ("get", "/v1/queues/{name}"),
                ("put", "/v1/queues/{name}"), ("delete", "/v1/queues/{name}"),
                ("get", "/openapi.json"), ("get", "/")}
    assert contract <= routes_of(make_controller_app(FakeController()))


def test_every_mutation_is_documented_as_needing_the_token() -> None:
    for path, ops in controller_document()["paths"].items():
        for method, op in ops.items():
            needs = method in ("post", "put", "delete")
            assert ("security" in op) == needs, (method, path)
            assert ("401" in op["responses"]) == needs, (method, path)


@pytest.mark.parametrize(("header", "ok"), [
    (None, False), ("", False), (f"Bearer {TOKEN}", True), (f"bearer {TOKEN}", True),
    (f"Bearer  {TOKEN} ", True), (f"Basic {TOKEN}", False), (f"Bearer {TOKEN}x", False),
    (f"Bearer {TOKEN[:-1]}", False), ("Bearer", False), (TOKEN, False),
])
def test_token_matches(header: str | None, ok: bool) -> None:
    assert token_matches(header, TOKEN) is ok


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/v1/workloads"), ("DELETE", "/v1/workloads/a-123456"),
    ("POST", "/v1/workloads/a-123456/migrate"), ("POST", "/v1/nodes/n1/drain"),
    ("POST", "/v1/nodes/n1/uncordon"), ("POST", "/v1/nodes/n1/cordon"),
    ("PUT", "/v1/queues/team-a"), ("DELETE", "/v1/queues/team-a"),
])
@pytest.mark.parametrize("header", [None, "Bearer wrong-token-0123456789", f"Basic {TOKEN}"])
async def test_mutations_without_the_token_get_401(client: TestClient[Any, Any], method: str,
                                                   path: str, header: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    resp = await client.request(method, path, json={"name": "x", "command": ["true"]},
                                headers=headers)
    assert resp.status == 401
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert "bearer token" in (await resp.json())["error"]


async def test_reads_need_no_token(client: TestClient[Any, Any]) -> None:
    for path in ("/healthz", "/v1/status", "/v1/nodes", "/v1/workloads", "/openapi.json"):
        assert (await client.get(path)).status == 200, path


AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.parametrize(("body", "content_type", "field", "text"), [
    (b"", "application/json", "body", "required"),
    (b"{", "application/json", "body", "invalid JSON"),
    (b"[1, 2]", "application/json", "body", "JSON object"),
    (b"\xff\xfe", "application/json", "body", "UTF-8"),
    (b'{"name": "x"}', "text/plain", "body", "Content-Type"),
    (b'{"command": ["true"]}', "application/json", "spec.name", "required"),
    (b'{"name": "Bad_Name", "command": ["true"]}', "application/json", "spec.name", "lowercase"),
    (b'{"name": "x", "command": "true"}', "application/json", "spec.command", "list"),
    (b'{"name": "x", "command": ["a\\u0000b"]}', "application/json", "spec.command[0]", "NUL"),
    (b'{"name": "x", "command": ["t"], "restart": {"window": 0}}', "application/json",
     "spec.restart.window", "> 0"),
    (b'{"name": "x", "command": ["t"], "gpus": 1.5}', "application/json", "spec.gpus",
     "integer"),
    (b'{"name": "x", "command": ["t"], "colour": 1}', "application/json", "spec.colour",
     "unknown field"),
    (b'{"name": "x", "command": ["t"], "env": {"A=B": "1"}}', "application/json",
     "spec.env.A=B", "'='"),
    (b"[" * 100000 + b"]" * 100000, "application/json", "body", "JSON"),
])
async def test_bad_bodies_get_400_naming_the_field(client: TestClient[Any, Any], body: bytes,
                                                   content_type: str, field: str,
                                                   text: str) -> None:
    resp = await client.post("/v1/workloads", data=body,
                             headers={**AUTH, "Content-Type": content_type})
    assert resp.status in (400, 413)
    if resp.status == 413:
        return
    error = await resp.json()
    assert error["field"] == field
    assert text in error["error"]


async def test_oversized_body_is_refused_with_413_json(client: TestClient[Any, Any]) -> None:
    resp = await client.post("/v1/workloads", data=b"x" * (300 * 1024),
                             headers={**AUTH, "Content-Type": "application/json"})
    assert resp.status == 413
    assert "limit" in (await resp.json())["error"]


async def test_etcd_down_is_503_not_500(client: TestClient[Any, Any]) -> None:
    resp = await client.post("/v1/workloads", json={"name": "x", "command": ["true"]},
                             headers=AUTH)
    assert resp.status == 503
    assert "etcd" in (await resp.json())["error"]


async def test_unknown_route_and_method_are_json(client: TestClient[Any, Any]) -> None:
    resp = await client.get("/v2/nothing")
    assert (resp.status, resp.content_type) == (404, "application/json")
    resp = await client.put("/v1/workloads", headers=AUTH)
    assert (resp.status, resp.content_type) == (405, "application/json")
    assert "POST" in resp.headers["Allow"]


@pytest.mark.parametrize("path", ["/v1/workloads/..%2F..%2Fetc", "/v1/workloads/a%00b",
                                  "/v1/nodes/..", "/v1/nodes/%0d%0aX:1"])
async def test_names_that_cannot_exist_are_404(client: TestClient[Any, Any], path: str) -> None:
    resp = await client.get(path)
    assert resp.status == 404
    assert "no " in (await resp.json())["error"]


async def test_migrate_body_is_checked(client: TestClient[Any, Any]) -> None:
    resp = await client.post("/v1/workloads/a-123456/migrate", json={"to": 3}, headers=AUTH)
    assert (resp.status, (await resp.json())["field"]) == (400, "body.to")
    resp = await client.post("/v1/workloads/a-123456/migrate", json={"where": "n"},
                             headers=AUTH)
    assert (resp.status, (await resp.json())["field"]) == (400, "body.where")


async def test_unexpected_failure_is_a_json_500_without_details() -> None:
    app = make_controller_app(FakeController(snapshot_error=RuntimeError("secret detail")))
    async with TestClient(TestServer(app, host="127.0.0.1")) as test_client:
        resp = await test_client.get("/v1/status")
        assert resp.status == 500
        body = await resp.json()
        assert "secret" not in body["error"]


async def test_reads_from_a_cache_etcd_no_longer_refreshes_say_so() -> None:
    fresh, stale = FakeController(), FakeController(stale=12.5)
    async with TestClient(TestServer(make_controller_app(fresh), host="127.0.0.1")) as c:
        resp = await c.get("/v1/status")
        assert (await resp.json())["stale"] is False and STALE_HEADER not in resp.headers
        assert (await c.get("/readyz")).status == 200
    async with TestClient(TestServer(make_controller_app(stale), host="127.0.0.1")) as c:
        resp = await c.get("/v1/status")
        body = await resp.json()
        assert (body["stale"], body["stale_seconds"]) == (True, 12.5)
        assert resp.headers[STALE_HEADER] == "12.5"
        assert (await c.get("/v1/nodes")).headers[STALE_HEADER] == "12.5"
        resp = await c.get("/readyz")
        assert resp.status == 503 and "for 12 s" in (await resp.json())["error"]


async def test_agent_api_probes_and_metrics() -> None:
    async with TestClient(TestServer(make_agent_app(FakeAgent()), host="127.0.0.1")) as c:
        assert (await c.get("/healthz")).status == 200
        resp = await c.get("/readyz")
        assert resp.status == 503 and "lease" in (await resp.json())["error"]
        resp = await c.get("/metrics")
        assert resp.status == 200 and resp.content_type == "text/plain"
        assert (await c.post("/v1/node")).status == 405


def write_token(path: Path, text: str, mode: int = 0o600) -> str:
    path.write_text(text)
    os.chmod(path, mode)
    return str(path)


def test_load_token(tmp_path: Path) -> None:
    assert load_token(write_token(tmp_path / "t", f"  {TOKEN}\n")) == TOKEN


@pytest.mark.parametrize(("text", "mode", "why"), [
    ("short", 0o600, "at least 16"), ("two tokens here!", 0o600, "at least 16"),
    ("a" * 20 + " b", 0o600, "without spaces"), (TOKEN, 0o644, "chmod 600"),
])
def test_bad_token_files_name_the_field(tmp_path: Path, text: str, mode: int,
                                        why: str) -> None:
    with pytest.raises(ValidationError) as info:
        load_token(write_token(tmp_path / "t", text, mode))
    assert info.value.field == "api.token_file" and why in info.value.message


def test_missing_token_file(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="cannot read"):
        load_token(str(tmp_path / "absent"))


def make_cert(tmp_path: Path) -> tuple[str, str]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext",
                    "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True,
                   timeout=30)
    return str(cert), str(key)


async def test_api_over_tls(tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path)
    app = make_controller_app(FakeController())
    server = TestServer(app, host="127.0.0.1")
    await server.start_server(ssl=server_tls(cert, key))
    try:
        url = f"https://127.0.0.1:{server.port}/healthz"
        trusted = ssl.create_default_context(cafile=cert)
        async with aiohttp.ClientSession() as session:
            async with session.get(url, ssl=trusted) as resp:
                assert resp.status == 200
                assert json.loads(await resp.text())["status"] == "ok"
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await session.get(url)  # the system CAs do not know this certificate
    finally:
        await server.close()


class UnavailableController(FakeController):
    failsafe_hold = 3.5

    async def failsafe_probe(self, cluster: str | None = None) -> str:
        return "unavailable"


@pytest.mark.parametrize(("trust", "engaged"), [(True, True), (False, False)])
async def test_agents_ask_controllers_failsafe_questions_over_tls(
        tmp_path: Path, trust: bool, engaged: bool) -> None:
    """With api.tls_cert on controllers, agents verify them with api.tls_ca; a controller whose
    certificate they cannot verify counts as no answer (so the failsafe does not engage)."""
    from hafo.agent.failsafe import AgentFailsafe
    from hafo.model.cluster import FailsafeSet

    cert, key = make_cert(tmp_path)
    server = TestServer(make_controller_app(UnavailableController()), host="127.0.0.1")
    await server.start_server(ssl=server_tls(cert, key))
    try:
        failsafe = AgentFailsafe("n1", store=None, keys=None, failsafe_max=300,  # type: ignore[arg-type]
                                 last_contact=lambda: 0.0, clock=lambda: 1.0,
                                 tls_ca=cert if trust else None)
        failsafe.current = FailsafeSet(1, {"ctl-1": {
            "api": f"https://127.0.0.1:{server.port}"}})
        assert (await failsafe.confirm(timeout=5) is not None) is engaged
    finally:
        await server.close()


async def test_connections_that_never_finish_a_request_are_closed() -> None:
    """Slowloris: connections that send part of their headers, or nothing, are closed after
    the server's idle timeout (aiohttp's default kept them an hour); a body that trickles
    in gets a 408 after the body timeout. The server keeps answering others meanwhile."""
    import asyncio
    import time

    from hafo.api import body as bodies
    from hafo.api.server import serve
    from hafo.local.procs import free_port

    app = make_controller_app(FakeController(DeadStore()), token=TOKEN)
    port = free_port()
    runner = await serve(app, "127.0.0.1", port, idle_timeout=0.5)
    saved, bodies.BODY_TIMEOUT = bodies.BODY_TIMEOUT, 0.5
    opened: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for i in range(30):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            if i % 2:
                writer.write(b"GET /v1/status HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            opened.append((reader, writer))
        started = time.monotonic()
        async with aiohttp.ClientSession() as session, \
                session.get(f"http://127.0.0.1:{port}/healthz") as resp:  # others served
            assert resp.status == 200
        for reader, _writer in opened:  # each closed by the server: EOF
            assert await asyncio.wait_for(reader.read(), 3.0) == b""
        assert time.monotonic() - started < 3.0
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"POST /v1/workloads HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}"
                     "\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
                     .encode())
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
        assert head.startswith(b"HTTP/1.1 408"), head
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        answer = await asyncio.wait_for(reader.readexactly(length), 1.0)
        assert b"not received within 0.5 s" in answer, answer
        writer.close()
    finally:
        bodies.BODY_TIMEOUT = saved
        for _reader, writer in opened:
            writer.close()
        await runner.cleanup()
