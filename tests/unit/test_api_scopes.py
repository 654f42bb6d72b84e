"""Team tokens scoped to queues (issue 30): the pure decision (``hafo.decisions.api_scopes``),
the file's format and its errors (``hafo.model.teams``, ``api.team_tokens_file``), the caller
identified from the token (``hafo.api.auth.identify``), and the controller's API with a team
token: its own queue's workloads only; nodes, queues and other teams' workloads are 403
naming the queue; the admin does everything; reads need no token."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from hafo.api import make_controller_app
from hafo.api.auth import identify, load_team_tokens
from hafo.decisions.api_scopes import ADMIN, ANONYMOUS, Action, Caller, Intent, refusal, team
from hafo.model.config import parse_config
from hafo.model.errors import ValidationError
from hafo.model.teams import parse_team_tokens

from .memory_controller import MemoryController

ADMIN_TOKEN = "admin-token-0123456789"
TOKEN_A = "team-a-token-0123456789"
TOKEN_B = "team-b-token-0123456789"
TEAM_A = team("team-a", ["team-a", "shared"])
TEAM_B = team("team-b", ["team-b"])

# -- the decision ---------------------------------------------------------------------------


@pytest.mark.parametrize(("caller", "intent", "refused"), [
    # the admin, and an API without tokens: everything
    *[(who, Intent(action, "x", "team-a"), None) for who in (ADMIN, ANONYMOUS)
      for action in Action],
    (ADMIN, Intent(Action.DELETE, "train-1a2b3c", None), None),  # unknown: left to the intent
    # a team: the workloads of its queues
    (TEAM_B, Intent(Action.SUBMIT, "train", "team-b"), None),
    (TEAM_B, Intent(Action.DELETE, "train-1a2b3c", "team-b"), None),
    (TEAM_B, Intent(Action.MIGRATE, "train-1a2b3c", "team-b"), None),
    (TEAM_A, Intent(Action.SUBMIT, "train", "shared"), None),
    (TEAM_A, Intent(Action.SUBMIT, "train", "team-a", "shared"), None),  # between its queues
    # ... and not another team's
    (TEAM_B, Intent(Action.DELETE, "train-1a2b3c", "team-a"),
     'token of team "team-b" may not delete workload train-1a2b3c of queue "team-a" '
     "(its queues: team-b)"),
    (TEAM_B, Intent(Action.MIGRATE, "train-1a2b3c", "team-a"),
     'token of team "team-b" may not migrate workload train-1a2b3c of queue "team-a" '
     "(its queues: team-b)"),
    (TEAM_A, Intent(Action.SUBMIT, "train", "team-b"),
     'token of team "team-a" may not submit workload train of queue "team-b" '
     "(its queues: shared, team-a)"),
    (TEAM_B, Intent(Action.SUBMIT, "train", "default"),
     'may not submit workload train of queue "default"'),
    # a change of another team's workload into its own queue: the current queue is checked
    (TEAM_B, Intent(Action.SUBMIT, "train", "team-a", "team-b"),
     'may not submit workload train of queue "team-a"'),
    # ... and a change of its own into another team's: the new one
    (TEAM_B, Intent(Action.SUBMIT, "train", "team-b", "team-a"),
     'may not submit workload train of queue "team-a"'),
    # a workload this controller does not know: its queue cannot be checked
    (TEAM_B, Intent(Action.DELETE, "train-1a2b3c", None),
     "this controller does not know its queue"),
    # nodes, queues and everything else: the admin's
    (TEAM_A, Intent(Action.DRAIN, "n1"), 'token of team "team-a" may not drain node n1: '
     "nodes need the admin token"),
    (TEAM_A, Intent(Action.CORDON, "n1"), "may not cordon node n1"),
    (TEAM_A, Intent(Action.UNCORDON, "n1"), "may not uncordon node n1"),
    (TEAM_A, Intent(Action.QUEUE_SET, "team-a"), 'token of team "team-a" may not set queue '
     '"team-a": queues need the admin token'),
    (TEAM_A, Intent(Action.QUEUE_DELETE, "team-a"), 'may not delete queue "team-a"'),
    (TEAM_A, Intent(Action.OTHER, "POST /v1/recover"), "may not change POST /v1/recover: "
     "that needs the admin token"),
    (team("none", []), Intent(Action.SUBMIT, "x", "default"), "(its queues: none)"),
])
def test_the_decision(caller: Caller, intent: Intent, refused: str | None) -> None:
    why = refusal(caller, intent)
    if refused is None:
        assert why is None
    else:
        assert why is not None and refused in why, why


# -- the file and the config ----------------------------------------------------------------


def teams_yaml(tmp_path: Path, text: str, mode: int = 0o600) -> str:
    path = tmp_path / "teams.yaml"
    path.write_text(text)
    os.chmod(path, mode)
    return str(path)


GOOD = f"""teams:
  team-a: {{token: {TOKEN_A}, queues: [team-a, shared]}}
  team-b: {{token: {TOKEN_B}, queues: [team-b]}}
"""


def test_the_team_tokens_file(tmp_path: Path) -> None:
    teams = load_team_tokens(teams_yaml(tmp_path, GOOD), ADMIN_TOKEN)
    assert set(teams.teams) == {"team-a", "team-b"}
    assert teams.teams["team-a"].queues == ("team-a", "shared")
    assert TOKEN_A not in repr(teams)


@pytest.mark.parametrize(("text", "mode", "message"), [
    (GOOD, 0o644, "is readable by every user; chmod 600 it"),
    ("teams: [\n", 0o600, "invalid YAML at line 2"),
    ("", 0o600, "teams: is required (the file is empty)"),
    (TOKEN_A, 0o600, "teams: the file must be a mapping with 'teams' (it holds a str)"),
    ("teams: {}\n", 0o600, "teams: must have at least 1 item(s)"),
    ("teams:\n  team-a: {token: short, queues: [team-a]}\n", 0o600,
     "teams.team-a.token: must be one token of at least 16 characters without spaces"),
    (f"teams:\n  team-a: {{token: {TOKEN_A}, queues: [Team A]}}\n", 0o600,
     "teams.team-a.queues[0]: must be lowercase letters, digits and '-'"),
    (f"teams:\n  team-a: {{token: {TOKEN_A}, queues: []}}\n", 0o600,
     "teams.team-a.queues: must be a non-empty list of queue names"),
    (f"teams:\n  team-a: {{token: {TOKEN_A}}}\n", 0o600, "teams.team-a.queues: is required"),
    (f"teams:\n  team-a: {{token: {TOKEN_A}, queues: [a], queue: [b]}}\n", 0o600,
     "teams.team-a.queue: unknown field, did you mean 'queues'?"),
    (f"teams:\n  a: {{token: {TOKEN_A}, queues: [a]}}\n  b: {{token: {TOKEN_A}, "
     "queues: [b]}\n", 0o600,
     "teams.b.token: is the same as the token of team 'a'; each team needs its own"),
    (f"teams:\n  a: {{token: {ADMIN_TOKEN}, queues: [a]}}\n", 0o600,
     "teams.a.token: is the admin token (api.token_file)"),
])
def test_bad_team_tokens_files_name_the_field(tmp_path: Path, text: str, mode: int,
                                              message: str) -> None:
    path = teams_yaml(tmp_path, text, mode)
    with pytest.raises(ValidationError) as info:
        load_team_tokens(path, ADMIN_TOKEN)
    assert info.value.field == "api.team_tokens_file"
    assert message in str(info.value), str(info.value)
    assert str(info.value).startswith("api.team_tokens_file: ")
    for token in (TOKEN_A, ADMIN_TOKEN):
        assert token not in str(info.value)  # never a token in an error


def test_a_missing_team_tokens_file(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="cannot read") as info:
        load_team_tokens(str(tmp_path / "absent"), ADMIN_TOKEN)
    assert info.value.field == "api.team_tokens_file"


def test_team_tokens_need_the_admin_token() -> None:
    with pytest.raises(ValidationError) as info:
        parse_config({"controller": {"name": "c"}, "api": {"team_tokens_file": "/t"}},
                     "controller")
    assert info.value.field == "api.team_tokens_file"
    assert "needs api.token_file too" in info.value.message
    config = parse_config({"controller": {"name": "c"},
                           "api": {"team_tokens_file": "/t", "token_file": "/a"}}, "controller")
    assert config.api.team_tokens_file == "/t"
    with pytest.raises(ValidationError, match="admin token"):
        parse_team_tokens({"teams": {"a": {"token": TOKEN_A, "queues": ["a"]}}}, None)


# -- who calls ------------------------------------------------------------------------------

TEAMS = parse_team_tokens({"teams": {"team-a": {"token": TOKEN_A, "queues": ["team-a"]},
                                     "team-b": {"token": TOKEN_B, "queues": ["team-b"]}}},
                          ADMIN_TOKEN)


@pytest.mark.parametrize(("header", "caller"), [
    (f"Bearer {ADMIN_TOKEN}", ADMIN), (f"Bearer {TOKEN_A}", team("team-a", ["team-a"])),
    (f"bearer {TOKEN_B} ", team("team-b", ["team-b"])), (None, None), ("", None),
    (f"Bearer {TOKEN_A}x", None), (f"Basic {TOKEN_A}", None), (TOKEN_A, None),
])
def test_identify(header: str | None, caller: Caller | None) -> None:
    assert identify(header, ADMIN_TOKEN, TEAMS) == caller
    assert identify(header, None) == ANONYMOUS  # no token configured: open


# -- the API --------------------------------------------------------------------------------


Controller = MemoryController


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


ADMIN_H, A_H, B_H = bearer(ADMIN_TOKEN), bearer(TOKEN_A), bearer(TOKEN_B)


@pytest.fixture
async def api() -> AsyncIterator[tuple[TestClient[Any, Any], Controller]]:
    ctl = Controller()
    app = make_controller_app(ctl, ADMIN_TOKEN, teams=TEAMS)

    async def put_queue(request: web.Request) -> web.Response:  # stands for the queue routes
        return web.json_response({"name": request.match_info["name"]})

    app.router.add_put("/v1/queues/{name}", put_queue)
    app.router.add_delete("/v1/queues/{name}", put_queue)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        yield client, ctl


def spec(name: str, queue: str) -> dict[str, Any]:
    return {"name": name, "command": ["true"], "queue": queue}


async def submitted(client: TestClient[Any, Any], ctl: Controller, name: str, queue: str,
                    headers: dict[str, str]) -> str:
    resp = await client.post("/v1/workloads", json=spec(name, queue), headers=headers)
    assert resp.status == 201, await resp.text()
    await ctl.refresh()
    wid: str = (await resp.json())["id"]
    return wid


async def refused(resp: Any, status: int = 403) -> str:
    assert resp.status == status, await resp.text()
    why: str = (await resp.json())["error"]
    return why


async def test_a_team_token_acts_on_its_queues_only(
        api: tuple[TestClient[Any, Any], Controller]) -> None:
    client, ctl = api
    mine = await submitted(client, ctl, "train-a", "team-a", A_H)  # its own queue
    theirs = await submitted(client, ctl, "train-b", "team-b", B_H)

    why = await refused(await client.delete(f"/v1/workloads/{mine}", headers=B_H))
    assert why == (f'token of team "team-b" may not delete workload {mine} of queue "team-a" '
                   "(its queues: team-b)")
    why = await refused(await client.delete("/v1/workloads/train-a", headers=B_H))  # by name
    assert f'may not delete workload {mine} of queue "team-a"' in why
    why = await refused(await client.post(f"/v1/workloads/{mine}/migrate", json={},
                                          headers=B_H))
    assert f'may not migrate workload {mine} of queue "team-a"' in why
    why = await refused(await client.post("/v1/workloads", json=spec("new", "team-a"),
                                           headers=B_H))
    assert 'may not submit workload new of queue "team-a" (its queues: team-b)' in why
    # taking another team's workload over by submitting it into its own queue
    why = await refused(await client.post("/v1/workloads", json=spec("train-a", "team-b"),
                                           headers=B_H))
    assert 'may not submit workload train-a of queue "team-a"' in why
    # nodes and queues are the admin's
    for path in ("/v1/nodes/n1/drain", "/v1/nodes/n1/cordon", "/v1/nodes/n1/uncordon"):
        why = await refused(await client.post(path, headers=A_H))
        assert why.startswith('token of team "team-a" may not') and "node n1" in why, why
    why = await refused(await client.put("/v1/queues/team-a", json={"gpus": 1}, headers=A_H))
    assert why == 'token of team "team-a" may not set queue "team-a": queues need the admin token'
    why = await refused(await client.delete("/v1/queues/team-a", headers=A_H))
    assert 'may not delete queue "team-a"' in why
    # an id this controller does not know: refused to a team (403), the admin's gets a 404
    why = await refused(await client.delete("/v1/workloads/ghost-1a2b3c", headers=A_H))
    assert "does not know its queue" in why
    await refused(await client.delete("/v1/workloads/ghost-1a2b3c", headers=ADMIN_H), 404)
    # its own: passed the scope (migrate of a pending workload is the move rule's 409)
    await refused(await client.post(f"/v1/workloads/{mine}/migrate", json={}, headers=A_H),
                  409)
    resp = await client.post("/v1/workloads", json={**spec("train-a", "team-a"), "priority": 5},
                             headers=A_H)
    assert resp.status == 200 and (await resp.json())["change"] == "updated"
    assert (await client.delete(f"/v1/workloads/{mine}", headers=A_H)).status == 200
    # nothing was dropped silently: team-b's workload is still there
    await ctl.refresh()
    assert theirs in ctl.snapshot().workloads and mine not in ctl.snapshot().workloads


async def test_the_admin_does_everything_and_reads_need_no_token(
        api: tuple[TestClient[Any, Any], Controller]) -> None:
    client, ctl = api
    theirs = await submitted(client, ctl, "train-b", "team-b", B_H)
    await submitted(client, ctl, "ops", "default", ADMIN_H)
    assert (await client.put("/v1/queues/team-a", json={"gpus": 4}, headers=ADMIN_H)).status \
        in (200, 201)
    await refused(await client.post("/v1/nodes/n1/drain", headers=ADMIN_H), 404)  # no node n1
    await refused(await client.post(f"/v1/workloads/{theirs}/migrate", json={},
                                    headers=ADMIN_H), 409)
    assert (await client.delete(f"/v1/workloads/{theirs}", headers=ADMIN_H)).status == 200
    for path in ("/v1/status", "/v1/nodes", "/v1/workloads", "/v1/workloads/ops",
                 "/openapi.json"):
        assert (await client.get(path)).status == 200, path


@pytest.mark.parametrize("headers", [{}, bearer("wrong-token-0123456789"),
                                     {"Authorization": f"Basic {TOKEN_A}"}])
async def test_a_missing_or_wrong_token_stays_401(
        api: tuple[TestClient[Any, Any], Controller], headers: dict[str, str]) -> None:
    client, _ = api
    for method, path in (("POST", "/v1/workloads"), ("DELETE", "/v1/workloads/a-123456"),
                         ("POST", "/v1/nodes/n1/drain"), ("PUT", "/v1/queues/q")):
        resp = await client.request(method, path, json=spec("x", "team-a"), headers=headers)
        assert resp.status == 401, (method, path)


def test_team_tokens_without_the_admin_token_are_refused() -> None:
    with pytest.raises(ValueError, match="admin token"):
        make_controller_app(Controller(), None, teams=TEAMS)


async def test_a_name_only_etcd_knows_yet_is_checked_there(
        api: tuple[TestClient[Any, Any], Controller]) -> None:
    client, ctl = api
    resp = await client.post("/v1/workloads", json=spec("fresh", "team-a"), headers=A_H)
    assert resp.status == 201  # not in this controller's snapshot (not refreshed)
    assert not ctl.snapshot().workloads
    why = await refused(await client.post("/v1/workloads", json=spec("fresh", "team-b"),
                                           headers=B_H))
    assert 'may not submit workload fresh of queue "team-a"' in why
