"""Table-driven validation of workload specs (docs/reference/workloads.md, "Workload spec")."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hafo.model.errors import ValidationError
from hafo.model.spec import RestartPolicy, WorkloadSpec, parse_spec

MINIMAL: dict[str, Any] = {"name": "train-demo", "command": ["python", "train.py"]}
FULL: dict[str, Any] = {
    "name": "train-demo",
    "command": ["python", "-u", "examples/train.py"],
    "gpus": 1,
    "gpu_model": "*H100*",
    "gpu_memory_mib": 40000,
    "env": {"KEY": "value", "N": 4, "FLAG": True},
    "restart": {"max_restarts": 3, "window": 600},
    "checks": [
        {"type": "http", "url": "http://127.0.0.1:9000/healthz", "interval": 2, "timeout": 1,
         "failure_threshold": 3},
        {"type": "exec", "command": ["./check.sh"], "interval": 10},
        {"type": "tcp", "port": 9000},
    ],
    "stop_grace": 30,
    "workdir": "/srv/job",
    "priority": 5,
    "node_selector": {"rack": "r1"},
}


NON_STRING_KEY: dict[Any, Any] = {**MINIMAL, 1: "x"}


def with_(**changes: Any) -> dict[str, Any]:
    """MINIMAL with some fields replaced or added."""
    return {**MINIMAL, **changes}


def without(key: str) -> dict[str, Any]:
    """MINIMAL without one field."""
    return {k: v for k, v in MINIMAL.items() if k != key}


@pytest.mark.parametrize("raw", [MINIMAL, FULL], ids=["minimal", "full"])
def test_valid_spec_round_trips_through_to_dict(raw: dict[str, Any]) -> None:
    spec = parse_spec(raw)
    canonical = spec.to_dict()
    assert json.loads(json.dumps(canonical)) == canonical
    again = parse_spec(canonical)
    assert again == spec
    assert again.to_dict() == canonical


def test_minimal_spec_defaults() -> None:
    spec = parse_spec(MINIMAL)
    assert spec == WorkloadSpec(name="train-demo", command=("python", "train.py"))
    assert spec.gpus == 0
    assert spec.restart == RestartPolicy(max_restarts=3, window=600.0)
    assert spec.checks == ()
    assert spec.stop_grace == 30.0
    assert spec.priority == 0
    out = spec.to_dict()
    assert "gpu_model" not in out and "gpu_memory_mib" not in out and "workdir" not in out


def test_full_spec_values() -> None:
    spec = parse_spec(FULL)
    assert spec.command == ("python", "-u", "examples/train.py")
    assert spec.gpu_model == "*H100*" and spec.gpu_memory_mib == 40000
    assert dict(spec.env) == {"KEY": "value", "N": "4", "FLAG": "true"}
    assert [c.type for c in spec.checks] == ["http", "exec", "tcp"]
    http, exe, tcp = spec.checks
    assert (http.interval, http.timeout, http.failure_threshold) == (2.0, 1.0, 3)
    assert http.options == {"url": "http://127.0.0.1:9000/healthz"}
    assert exe.options == {"command": ["./check.sh"]} and exe.interval == 10.0
    assert tcp.options == {"port": 9000} and tcp.timeout == 5.0
    assert dict(spec.node_selector) == {"rack": "r1"}
    assert spec.priority == 5 and spec.workdir == "/srv/job"


@pytest.mark.parametrize(("raw", "field"), [
    pytest.param(["not", "a", "mapping"], "spec", id="not-a-mapping"),
    pytest.param(NON_STRING_KEY, "spec", id="non-string-key"),
    pytest.param(without("name"), "spec.name", id="missing-name"),
    pytest.param(with_(name=None), "spec.name", id="null-name"),
    pytest.param(with_(name=""), "spec.name", id="empty-name"),
    pytest.param(with_(name=7), "spec.name", id="name-not-string"),
    pytest.param(with_(name="Train"), "spec.name", id="name-uppercase"),
    pytest.param(with_(name="train_demo"), "spec.name", id="name-underscore"),
    pytest.param(with_(name="-train"), "spec.name", id="name-leading-dash"),
    pytest.param(with_(name="train-"), "spec.name", id="name-trailing-dash"),
    pytest.param(with_(name="a" * 53), "spec.name", id="name-too-long"),
    pytest.param(with_(name="train\n"), "spec.name", id="name-trailing-newline"),
    pytest.param(without("command"), "spec.command", id="missing-command"),
    pytest.param(with_(command="python train.py"), "spec.command", id="command-string"),
    pytest.param(with_(command=[]), "spec.command", id="command-empty"),
    pytest.param(with_(command=["python", 3]), "spec.command[1]", id="argv-non-string"),
    pytest.param(with_(command=["python", ""]), "spec.command[1]", id="argv-empty-string"),
    pytest.param(with_(gpus=-1), "spec.gpus", id="gpus-negative"),
    pytest.param(with_(gpus=True), "spec.gpus", id="gpus-bool"),
    pytest.param(with_(gpus=1.5), "spec.gpus", id="gpus-float"),
    pytest.param(with_(gpus="2"), "spec.gpus", id="gpus-string"),
    pytest.param(with_(gpus=65), "spec.gpus", id="gpus-too-many"),
    pytest.param(with_(gpu_model=""), "spec.gpu_model", id="gpu-model-empty"),
    pytest.param(with_(gpu_memory_mib=0), "spec.gpu_memory_mib", id="gpu-memory-zero"),
    pytest.param(with_(replica=2), "spec.replica", id="unknown-field"),
    pytest.param(with_(checkpoint={"mode": "magic"}), "spec.checkpoint.mode",
                 id="checkpoint-mode"),
    pytest.param(with_(checkpoint={"every": 5}), "spec.checkpoint.every",
                 id="checkpoint-unknown"),
    pytest.param(with_(restart=3), "spec.restart", id="restart-not-mapping"),
    pytest.param(with_(restart={"window": 0}), "spec.restart.window", id="window-zero"),
    pytest.param(with_(restart={"window": -5}), "spec.restart.window", id="window-negative"),
    pytest.param(with_(restart={"window": "10m"}), "spec.restart.window", id="window-string"),
    pytest.param(with_(restart={"window": float("nan")}), "spec.restart.window", id="window-nan"),
    pytest.param(with_(restart={"max_restarts": -1}), "spec.restart.max_restarts",
                 id="max-restarts-negative"),
    pytest.param(with_(restart={"retries": 5}), "spec.restart.retries",
                 id="unknown-restart-field"),
    pytest.param(with_(restart={"backoff": -1}), "spec.restart.backoff",
                 id="negative-backoff"),
    pytest.param(with_(checks={"type": "http"}), "spec.checks", id="checks-not-list"),
    pytest.param(with_(checks=["http"]), "spec.checks[0]", id="check-not-mapping"),
    pytest.param(with_(checks=[{}]), "spec.checks[0].type", id="check-without-type"),
    pytest.param(with_(checks=[{"type": "exec"}]), "spec.checks[0].command",
                 id="exec-without-command"),
    pytest.param(with_(checks=[{"type": "exec", "command": "./check.sh"}]),
                 "spec.checks[0].command", id="exec-command-string"),
    pytest.param(with_(checks=[{"type": "http"}]), "spec.checks[0].url",
                 id="http-without-url"),
    pytest.param(with_(checks=[{"type": "exec", "command": ["x"]}, {"type": "http"}]),
                 "spec.checks[1].url", id="second-check-bad"),
    pytest.param(with_(checks=[{"type": "tcp", "port": 70000}]), "spec.checks[0].port",
                 id="tcp-port-range"),
    pytest.param(with_(checks=[{"type": "http", "url": "u", "interval": 0}]),
                 "spec.checks[0].interval", id="check-interval-zero"),
    pytest.param(with_(checks=[{"type": "http", "url": "u", "failure_threshold": 0}]),
                 "spec.checks[0].failure_threshold", id="check-threshold-zero"),
    pytest.param(with_(env=["A=1"]), "spec.env", id="env-not-mapping"),
    pytest.param(with_(env={"A": {"b": 1}}), "spec.env.A", id="env-nested-value"),
    pytest.param(with_(stop_grace=-1), "spec.stop_grace", id="stop-grace-negative"),
    pytest.param(with_(priority=5000), "spec.priority", id="priority-too-high"),
    pytest.param(with_(node_selector=["rack"]), "spec.node_selector", id="selector-list"),
])
def test_bad_spec_names_the_field(raw: Any, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_spec(raw)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert isinstance(info.value, ValueError)


def test_field_prefix_is_used_in_errors() -> None:
    with pytest.raises(ValidationError) as info:
        parse_spec(with_(gpus=-1), field_prefix="body")
    assert info.value.field == "body.gpus"


@pytest.mark.parametrize(("name", "ok"), [
    ("a", True), ("0", True), ("a-b-c", True), ("a" * 52, True), ("a" * 53, False),
    ("a--b", True), ("ab.c", False), ("é", False),
])
def test_name_rule(name: str, ok: bool) -> None:
    raw = with_(name=name)
    if ok:
        assert parse_spec(raw).name == name
    else:
        with pytest.raises(ValidationError):
            parse_spec(raw)


def test_transparent_checkpoint_mode_round_trips() -> None:
    from hafo.model.spec import parse_spec

    spec = parse_spec({"name": "opaque", "command": ["x"], "checkpoint": {"mode": "transparent"}})
    assert spec.checkpoint_mode == "transparent"
    assert parse_spec(spec.to_dict()) == spec
    assert parse_spec({"name": "plain", "command": ["x"]}).checkpoint_mode == "cooperative"


@pytest.mark.parametrize(("extra", "expected"), [
    pytest.param({}, {"gpu_profile": None, "placement": None, "preempt": False}, id="defaults"),
    pytest.param({"gpu_profile": "1g.10gb", "gpus": 2},
                 {"gpu_profile": "1g.10gb", "gpus": 2}, id="profile"),
    pytest.param({"gpu_profile": "1g.20gb+me"}, {"gpu_profile": "1g.20gb+me"},
                 id="profile-with-media-extensions"),
    pytest.param({"placement": "binpack"}, {"placement": "binpack"}, id="binpack"),
    pytest.param({"placement": "spread"}, {"placement": "spread"}, id="spread"),
    pytest.param({"preempt": True, "priority": 10}, {"preempt": True, "priority": 10},
                 id="preempt"),
    pytest.param({"preempt": None}, {"preempt": False}, id="preempt-null"),
])
def test_placement_fields(extra: dict[str, Any], expected: dict[str, Any]) -> None:
    spec = parse_spec(with_(**extra))
    assert {k: getattr(spec, k) for k in expected} == expected
    assert parse_spec(spec.to_dict()) == spec
    out = spec.to_dict()
    assert ("gpu_profile" in out) == (spec.gpu_profile is not None)
    assert ("placement" in out) == (spec.placement is not None)
    assert out.get("preempt", False) == spec.preempt


@pytest.mark.parametrize(("extra", "field"), [
    pytest.param({"gpu_profile": "big"}, "spec.gpu_profile", id="profile-shape"),
    pytest.param({"gpu_profile": "9g.10gb"}, "spec.gpu_profile", id="profile-slices"),
    pytest.param({"gpu_profile": "1g.10GB"}, "spec.gpu_profile", id="profile-case"),
    pytest.param({"gpu_profile": 1}, "spec.gpu_profile", id="profile-int"),
    pytest.param({"placement": "random"}, "spec.placement", id="placement-unknown"),
    pytest.param({"placement": ""}, "spec.placement", id="placement-empty"),
    pytest.param({"preempt": "yes"}, "spec.preempt", id="preempt-string"),
    pytest.param({"preempt": 1}, "spec.preempt", id="preempt-int"),
])
def test_bad_placement_fields(extra: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_spec(with_(**extra))
    assert info.value.field == field


@pytest.mark.parametrize(("extra", "field", "size"), [
    ({"env": {"BLOB": "x" * 5_200_000}}, "spec.env", "5.0 MiB"),
    ({"command": ["python", "-c", "y" * 1_000_000]}, "spec.command", "976.6 KiB"),
])
def test_a_spec_too_big_for_etcd_names_its_biggest_field(extra: dict[str, object], field: str,
                                                         size: str) -> None:
    """Refused at submit (CLI and API alike), not by etcd's gRPC "message larger than max"."""
    from hafo.model.errors import ValidationError
    from hafo.model.spec import MAX_SPEC_BYTES

    with pytest.raises(ValidationError) as caught:
        parse_spec({"name": "big", "command": ["x"], **extra})
    assert caught.value.field == field
    assert caught.value.message.startswith(f"{size} encoded; a whole spec is at most 256 KiB")
    assert MAX_SPEC_BYTES == 256 * 1024
    parse_spec({"name": "fits", "command": ["x"], "env": {"A": "x" * 200_000}})
