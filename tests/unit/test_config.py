"""Table-driven validation of daemon configs (docs/reference/config-files.md, "Daemon config")."""

from __future__ import annotations

import math
from typing import Any

import pytest

from hafo.model.config import (
    ELECTION_ROUND_TRIPS,
    ETCD_ELECTION_TIMEOUT_MS,
    ETCD_HEARTBEAT_INTERVAL_MS,
    Config,
    GpuSource,
    SimulatedGpus,
    TimingConfig,
    election_problem,
    election_slack,
    parse_config,
)
from hafo.model.errors import ValidationError
from hafo.model.timing_profile import PROFILES

GOOD = "http://127.0.0.1:2379"
AGENT: dict[str, Any] = {"node": {"name": "node-a"}}
CONTROLLER: dict[str, Any] = {"controller": {"name": "ctl-1"}}
CONTRACT_EXAMPLE: dict[str, Any] = {
    "cluster": "default",
    "etcd": {"endpoints": [GOOD]},
    "timing": {"lease_ttl": 3, "heartbeat": 1},
    "api": {"listen": "127.0.0.1:8600", "token_file": None},
    "node": {"name": "node-a", "labels": {"rack": "r1"}, "state_dir": "/var/lib/hafo",
             "gpus": "auto"},
    "checkpoint": {"root": "/mnt/shared/hafo"},
}


def expect_error(raw: Any, role: str, field: str) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        parse_config(raw, role)
    assert info.value.field == field, str(info.value)
    return info.value


@pytest.mark.parametrize("raw", [None, {}], ids=["none", "empty"])
def test_client_defaults(raw: Any) -> None:
    config = parse_config(raw, "client")
    assert config == Config()
    assert config.cluster == "default"
    assert config.etcd.endpoints == (GOOD,)
    assert config.timing == TimingConfig(lease_ttl=3, heartbeat=1.0, fence_margin=0.5)
    assert (config.api.listen, config.api.host, config.api.port) == ("127.0.0.1:8600",
                                                                     "127.0.0.1", 8600)
    assert config.node is None and config.controller_name is None


def test_contract_example_for_agent() -> None:
    config = parse_config(CONTRACT_EXAMPLE, "agent")
    assert config.node is not None
    assert config.node.name == "node-a"
    assert dict(config.node.labels) == {"rack": "r1"}
    assert (config.node.gpu_source, config.node.simulate) == (GpuSource.AUTO, None)
    assert config.checkpoint_root == "/mnt/shared/hafo"
    assert config.api.token_file is None


@pytest.mark.parametrize(("value", "expected"), [
    ([GOOD], (GOOD,)),
    (GOOD, (GOOD,)),
    ("http://a:2379,http://b:2379", ("http://a:2379", "http://b:2379")),
    (" http://a:2379 , http://b:2379 ,", ("http://a:2379", "http://b:2379")),
    (["http://etcd-1.example:2379/", "http://[::1]:22379"],
     ("http://etcd-1.example:2379/", "http://[::1]:22379")),
])
def test_endpoints_parse(value: Any, expected: tuple[str, ...]) -> None:
    assert parse_config({"etcd": {"endpoints": value}}, "client").etcd.endpoints == expected


TLS = {"endpoints": ["https://e1:2379", "https://e2:2379"], "ca": "/etc/hafo/ca.pem"}


@pytest.mark.parametrize("etcd", [
    TLS,
    {**TLS, "cert": "/c.pem", "key": "/k.pem"},
    {**TLS, "username": "hafo", "password_file": "/etc/hafo/etcd-password"},
    {"endpoints": [GOOD], "username": "hafo", "password": "secret"},
])
def test_etcd_security_settings_that_fit(etcd: dict[str, Any]) -> None:
    config = parse_config({"etcd": etcd}, "client").etcd
    assert config.endpoints == tuple(etcd["endpoints"])
    assert (config.ca, config.username) == (etcd.get("ca"), etcd.get("username"))


@pytest.mark.parametrize(("etcd", "field"), [
    ({"endpoints": ["https://e1:2379"]}, "etcd.ca"),
    ({"endpoints": ["https://e1:2379", GOOD], "ca": "/ca"}, "etcd.endpoints"),
    ({"endpoints": [GOOD], "ca": "/ca"}, "etcd.endpoints"),
    ({**TLS, "cert": "/c.pem"}, "etcd.key"),
    ({**TLS, "key": "/k.pem"}, "etcd.cert"),
    ({"endpoints": [GOOD], "username": "hafo"}, "etcd.password_file"),
    ({"endpoints": [GOOD], "password": "x"}, "etcd.username"),
    ({"endpoints": [GOOD], "username": "u", "password": "x", "password_file": "/p"},
     "etcd.password"),
    ({"endpoints": [GOOD], "token": "x"}, "etcd.token"),
])
def test_etcd_security_mistakes_name_the_field(etcd: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_config({"etcd": etcd}, "client")
    assert info.value.field == field


@pytest.mark.parametrize(("value", "field"), [
    ([], "etcd.endpoints"),
    ("", "etcd.endpoints"),
    (" , ", "etcd.endpoints"),
    (2379, "etcd.endpoints"),
    ("127.0.0.1:2379", "etcd.endpoints[0]"),
    ([GOOD, "127.0.0.1:2379"], "etcd.endpoints[1]"),
    ([GOOD, "http://h:99999"], "etcd.endpoints[1]"),
    ([GOOD, "http://h:0"], "etcd.endpoints[1]"),
    ([GOOD, 2379], "etcd.endpoints[1]"),
    ([GOOD, "http://h"], "etcd.endpoints[1]"),
    (f"{GOOD},ftp://b:2379", "etcd.endpoints[1]"),
])
def test_bad_endpoints_name_the_item(value: Any, field: str) -> None:
    expect_error({"etcd": {"endpoints": value}}, "client", field)


def test_etcd_tls_fields() -> None:
    etcd = parse_config({"etcd": {"endpoints": ["https://e:2379"], "ca": "/ca.pem",
                                  "cert": "/c.pem", "key": "/k.pem"}}, "client").etcd
    assert (etcd.ca, etcd.cert, etcd.key) == ("/ca.pem", "/c.pem", "/k.pem")


@pytest.mark.parametrize(("timing", "expected"), [
    ({}, TimingConfig(3, 1.0, 0.5)),
    ({"lease_ttl": 3, "heartbeat": 1.5}, TimingConfig(3, 1.5, 0.5)),
    ({"lease_ttl": 10, "heartbeat": 5}, TimingConfig(10, 5.0, 0.5)),
    ({"lease_ttl": 2, "heartbeat": 0.25, "fence_margin": 1.25}, TimingConfig(2, 0.25, 1.25)),
])
def test_timing_valid(timing: dict[str, Any], expected: TimingConfig) -> None:
    # an etcd that elects fast enough for every row (the rule between them: below)
    raw = {"timing": timing, "etcd": {"election_timeout": 0.1}}
    assert parse_config(raw, "client").timing == expected


@pytest.mark.parametrize(("timing", "field"), [
    pytest.param({"lease_ttl": 3, "heartbeat": 1.6}, "timing.heartbeat", id="hb-over-half"),
    pytest.param({"lease_ttl": 4, "heartbeat": 2.5}, "timing.heartbeat", id="hb-over-half-4"),
    pytest.param({"heartbeat": 0}, "timing.heartbeat", id="hb-zero"),
    pytest.param({"heartbeat": True}, "timing.heartbeat", id="hb-bool"),
    pytest.param({"heartbeat": float("nan")}, "timing.heartbeat", id="hb-nan"),
    pytest.param({"lease_ttl": 0}, "timing.lease_ttl", id="ttl-too-small"),
    pytest.param({"lease_ttl": 1}, "timing.heartbeat", id="ttl1-default-heartbeat"),
    pytest.param({"profile": "quick"}, "timing.profile", id="profile-unknown"),
    pytest.param({"profile": "Fast"}, "timing.profile", id="profile-case"),
    pytest.param({"profile": 1}, "timing.profile", id="profile-number"),
    pytest.param({"profile": "fast", "heartbeat": 0.6}, "timing.heartbeat",
                 id="fast-heartbeat-over-half"),
    pytest.param({"lease_ttl": 2.5}, "timing.lease_ttl", id="ttl-float"),
    pytest.param({"lease_ttl": 3, "heartbeat": 1, "fence_margin": 2}, "timing.fence_margin",
                 id="margin-too-big"),
    pytest.param({"fence_margin": 0}, "timing.fence_margin", id="margin-zero"),
    pytest.param({"jitter": 0.1}, "timing.jitter", id="unknown-timing-key"),
])
def test_bad_timing(timing: dict[str, Any], field: str) -> None:
    expect_error({"timing": timing}, "client", field)


def test_default_timing_fits_the_default_etcd_election() -> None:
    """TTL 3, heartbeat 1, margin 0.5: 1.5 s of slack; etcd (500 ms): 2 x 0.5 + 0.25 s."""
    config = parse_config({}, "client")
    assert config.etcd.election_timeout == ETCD_ELECTION_TIMEOUT_MS / 1000 == 0.5
    assert ETCD_ELECTION_TIMEOUT_MS >= 10 * ETCD_HEARTBEAT_INTERVAL_MS  # etcd's advice
    assert election_slack(config.timing) == 1.5
    assert election_problem(config.etcd.election_timeout, config.timing) is None
    assert 2 * config.etcd.election_timeout + ELECTION_ROUND_TRIPS < 1.5


@pytest.mark.parametrize(("timing", "election_timeout", "fits"), [
    pytest.param({}, None, True, id="defaults"),
    pytest.param({}, 0.6, True, id="defaults-600ms"),  # 1.45 < 1.5
    pytest.param({}, 0.625, False, id="defaults-625ms-equal"),  # 1.5 is not below 1.5
    pytest.param({}, 1.0, False, id="defaults-etcd-default-1s"),  # the gap this rule closes
    pytest.param({"lease_ttl": 5}, 1.0, True, id="ttl5-etcd-default-1s"),  # 2.25 < 3.5
    pytest.param({"lease_ttl": 2, "heartbeat": 1}, None, False, id="ttl2-hb1"),  # slack 0.5
    pytest.param({"lease_ttl": 2, "heartbeat": 0.5}, None, False, id="ttl2-hb0.5"),  # 1.0
    pytest.param({"lease_ttl": 2, "heartbeat": 0.5}, 0.3, True, id="ttl2-hb0.5-300ms"),
    pytest.param({"lease_ttl": 3, "heartbeat": 1.5}, None, False, id="ttl3-hb1.5"),  # 1.0
    pytest.param({"lease_ttl": 3, "fence_margin": 1.2}, None, False, id="big-margin"),
    pytest.param({"lease_ttl": 2, "heartbeat": 0.5, "fence_margin": 1.25}, 0.01, False,
                 id="slack-0.25-never"),  # no election fits in the round trips' 0.25 s
    pytest.param({"lease_ttl": 10, "heartbeat": 5}, 2.0, True, id="ttl10-hb5-2s"),
])
def test_etcd_election_timeout_must_fit_the_slack(timing: dict[str, Any],
                                                   election_timeout: float | None,
                                                   fits: bool) -> None:
    """2 x election_timeout + ELECTION_ROUND_TRIPS < lease_ttl - heartbeat - fence_margin,
    checked across the etcd and timing sections; the error names etcd.election_timeout."""
    etcd = {} if election_timeout is None else {"election_timeout": election_timeout}
    raw = {"timing": timing, "etcd": etcd}
    for role, extra in (("agent", AGENT), ("controller", CONTROLLER), ("client", {})):
        if fits:
            assert parse_config({**raw, **extra}, role).etcd.election_timeout == (
                election_timeout or 0.5)
        else:
            error = expect_error({**raw, **extra}, role, "etcd.election_timeout")
            assert "must be below lease_ttl - heartbeat - fence_margin" in str(error)
    parsed = TimingConfig(**timing)
    assert (election_problem(election_timeout or 0.5, parsed) is None) == fits


@pytest.mark.parametrize(("raw", "expected"), [
    pytest.param({}, (3, 1.0, 0.5, 0.5), id="default"),
    pytest.param({"timing": {"profile": "default"}}, (3, 1.0, 0.5, 0.5), id="default-named"),
    pytest.param({"timing": {"profile": "fast"}}, (1, 0.2, 0.2, 0.15), id="fast"),
    pytest.param({"timing": {"profile": "fast", "lease_ttl": 2}}, (2, 0.2, 0.2, 0.15),
                 id="fast-ttl-given"),
    pytest.param({"timing": {"profile": "fast", "heartbeat": None}}, (1, 0.2, 0.2, 0.15),
                 id="fast-null-is-not-given"),
    pytest.param({"timing": {"profile": "fast"}, "etcd": {"election_timeout": 0.1}},
                 (1, 0.2, 0.2, 0.1), id="fast-election-given"),
    pytest.param({"timing": {"profile": "fast"}, "etcd": None}, (1, 0.2, 0.2, 0.15),
                 id="fast-etcd-null"),
])
def test_timing_profile_gives_the_defaults(raw: dict[str, Any],
                                           expected: tuple[float, ...]) -> None:
    """timing.profile names the defaults of lease_ttl, heartbeat, fence_margin and
    etcd.election_timeout; a field given beside it wins (hafo.model.timing_profile)."""
    for role, extra in (("agent", AGENT), ("controller", CONTROLLER), ("client", {})):
        config = parse_config({**raw, **extra}, role)
        timing = config.timing
        assert (timing.lease_ttl, timing.heartbeat, timing.fence_margin,
                config.etcd.election_timeout) == expected
        assert election_problem(config.etcd.election_timeout, timing) is None


def test_the_fast_profile_fits_etcd_and_its_own_rules() -> None:
    """The fast profile's etcd timing: election 10 x the heartbeat (etcd's advice), and a
    minimum lease TTL (1.5 election timeouts, rounded up to a second) of 1 s."""
    fast = PROFILES["fast"]
    assert fast.etcd_election_ms == 10 * fast.etcd_heartbeat_ms
    assert math.ceil(1.5 * fast.etcd_election_ms / 1000) <= fast.lease_ttl == 1
    slack = fast.lease_ttl - fast.heartbeat - fast.fence_margin
    assert 2 * fast.election_timeout + ELECTION_ROUND_TRIPS < slack
    default = PROFILES["default"]
    assert (default.etcd_heartbeat_ms, default.etcd_election_ms) == (
        ETCD_HEARTBEAT_INTERVAL_MS, ETCD_ELECTION_TIMEOUT_MS)


def test_a_fast_profile_with_a_slow_etcd_is_refused() -> None:
    error = expect_error({"timing": {"profile": "fast"}, "etcd": {"election_timeout": 0.5}},
                         "client", "etcd.election_timeout")
    assert "= 0.6 s" in str(error)


@pytest.mark.parametrize(("raw", "message"), [
    pytest.param({"timing": {"lease_ttl": 2, "heartbeat": 1}},
                 "etcd.election_timeout: etcd elects a new leader within 2 x election_timeout "
                 "(+0.25 s) = 1.25 s; that must be below lease_ttl - heartbeat - fence_margin "
                 "= 0.5 s (lower etcd's --election-timeout and this, or raise "
                 "timing.lease_ttl)", id="ttl2-hb1"),
    pytest.param({"etcd": {"election_timeout": 1}},
                 "etcd.election_timeout: etcd elects a new leader within 2 x election_timeout "
                 "(+0.25 s) = 2.25 s; that must be below lease_ttl - heartbeat - fence_margin "
                 "= 1.5 s (lower etcd's --election-timeout and this, or raise "
                 "timing.lease_ttl)", id="etcd-default-1s"),
])
def test_election_error_states_the_rule_with_the_numbers(raw: dict[str, Any],
                                                         message: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_config(raw, "client")
    assert str(info.value) == message


@pytest.mark.parametrize(("value", "field"), [
    pytest.param(0, "etcd.election_timeout", id="zero"),
    pytest.param(-0.5, "etcd.election_timeout", id="negative"),
    pytest.param("500ms", "etcd.election_timeout", id="string"),
    pytest.param(True, "etcd.election_timeout", id="bool"),
])
def test_bad_election_timeout(value: Any, field: str) -> None:
    expect_error({"etcd": {"election_timeout": value}}, "client", field)


def test_a_timing_mistake_is_reported_before_the_election_rule() -> None:
    """The sections' own rules come first: the cross-section rule sees valid sections."""
    expect_error({"timing": {"lease_ttl": 3, "heartbeat": 2}}, "client", "timing.heartbeat")
    expect_error({"timing": {"lease_ttl": 2, "heartbeat": 1}, "etcd": {"ca": "/ca"}},
                 "client", "etcd.endpoints")


@pytest.mark.parametrize(("raw", "role", "field"), [
    pytest.param({}, "agent", "node", id="agent-without-node"),
    pytest.param({"node": None}, "agent", "node", id="agent-node-null"),
    pytest.param({"node": {}}, "agent", "node.name", id="agent-without-node-name"),
    pytest.param({"node": {"name": "bad name"}}, "agent", "node.name", id="node-name-space"),
    pytest.param({}, "controller", "controller.name", id="controller-without-section"),
    pytest.param({"controller": {}}, "controller", "controller.name", id="controller-no-name"),
    pytest.param({"controller": {"name": ""}}, "controller", "controller.name",
                 id="controller-empty-name"),
])
def test_role_requirements(raw: dict[str, Any], role: str, field: str) -> None:
    expect_error(raw, role, field)


def test_roles_accept_what_they_need() -> None:
    assert parse_config(AGENT, "agent").node is not None
    assert parse_config(AGENT, "agent").controller_name is None
    assert parse_config(CONTROLLER, "controller").controller_name == "ctl-1"
    assert parse_config(CONTROLLER, "controller").node is None
    assert parse_config({}, "client").node is None


SIM = SimulatedGpus(count=2, model="Sim GPU", memory_mib=1024, faults_file="/tmp/f.json")


@pytest.mark.parametrize(("gpus", "source"), [
    (None, GpuSource.AUTO),
    ("auto", GpuSource.AUTO),
    ("none", GpuSource.NONE),
    ({"simulate": None}, SimulatedGpus()),
    ({"simulate": {}}, SimulatedGpus()),
    ({"simulate": {"count": 2, "model": "Sim GPU", "memory_mib": 1024,
                   "faults_file": "/tmp/f.json"}}, SIM),
])
def test_gpu_sources(gpus: Any, source: GpuSource | SimulatedGpus) -> None:
    """The config key ``gpus`` sets ``gpu_source``: a GpuSource, or the simulated GPUs."""
    node: dict[str, Any] = {"name": "node-a"}
    if gpus is not None:
        node["gpus"] = gpus
    config = parse_config({"node": node}, "agent")
    assert config.node is not None
    assert config.node.gpu_source == source
    assert config.node.simulate == (source if isinstance(source, SimulatedGpus) else None)


@pytest.mark.parametrize(("gpus", "field"), [
    ("all", "node.gpus"),
    (4, "node.gpus"),
    ({"simulate": {}, "extra": 1}, "node.gpus"),
    ({"simulate": {"count": -1}}, "node.gpus.simulate.count"),
    ({"simulate": {"count": 65}}, "node.gpus.simulate.count"),
    ({"simulate": {"memory_mib": 0}}, "node.gpus.simulate.memory_mib"),
    ({"simulate": {"bogus": 1}}, "node.gpus.simulate.bogus"),
    ({"simulate": [1]}, "node.gpus.simulate"),
])
def test_bad_gpus(gpus: Any, field: str) -> None:
    expect_error({"node": {"name": "node-a", "gpus": gpus}}, "agent", field)


@pytest.mark.parametrize(("raw", "role", "field"), [
    ({"bogus": 1}, "client", "bogus"),
    ({"etcd": {"endpoint": GOOD}}, "client", "etcd.endpoint"),
    ({"api": {"port": 1}}, "client", "api.port"),
    ({"node": {"name": "n", "gpu": "auto"}}, "agent", "node.gpu"),
    ({"checkpoint": {"path": "/x"}}, "client", "checkpoint.path"),
    ({"controller": {"name": "c", "id": 1}}, "controller", "controller.id"),
    ({"log": {"level": "debug"}}, "client", "log.level"),
])
def test_unknown_keys_are_rejected_by_name(raw: dict[str, Any], role: str, field: str) -> None:
    expect_error(raw, role, field)


@pytest.mark.parametrize(("listen", "host", "port"), [
    ("127.0.0.1:8600", "127.0.0.1", 8600),
    ("0.0.0.0:0", "0.0.0.0", 0),
    ("localhost:80", "localhost", 80),
    ("[::1]:8600", "::1", 8600),
])
def test_api_listen_valid(listen: str, host: str, port: int) -> None:
    api = parse_config({"api": {"listen": listen}}, "client").api
    assert (api.listen, api.host, api.port) == (listen, host, port)


@pytest.mark.parametrize("listen", ["8600", "host:", ":8600", "host:70000", "host:port", "",
                                    8600, "a:b:8600"])
def test_api_listen_invalid(listen: Any) -> None:
    expect_error({"api": {"listen": listen}}, "client", "api.listen")


@pytest.mark.parametrize(("raw", "field"), [
    pytest.param({"cluster": "Prod_1"}, "cluster", id="cluster-bad"),
    pytest.param({"cluster": 3}, "cluster", id="cluster-int"),
    pytest.param({"cluster": "prod\n"}, "cluster", id="cluster-trailing-newline"),
    pytest.param({"log": {"format": "xml"}}, "log.format", id="log-format"),
    pytest.param({"etcd": "http://x:1"}, "etcd", id="etcd-not-mapping"),
    pytest.param(["cluster"], "config", id="config-not-mapping"),
])
def test_other_bad_values(raw: Any, field: str) -> None:
    expect_error(raw, "client", field)


@pytest.mark.parametrize(("simulate", "expected"), [
    pytest.param({"utilization": {"0": 50, "3": 12.5}},
                 SimulatedGpus(utilization={0: 50.0, 3: 12.5}), id="utilization"),
    pytest.param({"count": 2, "mig": {"1": ["1g.10gb", "1g.10gb", "3g.40gb"]}},
                 SimulatedGpus(count=2, mig={1: ("1g.10gb", "1g.10gb", "3g.40gb")}),
                 id="mig"),
    pytest.param({"mig": {}, "utilization": None}, SimulatedGpus(), id="empty"),
])
def test_simulated_utilization_and_mig(simulate: dict[str, Any],
                                       expected: SimulatedGpus) -> None:
    config = parse_config({"node": {"name": "n", "gpus": {"simulate": simulate}}}, "agent")
    assert config.node is not None and config.node.simulate == expected


@pytest.mark.parametrize(("simulate", "field"), [
    ({"utilization": {"4": 10}}, "node.gpus.simulate.utilization.4"),
    ({"utilization": {"x": 10}}, "node.gpus.simulate.utilization.x"),
    ({"utilization": {"0": 101}}, "node.gpus.simulate.utilization.0"),
    ({"utilization": {"0": -1}}, "node.gpus.simulate.utilization.0"),
    ({"utilization": {"0": "busy"}}, "node.gpus.simulate.utilization.0"),
    ({"utilization": [50]}, "node.gpus.simulate.utilization"),
    ({"mig": {"4": ["1g.10gb"]}}, "node.gpus.simulate.mig.4"),
    ({"count": 0, "mig": {"0": ["1g.10gb"]}}, "node.gpus.simulate.mig.0"),
    ({"mig": {"0": "1g.10gb"}}, "node.gpus.simulate.mig.0"),
    ({"mig": {"0": []}}, "node.gpus.simulate.mig.0"),
    ({"mig": {"0": ["1g.10gb"] * 8}}, "node.gpus.simulate.mig.0"),
    ({"mig": {"0": ["1g.10gb", "huge"]}}, "node.gpus.simulate.mig.0[1]"),
    ({"mig": {"0": ["10g.10gb"]}}, "node.gpus.simulate.mig.0[0]"),
])
def test_bad_simulated_utilization_and_mig(simulate: dict[str, Any], field: str) -> None:
    expect_error({"node": {"name": "n", "gpus": {"simulate": simulate}}}, "agent", field)


@pytest.mark.parametrize(("raw", "strategy"), [
    ({}, "spread"),
    ({"placement": None}, "spread"),
    ({"placement": {}}, "spread"),
    ({"placement": {"strategy": "binpack"}}, "binpack"),
    ({"placement": {"strategy": "spread"}}, "spread"),
])
def test_placement_strategy(raw: dict[str, Any], strategy: str) -> None:
    config = parse_config({**raw, "controller": {"name": "c"}}, "controller")
    assert config.placement_strategy == strategy


@pytest.mark.parametrize(("raw", "field"), [
    ({"placement": {"strategy": "random"}}, "placement.strategy"),
    ({"placement": {"mode": "spread"}}, "placement.mode"),
    ({"placement": "binpack"}, "placement"),
])
def test_bad_placement_strategy(raw: dict[str, Any], field: str) -> None:
    expect_error(raw, "client", field)


def test_yaml_integer_keys_name_gpus_too() -> None:
    config = parse_config({"node": {"name": "n", "gpus": {"simulate": {
        "count": 2, "utilization": {1: 50}, "mig": {0: ["1g.10gb"]}}}}}, "agent")
    assert config.node is not None and config.node.simulate == SimulatedGpus(
        count=2, utilization={1: 50.0}, mig={0: ("1g.10gb",)})


def test_only_the_agent_reads_the_node_section() -> None:
    raw = {"node": {"name": "bad name"}, "controller": {"name": "c"}}
    assert parse_config(raw, "controller").node is None
    expect_error(raw, "agent", "node.name")


@pytest.mark.parametrize(("raw", "message"), [
    ({"timing": {"heartbeat": 2}}, "timing.heartbeat: must be at most half of lease_ttl (3)"),
    ({"timing": {"lease_ttl": "3"}}, "timing.lease_ttl: must be an integer, got '3'"),
    ({"etcd": {"endpoints": ["http://h:0"]}}, "etcd.endpoints[0]: port out of range in "
                                              "'http://h:0'"),
    ({"api": {"port": 1}}, "api.port: unknown field (allowed: listen, team_tokens_file, "
                           "tls_ca, tls_cert, tls_key, token_file)"),
])
def test_errors_are_one_line_naming_the_field(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_config(raw, "client")
    assert str(info.value) == message
