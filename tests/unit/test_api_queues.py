"""The queue routes on a real aiohttp app over the in-memory store: list, read, declare
(201/200, the path's name wins), delete (404/409), bad bodies (400 naming the field), and
submit's 409 naming ``spec.queue``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from hafo.api import make_controller_app
from hafo.api.openapi import controller_document, schemas

from .memory_controller import MemoryController

Controller = MemoryController


@pytest.fixture
async def api() -> AsyncIterator[tuple[TestClient[Any, Any], Controller]]:
    controller = Controller()
    app = make_controller_app(controller)  # type: ignore[arg-type]
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        yield client, controller


async def test_declare_read_list_and_delete_a_queue(
        api: tuple[TestClient[Any, Any], Controller]) -> None:
    client, controller = api
    resp = await client.put("/v1/queues/team-a", json={"gpus": 8, "cohort": "research"})
    assert resp.status == 201
    assert await resp.json() == {"name": "team-a", "gpus": 8, "cohort": "research",
                                 "borrowing_limit": None, "lending_limit": None,
                                 "weight": 1.0, "change": "created"}
    assert resp.headers["Location"] == "/v1/queues/team-a"
    resp = await client.put("/v1/queues/team-a", json={"name": "team-a", "gpus": 8,
                                                       "cohort": "research"})
    assert (resp.status, (await resp.json())["change"]) == (200, "unchanged")
    resp = await client.put("/v1/queues/team-a", json={"gpus": 16})
    assert (resp.status, (await resp.json())["change"]) == (200, "updated")
    await controller.refresh()
    resp = await client.get("/v1/queues")
    assert resp.status == 200
    assert await resp.json() == [{"name": "team-a", "gpus": 16, "cohort": None,
                                  "borrowing_limit": None, "lending_limit": None,
                                  "weight": 1.0, "workloads": [],
                                  "usage": {"used": 0.0, "borrowed": 0.0, "lent": 0.0,
                                            "pending": 0.0, "share": 0.0}}]
    assert (await (await client.get("/v1/queues/team-a")).json())["gpus"] == 16
    resp = await client.delete("/v1/queues/team-a")
    assert (resp.status, await resp.json()) == (200, {"name": "team-a", "deleted": True})
    await controller.refresh()
    assert await (await client.get("/v1/queues")).json() == []


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/v1/queues/nope", 404), ("DELETE", "/v1/queues/nope", 404),
    ("GET", "/v1/queues/Bad_Name", 404), ("DELETE", "/v1/queues/a%00b", 404),
])
async def test_unknown_queues_are_404(api: tuple[TestClient[Any, Any], Controller],
                                      method: str, path: str, status: int) -> None:
    client, _ = api
    resp = await client.request(method, path)
    assert resp.status == status
    assert "no queue" in (await resp.json())["error"]


@pytest.mark.parametrize(("path", "body", "field", "text"), [
    ("/v1/queues/team-a", {"name": "team-b", "gpus": 1}, "queue.name", "path names"),
    ("/v1/queues/Bad_Name", {"gpus": 1}, "name", "queue's name"),
    ("/v1/queues/team-a", {"cohort": "c"}, "queue.cohort", "needs a quota"),
    ("/v1/queues/team-a", {"gpus": -1}, "queue.gpus", "0"),
    ("/v1/queues/team-a", {"gpus": "8"}, "queue.gpus", "integer"),
    ("/v1/queues/team-a", {"gpus": 4, "lending_limit": 2}, "queue.lending_limit", "cohort"),
    ("/v1/queues/team-a", {"gpus": 4, "cohort": "c", "lending_limit": 5},
     "queue.lending_limit", "above"),
    ("/v1/queues/team-a", {"gpus": 4, "weight": 0}, "queue.weight", "0"),
    ("/v1/queues/team-a", {"gpus": 4, "colour": 1}, "queue.colour", "unknown field"),
])
async def test_bad_queue_bodies_get_400_naming_the_field(
        api: tuple[TestClient[Any, Any], Controller], path: str, body: dict[str, Any],
        field: str, text: str) -> None:
    client, _ = api
    resp = await client.put(path, json=body)
    assert resp.status == 400
    error = await resp.json()
    assert error["field"] == field and text in error["error"]


async def test_queue_in_use_is_409_and_undeclared_queue_refuses_submit(
        api: tuple[TestClient[Any, Any], Controller]) -> None:
    client, controller = api
    assert (await client.put("/v1/queues/team-a", json={"gpus": 2})).status == 201
    resp = await client.post("/v1/workloads", json={"name": "w", "command": ["true"],
                                                    "queue": "team-x"})
    assert resp.status == 409
    error = await resp.json()
    assert error["field"] == "spec.queue" and "team-a" in error["error"]
    resp = await client.post("/v1/workloads", json={"name": "w", "command": ["true"],
                                                    "queue": "team-a"})
    assert resp.status == 201
    wid = (await resp.json())["id"]
    resp = await client.delete("/v1/queues/team-a")
    assert resp.status == 409
    assert wid in (await resp.json())["error"]
    await controller.refresh()
    assert (await (await client.get("/v1/queues/team-a")).json())["workloads"] == [wid]


def test_the_queue_schema_is_the_declarations() -> None:
    queue = schemas()["QueueSpec"]
    assert set(queue["properties"]) == {"name", "gpus", "cohort", "borrowing_limit",
                                        "lending_limit", "weight", "models"}
    assert queue["required"] == ["name"]  # a queue without gpus has no quota
    put = controller_document()["paths"]["/v1/queues/{name}"]["put"]
    assert put["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/QueueBody"}
    body = schemas()["QueueBody"]  # QueueSpec, but the path names the queue
    assert body["properties"] == queue["properties"] and not body.get("required")
    assert {"200", "201", "400", "401"} <= set(put["responses"])
