"""Removing a node over the in-memory store (``hafo.store.intents.remove_node``) and through
the API (``DELETE /v1/nodes/{name}``): refused while busy (naming the workloads) or while its
agent is alive, 404 for an unknown node; a removal deletes every per-node key in one
transaction and leaves the workloads' history alone; ``drain=true`` drains a busy node."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from hafo.api import make_controller_app
from hafo.model.cluster import Assignment, InstanceStatus
from hafo.store import Keys, codec, intents
from hafo.store.memory import MemoryStore
from hafo.store.state import read_events, read_snapshot

from .conftest import make_node, placed, submit
from .memory_controller import MemoryController as Controller

KEYS = Keys("unit")


async def seed(store: MemoryStore, *, alive: bool = False, work: bool = False) -> None:
    """Node ``gone`` (and ``other``) with every per-node key; ``work``: w1 placed on it."""
    for name in ("gone", "other"):
        await store.put(KEYS.node(name), codec.encode(make_node(name).to_dict()))
    await store.put(KEYS.alive("other"), codec.encode({"node": "other", "lease": 1,
                                                       "since": 0.0}))
    if alive:
        await store.put(KEYS.alive("gone"), codec.encode({"node": "gone", "lease": 2,
                                                          "since": 0.0}))
    await store.put(KEYS.cordon("gone"), b"{}")
    await store.put(KEYS.report("gone"), b"{}")
    await store.put(KEYS.history("w0"), b"[]")
    await store.put(KEYS.workload("w1"), codec.encode_submission(submit("w1")))
    status = InstanceStatus(workload="w0", node="gone", epoch=3, state="exited", exit_code=0)
    await store.put(KEYS.status("w0", "gone"), codec.encode(status.to_dict()))
    if work:
        assignment = placed("w1", "gone")
        await store.put(KEYS.assignment("w1"), codec.encode(assignment.to_dict()))
        await store.put(KEYS.node_assignment("gone", "w1"), codec.encode(assignment.to_dict()))
    else:
        done = Assignment(workload="w1", phase="completed", epoch=4)
        await store.put(KEYS.assignment("w1"), codec.encode(done.to_dict()))


async def keys_of(store: MemoryStore) -> set[str]:
    _, kvs = await store.get_prefix(KEYS.root)
    return {kv.key for kv in kvs}


async def test_a_down_node_with_no_work_is_removed_with_every_key_of_it() -> None:
    store = MemoryStore()
    await seed(store)
    await intents.remove_node(store, KEYS, "gone")
    left = await keys_of(store)
    assert not [k for k in left if "gone" in k]
    assert {KEYS.node("other"), KEYS.history("w0"), KEYS.assignment("w1")} <= left
    snapshot = await read_snapshot(store, KEYS)
    assert set(snapshot.nodes) == {"other"}
    events = await read_events(store, KEYS)
    assert [(e.kind, e.node) for e in events] == [("node-removed", "gone")]
    with pytest.raises(intents.NotFound, match="no node 'gone' \\(nodes: other\\)"):
        await intents.remove_node(store, KEYS, "gone")


@pytest.mark.parametrize(("alive", "work", "kind", "words"), [
    (True, False, "alive", "stop its agent first (systemctl stop hafo-agent)"),
    (False, True, "busy", "node gone holds 1 workload (w1): drain it first"),
    (True, True, "busy", "(w1)"),
])
async def test_a_removal_is_refused(alive: bool, work: bool, kind: str, words: str) -> None:
    store = MemoryStore()
    await seed(store, alive=alive, work=work)
    before = await keys_of(store)
    with pytest.raises(intents.RemovalRefused) as caught:
        await intents.remove_node(store, KEYS, "gone")
    assert caught.value.refusal.kind == kind
    assert words in str(caught.value)
    assert await keys_of(store) == before


@pytest.fixture
async def api() -> AsyncIterator[tuple[TestClient[Any, Any], Controller]]:
    controller = Controller()
    app = make_controller_app(controller)  # type: ignore[arg-type]
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        yield client, controller


async def test_the_api_removes_refuses_and_drains(
        api: tuple[TestClient[Any, Any], Controller]) -> None:
    client, controller = api
    await seed(controller.store, work=True)
    resp = await client.delete("/v1/nodes/gone")
    assert resp.status == 409
    assert "holds 1 workload (w1)" in (await resp.json())["error"]
    resp = await client.delete("/v1/nodes/gone?drain=true")
    assert resp.status == 202
    assert await resp.json() == {"node": "gone", "removed": False, "draining": True,
                                 "moving": ["w1"]}
    assert await controller.store.get(KEYS.move("w1")) is not None
    resp = await client.delete("/v1/nodes/gone?drain=maybe")
    assert resp.status == 400 and (await resp.json())["field"] == "drain"
    assert (await client.delete("/v1/nodes/nowhere")).status == 404
    # the work moved off (the controller's job): now it goes
    await controller.store.put(KEYS.assignment("w1"), codec.encode(
        Assignment(workload="w1", phase="pending", epoch=5).to_dict()))
    await controller.store.delete(KEYS.node_assignment("gone", "w1"))
    resp = await client.delete("/v1/nodes/gone")
    assert resp.status == 200
    assert await resp.json() == {"node": "gone", "removed": True, "draining": False,
                                 "moving": []}
    assert await controller.store.get(KEYS.node("gone")) is None


async def test_the_api_refuses_a_node_whose_agent_is_alive(
        api: tuple[TestClient[Any, Any], Controller]) -> None:
    client, controller = api
    await seed(controller.store, alive=True)
    resp = await client.delete("/v1/nodes/gone?drain=true")
    assert resp.status == 409
    assert "agent is alive" in (await resp.json())["error"]


async def test_the_demand_route_answers(api: tuple[TestClient[Any, Any], Controller]) -> None:
    client, _controller = api
    resp = await client.get("/v1/demand")
    assert resp.status == 200
    body = await resp.json()
    assert body["pending"] == [] and body["removable"] == [] and body["leader"] is True


def test_timeout_without_drain_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from hafo.cli import main

    assert main(["node", "remove", "gone", "--timeout", "5"]) == 2
    assert capsys.readouterr().err.strip() == (
        "hafo node remove: --timeout: only with --drain (see --help)")
    assert main(["node", "remove", "gone", "--drain", "--timeout", "0"]) == 2


def test_hafo_demand_renders_shapes() -> None:
    from hafo.commands.demand import render_demand

    data = {"pending": [{"queue": "r", "gpu_model": "*H100*", "gpu_profile": None, "nodes": 4,
                         "gpus_per_node": 8, "count": 2},
                        {"queue": "default", "gpu_model": None, "gpu_profile": "1g.10gb",
                         "nodes": 1, "gpus_per_node": 1, "count": 3}], "removable": []}
    assert render_demand(data).splitlines() == [
        "2 x gang 4 nodes x 8 GPUs (*H100*) in queue r",
        "3 x 1 GPU(s) (any model, MIG 1g.10gb) in queue default"]
    assert render_demand({"pending": []}) == "no pending work that more nodes would run"
