"""The ``hafo dev`` control protocol's declarations (``hafo.local.dev_protocol``): round trips,
bad messages (one clear line, never a traceback), replies of other versions, and the running
cluster's socket answering bad lines through the real client."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from pathlib import Path

import pytest

from hafo.local import dev
from hafo.local.dev_client import call
from hafo.local.dev_protocol import (
    ACTIONS,
    MAX_REQUEST,
    USAGE,
    ControllerState,
    ControlReply,
    ControlRequest,
    DevStatus,
    DevUnavailable,
    GpuFault,
    NodeState,
    parse_request,
    socket_path,
)
from hafo.model.errors import ValidationError


def status() -> DevStatus:
    return DevStatus(
        cluster="dev", dir="/tmp/d", etcd=["http://127.0.0.1:2379"], gpus_per_node=2,
        controllers=[ControllerState("ctl-1", True, "http://127.0.0.1:3001/")],
        nodes=[NodeState("node-1", True, 12, "http://127.0.0.1:4001", {"1": {"lost": True}},
                         agent_alive=True),
               NodeState("node-2", False, None, "http://127.0.0.1:4002")])


def test_actions_are_the_declared_ones() -> None:
    assert ACTIONS == ("status", "power-off", "power-on", "fault")


@pytest.mark.parametrize("request_", [
    ControlRequest("fault", node="node-1", gpu=1, fault=GpuFault(thermal=91.5)),
    ControlRequest("fault", node="node-1", gpu=0, fault=GpuFault(lost=True, ecc_dbe=3)),
    ControlRequest("power-on", node="node-3"),
])
def test_a_request_is_its_json(request_: ControlRequest) -> None:
    text = request_.to_json()
    assert "\n" not in text
    assert json.loads(text) == asdict(request_)  # the wire format of earlier versions
    assert ControlRequest.from_json(text) == request_


def test_nulls_and_unknown_top_level_keys_are_ignored_integral_numbers_taken() -> None:
    got = ControlRequest.from_json('{"action": "fault", "node": "n", "gpu": 1.0, '
                                   '"fault": {"thermal": 90, "xid": null}, "later": 1}')
    assert got == ControlRequest("fault", node="n", gpu=1, fault=GpuFault(thermal=90.0))
    assert isinstance(got.fault, GpuFault) and isinstance(got.fault.thermal, float)


@pytest.mark.parametrize(("line", "message"), [
    (b"", "request: not JSON"),
    (b"\xff\xfe{", "request: not JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "request: not JSON"),  # cut at MAX_REQUEST
    (b'"status"', "request: must be a mapping, got 'status'"),
    (b"{}", "action: is required"),
    (b'{"action": "reboot"}',
     "action: must be 'status', 'power-off', 'power-on' or 'fault', got 'reboot'"),
    (b'{"action": "fault", "node": "n", "gpu": "0", "fault": {"xid": "79", "melt": 1}}',
     "gpu: must be an integer, got '0'; fault.melt: unknown field (allowed: ecc_dbe, lost, "
     "thermal, xid); fault.xid: must be an integer, got '79'"),
])
def test_a_bad_line_is_one_reply_naming_every_bad_field(line: bytes, message: str) -> None:
    reply = parse_request(line)
    assert reply == ControlReply(False, message, USAGE)


def test_a_deeply_nested_request_is_not_json_not_a_crash() -> None:
    with pytest.raises(ValidationError, match=r"^request: not JSON$"):
        ControlRequest.from_json("[" * 50_000 + "]" * 50_000)


def test_a_reply_is_its_json_and_status_json_is_unchanged() -> None:
    reply = ControlReply(True, "ok", status=status())
    assert ControlReply.from_json(reply.to_json()) == reply
    assert json.loads(reply.to_json()) == asdict(reply)
    assert status().to_dict() == asdict(status())  # ``hafo dev status --json``


@pytest.mark.parametrize("text", [
    "", "nope", "[]", '{"ok": true}', '{"ok": true, "message": "m", "status": {"dir": 1}}',
    "[" * 50_000,
])
def test_what_is_not_a_reply_is_unavailable(text: str) -> None:
    with pytest.raises(DevUnavailable, match=r"^not a hafo dev reply: "):
        ControlReply.from_json(text)


def test_replies_of_another_version_parse() -> None:
    raw = json.loads(ControlReply(True, "ok", status=status()).to_json())
    raw["later"] = {"a": 1}
    del raw["code"]
    raw["status"]["nodes"][0]["later"] = 2
    del raw["status"]["nodes"][0]["agent_alive"]
    back = ControlReply.from_json(json.dumps(raw))
    assert back.code == 0 and back.status is not None
    assert back.status.nodes[0].agent_alive is None and back.status.node("node-2") is not None


def test_hafo_local_dev_keeps_its_names() -> None:
    for name in dev.__all__:
        assert getattr(dev, name) is not None
    assert dev.ControlRequest is ControlRequest and dev.call is call


def send_raw(base: Path, data: bytes) -> bytes:
    """Write ``data`` to the control socket; what comes back, up to its first newline."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(socket_path(base)))
        sock.sendall(data)
        out = b""
        while not out.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            out += chunk
    return out


async def test_the_socket_answers_bad_lines_with_one_error(tmp_path: Path) -> None:
    """The running cluster's connection handler on a real UNIX socket: a bad line, an
    over-long one, and an unknown node each get one reply."""
    from hafo.local.dev_server import DevCluster, DevOptions

    cluster = DevCluster(DevOptions(nodes=1, gpus=1), tmp_path, temporary=False)
    server = await asyncio.start_unix_server(cluster.serve_client,
                                             path=str(socket_path(tmp_path)),
                                             limit=MAX_REQUEST)
    async with server:
        raw = await asyncio.to_thread(send_raw, tmp_path, b'{"action": 7}\n')
        reply = ControlReply.from_json(raw.decode())
        assert (reply.ok, reply.code) == (False, USAGE) and reply.message.startswith("action: ")
        raw = await asyncio.to_thread(send_raw, tmp_path, b"x" * (MAX_REQUEST * 2) + b"\n")
        assert ControlReply.from_json(raw.decode()) == ControlReply(
            False, f"request: longer than {MAX_REQUEST} bytes", USAGE)
        refused = await asyncio.to_thread(call, tmp_path,
                                          ControlRequest("power-off", node="node-9"))
        assert (refused.ok, refused.code) == (False, 4)
        assert "no node 'node-9'" in refused.message
