"""``hafo queue set|delete`` and ``hafo queues [NAME]`` on the in-memory store (etcd left
out): bad flags are one line naming the flag (exit 2) with the API's messages, the table's
rows (``queue_rows``), a queue in detail, and the exit codes of delete."""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from hafo import cli
from hafo.commands.queues import HEADERS, queue_rows
from hafo.model.queues import QueueSpec
from hafo.store import Keys, intents
from hafo.store.memory import MemoryStore

from .conftest import make_snapshot, make_spec, submit

UNREACHABLE = ["--etcd", "http://127.0.0.1:1"]


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> MemoryStore:
    """The in-memory store every command of the test reads and writes (cluster 'default')."""
    memory = MemoryStore()

    async def with_store(args: argparse.Namespace,
                         body: Callable[[Any, Keys], Awaitable[int]]) -> int:
        return await body(memory, Keys(args.cluster or "default"))

    monkeypatch.setattr("hafo.commands.base.with_store", with_store)
    return memory


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("flags", "message"), [
    (["--gpus", "many"], "--gpus: "),
    (["--gpus", "1.5"], "--gpus: "),
    (["--gpus", "-1"], "--gpus: "),
    (["--gpus", "4", "--weight", "0"], "--weight: "),
    (["--gpus", "4", "--weight", "x"], "--weight: "),
    (["--gpus", "4", "--lending-limit", "2"], "--lending-limit: needs a cohort"),
    (["--gpus", "4", "--borrowing-limit", "2"], "--borrowing-limit: needs a cohort"),
    (["--gpus", "4", "--cohort", "r", "--lending-limit", "5"], "--lending-limit: is 5, above"),
    (["--gpus", "4", "--cohort", "Bad_Cohort"], "--cohort: must be lowercase"),
])
def test_bad_flags_are_one_line_naming_the_flag(capsys: pytest.CaptureFixture[str],
                                               flags: list[str], message: str) -> None:
    code, out, err = run(capsys, "queue", "set", "team-a", *flags, *UNREACHABLE)
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1 and err.startswith(f"hafo queue set: {message}"), err


def test_a_bad_name_and_a_cohort_without_a_quota(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "queue", "set", "Team_A", "--gpus", "1", *UNREACHABLE)
    assert code == 2 and err.startswith("hafo queue set: NAME: must be lowercase")
    code, _, err = run(capsys, "queue", "set", "team-a", "--cohort", "c", *UNREACHABLE)
    assert code == 2 and err.startswith("hafo queue set: --cohort: needs a quota") \
        and len(err.splitlines()) == 1


def test_set_list_show_and_delete(store: MemoryStore,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "queues")[:2] == (0, "no queues (every workload is admitted)\n")
    assert run(capsys, "queue", "set", "team-a", "--gpus", "8", "--cohort", "research",
               "--borrowing-limit", "4", "--weight", "2") == (
        0, "created queue team-a (8 GPU(s))\n", "")
    assert run(capsys, "queue", "set", "team-a", "--gpus", "8", "--cohort", "research",
               "--borrowing-limit", "4", "--weight", "2")[1].startswith("unchanged")
    assert run(capsys, "queue", "set", "team-b", "--gpus", "2")[1] == (
        "created queue team-b (2 GPU(s))\n")
    code, out, _ = run(capsys, "queues")
    assert code == 0
    assert out.splitlines() == [
        "NAME    GPUS  USED  BORROWED  LENT  PENDING  SHARE  COHORT    BORROWING LIMIT  "
        "LENDING LIMIT  WEIGHT  WORKLOADS",
        "team-a  8     0     0         0     0        0.000  research  4                "
        "-              2       0",
        "team-b  2     0     0         0     0        0.000  -         -                "
        "-              1       0"]
    code, out, _ = run(capsys, "queues", "--json")
    assert [q["name"] for q in json.loads(out)] == ["team-a", "team-b"]
    code, out, _ = run(capsys, "queues", "team-b")
    assert (code, out.splitlines()[0], out.splitlines()[-1]) == (
        0, "queue:           team-b", "workloads:       none")
    assert run(capsys, "queue", "delete", "team-b") == (0, "deleted queue team-b\n", "")
    assert run(capsys, "queue", "delete", "team-b") == (4, "", "hafo: no queue 'team-b'\n")
    code, out, err = run(capsys, "queues", "team-b")
    assert (code, out, err.splitlines()[-1]) == (4, "", "hafo: no queue 'team-b' (queues: team-a)")


def test_a_queue_in_use_is_not_deleted(store: MemoryStore,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    import asyncio

    async def setup() -> str:
        keys = Keys("default")
        await intents.set_queue(store, keys, QueueSpec(name="team-a", gpus=4))
        return (await intents.submit(store, keys, make_spec("w", queue="team-a"))).submission.id

    wid = asyncio.run(setup())
    code, out, err = run(capsys, "queue", "delete", "team-a")
    assert (code, out) == (5, "")
    assert err.startswith("hafo: cannot delete queue team-a: queue 'team-a' is in use: 1 "
                          f"workload(s) name it (e.g. {wid})")
    code, out, _ = run(capsys, "queues", "team-a")
    assert code == 0 and out.splitlines()[-1].split()[:4] == [wid, "w", "pending", "1"]


def test_queue_rows_count_workloads_not_replicas() -> None:
    snapshot = make_snapshot(workloads=[
        submit("a", queue="team-a"), submit("b", queue="team-a"), submit("c"),
        submit("svc", spec=make_spec("svc", queue="team-b", replicas=2))])
    snapshot = type(snapshot)(**{**snapshot.__dict__, "queues": {
        "team-a": QueueSpec(name="team-a", gpus=4),
        "team-b": QueueSpec(name="team-b", gpus=2, cohort="c", lending_limit=1)}})
    rows = queue_rows(snapshot)
    assert len(rows[0]) == len(HEADERS)
    assert rows == [["team-a", 4, "0", "0", "0", "2", "0.000", None, None, None, "1", 2],
                    ["team-b", 2, "0", "0", "0", "0", "0.000", "c", None, 1, "1", 1]]
