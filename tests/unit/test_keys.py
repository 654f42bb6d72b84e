"""The key schema: every key a builder spells parses back to its kind and names; any other key
is ``unknown``."""

from __future__ import annotations

import pytest

from hafo.store.keys import UNKNOWN, Keys, ParsedKey

K = Keys("prod-1.eu")

NODE = "gpu-01.rack-3_a"     # node names may hold '.', '_' and '-'
WORKLOAD = "train-x.y-0a1b2c"


@pytest.mark.parametrize(("key", "expected"), [
    (K.leader, ParsedKey("leader")),
    (K.failsafe, ParsedKey("failsafe")),
    (K.node(NODE), ParsedKey("node", node=NODE)),
    (K.alive(NODE), ParsedKey("alive", node=NODE)),
    (K.cordon(NODE), ParsedKey("cordon", node=NODE)),
    (K.workload(WORKLOAD), ParsedKey("workload", workload=WORKLOAD)),
    (K.assignment(WORKLOAD), ParsedKey("assignment", workload=WORKLOAD)),
    (K.node_assignment(NODE, WORKLOAD),
     ParsedKey("node-assignment", node=NODE, workload=WORKLOAD)),
    (K.move(WORKLOAD), ParsedKey("move", workload=WORKLOAD)),
    (K.status(WORKLOAD, NODE), ParsedKey("status", node=NODE, workload=WORKLOAD)),
    (K.controller("ctl-1.example.com"), ParsedKey("controller", name="ctl-1.example.com")),
    (K.controller("a/b"), ParsedKey("controller", name="a/b")),  # free-form: the whole rest
    (K.report(NODE), ParsedKey("report", node=NODE)),
    (K.fair_share, ParsedKey("fair-share")),
    (K.names_indexed, ParsedKey("names-indexed")),
])
def test_every_builder_parses_back(key: str, expected: ParsedKey) -> None:
    assert K.parse(key) == expected


def test_an_event_key_parses_to_its_id() -> None:
    parsed = K.parse(K.new_event(1.5))
    assert parsed.kind == "event" and parsed.node is None and parsed.workload is None
    assert parsed.name is not None and parsed.name.startswith(f"{int(1.5e9):020d}-")


@pytest.mark.parametrize("key", [
    Keys("other").node(NODE),                # another cluster's
    Keys("prod-1").node(NODE),               # a cluster whose name is a prefix of ours
    "/hafo/\0revision-probe",
    "",
    K.root,                                  # prefixes, not keys
    K.state,
    K.events,
    K.by_node,
    K.node_assignments(NODE),
    K.assignments,
    K.node(""),                              # empty or extra segments
    K.node(f"{NODE}/x"),
    K.status(WORKLOAD, ""),
    K.status("", NODE),
    K.status(WORKLOAD, f"{NODE}/x"),
    K.node_assignment(NODE, f"{WORKLOAD}/x"),
    f"{K.state}leader/x",
    f"{K.state}unheard-of/x",
    f"{K.root}elsewhere/x",
    K.node(NODE).replace("/hafo/", "/other/"),
])
def test_foreign_keys_are_unknown(key: str) -> None:
    assert K.parse(key) == UNKNOWN
    assert K.parse(key).kind == "unknown"


@pytest.mark.parametrize("cluster", ["c", "a.b", "x-y_z", "s", "byn"])
def test_cluster_names_do_not_confuse_the_parse(cluster: str) -> None:
    keys = Keys(cluster)
    assert keys.parse(keys.status(WORKLOAD, NODE)) == ParsedKey("status", node=NODE,
                                                               workload=WORKLOAD)
    assert keys.parse(keys.node_assignment(NODE, WORKLOAD)).kind == "node-assignment"


@pytest.mark.parametrize(("key", "expected"), [
    (K.queue("team-a"), ParsedKey("queue", name="team-a")),
    (K.queue("default"), ParsedKey("queue", name="default")),
    (K.queue(""), UNKNOWN),
    (K.queue("a/b"), UNKNOWN),   # queue names hold no '/': not free-form as a controller's
    (K.queues, UNKNOWN),
])
def test_queue_keys(key: str, expected: ParsedKey) -> None:
    assert K.parse(key) == expected
    assert key.startswith(K.state)  # in the controllers' watched snapshot
