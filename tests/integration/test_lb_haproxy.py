"""``hafo lb haproxy`` against a real HAProxy (2.6, the shipped examples/haproxy.cfg with a
temporary socket and port) and tiny aiohttp backends on 127.0.0.1: only ready backends
serve, a replica leaves rotation within milliseconds, requests in flight finish, a restarted
lb or HAProxy converges, HAProxy's errors are one line; and the whole runner, from a change
in the (in-memory) store to HAProxy's traffic."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from hafo.lb.haproxy import run_haproxy_lb
from hafo.lb.runtime import HaproxyRefused, HaproxyUnreachable, RuntimeApi
from hafo.lb.slots import SlotPlan, SlotState, assign_slots
from hafo.local.procs import free_port, spawn, stop_process
from hafo.model.cluster import Assignment, InstanceStatus, Liveness, NodeRecord, Submission
from hafo.model.endpoints import Endpoint, Endpoints
from hafo.model.spec import parse_spec
from hafo.store import Keys, codec
from hafo.store.memory import MemoryStore

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
BACKEND = "web"
SLOW = 0.6  # seconds a /slow request takes


class Haproxy:
    """A real HAProxy running examples/haproxy.cfg on ``port`` with its admin socket at
    ``socket`` (and a ``level operator`` one at ``operator``), stopped by pid."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.socket = str(base / "admin.sock")
        self.operator = str(base / "operator.sock")
        self.port = free_port()
        self.config = base / "haproxy.cfg"
        self.proc: subprocess.Popen[bytes] | None = None
        text = (REPO / "examples" / "haproxy.cfg").read_text()
        stats = "    stats socket /run/haproxy/hafo.sock mode 600 level admin\n"
        assert stats in text and "    bind 127.0.0.1:8080\n" in text
        text = text.replace(stats, f"    stats socket {self.socket} mode 600 level admin\n"
                                   f"    stats socket {self.operator} mode 600 level operator\n")
        text = text.replace("    bind 127.0.0.1:8080\n", f"    bind 127.0.0.1:{self.port}\n")
        self.config.write_text(text.replace("    log stdout format short local0 info\n", ""))

    def start(self) -> None:
        check = subprocess.run([HAPROXY, "-c", "-q", "-f", str(self.config)],
                               capture_output=True, text=True, timeout=10, check=False)
        assert check.returncode == 0, check.stdout + check.stderr
        self.proc = spawn([HAPROXY, "-db", "-f", str(self.config)], self.base / "haproxy.log")

    async def started(self) -> None:
        """Wait until the runtime API answers."""
        api = RuntimeApi(self.socket, timeout=1.0)
        deadline = time.monotonic() + 10
        while True:
            assert self.proc is not None and self.proc.poll() is None, self.log()
            try:
                await api.command("show info")
                return
            except HaproxyUnreachable:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, grace=2.0)
            self.proc = None

    def log(self) -> str:
        path = self.base / "haproxy.log"
        return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture
def haproxy_base() -> Iterator[Path]:
    """A short directory (a unix socket path has at most 107 bytes)."""
    if not Path(HAPROXY).exists():
        pytest.skip("haproxy is not installed (scripts/install-test-deps.sh installs it)")
    base = Path(tempfile.mkdtemp(prefix="hafo-lb-"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
async def haproxy(haproxy_base: Path) -> AsyncIterator[Haproxy]:
    proxy = Haproxy(haproxy_base)
    try:
        proxy.start()
        await proxy.started()
        yield proxy
    finally:
        proxy.stop()


class Backends:
    """Tiny HTTP servers on 127.0.0.1: ``/`` answers the server's name, ``/slow`` too after
    ``SLOW`` seconds."""

    def __init__(self) -> None:
        self.ports: dict[str, int] = {}
        self.runners: dict[str, web.AppRunner] = {}

    async def start(self, *names: str) -> None:
        for name in names:
            self.ports[name] = free_port()
            await self.restart(name)

    async def restart(self, name: str) -> None:
        async def hello(_request: web.Request) -> web.Response:
            return web.Response(text=name)

        async def slow(_request: web.Request) -> web.Response:
            await asyncio.sleep(SLOW)
            return web.Response(text=name)

        app = web.Application()
        app.add_routes([web.get("/", hello), web.get("/slow", slow)])
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.ports[name]).start()
        self.runners[name] = runner

    async def kill(self, name: str) -> None:
        await self.runners.pop(name).cleanup()

    async def close(self) -> None:
        for name in list(self.runners):
            await self.kill(name)


@pytest.fixture
async def backends() -> AsyncIterator[Backends]:
    servers = Backends()
    try:
        await servers.start("b1", "b2", "b3")
        yield servers
    finally:
        await servers.close()


async def get(port: int, path: str = "/") -> tuple[int, str]:
    """One request through HAProxy's frontend, on a new connection."""
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(
            force_close=True)) as session, session.get(f"http://127.0.0.1:{port}{path}") as r:
        return r.status, await r.text()


async def served_by(port: int, requests: int = 9) -> set[str]:
    """Who answers ``requests`` requests (roundrobin: every server in rotation)."""
    seen = set()
    for _ in range(requests):
        status, text = await get(port)
        assert status == 200, (status, text)
        seen.add(text)
    return seen


def endpoints(backends: Backends, ready: dict[str, bool],
              retiring: Sequence[str] = ()) -> Endpoints:
    """The replicas ``ready`` names, each served by the backend of that name."""
    return Endpoints(workload="web-1", name="web", endpoints=tuple(
        Endpoint(replica=name, node=f"node-{name}", address="127.0.0.1",
                 ports={"http": backends.ports[name]}, ready=ok, state="running",
                 retiring=name in retiring)
        for name, ok in ready.items()))


class Lb:
    """What one pass of ``hafo lb`` does, by hand: plan against the slots it knows, apply."""

    def __init__(self, api: RuntimeApi) -> None:
        self.api = api
        self.slots: list[SlotState] = []

    async def read(self) -> None:
        self.slots = await self.api.servers_state(BACKEND)

    async def push(self, wanted: Endpoints) -> SlotPlan:
        plan = assign_slots(wanted, "http", self.slots)
        await self.api.apply(BACKEND, plan.changes)
        self.slots = list(plan.slots)
        return plan


async def test_only_ready_replicas_serve_and_a_failed_one_leaves_at_once(
        haproxy: Haproxy, backends: Backends) -> None:
    lb = Lb(RuntimeApi(haproxy.socket))
    await lb.read()
    assert [(s.name, s.mode) for s in lb.slots] == [(f"srv{i}", "maint") for i in range(1, 9)]
    status, _ = await get(haproxy.port)
    assert status == 503  # nothing in rotation yet
    await lb.push(endpoints(backends, {"b1": True, "b2": True, "b3": False}))
    assert await served_by(haproxy.port) == {"b1", "b2"}

    started = time.perf_counter()
    plan = await lb.push(endpoints(backends, {"b1": True, "b2": False, "b3": False}))
    took = time.perf_counter() - started
    assert [c.commands(BACKEND) for c in plan.changes] == [[f"set server {BACKEND}/srv2 "
                                                             "state maint"]]
    assert took < 1.0, f"the plan and its command took {took:.3f}s"
    assert await served_by(haproxy.port) == {"b1"}
    assert [s.mode for s in await lb.api.servers_state(BACKEND)][:3] == \
        ["ready", "maint", "maint"]

    await lb.push(endpoints(backends, {"b1": True, "b2": True, "b3": True}))
    assert await served_by(haproxy.port) == {"b1", "b2", "b3"}


@pytest.mark.parametrize("mode", ["maint", "drain"])
async def test_a_request_in_flight_finishes_when_its_server_leaves_rotation(
        haproxy: Haproxy, backends: Backends, mode: str) -> None:
    lb = Lb(RuntimeApi(haproxy.socket))
    await lb.read()
    await lb.push(endpoints(backends, {"b1": True}))
    in_flight = asyncio.create_task(get(haproxy.port, "/slow"))
    await asyncio.sleep(SLOW / 3)  # it reached b1
    # b1 leaves rotation (failed: maint; retired by a rolling update: drain), b2 enters.
    await lb.push(endpoints(backends, {"b1": False, "b2": True},
                            retiring=["b1"] if mode == "drain" else []))
    assert lb.slots[0].mode == mode
    assert await served_by(haproxy.port, 3) == {"b2"}
    assert await in_flight == (200, "b1")


async def test_a_dead_server_still_in_rotation_is_retried_on_another(
        haproxy: Haproxy, backends: Backends) -> None:
    """Before hafo notices (the window ``hafo lb`` shortens), ``retries`` and ``option
    redispatch 1`` in examples/haproxy.cfg send a refused connection to another server."""
    lb = Lb(RuntimeApi(haproxy.socket))
    await lb.read()
    await lb.push(endpoints(backends, {"b1": True, "b2": True}))
    await backends.kill("b2")
    started = time.perf_counter()
    assert await served_by(haproxy.port, 6) == {"b1"}
    assert time.perf_counter() - started < 3.0


async def test_a_restarted_lb_and_a_restarted_haproxy_converge(
        haproxy: Haproxy, backends: Backends) -> None:
    api = RuntimeApi(haproxy.socket)
    first = Lb(api)
    await first.read()
    wanted = endpoints(backends, {"b1": True, "b2": True, "b3": False})
    await first.push(wanted)

    # A new lb knows no replicas: it finds them by address and port, and sends nothing.
    second = Lb(api)
    await second.read()
    sent = api.sent
    plan = await second.push(wanted)
    assert plan.changes == () and api.sent == sent
    assert [s.replica for s in plan.slots][:3] == ["b1", "b2", "b3"]

    # HAProxy restarted: every slot disabled again; one re-read and a pass put them back.
    haproxy.stop()
    with pytest.raises(HaproxyUnreachable, match=r"runtime API at .*admin\.sock"):
        await api.servers_state(BACKEND)
    haproxy.start()
    await haproxy.started()
    await second.read()
    assert {s.mode for s in second.slots} == {"maint"}
    assert [s.replica for s in second.slots][:2] == [None, None]  # addresses reset
    plan = await second.push(wanted)
    assert len(plan.changes) == 3
    assert await served_by(haproxy.port) == {"b1", "b2"}


async def test_haproxy_errors_are_one_line(haproxy: Haproxy) -> None:
    api = RuntimeApi(haproxy.socket)
    with pytest.raises(HaproxyRefused, match=r"^haproxy has no backend 'nope'$"):
        await api.servers_state("nope")
    with pytest.raises(HaproxyRefused, match=r"^haproxy has no backend 'nope'$"):
        await api.set_mode("nope", "srv1", "ready")
    with pytest.raises(HaproxyRefused, match=r"^haproxy's backend 'web' has no server 'srv9'$"):
        await api.set_mode(BACKEND, "srv9", "ready")
    with pytest.raises(HaproxyRefused, match="Invalid addr"):
        await api.set_address(BACKEND, "srv1", "300.1.1.1", 80)
    assert (await api.command("frobnicate")).startswith("Unknown command")
    operator = RuntimeApi(haproxy.operator)
    assert len(await operator.servers_state(BACKEND)) == 8  # reading needs no admin level
    with pytest.raises(HaproxyRefused, match=r"permission denied.*'level admin'"):
        await operator.set_mode(BACKEND, "srv1", "ready")


async def test_the_runner_fails_at_once_on_a_wrong_backend(haproxy: Haproxy) -> None:
    with pytest.raises(HaproxyRefused, match=r"^haproxy has no backend 'api'$"):
        await asyncio.wait_for(run_haproxy_lb(MemoryStore(), Keys("lb"), "web", "api",
                                              haproxy.socket), 5)


# The whole runner: the store's watch -> endpoints -> slots -> HAProxy.

class State:
    """What the controller and the agents would write for a service "web" whose replicas
    run on nodes n1, n2... (all at 127.0.0.1), each serving one backend."""

    def __init__(self, store: MemoryStore, keys: Keys, backends: Backends) -> None:
        self.store, self.keys, self.backends = store, keys, backends
        self.spec = parse_spec({"name": "web", "command": ["serve"], "replicas": 2,
                                "ports": {"http": 0}})
        self.epochs: dict[str, int] = {}

    async def submit(self) -> None:
        service = Submission(id="web-1", spec=self.spec, submitted_at=0.0)
        await self.store.put(self.keys.workload(service.id), codec.encode_submission(service))
        await self.store.put(self.keys.name("web"), b"web-1")

    async def replica(self, serial: int, backend: str) -> str:
        rid, node = f"web-1.{serial}", f"n{serial}"
        replica = Submission(id=rid, spec=self.spec.template, submitted_at=0.0,
                             service="web-1")
        await self.store.put(self.keys.workload(rid), codec.encode_submission(replica))
        record = NodeRecord(name=node, address="127.0.0.1")
        await self.store.put(self.keys.node(node), codec.encode(record.to_dict()))
        alive = Liveness(node=node, lease=serial, since=0.0)
        await self.store.put(self.keys.alive(node), codec.encode(alive.to_dict()))
        assignment = Assignment(workload=rid, phase="placed", node=node)
        self.epochs[rid] = await self.store.put(self.keys.assignment(rid),
                                                codec.encode(assignment.to_dict()))
        await self.report(rid, backend, ready=True)
        return rid

    async def report(self, rid: str, backend: str, ready: bool) -> int:
        node = f"n{rid.rpartition('.')[2]}"
        status = InstanceStatus(workload=rid, node=node, epoch=self.epochs[rid],
                                state="running", ready=ready,
                                ports={"http": self.backends.ports[backend]})
        return await self.store.put(self.keys.status(rid, node),
                                    codec.encode(status.to_dict()))


async def test_the_runner_follows_the_store(haproxy: Haproxy, backends: Backends) -> None:
    store, keys = MemoryStore(), Keys("lbtest")
    state = State(store, keys, backends)
    stop = asyncio.Event()
    passes: list[tuple[float, SlotPlan]] = []
    changed = asyncio.Event()

    def on_apply(plan: SlotPlan) -> None:
        passes.append((time.perf_counter(), plan))
        changed.set()

    async def until(check: object, timeout: float = 5.0) -> SlotPlan:
        async def wait() -> SlotPlan:
            while True:
                for _, plan in passes:
                    if callable(check) and check(plan):
                        return plan
                changed.clear()
                await changed.wait()
        return await asyncio.wait_for(wait(), timeout)

    def modes(plan: SlotPlan) -> dict[str, str]:
        return {s.replica: s.mode for s in plan.slots if s.replica}

    runner = asyncio.create_task(run_haproxy_lb(store, keys, "web", BACKEND, haproxy.socket,
                                                stop=stop, on_apply=on_apply, resync=0.5))
    try:
        # No workload yet: the lb waits (every slot in maint) until it is submitted.
        await until(lambda plan: plan.port_name is None)
        await state.submit()
        r1 = await state.replica(1, "b1")
        r2 = await state.replica(2, "b2")
        await until(lambda plan: modes(plan) == {r1: "ready", r2: "ready"})
        assert await served_by(haproxy.port) == {"b1", "b2"}

        # The agent reports r2 not ready: out of rotation within milliseconds.
        passes.clear()
        written = time.perf_counter()
        await state.report(r2, "b2", ready=False)
        plan = await until(lambda plan: modes(plan).get(r2) == "maint")
        latency = next(t for t, p in passes if p is plan) - written
        print(f"store change -> haproxy command done: {latency * 1000:.1f} ms")
        assert latency < 1.0, f"{latency:.3f}s from the store's change to HAProxy's"
        assert await served_by(haproxy.port) == {"b1"}

        # Someone puts r2 back in rotation by hand: the next re-read undoes it.
        await RuntimeApi(haproxy.socket).set_mode(BACKEND, plan.slots[1].name, "ready")
        passes.clear()
        await until(lambda plan: bool(plan.changes) and modes(plan).get(r2) == "maint")
        assert await served_by(haproxy.port) == {"b1"}

        # HAProxy down while r2 recovers: the lb retries, and sets the new HAProxy's slots.
        haproxy.stop()
        passes.clear()
        await state.report(r2, "b2", ready=True)
        await asyncio.sleep(0.3)
        assert passes == []
        haproxy.start()
        await haproxy.started()
        await until(lambda plan: modes(plan) == {r1: "ready", r2: "ready"})
        assert await served_by(haproxy.port) == {"b1", "b2"}
    finally:
        stop.set()
        assert await asyncio.wait_for(runner, 5) == 0
