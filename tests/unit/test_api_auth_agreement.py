"""Controllers agree on their API's auth (issue 28, finding 5): the pure rule
(``hafo.decisions.api_auth``), its I/O on the in-memory store (``hafo.store.api_auth``), and
two controllers sharing one store, one with a token and one without: the one that differs
from the cluster's record refuses every mutation (503, the reason) and is not ready."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from hafo.api import make_controller_app
from hafo.controller.daemon import Controller
from hafo.decisions.api_auth import (
    ApiAuth,
    api_auth_of,
    judge,
    teams_fingerprint,
    token_fingerprint,
)
from hafo.model.config import parse_config
from hafo.model.teams import TeamTokensFile, parse_team_tokens
from hafo.store import EventLog, Keys, codec, read_events
from hafo.store.api_auth import NOT_YET, ApiAuthAgreement
from hafo.store.keys import ParsedKey
from hafo.store.memory import MemoryStore

T1 = "first-token-0123456789"
T2 = "second-token-0123456789"
OPEN = ApiAuth(False)
TOKEN = api_auth_of(T1, False, "c")
OTHER = api_auth_of(T2, False, "c")
TLS = api_auth_of(T1, True, "c")
OPEN_TLS = ApiAuth(False, "", True)
TEAM_A = "team-a-token-0123456789"
TEAMS = parse_team_tokens({"teams": {"team-a": {"token": TEAM_A, "queues": ["a", "b"]}}}, T1)
TEAMED = api_auth_of(T1, False, "c", TEAMS)
TEAMS_2 = parse_team_tokens({"teams": {"team-a": {"token": TEAM_A, "queues": ["a"]}}}, T1)
TEAMED_2 = api_auth_of(T1, False, "c", TEAMS_2)


def test_team_tokens_are_in_the_fingerprint_never_the_tokens() -> None:
    assert TEAMED.token_hash == TOKEN.token_hash and TEAMED.teams_hash
    assert TEAMED != TOKEN and TEAMED_2 != TEAMED  # another queue: another fingerprint
    assert TEAM_A not in json.dumps(TEAMED.to_dict()) and T1 not in json.dumps(TEAMED.to_dict())
    assert ApiAuth.from_dict(TEAMED.to_dict()) == TEAMED
    # the file's order is not part of it; the cluster's name is
    shuffled = parse_team_tokens({"teams": {"team-a": {"token": TEAM_A, "queues": ["b", "a"]}}},
                                 T1)
    assert teams_fingerprint(shuffled, "c") == TEAMED.teams_hash
    assert teams_fingerprint(TEAMS, "other") != TEAMED.teams_hash
    other_token = parse_team_tokens({"teams": {"team-a": {"token": TEAM_A + "x",
                                                          "queues": ["a", "b"]}}}, T1)
    assert teams_fingerprint(other_token, "c") != TEAMED.teams_hash
    # without team tokens, the settings (and their JSON) are as before team tokens
    assert api_auth_of(T1, False, "c", None) == TOKEN
    assert "teams_hash" not in TOKEN.to_dict()
    with pytest.raises(ValueError, match="admin token"):
        api_auth_of(None, False, "c", TEAMS)


def test_the_fingerprint_is_a_salted_slow_hash_never_the_token() -> None:
    fingerprint = api_auth_of(T1, True, "c")
    assert fingerprint.token and fingerprint.tls
    assert T1 not in json.dumps(fingerprint.to_dict())
    assert fingerprint.token_hash == token_fingerprint(T1, "c")  # the same on every controller
    assert token_fingerprint(T1, "other") != fingerprint.token_hash  # salted with the cluster
    assert token_fingerprint(T2, "c") != fingerprint.token_hash
    assert api_auth_of(None, False, "c") == OPEN


@pytest.mark.parametrize("data", [None, [], {}, {"token": True, "token_hash": "", "tls": False},
                                  {"token": False, "token_hash": "ab", "tls": False},
                                  {"token": 1, "token_hash": "ab", "tls": False},
                                  {"token": False, "tls": "no"},
                                  {"token": False, "token_hash": "", "tls": False,
                                   "teams_hash": "ab"},
                                  {"token": True, "token_hash": "ab", "tls": False,
                                   "teams_hash": 1}])
def test_settings_not_of_their_shape_are_none(data: Any) -> None:
    assert ApiAuth.from_dict(data) is None


def test_settings_round_trip() -> None:
    for auth in (OPEN, TOKEN, TLS, OPEN_TLS, TEAMED):
        assert ApiAuth.from_dict(auth.to_dict()) == auth


@pytest.mark.parametrize(("mine", "record", "live", "refused", "write"), [
    # no record: the first controller's settings are the cluster's
    (OPEN, None, {"a": OPEN}, "", OPEN),
    (TOKEN, None, {"a": TOKEN, "b": OPEN}, "", TOKEN),
    # the same settings: agreed
    (TOKEN, TOKEN, {"a": TOKEN, "b": TOKEN}, "", None),
    (OPEN, OPEN, {"a": OPEN}, "", None),
    # the finding: a controller without a token next to one that needs one
    (OPEN, TOKEN, {"a": TOKEN, "b": OPEN},
     "this controller's API auth (no token, plain HTTP) differs from the cluster's (token "
     "required, plain HTTP); writes refused: the cluster's API auth is weakened only by an "
     "operator deleting its record", None),
    # a token changed on one controller of two: refused until the other has it too
    (OTHER, TOKEN, {"a": TOKEN, "b": OTHER},
     "this controller's API token differs from the cluster's; writes refused: it becomes "
     "the cluster's once every live controller has it (not yet: a)", None),
    # ... then on both: the record is replaced
    (OTHER, TOKEN, {"a": OTHER, "b": OTHER}, "", OTHER),
    # a controller of an older hafo publishes nothing: no replacement past it
    (OTHER, TOKEN, {"a": None, "b": OTHER}, "not yet: a", None),
    # strengthened on every controller (a token, TLS added): replaced
    (TOKEN, OPEN, {"b": TOKEN}, "", TOKEN),
    (TLS, TOKEN, {"a": TLS, "b": TLS}, "", TLS),
    # stronger than the record but not everywhere yet: refused too
    (TOKEN, OPEN, {"a": OPEN, "b": TOKEN}, "(token required, plain HTTP) differs from the "
     "cluster's (no token, plain HTTP)", None),
    # weakened on every live controller (a lone one started without the token, or without
    # TLS): never replaced by agreement; an operator deletes the record
    (OPEN, TOKEN, {"b": OPEN}, "weakened only by an operator deleting its record", None),
    (TOKEN, TLS, {"a": TOKEN, "b": TOKEN}, "(token required, plain HTTP) differs from the "
     "cluster's (token required, TLS)", None),
    (OPEN_TLS, TOKEN, {"b": OPEN_TLS}, "deleting its record", None),
    # team tokens: a controller started with another team tokens file (or none) refuses
    (TEAMED_2, TEAMED, {"a": TEAMED, "b": TEAMED_2},
     "this controller's team tokens (api.team_tokens_file) differ from the cluster's; "
     "writes refused: it becomes the cluster's once every live controller has it (not yet: "
     "a)", None),
    (TOKEN, TEAMED, {"a": TEAMED, "b": TOKEN}, "this controller's API auth (token required, "
     "plain HTTP) differs from the cluster's (token required, team tokens, plain HTTP)", None),
    (TEAMED, TOKEN, {"a": TOKEN, "b": TEAMED}, "(token required, team tokens, plain HTTP) "
     "differs from the cluster's (token required, plain HTTP)", None),
    # ... changed, added or removed on every live controller: replaced (not weaker)
    (TEAMED_2, TEAMED, {"a": TEAMED_2, "b": TEAMED_2}, "", TEAMED_2),
    (TEAMED, TOKEN, {"a": TEAMED}, "", TEAMED),
    (TOKEN, TEAMED, {"a": TOKEN, "b": TOKEN}, "", TOKEN),
    # an older hafo controller publishes no team tokens: it holds a change back
    (TEAMED, TOKEN, {"a": None, "b": TEAMED}, "not yet: a", None),
])
def test_judge(mine: ApiAuth, record: ApiAuth | None, live: dict[str, ApiAuth | None],
               refused: str, write: ApiAuth | None) -> None:
    verdict = judge(mine, record, live)
    assert verdict.write == write
    if refused:
        assert refused in verdict.refusal and "writes refused" in verdict.refusal
        assert "docs/reference/http.md" in verdict.refusal
    else:
        assert verdict.refusal == ""


def test_the_record_key_parses_back() -> None:
    keys = Keys("c")
    assert keys.parse(keys.api_auth) == ParsedKey("api-auth")
    assert keys.parse(keys.controller("ctl-1")) == ParsedKey("controller", name="ctl-1")


async def present(store: MemoryStore, keys: Keys, name: str, auth: ApiAuth | None) -> None:
    value: dict[str, Any] = {"api": f"http://{name}:8600"}
    if auth is not None:
        value["auth"] = auth.to_dict()
    await store.put(keys.controller(name), codec.encode(value))


async def test_a_token_changed_on_every_controller_becomes_the_cluster_s() -> None:
    store, keys = MemoryStore(), Keys("c")
    a = ApiAuthAgreement(store, keys, "a", TOKEN)
    b = ApiAuthAgreement(store, keys, "b", TOKEN)
    assert a.refusal == NOT_YET  # refused until compared
    await present(store, keys, "a", TOKEN)
    await present(store, keys, "b", TOKEN)
    assert await a.check() == "" and await b.check() == ""
    kv = await store.get(keys.api_auth)
    assert kv is not None and ApiAuth.from_dict(codec.decode(kv.value)) == TOKEN
    assert T1.encode() not in kv.value
    # The operator changes the token on a, then on b.
    a.mine = OTHER
    await present(store, keys, "a", OTHER)
    assert "token differs" in await a.check() and await b.check() == ""
    b.mine = OTHER
    await present(store, keys, "b", OTHER)
    assert await b.check() == ""  # every live controller has it: replaced
    assert await a.check() == ""
    kv = await store.get(keys.api_auth)
    assert kv is not None and ApiAuth.from_dict(codec.decode(kv.value)) == OTHER


async def test_the_token_is_dropped_only_by_deleting_the_record() -> None:
    store, keys = MemoryStore(), Keys("c")
    a = ApiAuthAgreement(store, keys, "a", TOKEN)
    await present(store, keys, "a", TOKEN)
    await a.check()
    await store.delete(keys.controller("a"))  # a is gone; b starts without a token
    b = ApiAuthAgreement(store, keys, "b", OPEN)
    await present(store, keys, "b", OPEN)
    assert "deleting its record" in await b.check()
    assert "deleting its record" in await b.check()  # still, on every check
    await store.delete(keys.api_auth)  # the operator's decision
    assert await b.check() == ""


async def mismatch_events(store: MemoryStore, keys: Keys) -> list[str]:
    """The messages of the ``api-auth-mismatch`` events, oldest first."""
    return [e.message for e in await read_events(store, keys, 0) if e.kind == "api-auth-mismatch"]


async def test_a_mismatch_is_said_once_again_when_it_changes_and_when_it_ends() -> None:
    store, keys = MemoryStore(), Keys("c")
    a = ApiAuthAgreement(store, keys, "a", TOKEN, EventLog(store, keys))
    b = ApiAuthAgreement(store, keys, "b", OPEN, EventLog(store, keys))
    assert not b.mismatch  # not before the first check, though it refuses writes
    await present(store, keys, "a", TOKEN)
    await present(store, keys, "b", OPEN)
    assert await a.check() == "" and not a.mismatch
    for _ in range(3):  # every cycle finds it: said once
        assert "deleting its record" in await b.check()
    assert b.mismatch
    said = await mismatch_events(store, keys)
    assert said == [f"controller b: {b.refusal}"], said
    assert "(no token, plain HTTP) differs from the cluster's (token required" in said[0]
    # b's settings change (another token, not a's): said once more
    b.mine = OTHER
    await present(store, keys, "b", OTHER)
    for _ in range(2):
        assert "token differs" in await b.check()
    said = await mismatch_events(store, keys)
    assert len(said) == 2 and "controller b: this controller's API token differs" in said[1]
    # b given the cluster's token: said once, and no more
    b.mine = TOKEN
    await present(store, keys, "b", TOKEN)
    assert await b.check() == "" and await b.check() == "" and not b.mismatch
    said = await mismatch_events(store, keys)
    assert len(said) == 3 and said[2] == ("controller b: its API auth is the cluster's again; "
                                          "writes accepted")
    assert a.said is None and not any(m.startswith("controller a") for m in said)


def controller(store: MemoryStore, name: str, token: str | None,
               teams: TeamTokensFile | None = None) -> Controller:
    config = parse_config({"etcd": {"endpoints": ["http://127.0.0.1:1"]},
                           "cluster": "c", "controller": {"name": name},
                           "timing": {"lease_ttl": 3, "failsafe_max": 0}}, "controller")
    return Controller(config, store=store, api_token=token, api_teams=teams)


@contextlib.asynccontextmanager
async def serving(ctl: Controller, token: str | None,
                  teams: TeamTokensFile | None = None) -> AsyncIterator[TestClient[Any, Any]]:
    ready = asyncio.Event()
    task = asyncio.create_task(ctl.run(ready))
    try:
        await asyncio.wait_for(ready.wait(), 10)
        app = make_controller_app(ctl, token, auth_refusal=lambda: ctl.api_auth.refusal,
                                  teams=teams)
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            yield client
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


SPEC = {"name": "train", "command": ["python", "train.py"], "gpus": 1}


@pytest.mark.parametrize(("token_a", "token_b"), [(T1, None), (T1, T2), (None, T1)])
async def test_a_controller_whose_auth_differs_refuses_writes_and_says_why(
        token_a: str | None, token_b: str | None) -> None:
    store = MemoryStore()
    a, b = controller(store, "ctl-a", token_a), controller(store, "ctl-b", token_b)
    async with serving(a, token_a) as client_a, serving(b, token_b) as client_b:
        headers_b = {"Authorization": f"Bearer {token_b}"} if token_b else {}
        resp = await client_b.post("/v1/workloads", json=SPEC, headers=headers_b)
        assert resp.status == 503
        why = (await resp.json())["error"]
        assert "differs from the cluster's" in why and "writes refused" in why, why
        assert (await client_b.post("/v1/nodes/n1/cordon", headers=headers_b)).status == 503
        ready = await client_b.get("/readyz")
        assert ready.status == 503 and (await ready.json())["error"] == why
        assert (await client_b.get("/v1/workloads")).status == 200  # reads stay open
        # The first controller's settings are the cluster's: it accepts.
        headers_a = {"Authorization": f"Bearer {token_a}"} if token_a else {}
        assert (await client_a.post("/v1/workloads", json=SPEC,
                                    headers=headers_a)).status == 201
        assert (await client_a.get("/readyz")).status == 200
        # Said once (an event, however many checks), and in b's metrics alone.
        await b.api_auth.check()
        await b.api_auth.check()
        said = await mismatch_events(store, Keys("c"))
        assert said == [f"controller ctl-b: {why}"], said
        assert b.registry.get_sample_value("hafo_api_auth_mismatch") == 1.0
        assert a.registry.get_sample_value("hafo_api_auth_mismatch") == 0.0
        metrics = await (await client_b.get("/metrics")).text()
        assert "\nhafo_api_auth_mismatch 1.0\n" in metrics
    if token_b is None:
        assert "(no token, plain HTTP) differs from the cluster's (token required" in why


@pytest.mark.parametrize("token", [T1, None])
async def test_controllers_with_the_same_auth_both_accept(token: str | None) -> None:
    store = MemoryStore()
    a, b = controller(store, "ctl-a", token), controller(store, "ctl-b", token)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with serving(a, token) as client_a, serving(b, token) as client_b:
        assert (await client_a.post("/v1/workloads", json=SPEC, headers=headers)).status == 201
        spec = {**SPEC, "name": "other"}
        assert (await client_b.post("/v1/workloads", json=spec, headers=headers)).status == 201
        assert (await client_b.get("/readyz")).status == 200
    assert await mismatch_events(store, Keys("c")) == []
    assert b.registry.get_sample_value("hafo_api_auth_mismatch") == 0.0
    kv = await store.get(Keys("c").controller("ctl-b"))
    assert kv is not None and "auth" in codec.decode(kv.value)
    assert (token or "absent").encode() not in kv.value


async def test_a_controller_with_another_team_tokens_file_refuses_writes() -> None:
    store = MemoryStore()
    a, b = controller(store, "ctl-a", T1, TEAMS), controller(store, "ctl-b", T1, TEAMS_2)
    async with serving(a, T1, TEAMS) as client_a, serving(b, T1, TEAMS_2) as client_b:
        team = {"Authorization": f"Bearer {TEAM_A}"}
        resp = await client_b.post("/v1/workloads", json={**SPEC, "queue": "a"}, headers=team)
        assert resp.status == 503
        assert "team tokens (api.team_tokens_file) differ" in (await resp.json())["error"]
        admin = {"Authorization": f"Bearer {T1}"}
        assert (await client_b.post("/v1/workloads", json=SPEC, headers=admin)).status == 503
        resp = await client_a.post("/v1/workloads", json={**SPEC, "queue": "a"}, headers=team)
        assert resp.status == 201, await resp.text()
