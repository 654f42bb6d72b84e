"""The `hafo dev` control protocol: requests and replies on the wire, the checks the running
cluster makes before acting, the fault entries, the export line and the banner."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from hafo.local.dev_client import call
from hafo.local.dev_protocol import (
    ControllerState,
    ControlReply,
    ControlRequest,
    DevStatus,
    DevUnavailable,
    GpuFault,
    NodeState,
    check_request,
)
from hafo.local.dev_server import banner, export_line

NODES = ["node-1", "node-2", "node-3"]


@pytest.mark.parametrize("fault, entry, words", [
    (GpuFault(xid=79), {"xid": 79}, "Xid 79"),
    (GpuFault(lost=True), {"lost": True}, "lost"),
    (GpuFault(ecc_dbe=2), {"ecc_dbe": 2}, "2 double-bit ECC"),
    (GpuFault(thermal=95.0), {"thermal": 95.0}, "95 C"),
    (GpuFault(), {}, "cleared"),
])
def test_fault_entries_are_the_faults_file_keys(fault: GpuFault, entry: dict[str, object],
                                                words: str) -> None:
    assert fault.entry() == entry
    assert words in fault.describe()


@pytest.mark.parametrize("request_", [
    ControlRequest("status"),
    ControlRequest("power-off", node="node-2"),
    ControlRequest("power-on", node="node-2"),
    ControlRequest("fault", node="node-1", gpu=3, fault=GpuFault(xid=48)),
    ControlRequest("fault", node="node-1", gpu=0, fault=GpuFault()),
])
def test_requests_survive_the_wire(request_: ControlRequest) -> None:
    assert ControlRequest.from_json(request_.to_json()) == request_


@pytest.mark.parametrize("text, field", [
    ("not json", "request"),
    ("[1]", "request"),
    ('{"action": "reboot"}', "action"),
    ('{"action": "power-off", "node": 3}', "node"),
    ('{"action": "fault", "node": "n", "gpu": "0"}', "gpu"),
    ('{"action": "fault", "node": "n", "gpu": true}', "gpu"),
    ('{"action": "fault", "node": "n", "gpu": 0, "fault": []}', "fault"),
    ('{"action": "fault", "node": "n", "gpu": 0, "fault": {"xid": "79"}}', "fault.xid"),
    ('{"action": "fault", "node": "n", "gpu": 0, "fault": {"thermal": "hot"}}',
     "fault.thermal"),
    ('{"action": "fault", "node": "n", "gpu": 0, "fault": {"lost": 1}}', "fault.lost"),
    ('{"action": "fault", "node": "n", "gpu": 0, "fault": {"melt": 1}}', "fault.melt"),
])
def test_bad_requests_name_the_field(text: str, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}:"):
        ControlRequest.from_json(text)


@pytest.mark.parametrize("request_, code, words", [
    (ControlRequest("status"), None, None),
    (ControlRequest("power-off", node="node-3"), None, None),
    (ControlRequest("fault", node="node-1", gpu=3, fault=GpuFault(lost=True)), None, None),
    (ControlRequest("power-off", node="node-9"), 4,
     "no node 'node-9' in this dev cluster (nodes: node-1, node-2, node-3)"),
    (ControlRequest("power-on"), 2, "node: required"),
    (ControlRequest("fault", node="node-1", gpu=4, fault=GpuFault(xid=79)), 2,
     "--gpu: node-1 has GPUs 0 to 3, not 4"),
    (ControlRequest("fault", node="node-1", gpu=-1, fault=GpuFault(xid=79)), 2, "--gpu"),
    (ControlRequest("fault", node="node-1", fault=GpuFault(xid=79)), 2, "gpu"),
])
def test_check_request(request_: ControlRequest, code: int | None, words: str | None) -> None:
    reply = check_request(request_, NODES, gpus=4)
    if code is None:
        assert reply is None
    else:
        assert reply is not None and not reply.ok and reply.code == code
        assert words is not None and words in reply.message


def status() -> DevStatus:
    return DevStatus(
        cluster="dev", dir="/tmp/hafo-dev-x y", etcd=["http://127.0.0.1:2379"], gpus_per_node=4,
        controllers=[ControllerState("ctl-1", True, "http://127.0.0.1:3001/"),
                     ControllerState("ctl-2", False, "http://127.0.0.1:3002/")],
        nodes=[NodeState("node-1", True, 123, "http://127.0.0.1:4001", {"0": {"xid": 79}}),
               NodeState("node-2", False, None, "http://127.0.0.1:4002")])


def test_replies_survive_the_wire() -> None:
    reply = ControlReply(True, "node-2 powered off", status=status())
    back = ControlReply.from_json(reply.to_json())
    assert back == reply
    assert back.status is not None and back.status.node("node-2") == status().nodes[1]
    error = ControlReply(False, "no node", 4)
    assert ControlReply.from_json(error.to_json()) == error
    with pytest.raises(DevUnavailable):
        ControlReply.from_json('{"hello": 1}')


def test_export_line_is_shell_quoted() -> None:
    line = export_line(["http://127.0.0.1:1", "http://127.0.0.1:2"], "dev",
                       Path("/tmp/a dir"))
    words = dict(w.split("=", 1) for w in shlex.split(line)[1:])
    assert shlex.split(line)[0] == "export"
    assert words == {"HAFO_ETCD": "http://127.0.0.1:1,http://127.0.0.1:2",
                     "HAFO_CLUSTER": "dev", "HAFO_DEV": "/tmp/a dir"}


def test_banner_names_the_export_line_dashboards_nodes_and_faults() -> None:
    text = "\n".join(banner(status(), 8.25, temporary=True))
    assert "ready in 8.2s" in text
    assert export_line(["http://127.0.0.1:2379"], "dev", Path("/tmp/hafo-dev-x y")) in text
    assert "dashboard: http://127.0.0.1:3001/  http://127.0.0.1:3002/" in text
    assert "nodes:     node-1 node-2" in text
    assert "hafo dev power-off node-1" in text and "hafo dev fault node-1 --gpu 0" in text
    assert "removes /tmp/hafo-dev-x y" in text
    kept = "\n".join(banner(status(), 1.0, temporary=False))
    assert "state stays in /tmp/hafo-dev-x y" in kept


def test_call_without_a_running_cluster(tmp_path: Path) -> None:
    with pytest.raises(DevUnavailable, match="no dev cluster runs at"):
        call(tmp_path, ControlRequest("status"))
    (tmp_path / "control.sock").write_text("")  # a leftover that nobody serves
    with pytest.raises(DevUnavailable, match="no dev cluster runs at"):
        call(tmp_path, ControlRequest("status"))


def test_status_round_trip_is_plain_json() -> None:
    reply = ControlReply(True, "ok", status=status())
    raw = json.loads(reply.to_json())
    assert raw["status"]["nodes"][0]["faults"] == {"0": {"xid": 79}}


def test_a_dead_agent_is_shown_dead_and_old_replies_still_parse() -> None:
    alive = NodeState("node-1", True, 123, "http://127.0.0.1:4001", agent_alive=True)
    dead = NodeState("node-1", True, 123, "http://127.0.0.1:4001", agent_alive=False)
    off = NodeState("node-2", False, None, "http://127.0.0.1:4002")
    assert [n.agent_words() for n in (alive, dead, off)] == [
        "pid 123", "dead (pid 123 exited)", "-"]
    raw = json.loads(ControlReply(True, "ok", status=status()).to_json())["status"]
    for node in raw["nodes"]:
        del node["agent_alive"]  # a dev cluster of an earlier version
    assert DevStatus.from_dict(raw).nodes[0].agent_alive is None


def test_power_on_of_a_powered_node_whose_agent_died_starts_the_agent_again(
        tmp_path: Path) -> None:
    """A real nodeinit, with ``sleep`` for its agent (no etcd): the agent killed, status says
    it is dead, power-on starts it again."""
    import asyncio
    import signal
    import subprocess
    import sys

    from hafo.local.dev_server import DevCluster, DevOptions
    from hafo.local.procs import kill_pid, pid_alive, stop_process, wait_until

    dev = DevCluster(DevOptions(nodes=1, gpus=1), tmp_path, temporary=False)
    handle = dev.cluster.add_node("node-1")
    handle.cgroup = handle.boot_id_file = None  # the host's namespaces, as started below
    handle.state_dir.mkdir(parents=True)
    handle.init = subprocess.Popen([sys.executable, "-m", "hafo.local.nodeinit",
                                    str(handle.pidfile), "--", "sleep", "60"])
    try:
        assert wait_until(handle.agent_alive, 10.0)
        first = handle.agent_pid()
        assert first is not None
        kill_pid(first, signal.SIGKILL)
        assert wait_until(lambda: not pid_alive(first), 5.0)
        node = dev.status().node("node-1")
        assert node is not None and node.powered and node.agent_alive is False
        reply = asyncio.run(dev.handle(ControlRequest("power-on", node="node-1")))
        assert reply.ok, reply.message
        assert f"its agent (pid {first}) had exited: agent started again" in reply.message
        assert handle.agent_pid() != first and handle.agent_alive()
        reply = asyncio.run(dev.handle(ControlRequest("power-on", node="node-1")))
        assert reply.message == f"node-1 is already powered on (agent pid {handle.agent_pid()})"
    finally:
        agent = handle.agent_pid()
        stop_process(handle.init, grace=3.0)
        if agent is not None and pid_alive(agent):
            kill_pid(agent, signal.SIGKILL)


def test_banner_says_the_timing_when_given() -> None:
    text = "\n".join(banner(status(), 1.0, temporary=True,
                            timing="profile fast, lease TTL 1s, heartbeat 0.2s"))
    assert "timing:    profile fast, lease TTL 1s, heartbeat 0.2s" in text
    assert "timing:" not in "\n".join(banner(status(), 1.0, temporary=True))


@pytest.mark.parametrize(("argv", "profile", "error"), [
    pytest.param(["dev"], "default", None, id="default"),
    pytest.param(["dev", "--fast"], "fast", None, id="fast"),
    pytest.param(["dev", "--fast", "status"], None, "--fast is for starting a dev cluster",
                 id="fast-with-an-action"),
])
def test_dev_fast_flag(monkeypatch: pytest.MonkeyPatch, argv: list[str], profile: str | None,
                       error: str | None) -> None:
    """``hafo dev --fast`` starts the cluster in the fast timing profile; with an action it
    is a usage error naming the flag."""
    import hafo.local.dev_server as dev_server
    from hafo.cli import build_parser
    from hafo.commands import dev
    from hafo.commands.base import CliError

    started: list[object] = []
    monkeypatch.setattr(dev_server, "run_dev", lambda options: started.append(options) or 0)
    args = build_parser().parse_args(argv)
    if error is not None:
        with pytest.raises(CliError, match=error):
            dev.run(args)
        return
    assert dev.run(args) == 0
    assert [getattr(o, "profile", None) for o in started] == [profile]
