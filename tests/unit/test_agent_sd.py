"""``GET /v1/sd/agents`` (Prometheus HTTP service discovery of the agents): the targets
``agent_targets`` makes from the node records, table-driven. The route itself serves a real
Prometheus in tests/e2e/test_monitoring_prometheus.py."""

from __future__ import annotations

import dataclasses

import pytest

from hafo.model.cluster import NodeRecord
from hafo.model.endpoints import agent_targets

from .conftest import make_node, make_snapshot


def node(name: str, api: str, address: str = "") -> NodeRecord:
    return dataclasses.replace(make_node(name, 1), api=api, address=address)


@pytest.mark.parametrize(("api", "address", "target"), [
    pytest.param("10.0.0.5:8600", "", "10.0.0.5:8600", id="listen-address"),
    pytest.param("10.0.0.5:8600", "10.9.9.9", "10.0.0.5:8600", id="listen-address-wins"),
    pytest.param("0.0.0.0:8600", "10.0.0.6", "10.0.0.6:8600", id="wildcard-node-address"),
    pytest.param("[::]:8601", "fd00::7", "[fd00::7]:8601", id="ipv6-wildcard"),
    pytest.param("[fd00::8]:8600", "", "[fd00::8]:8600", id="ipv6"),
    pytest.param("agent-a.example:8600", "", "agent-a.example:8600", id="host-name"),
    pytest.param("0.0.0.0:8600", "", None, id="wildcard-no-address"),
    pytest.param("", "10.0.0.9", None, id="no-api"),
    pytest.param("agent-a:http", "", None, id="no-port"),
])
def test_one_target_per_agent_api(api: str, address: str, target: str | None) -> None:
    found = agent_targets(make_snapshot([node("n1", api, address)]))
    expected = [] if target is None else [{"targets": [target],
                                           "labels": {"hafo_node": "n1"}}]
    assert found == expected


def test_down_nodes_stay_targets_sorted_by_name() -> None:
    snapshot = make_snapshot([node("n2", "10.0.0.2:8600"), node("n1", "10.0.0.1:8600")],
                             down=["n2"])
    assert agent_targets(snapshot) == [
        {"targets": ["10.0.0.1:8600"], "labels": {"hafo_node": "n1"}},
        {"targets": ["10.0.0.2:8600"], "labels": {"hafo_node": "n2"}}]
    assert agent_targets(make_snapshot()) == []
