"""``hafo lb haproxy``'s pure parts: which slot serves which replica in which state
(``plan_slots``), the reply of ``show servers state`` as HAProxy 2.6 writes it, runtime-API
addresses, and one pass of the driver on a hand-built snapshot with a fake runtime API."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import pytest

from hafo.lb.haproxy import HaproxyDriver, run_haproxy_lb
from hafo.lb.runtime import RuntimeApi, SocketAddress, parse_socket
from hafo.lb.slots import (
    LbError,
    SlotChange,
    SlotMode,
    SlotState,
    assign_slots,
    carry_replicas,
    endpoint_mode,
    parse_servers_state,
    plan_slots,
    select_port,
)
from hafo.model.cluster import (
    Assignment,
    ClusterSnapshot,
    InstanceStatus,
    Liveness,
    NodeRecord,
    Submission,
)
from hafo.model.endpoints import Endpoint, Endpoints
from hafo.model.spec import parse_spec
from hafo.store import Keys
from hafo.store.memory import MemoryStore

PLACEHOLDER = ("127.0.0.1", 1)


def ep(replica: str, address: str | None = "10.0.0.1", port: int | None = 8080,
       ready: bool = True, state: str = "running", retiring: bool = False,
       node: str | None = "n", ports: Mapping[str, int] | None = None) -> Endpoint:
    """An endpoint serving ``http`` on ``address``:``port``."""
    bound = dict(ports) if ports is not None else ({"http": port} if port else {})
    return Endpoint(replica=replica, node=node, address=address, ports=bound, ready=ready,
                    state=state, retiring=retiring)


def eps(*endpoints: Endpoint) -> Endpoints:
    return Endpoints(workload="web-1a2b3c", name="web", endpoints=endpoints)


def fresh(n: int) -> list[SlotState]:
    """``n`` slots as ``server-template srv 1-n 127.0.0.1:1 disabled`` leaves them."""
    return [SlotState(f"srv{i}", *PLACEHOLDER, "maint") for i in range(1, n + 1)]


def slot(name: str, address: str, port: int, mode: SlotMode,
         replica: str | None = None) -> SlotState:
    return SlotState(name, address, port, mode, replica)


def with_slots(n: int, *given: SlotState) -> list[SlotState]:
    by_name = {s.name: s for s in given}
    return [by_name.get(s.name, s) for s in fresh(n)]


def summary(changes: Sequence[SlotChange]) -> list[tuple[str, str, int, str, tuple[str, ...]]]:
    """(slot, address, port, state, steps) per change, in order."""
    return [(c.slot, c.after.address, c.after.port, c.after.mode, c.steps()) for c in changes]


A, B, C = "10.0.0.1", "10.0.0.2", "10.0.0.3"

CASES = {
    "nothing to serve, nothing to change": (eps(), fresh(2), []),
    "a ready replica gets the first slot: address first, then ready": (
        eps(ep("r1", A)), fresh(2), [("srv1", A, 8080, "ready", ("addr", "state"))]),
    "two ready replicas, two slots": (
        eps(ep("r1", A), ep("r2", B, 9000)), fresh(3),
        [("srv1", A, 8080, "ready", ("addr", "state")),
         ("srv2", B, 9000, "ready", ("addr", "state"))]),
    "a replica keeps the slot it remembers": (
        eps(ep("r1", A)), with_slots(3, slot("srv3", A, 8080, "ready", "r1")), []),
    "a restarted lb finds a replica by its address and port": (
        eps(ep("r1", A), ep("r2", B)),
        with_slots(3, slot("srv2", B, 8080, "ready"), slot("srv3", A, 8080, "ready")), []),
    "a replica that fails: its slot to maint, state only": (
        eps(ep("r1", A, ready=False, state="lost"), ep("r2", B)),
        with_slots(2, slot("srv1", A, 8080, "ready", "r1"), slot("srv2", B, 8080, "ready", "r2")),
        [("srv1", A, 8080, "maint", ("state",))]),
    "a retiring replica that still runs drains": (
        eps(ep("r1", A, ready=False, retiring=True)),
        with_slots(2, slot("srv1", A, 8080, "ready", "r1")),
        [("srv1", A, 8080, "drain", ("state",))]),
    "a retiring replica that stopped is in maint": (
        eps(ep("r1", A, ready=False, retiring=True, state="exited")),
        with_slots(2, slot("srv1", A, 8080, "drain", "r1")),
        [("srv1", A, 8080, "maint", ("state",))]),
    "a starting replica holds a slot in maint": (
        eps(ep("r1", A, ready=False, state="starting")), fresh(2),
        [("srv1", A, 8080, "maint", ("addr",))]),
    "a replica gone: its slot to maint, address kept": (
        eps(ep("r2", B)),
        with_slots(2, slot("srv1", A, 8080, "ready", "r1"), slot("srv2", B, 8080, "ready", "r2")),
        [("srv1", A, 8080, "maint", ("state",))]),
    "a replica that moved keeps its slot, on its new node": (
        eps(ep("r1", C, 8081)), with_slots(2, slot("srv2", A, 8080, "ready", "r1")),
        [("srv2", C, 8081, "ready", ("addr",))]),
    "a new replica on a failed one's node and port takes a free slot, not its slot": (
        eps(ep("r1", A, ready=False, state="lost"), ep("r3", A)),
        with_slots(2, slot("srv1", A, 8080, "ready", "r1")),
        [("srv1", A, 8080, "maint", ("state",)), ("srv2", A, 8080, "ready", ("addr", "state"))]),
    "an endpoint without a node gets no slot": (
        eps(ep("r1", None, node=None, ready=False, state="pending")), fresh(1), []),
    "an endpoint without its port bound gets no slot": (
        eps(ep("r1", A, port=None, ready=False, state="starting")), fresh(1), []),
    "leaving rotation comes before entering it": (
        eps(ep("r1", A, ready=False, state="failed"), ep("r2", B)),
        with_slots(2, slot("srv2", A, 8080, "ready", "r1")),
        [("srv2", A, 8080, "maint", ("state",)), ("srv1", B, 8080, "ready", ("addr", "state"))]),
    "free slots in maint are taken before stale ready ones": (
        eps(ep("r2", B)), with_slots(2, slot("srv1", A, 8080, "ready", "gone")),
        [("srv1", A, 8080, "maint", ("state",)), ("srv2", B, 8080, "ready", ("addr", "state"))]),
    "a slot in drain set by hand is made ready again": (
        eps(ep("r1", A)), with_slots(1, slot("srv1", A, 8080, "drain")),
        [("srv1", A, 8080, "ready", ("state",))]),
}


@pytest.mark.parametrize("endpoints, slots, expected", CASES.values(), ids=list(CASES))
def test_plan_slots(endpoints: Endpoints, slots: list[SlotState],
                    expected: list[tuple[str, str, int, str, tuple[str, ...]]]) -> None:
    assert summary(plan_slots(endpoints, "http", slots)) == expected


def test_the_plan_is_deterministic_and_converges() -> None:
    endpoints = eps(ep("r1", A), ep("r2", B, ready=False, state="lost"), ep("r3", C))
    first = assign_slots(endpoints, "http", fresh(4))
    assert first == assign_slots(endpoints, "http", fresh(4))
    assert [s.replica for s in first.slots] == ["r1", "r2", "r3", None]
    again = assign_slots(endpoints, "http", list(first.slots))
    assert again.changes == () and again.slots == first.slots


def test_more_endpoints_than_slots_ready_ones_first() -> None:
    endpoints = eps(ep("r1", A, ready=False, state="lost"), ep("r2", B), ep("r3", C),
                    ep("r4", "10.0.0.4", ready=False, retiring=True))
    plan = assign_slots(endpoints, "http",
                        with_slots(2, slot("srv1", A, 8080, "ready", "r1")))
    # r1 (lost) loses its slot to ready replicas; free slots in maint are taken first.
    assert [(s.name, s.replica, s.mode) for s in plan.slots] == [
        ("srv1", "r3", "ready"), ("srv2", "r2", "ready")]
    assert plan.unslotted == ("r1", "r4")
    assert summary(plan.changes) == [("srv1", C, 8080, "ready", ("addr",)),
                                     ("srv2", B, 8080, "ready", ("addr", "state"))]
    three = assign_slots(endpoints, "http", fresh(3))
    assert [s.replica for s in three.slots] == ["r2", "r3", "r4"]
    assert three.slots[2].mode == "drain" and three.unslotted == ("r1",)


def test_the_only_port_is_used_when_none_is_named() -> None:
    endpoints = eps(ep("r1", A, ports={"grpc": 7000}))
    plan = assign_slots(endpoints, None, fresh(1))
    assert plan.port_name == "grpc"
    assert summary(plan.changes) == [("srv1", A, 7000, "ready", ("addr", "state"))]
    # Nothing bound yet: nothing to serve, no error.
    assert assign_slots(eps(ep("r1", A, port=None)), None, fresh(1)).changes == ()


def test_several_ports_need_a_name() -> None:
    endpoints = eps(ep("r1", A, ports={"http": 8080, "metrics": 9100}))
    with pytest.raises(LbError, match="several ports"):
        plan_slots(endpoints, None, fresh(1))
    assert summary(plan_slots(endpoints, "metrics", fresh(1))) == [
        ("srv1", A, 9100, "ready", ("addr", "state"))]


@pytest.mark.parametrize("declared, wanted, expected", [
    (("http",), None, "http"),
    (("http", "metrics"), "metrics", "metrics"),
    (("http",), "http", "http"),
    (("http", "metrics"), None, "several ports (http, metrics): choose one with --port"),
    ((), None, "declares no ports"),
    (("http",), "grpc", "declares no port 'grpc' (its ports: http)"),
    ((), "http", "declares no port 'http' (its ports: none)"),
])
def test_select_port(declared: tuple[str, ...], wanted: str | None, expected: str) -> None:
    if expected in declared:
        assert select_port(declared, wanted, "web") == expected
    else:
        with pytest.raises(LbError, match=expected.replace("(", r"\(").replace(")", r"\)")):
            select_port(declared, wanted, "web")


@pytest.mark.parametrize("endpoint, mode", [
    (ep("r", ready=True), "ready"),
    (ep("r", ready=False, state="running"), "maint"),
    (ep("r", ready=False, retiring=True, state="running"), "drain"),
    (ep("r", ready=False, retiring=True, state="lost"), "maint"),
    (ep("r", ready=False, state="pending", node=None, address=None), "maint"),
])
def test_endpoint_mode(endpoint: Endpoint, mode: str) -> None:
    assert endpoint_mode(endpoint) == mode


def test_commands_as_sent() -> None:
    before = slot("srv2", *PLACEHOLDER, "maint")
    entering = SlotChange(before, slot("srv2", A, 8080, "ready", "r1"))
    assert entering.commands("web") == ["set server web/srv2 addr 10.0.0.1 port 8080",
                                        "set server web/srv2 state ready"]
    leaving = SlotChange(slot("srv2", A, 8080, "ready"), slot("srv2", B, 80, "drain"))
    assert leaving.commands("web") == ["set server web/srv2 state drain",
                                       "set server web/srv2 addr 10.0.0.2 port 80"]
    assert SlotChange(before, before).commands("web") == []
    assert str(entering.after) == "srv2 10.0.0.1:8080 ready (r1)"
    assert str(slot("srv1", "::1", 80, "maint")) == "srv1 [::1]:80 maint"


# Captured from HAProxy 2.6.12 (Debian 12) with `server-template srv 1-4 127.0.0.1:1 disabled`
# after: set server web/srv1 addr ::1 port 9999; set server web/srv1 state ready;
# set server web/srv2 state drain; set server web/srv3 state ready. Admin state 4 is
# "disabled in the config" (CMAINT), which stays set once the slot is ready.
SHOW_SERVERS_STATE = """\
1
# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight \
srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health \
srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord \
srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port
3 web 1 srv1 ::1 2 4 1 1 82 1 0 0 8 0 0 0 - 9999 - 0 0 - - 0
3 web 2 srv2 127.0.0.1 2 12 1 1 81 1 0 0 8 0 0 0 - 1 - 0 0 - - 0
3 web 3 srv3 127.0.0.1 2 4 1 1 81 1 0 0 8 0 0 0 - 1 - 0 0 - - 0
3 web 4 srv4 127.0.0.1 0 5 1 1 83 1 0 0 8 0 0 0 - 1 - 0 0 - - 0
4 api 1 a1 10.1.1.1 2 0 1 1 3 1 0 0 8 0 0 0 - 80 - 0 0 - - 0
4 api 2 a2 10.1.1.2 0 1 1 1 3 1 0 0 8 0 0 0 - 80 - 0 0 - - 0

"""


def test_parse_show_servers_state() -> None:
    assert parse_servers_state(SHOW_SERVERS_STATE, "web") == [
        slot("srv1", "::1", 9999, "ready"), slot("srv2", "127.0.0.1", 1, "drain"),
        slot("srv3", "127.0.0.1", 1, "ready"), slot("srv4", "127.0.0.1", 1, "maint")]
    assert [(s.name, s.mode) for s in parse_servers_state(SHOW_SERVERS_STATE)][4:] == [
        ("a1", "ready"), ("a2", "maint")]
    assert parse_servers_state(SHOW_SERVERS_STATE, "nope") == []


@pytest.mark.parametrize("reply, error", [
    ("Can't find backend.\n\n", "unexpected reply to 'show servers state': \"Can't find"),
    ("", "unexpected reply"),
    ("1\n# be_name srv_name\n", "lacks the columns srv_addr, srv_admin_state, srv_port"),
    (SHOW_SERVERS_STATE.replace("9999", "x"), "unexpected line"),
    (SHOW_SERVERS_STATE.replace(" - 0 0 - - 0\n3 web 2", "\n3 web 2"), "unexpected line"),
])
def test_parse_show_servers_state_refuses_what_it_does_not_know(reply: str,
                                                                error: str) -> None:
    with pytest.raises(LbError, match=error):
        parse_servers_state(reply, "web")


def test_carry_replicas_only_where_the_slot_still_points() -> None:
    previous = [slot("srv1", A, 8080, "ready", "r1"), slot("srv2", B, 8080, "ready", "r2")]
    current = [slot("srv1", A, 8080, "maint"), slot("srv2", *PLACEHOLDER, "maint"),
               slot("srv3", *PLACEHOLDER, "maint")]
    assert [s.replica for s in carry_replicas(previous, current)] == ["r1", None, None]


@pytest.mark.parametrize("address, expected", [
    ("/run/haproxy/hafo.sock", SocketAddress(path="/run/haproxy/hafo.sock")),
    ("unix@/tmp/a.sock", SocketAddress(path="/tmp/a.sock")),
    ("relative.sock", SocketAddress(path="relative.sock")),
    ("127.0.0.1:9999", SocketAddress(host="127.0.0.1", port=9999)),
    ("ipv4@127.0.0.1:9999", SocketAddress(host="127.0.0.1", port=9999)),
    ("ipv6@[::1]:9999", SocketAddress(host="::1", port=9999)),
    ("lb.example:9999", SocketAddress(host="lb.example", port=9999)),
])
def test_parse_socket(address: str, expected: SocketAddress) -> None:
    assert parse_socket(address) == expected


@pytest.mark.parametrize("address", ["", "unix@", "ipv4@nohost", "127.0.0.1:99999"])
def test_parse_socket_refuses(address: str) -> None:
    with pytest.raises(LbError):
        parse_socket(address)


async def test_an_unreachable_socket_is_one_line() -> None:
    api = RuntimeApi("/nonexistent/hafo.sock", timeout=1.0)
    with pytest.raises(LbError, match=r"^haproxy's runtime API at /nonexistent/hafo.sock: "):
        await api.servers_state("web")
    with pytest.raises(LbError, match="one command at a time"):
        await api.command("show info; shutdown frontend web")


# One pass of the driver on a hand-built snapshot, with a fake runtime API.

@dataclass
class FakeApi:
    """HAProxy's slots in memory; records the commands."""

    slots: list[SlotState]
    sent: list[str] = field(default_factory=list)

    async def servers_state(self, backend: str) -> list[SlotState]:
        return list(self.slots)

    async def apply(self, backend: str, changes: Sequence[SlotChange]) -> int:
        by_name = {s.name: s for s in self.slots}
        for change in changes:
            self.sent.extend(change.commands(backend))
            by_name[change.slot] = SlotState(change.slot, change.after.address,
                                             change.after.port, change.after.mode)
        self.slots = [by_name[s.name] for s in self.slots]
        return len(self.sent)


def snapshot(ready: Mapping[str, bool], ports: Mapping[str, int] | None = None,
             ) -> ClusterSnapshot:
    """A service "web" whose replicas (one per node, "web-1.1" on "n1" at 10.0.0.1...)
    serve ``http`` on 8080 and are ready or not."""
    spec = parse_spec({"name": "web", "command": ["serve"], "replicas": len(ready),
                       "ports": dict(ports or {"http": 0})})
    workloads = {"web-1": Submission(id="web-1", spec=spec, submitted_at=0.0)}
    nodes, alive, assignments, statuses = {}, {}, {}, {}
    for i, (rid, ok) in enumerate(ready.items(), start=1):
        node = f"n{i}"
        workloads[rid] = Submission(id=rid, spec=spec.template, submitted_at=0.0,
                                    service="web-1")
        nodes[node] = NodeRecord(name=node, address=f"10.0.0.{i}")
        alive[node] = Liveness(node=node, lease=i, since=0.0)
        assignments[rid] = Assignment(workload=rid, phase="placed", node=node, epoch=10 + i)
        statuses[(rid, node)] = InstanceStatus(workload=rid, node=node, epoch=10 + i,
                                               state="running", ready=ok,
                                               ports={"http": 8080})
    return ClusterSnapshot(revision=1, nodes=MappingProxyType(nodes),
                           alive=MappingProxyType(alive), cordoned=frozenset(),
                           workloads=MappingProxyType(workloads),
                           assignments=MappingProxyType(assignments),
                           statuses=MappingProxyType(statuses))


def driver(api: FakeApi, port: str | None = None) -> HaproxyDriver:
    return HaproxyDriver(api, "web", "web", port)  # type: ignore[arg-type]


async def test_a_pass_sends_only_what_differs() -> None:
    api = FakeApi(fresh(3))
    lb = driver(api)
    await lb.sync(snapshot({"web-1.1": True, "web-1.2": True}))
    assert api.sent == ["set server web/srv1 addr 10.0.0.1 port 8080",
                        "set server web/srv1 state ready",
                        "set server web/srv2 addr 10.0.0.2 port 8080",
                        "set server web/srv2 state ready"]
    api.sent.clear()
    await lb.sync(snapshot({"web-1.1": True, "web-1.2": True}))
    assert api.sent == []
    await lb.sync(snapshot({"web-1.1": False, "web-1.2": True}))
    assert api.sent == ["set server web/srv1 state maint"]
    assert [s.replica for s in lb.known] == ["web-1.1", "web-1.2", None]


async def test_a_pass_converges_from_what_haproxy_has() -> None:
    api = FakeApi(fresh(3))
    lb = driver(api)
    await lb.sync(snapshot({"web-1.1": True, "web-1.2": True}))
    api.slots = fresh(3)  # HAProxy restarted: every slot disabled again
    api.sent.clear()
    lb.stale = True  # what the driver's loop does after a resync period or an error
    await lb.sync(snapshot({"web-1.1": True, "web-1.2": True}))
    assert len(api.sent) == 4
    assert [s.mode for s in api.slots] == ["ready", "ready", "maint"]


async def test_no_workload_means_every_slot_in_maint() -> None:
    api = FakeApi(with_slots(2, slot("srv1", A, 8080, "ready")))
    lb = driver(api)
    plan = await lb.sync(ClusterSnapshot(revision=1, nodes={}, alive={}, cordoned=frozenset(),
                                         workloads={}, assignments={}, statuses={}))
    assert api.sent == ["set server web/srv1 state maint"] and plan.port_name is None


async def test_a_port_the_workload_does_not_declare_is_an_error() -> None:
    lb = driver(FakeApi(fresh(1)), port="grpc")
    with pytest.raises(LbError, match="declares no port 'grpc' \\(its ports: http\\)"):
        await lb.sync(snapshot({"web-1.1": True}))
    lb = driver(FakeApi(fresh(1)))
    with pytest.raises(LbError, match="several ports"):
        await lb.sync(snapshot({"web-1.1": True}, ports={"http": 0, "metrics": 0}))



async def test_the_runner_waits_for_an_unreachable_haproxy_until_stopped() -> None:
    stop = asyncio.Event()
    runner = asyncio.create_task(run_haproxy_lb(MemoryStore(), Keys("lb"), "web", "web",
                                                "/nonexistent/hafo.sock", stop=stop))
    await asyncio.sleep(0.3)
    assert not runner.done()
    stop.set()
    assert await asyncio.wait_for(runner, 2) == 0


@pytest.mark.parametrize("backend, socket, error", [
    ("web", "ipv4@nohost", "invalid runtime API address"),
    ("web/srv1", "/tmp/x.sock", "invalid backend name 'web/srv1'"),
])
async def test_the_runner_refuses_invalid_arguments(backend: str, socket: str,
                                                    error: str) -> None:
    with pytest.raises(LbError, match=error):
        await run_haproxy_lb(MemoryStore(), Keys("lb"), "web", backend, socket)


async def test_host_names_are_resolved_and_an_unresolved_one_gets_no_slot() -> None:
    lb = driver(FakeApi(fresh(3)))
    lb.names.cache["gone.example"] = (None, float("inf"))  # as a failed lookup leaves it
    resolved = await lb._resolved(eps(ep("r1", "localhost"), ep("r2", "gone.example"),
                                      ep("r3", B)))
    assert [e.address for e in resolved.endpoints] in (
        ["127.0.0.1", None, B], ["::1", None, B])
    plan = assign_slots(resolved, "http", fresh(3))
    assert [s.replica for s in plan.slots] == ["r1", "r3", None]
