"""One declaration per format (``hafo.model.schema``): errors name the field, records
round-trip through their JSON forms and the codec, and the JSON Schemas the OpenAPI document
publishes agree with the validators they come from."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest

from hafo.api.openapi import controller_document
from hafo.checks.api import CheckOptionError
from hafo.checks.builtin import ExecCheck, HttpCheck, ProgressCheck, TcpCheck
from hafo.model.cluster import (
    Assignment,
    CheckpointInfo,
    Event,
    FailsafeSet,
    Gpu,
    InstanceEnd,
    InstanceStatus,
    Liveness,
    MoveRequest,
    NodeRecord,
    Submission,
)
from hafo.model.config import parse_config
from hafo.model.errors import ValidationError
from hafo.model.names import MIG_PROFILE
from hafo.model.schema import field_path
from hafo.model.spec import SPEC, parse_spec
from hafo.store import codec

from .conftest import make_node, make_spec

RECORDS: list[Any] = [
    make_node("a", 2, labels={"rack": "r1"}),
    NodeRecord("b", gpus=(Gpu(101, "MIG-x", "H100", 10240, degraded=True, reason="slow",
                              utilization=12.5, profile="1g.10gb", parent=0),),
               healthy=False, reason="disk", api="http://b:8601", failsafe_seen=3, lease=77),
    Liveness("a", 12, 5.5, claimed=9),
    Assignment("w", "moving", "a", (0, 1), epoch=0, restarts=2, restart_times=(1.0, 2.5),
               reason="why", avoid={"b": 9.0}, stopping=8, move_to="c", urgent=True,
               after_stop="restart", not_before=3.0, failed_on={"c": 4.0},
               preempted_for="v", cause="preempted"),
    InstanceStatus("w", "a", 8, "exited", pid=4, exit_code=1, started_at=1.0,
                   finished_at=2.0, checkpoint=CheckpointInfo(3, 8, "/ck/w/ckpt-e8-s3"),
                   failing="check x failed", ended=InstanceEnd.GUARD_LOST),
    CheckpointInfo(1, 2, "/p"),
    Event(1.5, "placed", "w placed on a", workload="w", node="a", epoch=8),
    FailsafeSet(4, {"ctl-1": {"api": "http://c:8600"}}),
    MoveRequest("w", "b", "drain"),
    Submission("w-abcdef", make_spec("w", 2, env={"A": "1"}, priority=3), 10.0),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_records_round_trip_through_their_json_forms(record: Any) -> None:
    data = record.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert type(record).from_dict(data) == record


@pytest.mark.parametrize(("record", "decode"), [
    (RECORDS[0], codec.decode_node), (RECORDS[1], codec.decode_node),
    (RECORDS[2], codec.decode_liveness), (RECORDS[4], codec.decode_status),
    (RECORDS[6], codec.decode_event), (RECORDS[7], codec.decode_failsafe),
    (RECORDS[8], codec.decode_move), (RECORDS[9], codec.decode_submission),
], ids=lambda r: type(r).__name__ if not callable(r) else r.__name__)
def test_the_codec_decodes_what_from_dict_does(record: Any, decode: Any) -> None:
    value = codec.encode(record.to_dict())
    assert decode(value) == type(record).from_dict(json.loads(value)) == record


def test_an_assignments_epoch_is_its_keys_revision_not_in_its_json() -> None:
    assignment = RECORDS[3]
    assert "epoch" not in assignment.to_dict()
    decoded = codec.decode_assignment(codec.encode({**assignment.to_dict(), "epoch": 5}), 42)
    assert decoded.epoch == 42 and decoded == Assignment.from_dict(assignment.to_dict(), 42)


def test_records_from_newer_writers_still_decode() -> None:
    status = codec.decode_status(codec.encode({
        "workload": "w", "node": "a", "epoch": 3, "state": "exited", "ended": "meteor",
        "failing": None, "new_field": {"x": 1}}))
    assert (status.ended, status.failing) == (None, "")
    assignment = Assignment.from_dict({"workload": "w", "phase": "moving",
                                       "after_stop": "teleport", "cause": "solar-flare"}, 3)
    assert (assignment.after_stop, assignment.cause, assignment.epoch) == ("move", None, 3)


def test_an_undecodable_record_is_a_validation_error() -> None:
    with pytest.raises(ValidationError) as info:
        codec.decode_node(b'{"name": "a", "gpus": [{"index": "zero"}]}')
    assert info.value.field.startswith("noderecord.gpus[0].")
    with pytest.raises(ValueError):
        codec.decode_status(b"not json")


@pytest.mark.parametrize(("prefix", "loc", "expected"), [
    ("spec", (), "spec"), ("", (), "config"), ("spec", ("checks", 0, "url"), "spec.checks[0].url"),
    ("", ("node", "gpus", "simulate", "mig", "0", 1), "node.gpus.simulate.mig.0[1]"),
    ("spec", ("env", "A=B", "[key]"), "spec.env.A=B"), ("", ("command", 2), "command[2]"),
])
def test_field_paths(prefix: str, loc: tuple[Any, ...], expected: str) -> None:
    assert field_path(prefix, loc, "config") == expected


# --- built-in check options: one declaration for the spec and the check --------------------

@pytest.mark.parametrize(("cls", "options"), [
    (HttpCheck, {"url": "ftp://x/"}), (HttpCheck, {"url": "http://x", "method": "FETCH"}),
    (HttpCheck, {"url": "http://x", "expect_status": [200, 99]}),
    (HttpCheck, {"url": "http://x", "expect": 200}), (TcpCheck, {"port": 0}),
    (ExecCheck, {"command": ["x", ""]}), (ProgressCheck, {"stall_after": 0}),
])
def test_spec_and_check_refuse_the_same_option_the_same_way(
        cls: Any, options: dict[str, Any]) -> None:
    kind = {HttpCheck: "http", TcpCheck: "tcp", ExecCheck: "exec", ProgressCheck: "progress"}
    with pytest.raises(CheckOptionError) as by_check:
        cls(options)
    with pytest.raises(ValidationError) as by_spec:
        parse_spec({"name": "w", "command": ["x"], "checks": [{"type": kind[cls], **options}]})
    assert by_spec.value.field == f"spec.checks[0].{by_check.value.field}"
    # the same words (a spec's check also allows the timing fields every check has)
    assert by_spec.value.message.split(" (")[0] == by_check.value.message.split(" (")[0]


def test_check_options_are_read_typed() -> None:
    check = HttpCheck({"url": "http://[::1]:80/x", "method": "post", "expect_status": 201,
                       "headers": {"X-N": 3}})
    assert (check.method, check.expect, check.headers) == ("POST", {201}, {"X-N": "3"})


# --- the OpenAPI document comes from the declarations ----------------------------------------

def document_schema(name: str) -> dict[str, Any]:
    """A component of the controller's document, resolvable on its own."""
    document = controller_document()
    return {"$ref": f"#/components/schemas/{name}", "components": document["components"]}


def test_the_document_is_openapi_3_1_without_3_0_leftovers() -> None:
    text = json.dumps(controller_document())
    assert '"nullable"' not in text and '"exclusiveMinimum": true' not in text
    refs = set(re.findall(r"#/components/schemas/([\w-]+)", text))
    assert refs <= set(controller_document()["components"]["schemas"])


def test_the_spec_schema_is_the_spec_declarations() -> None:
    published = controller_document()["components"]["schemas"]["WorkloadSpec"]
    own = SPEC.json_schema()
    assert set(published["properties"]) == set(own["properties"])
    assert published["additionalProperties"] is False and published["required"] == own[
        "required"] == ["name", "command"]


def test_one_mig_profile_pattern() -> None:
    text = json.dumps(controller_document())
    assert json.dumps(f"^(?:{MIG_PROFILE})$") in text
    for bad in ("9g.10gb", "1g.10GB"):
        with pytest.raises(ValidationError):
            parse_spec({"name": "w", "command": ["x"], "gpu_profile": bad})
        with pytest.raises(ValidationError):
            parse_config({"node": {"name": "n", "gpus": {"simulate": {"mig": {"0": [bad]}}}}},
                         "agent")


SPECS: list[Any] = [
    {"name": "w", "command": ["x"]},
    {"name": "w", "command": ["x"], "gpus": None, "env": {"A": 1, "B": True, "C": "c"},
     "restart": {"window": 1.5, "backoff": None}, "checkpoint": {"mode": "transparent"},
     "gpu_profile": "2g.20gb", "placement": "binpack", "preempt": True, "priority": -5},
    {"name": "w", "command": ["x"], "checks": [
        {"type": "http", "url": "https://u:p@h:8/x?y", "method": "delete",
         "expect_status": [200, 204], "headers": {"A": "b"}},
        {"type": "tcp", "port": 1, "host": "h"}, {"type": "exec", "command": ["c"]},
        {"type": "process", "max_rss_mib": 1}, {"type": "progress", "stall_after": 0.5},
        {"type": "training", "anything": [1, 2], "interval": 3}]},
    {"name": "W", "command": ["x"]}, {"name": "w", "command": "x"}, {"name": "w"},
    {"name": "w", "command": ["x"], "gpus": 65}, {"name": "w", "command": ["x"], "gpus": True},
    {"name": "w", "command": ["x"], "env": {"A=B": "x"}}, {"name": "w", "command": ["x\x00"]},
    {"name": "w", "command": ["x"], "restart": {"window": 0}}, {"name": "w", "command": ["x"],
                                                                "colour": 1},
    {"name": "w", "command": ["x"], "checks": [{"type": "http", "url": "ftp://x"}]},
    {"name": "w", "command": ["x"], "checks": [{"type": "http", "url": "http://x",
                                                "bogus": 1}]},
    {"name": "w", "command": ["x"], "checks": [{"type": "tcp"}]},
    {"name": "w", "command": ["x"], "checks": [{"type": "exec", "command": []}]},
    {"name": "w", "command": ["x"], "checks": [{"type": ""}]},
    {"name": "w", "command": ["x"], "checks": [{"type": "progress", "stall_after": 1,
                                                "interval": 0}]},
    {"name": "w", "command": ["x"], "placement": "random"},
    {"name": "w", "command": ["x"], "preempt": 1},
]


@pytest.mark.parametrize("raw", SPECS)
def test_the_published_schema_and_the_validator_agree(raw: dict[str, Any]) -> None:
    try:
        parse_spec(raw)
        accepted = True
    except ValidationError:
        accepted = False
    valid = jsonschema.Draft202012Validator(document_schema("WorkloadSpec")).is_valid(raw)
    assert valid == accepted, raw
