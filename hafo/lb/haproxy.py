"""``hafo lb haproxy``: keep a running HAProxy's backend serving a workload's ready replicas.

The process watches the cluster state (``ClusterCache``, one etcd watch) and, on every
change, computes the workload's endpoints (``endpoints_of``), maps them onto the backend's
server slots (``hafo.lb.slots``) and sends HAProxy's runtime API only what differs
(``hafo.lb.runtime``): a replica leaves rotation as soon as hafo learns that it failed, with
no polling health check in between (no sleep either: a few milliseconds from the watch event
to the command). Every ``resync`` seconds, and after any error, it reads the slots back
(``show servers state``), so a restarted HAProxy, a restarted ``hafo lb`` or a slot changed by
hand converges.

Errors, each logged in one line (again only when it changes), never a traceback:

- HAProxy unreachable: retried with a jittered backoff (0.1 s to 2 s, ``hafo.retry``);
- the workload does not exist (yet): every slot in ``maint``, waiting for it;
- an operator's error (no such backend, a socket without ``level admin``, no port to
  balance): ``LbError`` if it happens before the first successful update, so that a typo
  fails at once (the CLI prints it and exits); later, logged and retried every few seconds,
  HAProxy left as it was;
- etcd unreachable: the cache's watch reconnects; HAProxy keeps the last known rotation.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket as sockets
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import structlog

from hafo.lb.runtime import (
    HaproxyRefused,
    HaproxyUnreachable,
    RuntimeApi,
    check_name,
    parse_socket,
)
from hafo.lb.slots import (
    LbError,
    SlotChange,
    SlotPlan,
    SlotState,
    assign_slots,
    carry_replicas,
    parse_servers_state,
    plan_slots,
    select_port,
)
from hafo.model.cluster import ClusterSnapshot
from hafo.model.endpoints import Endpoint, Endpoints, endpoints_of, resolve
from hafo.retry import Retry, RetryPolicy
from hafo.store import TRANSIENT, ClusterCache, Keys, Store
from hafo.tasks import loop_time, wait_event

__all__ = ["HaproxyDriver", "HaproxyRefused", "HaproxyUnreachable", "LbError", "RuntimeApi",
           "SlotChange", "SlotPlan", "SlotState", "assign_slots", "parse_servers_state",
           "parse_socket", "plan_slots", "run_haproxy_lb", "select_port"]

log = structlog.get_logger("hafo.lb")

#: Seconds between two reads of HAProxy's slots (``show servers state``).
RESYNC = 5.0
BACKOFF_MIN, BACKOFF_MAX = 0.1, 2.0
#: Seconds before retrying after HAProxy refused a command (or the workload has no port).
HOLD = 5.0
#: HAProxy unreachable, and etcd unreachable at start: forever, 0.1 s doubling up to 2 s,
#: jittered down (``hafo.retry``); each problem is said once when it starts, and the retry
#: warns again while it lasts.
HAPROXY_POLICY = ETCD_POLICY = RetryPolicy(first=BACKOFF_MIN, cap=BACKOFF_MAX, jitter=0.5,
                                           warn_after=3)
#: HAProxy refused a command: retried every ``HOLD`` seconds (jittered down), forever.
HOLD_POLICY = RetryPolicy(first=HOLD, cap=HOLD, jitter=0.5, warn_after=3)
#: Seconds a host name's address is cached (node addresses are usually IP addresses).
DNS_TTL = 30.0

OnApply = Callable[[SlotPlan], object]


async def run_haproxy_lb(store: Store, keys: Keys, ref: str, backend: str, socket: str,
                         port_name: str | None = None, stop: asyncio.Event | None = None,
                         on_apply: OnApply | None = None, *, resync: float = RESYNC) -> int:
    """Drive the HAProxy whose runtime API is at ``socket`` (a unix socket path, or
    ``[ipv4@]HOST:PORT``): its backend ``backend`` serves the endpoints of the workload
    ``ref`` (an id or a name) on the port ``port_name`` (None: its only port), until ``stop``
    is set; returns the exit code (0). ``on_apply`` is called after every pass with its
    plan (its ``changes`` are what was sent: possibly nothing).

    LbError (a one-line message) for an invalid socket address or backend name, and for an
    operator's error found before the first successful update (see the module)."""
    api = RuntimeApi(socket)
    check_name(backend, "backend")
    stop = stop if stop is not None else asyncio.Event()
    cache = ClusterCache(store, keys)
    if not await _load(cache, stop):
        return 0
    driver = HaproxyDriver(api, backend, ref, port_name, on_apply, resync)
    log.info("driving haproxy", workload=ref, backend=backend, socket=str(api.address),
             port=port_name or "(its only port)")
    return await _until_stopped(stop, follow=cache.follow(),
                                confirm=cache.confirm_expiries(), sync=driver.run(cache))


async def _load(cache: ClusterCache, stop: asyncio.Event) -> bool:
    """Read the cluster state, retrying while etcd is unreachable; False if stopped first."""
    retry = Retry("lb etcd load", ETCD_POLICY, logger=log,
                  sleep=lambda delay: wait_event(stop, delay))
    while not stop.is_set():
        try:
            await cache.load()
        except TRANSIENT as exc:
            if not retry.failures:
                log.warning("etcd unreachable; retrying", error=type(exc).__name__)
            await retry.failed(exc)
            continue
        if retry.failures:
            log.info("etcd reachable")
        retry.succeeded()
        return True
    return False


async def _until_stopped(stop: asyncio.Event, **loops: Awaitable[Any]) -> int:
    """Run ``loops`` until ``stop`` is set (0) or one of them fails (re-raised)."""
    tasks = {asyncio.ensure_future(loop): name for name, loop in loops.items()}
    stopped = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait([*tasks, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (*tasks, stopped):
            task.cancel()
        await asyncio.gather(*tasks, stopped, return_exceptions=True)
    for task in done:
        if task is not stopped:
            task.result()  # an error: raised here
            log.error("a loop of hafo lb ended", loop=tasks[task])
            return 1
    return 0


class HaproxyDriver:
    """One backend of one HAProxy serving one workload's endpoints (see the module)."""

    def __init__(self, api: RuntimeApi, backend: str, ref: str, port_name: str | None = None,
                 on_apply: OnApply | None = None, resync: float = RESYNC) -> None:
        self.api = api
        self.backend = backend
        self.ref = ref
        self.port_name = port_name
        self.on_apply = on_apply
        self.resync = resync
        self.known: list[SlotState] = []  # the slots as last read or set
        self.stale = True  # read them from HAProxy before the next change
        self.read_at = float("-inf")
        self.passes = 0  # successful passes
        self.names = _Names()
        self._said: dict[str, object] = {}

    async def run(self, cache: ClusterCache) -> None:
        """Forever: a pass at every change of the cache, and every ``resync`` seconds."""
        unreachable = Retry("haproxy", HAPROXY_POLICY, logger=log, backend=self.backend)
        refused = Retry("haproxy refused", HOLD_POLICY, logger=log, backend=self.backend)
        while True:
            snapshot = cache.snapshot()
            cache.changed.clear()
            try:
                await self.sync(snapshot)
            except HaproxyUnreachable as exc:
                self.stale = True
                self._say("haproxy", "warning", "haproxy unreachable; retrying",
                          error=str(exc))
                await unreachable.failed(exc)
                continue
            except LbError as exc:
                if not self.passes:
                    raise
                self.stale = True
                self._say("refused", "error", "haproxy not updated; retrying", error=str(exc))
                await refused.failed(exc)
                continue
            unreachable.succeeded()
            refused.succeeded()
            self._clear("haproxy", "haproxy reachable")
            self._clear("refused", "haproxy updated again")
            await wait_event(cache.changed, max(0.0, self.read_at + self.resync - loop_time()))

    async def sync(self, snapshot: ClusterSnapshot) -> SlotPlan:
        """One pass: the endpoints of ``snapshot`` onto the slots, only what differs sent."""
        endpoints, port = await self.endpoints(snapshot)
        if self.stale or loop_time() >= self.read_at + self.resync:
            await self.read()
        plan = assign_slots(endpoints, port, self.known)
        self.stale = True  # unknown while commands are in flight
        sent = await self.api.apply(self.backend, plan.changes)
        self.known, self.stale = list(plan.slots), False
        self.passes += 1
        self._report(plan, sent)
        if self.on_apply is not None:
            self.on_apply(plan)
        return plan

    async def endpoints(self, snapshot: ClusterSnapshot) -> tuple[Endpoints, str | None]:
        """The workload's endpoints (none while it does not exist) and the port to use."""
        wid, why = resolve(snapshot, self.ref)
        if wid is None:
            self._say("workload", "warning", "waiting for the workload", workload=self.ref,
                      why=why)
            return Endpoints(workload="", name=self.ref), None
        self._clear("workload", "workload found", workload=self.ref, id=wid)
        spec = snapshot.workloads[wid].spec
        port = select_port(spec.ports, self.port_name, spec.name)
        return await self._resolved(endpoints_of(snapshot, wid)), port

    async def read(self) -> None:
        """Read the slots back from HAProxy (they may have changed under us)."""
        current = await self.api.servers_state(self.backend)
        self.read_at = loop_time()
        if self.known and [_plain(s) for s in current] != [_plain(s) for s in self.known]:
            log.info("haproxy's servers differ from what hafo lb set: re-synced",
                     backend=self.backend, servers=[str(s) for s in current])
        self.known, self.stale = carry_replicas(self.known, current), False

    async def _resolved(self, endpoints: Endpoints) -> Endpoints:
        """``endpoints`` with each host name replaced by its IP address (HAProxy's runtime
        API takes addresses only); an endpoint whose name does not resolve has none."""
        if all(e.address is None or _is_ip(e.address) for e in endpoints.endpoints):
            return endpoints
        fixed: list[Endpoint] = []
        for endpoint in endpoints.endpoints:
            if endpoint.address is not None and not _is_ip(endpoint.address):
                address = await self.names.lookup(endpoint.address)
                if address is None:
                    self._say(f"dns:{endpoint.address}", "warning",
                              "node address does not resolve: replica left out",
                              replica=endpoint.replica, address=endpoint.address)
                endpoint = replace(endpoint, address=address)
            fixed.append(endpoint)
        return replace(endpoints, endpoints=tuple(fixed))

    def _report(self, plan: SlotPlan, sent: int) -> None:
        if plan.changes:
            log.info("haproxy updated", backend=self.backend, commands=sent,
                     changes=[str(c.after) for c in plan.changes])
        if plan.unslotted:
            self._say("unslotted", "warning",
                      "endpoints have no slot: give the backend's server-template more "
                      "servers", backend=self.backend, unslotted=len(plan.unslotted),
                      slots=len(plan.slots), replicas=list(plan.unslotted))
        else:
            self._clear("unslotted", "every endpoint has a slot", backend=self.backend)

    def _say(self, topic: str, level: str, event: str, **fields: Any) -> None:
        """Log ``event`` unless it is what ``topic`` said last."""
        said = (event, sorted(fields.items(), key=lambda kv: kv[0]))
        if self._said.get(topic) != said:
            self._said[topic] = said
            getattr(log, level)(event, **fields)

    def _clear(self, topic: str, event: str, **fields: Any) -> None:
        """``topic`` is over: say so if something was said about it."""
        if self._said.pop(topic, None) is not None:
            log.info(event, **fields)


class _Names:
    """Host names to IP addresses, each cached ``DNS_TTL`` seconds."""

    def __init__(self) -> None:
        self.cache: dict[str, tuple[str | None, float]] = {}

    async def lookup(self, name: str) -> str | None:
        cached = self.cache.get(name)
        if cached is not None and cached[1] > loop_time():
            return cached[0]
        address: str | None = None
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(2.0):
                infos = await asyncio.get_running_loop().getaddrinfo(
                    name, None, type=sockets.SOCK_STREAM)
            address = str(infos[0][4][0]) if infos else None
        self.cache[name] = (address, loop_time() + DNS_TTL)
        return address


def _is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def _plain(slot: SlotState) -> tuple[str, str, int, str]:
    return slot.name, slot.address, slot.port, slot.mode
