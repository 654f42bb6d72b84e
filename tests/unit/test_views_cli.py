"""``hafo status|nodes|workloads`` over a given snapshot (etcd left out): the detail views,
an unknown name (exit 4, one line), the REASON column, and the empty-cluster warning."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from hafo import cli
from hafo.model.cluster import Assignment, ClusterSnapshot
from hafo.store import EventLog, Keys
from hafo.store.memory import MemoryStore

from .conftest import make_snapshot, sample_cluster, status, submit

WARNING = ("warning: no node or controller has registered in cluster 'nosuch' (check "
           "--cluster / $HAFO_CLUSTER)\n")


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Callable[[ClusterSnapshot], None]:
    """Make the CLI read ``snapshot`` instead of etcd."""
    holder: dict[str, Any] = {}

    async def with_store(args: argparse.Namespace,
                         body: Callable[[Any, Keys], Awaitable[int]]) -> int:
        return await body(holder.get("store") or MemoryStore(), Keys(args.cluster or "default"))

    async def read_snapshot(store: Any, keys: Keys) -> ClusterSnapshot:
        return holder["snapshot"]

    monkeypatch.setattr("hafo.commands.base.with_store", with_store)
    monkeypatch.setattr("hafo.store.read_snapshot", read_snapshot)
    return lambda snapshot: holder.__setitem__("snapshot", snapshot)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_workload_detail(cluster: Callable[[ClusterSnapshot], None],
                         capsys: pytest.CaptureFixture[str]) -> None:
    cluster(sample_cluster())
    code, out, err = run(capsys, "workloads", "run")
    assert (code, err) == (0, "")
    assert out.startswith("workload:   run (run)\nstate:      running\n")
    code, out, _ = run(capsys, "workloads", "run", "--json")
    data = json.loads(out)
    assert (code, data["id"], data["gpus_requested"]) == (0, "run", 2)


def test_node_detail(cluster: Callable[[ClusterSnapshot], None],
                     capsys: pytest.CaptureFixture[str]) -> None:
    cluster(sample_cluster())
    code, out, err = run(capsys, "nodes", "a")
    assert (code, err) == (0, "")
    assert out.startswith("node:       a (ready)\n")
    assert "  run  run   running  2" in out
    code, out, _ = run(capsys, "nodes", "a", "--json")
    assert (code, json.loads(out)["name"], json.loads(out)["workloads"]) == (0, "a", ["run"])


@pytest.mark.parametrize(("argv", "message"), [
    (("workloads", "nosuch"), "hafo: no workload 'nosuch'\n"),
    (("workloads", "nosuch", "--json"), "hafo: no workload 'nosuch'\n"),
    (("nodes", "nosuch"), "hafo: no node 'nosuch' (nodes: a, b, c, d)\n"),
])
def test_an_unknown_name_is_exit_4_in_one_line(
        cluster: Callable[[ClusterSnapshot], None], capsys: pytest.CaptureFixture[str],
        argv: tuple[str, ...], message: str) -> None:
    cluster(sample_cluster())
    assert run(capsys, *argv) == (4, "", message)


def test_the_workloads_table_has_the_reason(cluster: Callable[[ClusterSnapshot], None],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    tail = "Traceback (most recent call last):\nValueError: bad learning rate\n"
    snap = make_snapshot(workloads=[submit("w", 8, nodes=8), submit("x")],
                         assignments=[Assignment(workload="w", phase="pending",
                                                 reason="gang of 8: no room"),
                                      Assignment(workload="x", phase="placed", node="a",
                                                 gpus=(0,), epoch=10, reason="new workload")],
                         statuses=[dataclasses.replace(status("x", "a", 10, "exited",
                                                              exit_code=1), stderr_tail=tail)],
                         controllers=["ctl-1"])
    cluster(snap)
    code, out, err = run(capsys, "workloads")
    assert (code, err) == (0, "")
    rows = out.splitlines()
    assert rows[0].split() == ["ID", "STATE", "NODE", "EPOCH", "RESTARTS", "GPUS",
                               "CHECKPOINT", "REASON"]
    assert rows[1].split()[:8] == ["w", "pending", "(gang", "of", "8)", "-", "0", "0/64"]
    assert rows[1].endswith("gang of 8: no room")
    assert rows[2].endswith("exited with code 1 on a: ValueError: bad learning rate")


@pytest.mark.parametrize("argv", [("status",), ("nodes",), ("workloads",),
                                  ("workloads", "--json"), ("status", "--json")])
def test_an_empty_cluster_is_said_on_stderr(cluster: Callable[[ClusterSnapshot], None],
                                            capsys: pytest.CaptureFixture[str],
                                            argv: tuple[str, ...]) -> None:
    cluster(make_snapshot())
    code, out, err = run(capsys, *argv, "--cluster", "nosuch")
    assert (code, err) == (0, WARNING)
    assert out.strip() in ("[]", "no nodes", "no workloads") or out.startswith(("leader:", "{"))


def test_a_cluster_with_a_controller_is_not_empty(cluster: Callable[[ClusterSnapshot], None],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    cluster(make_snapshot(controllers=["ctl-1"]))
    assert run(capsys, "workloads")[1:] == ("no workloads\n", "")


def test_status_on_a_store_that_is_not_the_cluster_is_one_line_and_exit_3(
        cluster: Callable[[ClusterSnapshot], None], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemons found etcd not to be the cluster they knew (it lost its data): ``hafo
    status`` says so in one line, exit 3, until a ``store-trusted`` event follows."""
    import asyncio
    import time

    from hafo.model.cluster import Event

    store = MemoryStore()
    cluster(sample_cluster())
    events = EventLog(store, Keys("default"))

    async def say(kind: str) -> None:
        await events.append(Event(ts=time.time(), kind=kind, message=f"controller c: {kind}"))

    async def with_store(args: argparse.Namespace,
                         body: Callable[[Any, Keys], Awaitable[int]]) -> int:
        return await body(store, Keys("default"))

    monkeypatch.setattr("hafo.commands.base.with_store", with_store)
    asyncio.run(say("store-untrusted"))
    code, out, err = run(capsys, "status")
    assert code == 3 and out == ""
    assert err.strip().splitlines() == [
        "hafo: etcd is not the cluster its daemons knew: controller c: store-untrusted"]
    asyncio.run(say("store-trusted"))
    code, out, err = run(capsys, "status")
    assert code == 0 and out
