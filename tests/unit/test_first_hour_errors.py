"""Issue 17: bad input says everything that is wrong with it, once, naming each field; a
closed pipe ends ``hafo`` quietly; ``hafo events`` filters; drain says what it did."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer

from hafo.cli import main
from hafo.commands.base import CliError
from hafo.commands.drain import drain_summary
from hafo.commands.events import EventFilter, check_kinds, parse_duration, selected
from hafo.model import ValidationError, parse_config, parse_spec
from hafo.model.cluster import Event
from hafo.model.config import state_dir_problem
from hafo.store.events import EVENT_KINDS

ROOT = Path(__file__).resolve().parents[2]
UNREACHABLE = ["--etcd", "http://127.0.0.1:1"]


# --- spec and config errors -----------------------------------------------------------------

def test_every_spec_error_at_once_with_did_you_mean() -> None:
    raw = {"name": "x", "command": ["t"], "gpu": 1, "priority": "high",
           "restart": {"max_restart": 2, "window": -1}}
    with pytest.raises(ValidationError) as info:
        parse_spec(raw)
    err = info.value
    assert [e.field for e in err.errors] == [
        "spec.gpu", "spec.restart.max_restart", "spec.restart.window", "spec.priority"]
    assert err.field == "spec.gpu"  # the first error, as before
    assert err.errors[0].message.startswith("unknown field, did you mean 'gpus'? (allowed: ")
    assert "did you mean 'max_restarts'?" in err.errors[1].message
    assert str(err).splitlines() == [str(e) for e in err.errors]


def test_an_unknown_field_close_to_nothing_has_no_guess() -> None:
    with pytest.raises(ValidationError) as info:
        parse_spec({"name": "x", "command": ["t"], "zzzzzz": 1})
    assert str(info.value).startswith("spec.zzzzzz: unknown field (allowed: ")


def test_a_list_item_error_is_not_repeated_as_its_list() -> None:
    with pytest.raises(ValidationError) as info:
        parse_config({"etcd": {"endpoints": ["http://h:0"]}}, "client")
    assert str(info.value) == "etcd.endpoints[0]: port out of range in 'http://h:0'"


def test_every_config_error_at_once_with_did_you_mean() -> None:
    raw = {"clustre": "c", "timing": {"lease_ttl": "3", "hearbeat": 1}}
    with pytest.raises(ValidationError) as info:
        parse_config(raw, "client")
    lines = str(info.value).splitlines()
    assert lines[0].startswith("clustre: unknown field, did you mean 'cluster'?")
    assert any(line.startswith("timing.hearbeat: unknown field, did you mean 'heartbeat'?")
               for line in lines), lines
    assert "timing.lease_ttl: must be an integer, got '3'" in lines


def test_the_cli_prints_one_line_per_error(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: x\ncommand: [t]\ngpu: 1\nstop_grace: -1\n")
    assert main(["submit", str(spec), *UNREACHABLE]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2, err
    assert err[0].startswith(f"hafo: {spec}: spec.gpu: unknown field, did you mean 'gpus'?")
    assert err[1] == f"hafo: {spec}: spec.stop_grace: must be >= 0, got -1"


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n"])
def test_an_empty_spec_says_the_file_is_empty(tmp_path: Path, text: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    assert main(["submit", str(spec), *UNREACHABLE]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hafo: {spec}: the file is empty"), err
    assert "NoneType" not in err


def test_an_empty_config_says_the_file_is_empty(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text("")
    assert main(["agent", "--config", str(config), "--check"]) == 2
    assert capsys.readouterr().err.startswith(f"hafo: {config}: the file is empty")


def test_an_unusable_state_dir_is_named(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"node": {"name": "n1", "state_dir": "/proc/nope"}}))
    assert main(["agent", "--config", str(config), "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hafo: {config}: node.state_dir: cannot create /proc/nope: "), err


def test_state_dir_problems(tmp_path: Path) -> None:
    afile = tmp_path / "file"
    afile.write_text("x")
    assert state_dir_problem(str(tmp_path)) == ""
    assert state_dir_problem(str(tmp_path / "a" / "b")) == ""
    assert not (tmp_path / "a").exists()  # what it made to find out is removed
    assert state_dir_problem(str(afile)) == f"{afile} is not a directory"
    assert state_dir_problem(str(afile / "x")).startswith(f"cannot create {afile / 'x'}: ")
    assert state_dir_problem("/proc/nope").startswith("cannot create /proc/nope: ")


# --- the API says the same ------------------------------------------------------------------

async def _submit(body: dict[str, Any], query: str = "") -> tuple[int, dict[str, Any]]:
    from hafo.api import make_controller_app
    from hafo.store.memory import MemoryStore
    from tests.unit.test_api_app import FakeController

    app = make_controller_app(FakeController(MemoryStore()))
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(f"/v1/workloads{query}", json=body)
        return resp.status, await resp.json()


async def test_the_api_lists_every_error_and_keeps_the_first_field() -> None:
    status, body = await _submit({"name": "x", "command": ["t"], "gpu": 1, "stop_grace": -1})
    assert status == 400
    assert body["field"] == "spec.gpu"
    assert [e["field"] for e in body["errors"]] == ["spec.gpu", "spec.stop_grace"]
    assert body["errors"][1]["error"] == "must be >= 0, got -1"
    assert body["error"].splitlines()[0].startswith("spec.gpu: unknown field, did you mean")


async def test_the_api_refuses_an_unknown_check_type_unless_allowed() -> None:
    spec = {"name": "x", "command": ["t"], "checks": [{"type": "htpp", "url": "http://h:1/"}]}
    status, body = await _submit(spec)
    assert status == 400, body
    assert body["field"] == "spec.checks[0].type"
    assert "did you mean 'http'?" in body["error"] and "allow_unknown_checks=true" in body["error"]
    status, body = await _submit(spec, "?allow_unknown_checks=true")
    assert status == 201, body
    status, body = await _submit(spec, "?allow_unknown_checks=yes")
    assert (status, body["field"]) == (400, "allow_unknown_checks")


# --- drain, events --------------------------------------------------------------------------

def test_drain_says_what_it_did() -> None:
    assert drain_summary("node-1", []) == "cordoned node-1; nothing to move"
    assert drain_summary("node-1", ["a"]) == "cordoned node-1; 1 planned move requested: a"
    assert drain_summary("node-1", ["a", "b", "c"]) == \
        "cordoned node-1; 3 planned moves requested: a, b, c"


def _event(ts: float, kind: str, workload: str | None = None,
           node: str | None = None) -> Event:
    return Event(ts=ts, kind=kind, message=f"{kind} {workload} {node}", workload=workload,
                 node=node)


EVENTS = [
    _event(1, "submitted", "train-0a1b2c"),
    _event(2, "placed", "train-0a1b2c", "n1"),
    _event(3, "submitted", "web-aaaaaa"),
    _event(4, "replica-created", "web-aaaaaa.1"),
    _event(5, "cordoned", None, "n1"),
    _event(6, "failover", "train-0a1b2c", "n2"),
    _event(7, "placed", "trainer-ffffff", "n2"),
    _event(8, "submitted", "train-999999"),  # another workload of that name, later
]


@pytest.mark.parametrize(("which", "limit", "expected"), [
    (EventFilter(), 0, [1, 2, 3, 4, 5, 6, 7, 8]),
    (EventFilter(), 3, [6, 7, 8]),
    (EventFilter(frozenset({"train-0a1b2c"})), 0, [1, 2, 6]),
    (EventFilter(frozenset({"web-aaaaaa"})), 0, [3, 4]),  # a service's replicas with it
    (EventFilter(workload_name="train"), 0, [1, 2, 6, 8]),  # by name: not "trainer"
    (EventFilter(node="n1"), 0, [2, 5]),
    (EventFilter(kinds=frozenset({"placed", "failover"})), 0, [2, 6, 7]),
    (EventFilter(frozenset({"train-0a1b2c"}), node="n2"), 0, [6]),
    (EventFilter(since=5.5), 0, [6, 7, 8]),
    (EventFilter(kinds=frozenset({"placed"})), 1, [7]),
])
def test_event_filters(which: EventFilter, limit: int, expected: list[int]) -> None:
    assert [e.ts for e in selected(EVENTS, which, limit)] == expected


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90), ("90s", 90), ("10m", 600), ("2h", 7200), ("1d", 86400), ("1.5m", 90)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "-1m", "0", "10x", "1 h"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="positive duration"):
        parse_duration(text)


def test_an_unknown_kind_lists_the_kinds() -> None:
    assert check_kinds(["failover", "placed"], EVENT_KINDS) == {"failover", "placed"}
    with pytest.raises(CliError) as info:
        check_kinds(["failvoer"], EVENT_KINDS)
    assert info.value.code == 2
    assert str(info.value).startswith("--kind: unknown kind 'failvoer', did you mean "
                                      "'failover'? (kinds: api-auth-mismatch, app-failed, ")


def test_a_bad_events_flag_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["events", "--kind", "nope", *UNREACHABLE]) == 2
    assert capsys.readouterr().err.startswith("hafo: --kind: unknown kind 'nope' (kinds: ")
    assert main(["events", "--since", "soon", *UNREACHABLE]) == 2
    assert "--since: must be a positive duration" in capsys.readouterr().err


def test_the_event_kinds_are_the_contract_s() -> None:
    """Every kind the controller writes is a declared kind, and the generated events
    reference (scripts/docs_reference.py) lists every declared kind."""
    from hafo.decisions.plan import _MOVE_EVENTS, _PLACE_EVENTS
    from scripts.docs_reference import events_page

    page = events_page()
    missing = [kind for kind in EVENT_KINDS if f"`{kind}`" not in page]
    assert not missing, f"the events reference lacks {missing}"
    assert set(_MOVE_EVENTS.values()) | set(_PLACE_EVENTS.values()) <= set(EVENT_KINDS)


# --- a closed pipe --------------------------------------------------------------------------

def test_a_closed_pipe_ends_hafo_quietly() -> None:
    """``hafo ... | head -1`` with more output than a pipe holds: no "Broken pipe", no
    traceback, status 141 (128 + SIGPIPE)."""
    program = ("import sys\nfrom hafo import cli\n"
               "def lots(args):\n    for i in range(200000):\n        print('line', i)\n"
               "    return 0\n"
               "cli.dispatch = lots\nsys.exit(cli.main(['status']))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["bash", "-c", f'"{sys.executable}" -c "$0" | head -1; '
                                         'echo "status=${PIPESTATUS[0]}" >&2', program],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.stdout == "line 0\n"
    assert done.stderr.strip() == "status=141", done.stderr


async def test_watch_prints_each_new_matching_event_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``hafo events --watch`` on a store: from the revision read before the listing, each
    new event once (one seen by the listing too is not repeated), filtered; SIGTERM ends it
    with 0."""
    import asyncio
    import json
    import signal

    from hafo.commands.events import _follow
    from hafo.store import Keys
    from hafo.store.events import EventLog
    from hafo.store.memory import MemoryStore

    store, keys = MemoryStore(), Keys("unit")
    log = EventLog(store, keys)
    await log.append(_event(1, "placed", "a-000000", "n1"))
    revision = await store.revision()
    listed = await log.put_op(_event(2, "placed", "a-000000", "n1"))  # read by the listing
    await store.put(listed.key, listed.value, lease=listed.lease)
    which = EventFilter(kinds=frozenset({"placed", "failover"}))
    task = asyncio.ensure_future(_follow(store, keys, which, revision, {listed.key}, True))
    await asyncio.sleep(0.05)
    await log.append(_event(3, "cordoned", None, "n1"))  # filtered out
    await log.append(_event(4, "failover", "a-000000", "n2"))
    await asyncio.sleep(0.5)  # the memory store's watch delivers at once
    assert not task.done()
    os.kill(os.getpid(), signal.SIGTERM)
    assert await asyncio.wait_for(task, 5) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(e["ts"], e["kind"]) for e in printed] == [(4, "failover")]


async def test_the_submitted_event_is_written_with_the_submission() -> None:
    """Same transaction, stamped with the submit time: the controller's ``pending`` (written
    after it saw the workload, stamped later) sorts after it."""
    from hafo.model.spec import parse_spec as spec_of
    from hafo.store import Keys, intents
    from hafo.store.memory import MemoryStore

    store, keys = MemoryStore(), Keys("unit")
    done = await intents.submit(store, keys, spec_of({"name": "x", "command": ["t"]}))
    workload = await store.get(keys.workload(done.submission.id))
    _rev, events = await store.get_prefix(keys.events)
    assert workload is not None and len(events) == 1
    assert events[0].mod_revision == workload.mod_revision
    event = Event.from_dict(json.loads(events[0].value))
    assert (event.kind, event.ts) == ("submitted", done.submission.submitted_at)
