"""Rebuilding a cluster from its agents' recovery reports (``hafo recover --from-agents``,
issue 28, finding 2): the pure plan (table-driven), bad reports skipped with one line naming
the node and field, the agent's report (bounded, read without side effects), and the plan
written into a memory store (assignments with their per-node copies, the identity's next
generation last, with an epoch base past every epoch reported)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hafo.agent.instances import InstanceKey, instance_dir, write_json_atomic
from hafo.agent.recovery_report import build_report, encode_report, reported_instances
from hafo.decisions.recovery import NodeReport, parse_report, plan_recovery
from hafo.decisions.store_trust import EPOCH_BUMP, IdentityRecord, Known
from hafo.model.cluster import Assignment, Member, Submission
from hafo.model.spec import parse_spec
from hafo.store import Keys, codec
from hafo.store.backup import holds_cluster, take_backup
from hafo.store.identity import read_identity
from hafo.store.memory import MemoryStore
from hafo.store.recovery import read_reports, write_recovery

KNOWN = Known("abc", 3, 500)


def submission(wid: str, name: str | None = None, service: str | None = None,
               **spec: Any) -> Submission:
    raw = {"name": name or wid.rsplit("-", 1)[0], "command": ["sleep", "60"], "gpus": 1,
           **spec}
    return Submission(id=wid, spec=parse_spec(raw), submitted_at=10.0, service=service)


def placed(wid: str, node: str, gpus: tuple[int, ...] = (0,), **kwargs: Any) -> Assignment:
    return Assignment(workload=wid, phase="placed", node=node, gpus=gpus, **kwargs)


def gang(wid: str, *nodes: str) -> Assignment:
    members = tuple(Member(rank, node, (0, 1), f"10.0.0.{rank}")
                    for rank, node in enumerate(nodes))
    return Assignment(workload=wid, phase="placed", node=nodes[0], gpus=(0, 1),
                      members=members, master_port=29500)


def entry(sub: Submission, assignment: Assignment, epoch: int,
          service: Submission | None = None, running: bool = True) -> dict[str, Any]:
    return {"workload": sub.id, "epoch": epoch, "running": running,
            "submission": sub.to_dict(), "assignment": assignment.to_dict(),
            "service": service.to_dict() if service is not None else None}


def raw_report(node: str, *entries: dict[str, Any], known: Known = KNOWN) -> bytes:
    return json.dumps({"format": "hafo-report/1", "node": node, "known": known.to_dict(),
                       "instances": list(entries), "left_out": []}).encode()


def report(node: str, *entries: dict[str, Any], known: Known = KNOWN) -> NodeReport:
    parsed, lines = parse_report(node, raw_report(node, *entries, known=known))
    assert parsed is not None and not lines, lines
    return parsed


W1, W2 = submission("w1-aaaaaa"), submission("w2-bbbbbb")
G = submission("g-cccccc", nodes=2)
SVC = submission("web-dddddd", replicas=2)
R0 = submission("web-dddddd.0", name="web", service="web-dddddd")
R1 = submission("web-dddddd.1", name="web", service="web-dddddd")


def where(plan: Any) -> dict[str, tuple[str, tuple[str, ...], int]]:
    return {r.workload: (r.assignment.phase, r.assignment.nodes, r.epoch) for r in plan.workloads}


@pytest.mark.parametrize(("reports", "expected", "dropped"), [
    # each workload where it ran
    ([report("n1", entry(W1, placed(W1.id, "n1"), 40)),
      report("n2", entry(W2, placed(W2.id, "n2", (1,)), 41))],
     {W1.id: ("placed", ("n1",), 40), W2.id: ("placed", ("n2",), 41)}, []),
    # two nodes claim one workload: the newest epoch is kept, the other said
    ([report("n1", entry(W1, placed(W1.id, "n1"), 40)),
      report("n2", entry(W1, placed(W1.id, "n2"), 55))],
     {W1.id: ("placed", ("n2",), 55)}, ["instance 40 on n1 dropped: older than instance 55"]),
    # a gang's members agree: one assignment, every member where it ran
    ([report("n1", entry(G, gang(G.id, "n1", "n2").on_node("n1"), 60)),  # type: ignore[arg-type]
      report("n2", entry(G, gang(G.id, "n1", "n2").on_node("n2"), 60))],  # type: ignore[arg-type]
     {G.id: ("placed", ("n1", "n2"), 60)}, []),
    # a gang whose members disagree: the newest epoch's
    ([report("n1", entry(G, gang(G.id, "n1", "n2").on_node("n1"), 60)),  # type: ignore[arg-type]
      report("n2", entry(G, gang(G.id, "n3", "n2").on_node("n2"), 70)),  # type: ignore[arg-type]
      report("n3", entry(G, gang(G.id, "n3", "n2").on_node("n3"), 70))],  # type: ignore[arg-type]
     {G.id: ("placed", ("n3", "n2"), 70)}, ["instance 60 on n1 dropped"]),
    # a gang with a member on a node that did not report: pending, for the controllers
    ([report("n1", entry(G, gang(G.id, "n1", "n9").on_node("n1"), 60))],  # type: ignore[arg-type]
     {G.id: ("pending", (), 60)}, ["n9 did not report"]),
    # a service's replicas, with the service from the newest replica's report
    ([report("n1", entry(R0, placed(R0.id, "n1"), 30, SVC)),
      report("n2", entry(R1, placed(R1.id, "n2"), 31, SVC))],
     {R0.id: ("placed", ("n1",), 30), R1.id: ("placed", ("n2",), 31)}, []),
    # a replica whose service nobody reported: dropped
    ([report("n1", entry(R0, placed(R0.id, "n1"), 30))], {},
     ["a replica of service web-dddddd, which no report holds"]),
    # two workloads of one name: the newer one
    ([report("n1", entry(W1, placed(W1.id, "n1"), 40)),
      report("n2", entry(submission("w1-eeeeee"), placed("w1-eeeeee", "n2"), 90))],
     {"w1-eeeeee": ("placed", ("n2",), 90)}, ["w1-aaaaaa: named 'w1' like w1-eeeeee"]),
    # a report of another cluster: skipped (the most common id wins)
    ([report("n1", entry(W1, placed(W1.id, "n1"), 40)),
      report("n2", entry(W2, placed(W2.id, "n2"), 41)),
      report("n3", entry(submission("x-ffffff"), placed("x-ffffff", "n3"), 9),
             known=Known("other", 1, 9))],
     {W1.id: ("placed", ("n1",), 40), W2.id: ("placed", ("n2",), 41)},
     ["report of node n3: knows cluster other"]),
    # an instance the guard fenced meanwhile is rebuilt too
    ([report("n1", entry(W1, placed(W1.id, "n1"), 40, running=False))],
     {W1.id: ("placed", ("n1",), 40)}, []),
])
def test_plan(reports: list[NodeReport], expected: dict[str, Any], dropped: list[str]) -> None:
    plan = plan_recovery(reports)
    assert where(plan) == expected
    for words in dropped:
        assert any(words in line for line in plan.dropped), plan.dropped
    if not dropped:
        assert not plan.dropped, plan.dropped
    assert plan.cluster_id == "abc" and plan.generations == (3,)
    for rebuilt in plan.workloads:
        assert rebuilt.assignment.epoch_base == plan.epoch_base
        assert rebuilt.assignment.reason == "recovered from the agents' reports"


def test_the_epoch_base_is_past_every_epoch_known() -> None:
    far = Known("abc", 3, 700, epoch_base=5_000)
    plan = plan_recovery([report("n1", entry(W1, placed(W1.id, "n1"), 5_600), known=far)],
                         store_highest_epoch=12)
    assert plan.epoch_base == 5_700 + EPOCH_BUMP
    plan = plan_recovery([report("n1", entry(W1, placed(W1.id, "n1"), 40))],
                         store_highest_epoch=9_999)
    assert plan.epoch_base == 9_999 + EPOCH_BUMP


def test_a_gang_keeps_ranks_gpus_and_rank_0_as_its_node() -> None:
    whole = gang(G.id, "n2", "n1")
    plan = plan_recovery([report("n1", entry(G, whole.on_node("n1"), 60)),  # type: ignore[arg-type]
                          report("n2", entry(G, whole.on_node("n2"), 60))])  # type: ignore[arg-type]
    (rebuilt,) = plan.workloads
    assert rebuilt.assignment.node == "n2" and rebuilt.assignment.gpus == (0, 1)
    assert rebuilt.assignment.members == whole.members
    assert rebuilt.assignment.master_port == 29500
    assert plan.names == {"g": G.id}


def test_the_service_and_names_are_kept() -> None:
    plan = plan_recovery([report("n1", entry(R0, placed(R0.id, "n1"), 30, SVC)),
                          report("n2", entry(W1, placed(W1.id, "n2"), 31))])
    assert plan.services == (SVC,)
    assert plan.names == {"web": SVC.id, "w1": W1.id}
    assert [r.submission for r in plan.workloads] == [W1, R0]


def test_restarts_are_kept() -> None:
    ran = placed(W1.id, "n1", restarts=2, restart_times=(1.0, 2.0))
    (rebuilt,) = plan_recovery([report("n1", entry(W1, ran, 40))]).workloads
    assert (rebuilt.assignment.restarts, rebuilt.assignment.restart_times) == (2, (1.0, 2.0))


def _with(data: dict[str, Any], path: str, value: Any) -> bytes:
    parts = path.split(".")
    target: Any = data
    for part in parts[:-1]:
        target = target[int(part)] if isinstance(target, list) else target[part]
    target[parts[-1]] = value
    return json.dumps(data).encode()


GOOD = json.loads(raw_report("n1", entry(W1, placed(W1.id, "n1"), 40)))


@pytest.mark.parametrize(("raw", "words", "whole"), [
    (b"{not json", "report of node n1: not JSON", True),
    (b"[1, 2]", "not a JSON object", True),
    (_with(json.loads(json.dumps(GOOD)), "format", "x/9"), "format", True),
    (_with(json.loads(json.dumps(GOOD)), "node", "n2"), "node: names 'n2'", True),
    (_with(json.loads(json.dumps(GOOD)), "known", {"id": ""}), "known:", True),
    (_with(json.loads(json.dumps(GOOD)), "instances", {}), "instances: must be a list", True),
    (_with(json.loads(json.dumps(GOOD)), "instances.0.epoch", -3), "instances[0].epoch", False),
    (_with(json.loads(json.dumps(GOOD)), "instances.0.workload", 7),
     "instances[0].workload", False),
    (_with(json.loads(json.dumps(GOOD)), "instances.0.submission.spec.gpus", "many"),
     "instances[0].submission.spec.gpus", False),
    (_with(json.loads(json.dumps(GOOD)), "instances.0.submission.id", "w9-999999"),
     "instances[0].submission.id", False),
    (_with(json.loads(json.dumps(GOOD)), "instances.0.assignment", None),
     "instances[0].assignment: must be an assignment", False),
    (_with(json.loads(json.dumps(GOOD)), "instances.0.assignment.node", "n7"),
     "does not place it on n1", False),
    (_with(json.loads(json.dumps(GOOD)), "instances.0.assignment.phase", "sideways"),
     "instances[0].assignment.phase", False),
    (_with(json.loads(json.dumps(GOOD)), "instances.0.service", {"id": "x"}),
     "instances[0].service", False),
])
def test_a_bad_report_is_one_line_naming_node_and_field(raw: bytes, words: str,
                                                        whole: bool) -> None:
    parsed, lines = parse_report("n1", raw)
    assert len(lines) == 1 and words in lines[0], lines
    assert lines[0].startswith("report of node n1: ")
    assert "\n" not in lines[0]
    if whole:
        assert parsed is None
    else:
        assert parsed is not None and parsed.instances == ()


def test_left_out_instances_are_said() -> None:
    data = json.loads(raw_report("n1"))
    data["left_out"] = ["w9-999999.12"]
    parsed, lines = parse_report("n1", json.dumps(data).encode())
    assert parsed is not None and parsed.left_out == ("w9-999999.12",)
    assert lines == ["report of node n1: w9-999999.12 was left out of the report (too big to "
                     "publish): not rebuilt"]


# -- the agent's report -----------------------------------------------------------------

def _instance(state_dir: Path, sub: Submission, epoch: int, state: str,
              ended: str | None = None, record: bool = True) -> None:
    path = instance_dir(state_dir, InstanceKey(sub.id, epoch))
    path.mkdir(parents=True)
    guard = {"pid": 1, "start": 0, "boot": "x"}  # not a live guard of this boot
    write_json_atomic(path / "state.json", {"state": state, "ended": ended, "guard": guard,
                                            "guard_pid": 1, "pid": 2, "reason": ""})
    if record:
        write_json_atomic(path / "submission.json", {
            "workload": sub.id, "epoch": epoch, "submission": sub.to_dict(), "service": None,
            "assignment": placed(sub.id, "n1").to_dict()})


def test_the_agent_reports_fenced_instances_and_says_which_have_no_record(
        tmp_path: Path) -> None:
    _instance(tmp_path, W1, 40, "exited", ended="fenced")
    _instance(tmp_path, W2, 41, "exited", ended="exit")  # ended by itself: not reported
    _instance(tmp_path, submission("old-111111"), 7, "exited", ended="fenced", record=False)
    entries, unrecorded = reported_instances(tmp_path)
    assert [(e["workload"], e["epoch"], e["running"]) for e in entries] == [(W1.id, 40, False)]
    assert unrecorded == ["old-111111.7"]
    report_, left_out = build_report("n1", KNOWN, entries)
    assert not left_out
    parsed, lines = parse_report("n1", encode_report(report_, 1.0))
    assert parsed is not None and not lines and parsed.known == KNOWN
    assert parsed.instances[0].submission == W1


def test_the_report_is_bounded(tmp_path: Path) -> None:
    entries = [entry(submission(f"w{i}-{i:06d}"), placed(f"w{i}-{i:06d}", "n1"), i + 1)
               for i in range(40)]
    report_, left_out = build_report("n1", KNOWN, entries, limit=8 * 1024)
    value = encode_report(report_, 1.0)
    assert len(value) <= 8 * 1024
    assert left_out and len(report_["instances"]) + len(left_out) == 40
    parsed, lines = parse_report("n1", value)
    assert parsed is not None and len(lines) == len(left_out)


# -- written into a store -----------------------------------------------------------------

async def test_written_back_with_copies_names_and_the_next_generation_last() -> None:
    store, keys = MemoryStore(), Keys("c")
    await store.put(keys.identity, codec.encode(IdentityRecord("fresh", 1).to_dict()))
    whole = gang(G.id, "n1", "n2")
    await store.put(keys.report("n1"), raw_report(
        "n1", entry(W1, placed(W1.id, "n1"), 40), entry(G, whole.on_node("n1"), 60),  # type: ignore[arg-type]
        entry(R0, placed(R0.id, "n1", (1,)), 61, SVC)))
    await store.put(keys.report("n2"), raw_report("n2", entry(G, whole.on_node("n2"), 60)))  # type: ignore[arg-type]
    await store.put(keys.report("n3"), b"garbage")
    assert await holds_cluster(store, keys) == [], "reports are not the cluster's state"
    reports, lines, highest = await read_reports(store, keys)
    assert [r.node for r in reports] == ["n1", "n2"]
    assert lines == ["report of node n3: not JSON: skipped"]
    plan = plan_recovery(reports, highest)
    record = await write_recovery(store, keys, plan)
    assert record.id == "abc" and record.generation > 3 and record.epoch_base == plan.epoch_base
    assert (await read_identity(store, keys))[0] == record
    for sub in (W1, G, R0, SVC):
        kv = await store.get(keys.workload(sub.id))
        assert kv is not None and codec.decode_submission(kv.value) == sub
    for name, wid in (("w1", W1.id), ("g", G.id), ("web", SVC.id)):
        kv = await store.get(keys.name(name))
        assert kv is not None and kv.value.decode() == wid
    assert await store.get(keys.name("web-dddddd.0")) is None
    kv = await store.get(keys.assignment(G.id))
    assert kv is not None
    assignment = codec.decode_assignment(kv.value, kv.mod_revision)
    assert assignment.nodes == ("n1", "n2") and assignment.epoch > 60
    assert assignment.epoch == kv.mod_revision + plan.epoch_base
    for node in ("n1", "n2"):
        copy = await store.get(keys.node_assignment(node, G.id))
        assert copy is not None and copy.mod_revision == kv.mod_revision
    assert await store.get(keys.node_assignment("n2", W1.id)) is None
    identity = await store.get(keys.identity)
    assert identity is not None and identity.mod_revision > kv.mod_revision, "identity last"
    backup = await take_backup(store, keys)
    assert not any(keys.parse(k).kind == "report" for k in backup.keys), "reports not kept"


def test_recover_needs_its_source() -> None:
    from hafo.cli import build_parser
    from hafo.commands import recover
    from hafo.commands.base import CliError

    args = build_parser().parse_args(["recover", "--yes"])
    with pytest.raises(CliError) as refused:
        recover.run(args)
    assert refused.value.code == 2 and "--from-agents" in str(refused.value)
