"""The agent's output routes: listing, reading by offset or tail, the bearer token, bad input,
and no way out of the state directory."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry
from yarl import URL

from hafo.agent.instances import write_json_atomic
from hafo.agent.outputlog import OutputWriter, list_outputs, read_output
from hafo.api import make_agent_app
from hafo.model.output import OutputChunk, OutputRequest, chunk_from
from hafo.model.output_view import OutputLog

TOKEN = "s3cret-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WID = "job-abc123"


class StateDirAgent:
    """An agent whose output routes read a real state directory."""

    name = "node-a"

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.registry = CollectorRegistry()

    def ready(self) -> bool:
        return True

    def status(self) -> dict[str, Any]:
        return {"node": self.name}

    async def serving(self, ref: str) -> tuple[bool, str]:
        return False, "none"

    def output_logs(self, workload: str) -> list[OutputLog]:
        return list_outputs(self.state_dir, self.name, workload)

    def read_output(self, workload: str, epoch: int,
                    request: OutputRequest) -> OutputChunk | None:
        return read_output(self.state_dir, self.name, workload, epoch, request)


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    path = state / "instances" / f"{WID}.7"
    path.mkdir(parents=True)
    write_json_atomic(path / "state.json", {"state": "running", "guard_pid": os.getpid()})
    writer = OutputWriter(path, 1 << 20)
    writer.write(b"".join(f"line {i}\n".encode() for i in range(10)))
    writer.close()
    # files a crafted path must never reach
    (tmp_path / "x.1.log").write_text("outside the state dir\n")
    (state / "x.1.log").write_text("beside logs/\n")
    return state


@pytest.fixture
async def client(state_dir: Path) -> AsyncIterator[TestClient[Any, Any]]:
    app = make_agent_app(StateDirAgent(state_dir), token=TOKEN)
    async with TestClient(TestServer(app, host="127.0.0.1")) as test_client:
        yield test_client


async def test_output_routes_need_the_token_when_one_is_set(
        client: TestClient[Any, Any]) -> None:
    for path in (f"/v1/workloads/{WID}/logs", f"/v1/workloads/{WID}/logs/7"):
        resp = await client.get(path)
        assert resp.status == 401 and resp.headers["WWW-Authenticate"].startswith("Bearer")
        assert "token" in (await resp.json())["error"]
        wrong = await client.get(path, headers={"Authorization": "Bearer nope-nope-nope-nope"})
        assert wrong.status == 401
        assert (await client.get(path, headers=AUTH)).status == 200
    assert (await client.get("/healthz")).status == 200  # the rest stays open
    assert (await client.get("/v1/node")).status == 200


async def test_output_routes_are_open_without_a_token(state_dir: Path) -> None:
    app = make_agent_app(StateDirAgent(state_dir))
    async with TestClient(TestServer(app, host="127.0.0.1")) as c:
        assert (await c.get(f"/v1/workloads/{WID}/logs/7")).status == 200


async def test_listing_and_reading(client: TestClient[Any, Any]) -> None:
    resp = await client.get(f"/v1/workloads/{WID}/logs", headers=AUTH)
    body = await resp.json()
    text = b"".join(f"line {i}\n".encode() for i in range(10))
    assert body == {"workload": WID, "node": "node-a", "epochs": [
        {"workload": WID, "node": "node-a", "epoch": 7, "start": 0, "end": len(text),
         "size": len(text), "running": True}]}
    resp = await client.get(f"/v1/workloads/{WID}/logs/7", headers=AUTH,
                            params={"offset": "7"})
    chunk = chunk_from(WID, resp.headers, await resp.read())
    assert (chunk.data, chunk.offset, chunk.next_offset) == (text[7:], 7, len(text))
    assert chunk.running and chunk.dropped == 0 and chunk.node == "node-a"
    resp = await client.get(f"/v1/workloads/{WID}/logs/7", headers=AUTH,
                            params={"tail": "2", "limit": "1000"})
    assert await resp.read() == b"line 8\nline 9\n"
    assert resp.headers["Hafo-Next-Offset"] == str(len(text))
    resp = await client.get(f"/v1/workloads/{WID}/logs/7", headers=AUTH,
                            params={"offset": "0", "limit": "5"})
    assert await resp.read() == b"line " and resp.headers["Hafo-Next-Offset"] == "5"


@pytest.mark.parametrize(("path", "status", "field"), [
    (f"/v1/workloads/{WID}/logs/8", 404, None),
    ("/v1/workloads/other-abc123/logs/7", 404, None),
    (f"/v1/workloads/{WID}/logs/seven", 400, "epoch"),
    (f"/v1/workloads/{WID}/logs/-1", 400, "epoch"),
    (f"/v1/workloads/{WID}/logs/7?offset=-1", 400, "offset"),
    (f"/v1/workloads/{WID}/logs/7?offset=x", 400, "offset"),
    (f"/v1/workloads/{WID}/logs/7?tail=0", 400, "tail"),
    (f"/v1/workloads/{WID}/logs/7?tail=1&offset=0", 400, "tail"),
    (f"/v1/workloads/{WID}/logs/7?limit=0", 400, "limit"),
    (f"/v1/workloads/{WID}/logs/7?limit=99999999", 400, "limit"),
    ("/v1/workloads/job/logs", 400, "workload"),        # a name, not an id
    ("/v1/workloads/Job-ABC123/logs/7", 400, "workload"),
])
async def test_bad_input_names_the_field(client: TestClient[Any, Any], path: str,
                                         status: int, field: str | None) -> None:
    resp = await client.get(URL(path, encoded=True), headers=AUTH)
    assert resp.status == status
    assert (await resp.json()).get("field") == field


@pytest.mark.parametrize("path", [
    "/v1/workloads/../x/logs/1", "/v1/workloads/%2e%2e/logs/1", "/v1/workloads/..%2Fx/logs/1",
    "/v1/workloads/%2e%2e%2fx/logs/1", "/v1/workloads/x.1/logs", "/v1/workloads/x/logs/1",
    "/v1/workloads/..%2F..%2Fx/logs/1", "/v1/workloads/%2E%2E/logs",
])
async def test_no_path_leaves_the_state_directory(client: TestClient[Any, Any],
                                                  path: str) -> None:
    resp = await client.get(URL(path, encoded=True), headers=AUTH)
    assert resp.status in (400, 404)
    body = await resp.read()
    assert b"outside the state dir" not in body and b"beside logs" not in body


async def test_the_cli_reads_through_the_route_with_its_token(state_dir: Path,
                                                              tmp_path: Path) -> None:
    """``hafo logs``' client: the token file is loaded and sent; without it the agent's
    refusal is one error with exit code 5."""
    import argparse

    from hafo.api.client import ApiClient, ApiRefused, ApiSetupError, cli_error
    from hafo.commands.base import EXIT_REFUSED
    from hafo.commands.logs import Agents, _api_access
    from hafo.model.cluster import ClusterSnapshot, NodeRecord

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    args = argparse.Namespace(api_token_file=str(token_file), api_ca=None, config=None)
    token, tls = _api_access(args)
    assert (token, tls) == (TOKEN, None)
    app = make_agent_app(StateDirAgent(state_dir), token=TOKEN)
    async with TestServer(app, host="127.0.0.1") as server, \
            ApiClient(token, tls) as client, ApiClient() as anonymous:
        record = NodeRecord(name="node-a", api=f"127.0.0.1:{server.port}")
        snapshot = ClusterSnapshot(1, {"node-a": record}, {}, frozenset(), {}, {}, {})
        agents = Agents(client, snapshot)
        [log] = await agents.kept("node-a", WID)
        assert (log.epoch, log.running) == (7, True)
        chunk = await agents.read("node-a", WID, 7, OutputRequest(tail=1))
        assert chunk is not None and chunk.data == b"line 9\n"
        assert await agents.read("node-a", WID, 8, OutputRequest()) is None
        with pytest.raises(ApiRefused) as refused:
            await Agents(anonymous, snapshot).kept("node-a", WID)
        error = cli_error(refused.value)
        assert error.code == EXIT_REFUSED and "--api-token-file" in str(error)
        assert str(error).startswith("node-a's agent refused: missing bearer token")
    bad = argparse.Namespace(api_token_file=str(tmp_path / "missing"), api_ca=None,
                             config=None)
    with pytest.raises(ApiSetupError) as setup:
        _api_access(bad)
    error = cli_error(setup.value)
    assert error.code == 2 and "--api-token-file" in str(error)
