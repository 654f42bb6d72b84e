"""Team tokens on a live local cluster (issue 30): a team's token submits to its queue, and
cannot delete another team's workload or drain a node (403 naming the queue); the admin's
token can."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.integration.conftest import ClusterFactory
from tests.integration.helpers import api_call

pytestmark = pytest.mark.timeout(90)
ADMIN = "integration-admin-0123456789"
TEAM_A = "integration-team-a-0123456789"
TEAM_B = "integration-team-b-0123456789"


def call(port: int, method: str, path: str, token: str | None, body: Any = None,
         ) -> tuple[int, Any]:
    return api_call(port, method, path, body, token)


async def test_a_team_token_cannot_delete_another_team_s_workload(
        local_cluster: ClusterFactory) -> None:
    cluster = await local_cluster.start(nodes=1, controllers=1, api_token=ADMIN, team_tokens={
        "team-a": {"token": TEAM_A, "queues": ["team-a"]},
        "team-b": {"token": TEAM_B, "queues": ["team-b"]}})
    port = next(iter(cluster.controller_handles.values())).api_port
    spec = {"name": "train", "command": ["sleep", "60"], "queue": "team-a"}
    code, created = await asyncio.to_thread(call, port, "POST", "/v1/workloads", TEAM_A, spec)
    assert code == 201, created
    wid = created["id"]
    deadline = time.monotonic() + 20
    while True:  # the controller's cache knows it (and its queue)
        code, shown = await asyncio.to_thread(call, port, "GET", f"/v1/workloads/{wid}", None)
        if code == 200:
            break
        assert time.monotonic() < deadline, shown
        await asyncio.sleep(0.1)
    code, body = await asyncio.to_thread(call, port, "DELETE", f"/v1/workloads/{wid}", TEAM_B)
    assert (code, body["error"]) == (403, f'token of team "team-b" may not delete workload '
                                          f'{wid} of queue "team-a" (its queues: team-b)')
    code, body = await asyncio.to_thread(call, port, "POST", "/v1/nodes/node-1/drain", TEAM_A)
    assert code == 403 and "nodes need the admin token" in body["error"]
    code, body = await asyncio.to_thread(call, port, "DELETE", f"/v1/workloads/{wid}", "x" * 20)
    assert code == 401
    code, body = await asyncio.to_thread(call, port, "GET", f"/v1/workloads/{wid}", None)
    assert code == 200  # still there: nothing was done
    code, body = await asyncio.to_thread(call, port, "DELETE", f"/v1/workloads/{wid}", TEAM_A)
    assert (code, body) == (200, {"id": wid, "deleted": True})
