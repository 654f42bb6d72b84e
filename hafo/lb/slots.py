"""Which server slot of an HAProxy backend serves which replica, and in which state. Pure.

The backend declares a fixed set of slots (``server-template srv 1-8 127.0.0.1:1 disabled``);
``plan_slots`` maps a service's endpoints onto them and says what to change:

- an endpoint takes a slot when it has a node, an address and a bound port (the port named
  ``--port``, or the service's only port: ``select_port``);
- a replica keeps the slot it had: the slot that remembers it (``SlotState.replica``), else
  the slot already pointing at its address and port (HAProxy remembers addresses, not
  replicas: a restarted ``hafo lb`` finds its replicas again that way);
- a ready endpoint's slot is ``ready``. A retiring replica that still runs (replaced by a
  rolling update or a drain) is ``drain``: no new connections, while its established ones,
  and clients stuck to it by a persistence cookie, finish. Any other endpoint (failed, lost,
  starting) and a slot with nothing assigned is ``maint``: no traffic at all. Neither state
  closes established connections in HAProxy (only ``shutdown sessions server``, or a failed
  health check with ``on-marked-down shutdown-sessions``, does): a request in flight on a
  replica that leaves rotation finishes, or fails with its replica;
- more endpoints than slots: ready endpoints first, then draining ones, then the rest, each
  in replica order; those left over are ``SlotPlan.unslotted`` (say so: the template needs
  more slots).

Changes that take a slot out of rotation come first, so a failed replica stops receiving
requests before anything else is sent.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from hafo.model.endpoints import Endpoint, Endpoints

__all__ = ["LbError", "SlotChange", "SlotMode", "SlotPlan", "SlotState", "Step",
           "assign_slots", "carry_replicas", "endpoint_mode", "parse_servers_state",
           "plan_slots", "select_port"]

#: A server's administrative state, as ``set server BACKEND/SLOT state MODE`` sets it.
SlotMode = Literal["ready", "drain", "maint"]
#: One runtime-API command of a change: point the slot elsewhere, or set its state.
Step = Literal["addr", "state"]

_RANK: Mapping[SlotMode, int] = {"ready": 0, "drain": 1, "maint": 2}
# srv_admin_state bits (HAProxy's SRV_ADMF_*): forced, inherited and resolution maintenance;
# forced and inherited drain. 0x04 (CMAINT, "disabled" in the config) stays set after
# ``set server ... state ready`` on 2.6 and says nothing of the current state.
_MAINT_BITS = 0x01 | 0x02 | 0x20
_DRAIN_BITS = 0x08 | 0x10
_COLUMNS = ("be_name", "srv_name", "srv_addr", "srv_admin_state", "srv_port")


class LbError(Exception):
    """An operator's error or a refusal, in one line for people (no traceback)."""


@dataclass(frozen=True, slots=True)
class SlotState:
    """One server slot of the backend: where it points, its administrative state, and the
    replica it serves (None: none, or not known; HAProxy does not store it)."""

    name: str
    address: str
    port: int
    mode: SlotMode = "maint"
    replica: str | None = None

    def __str__(self) -> str:
        served = f" ({self.replica})" if self.replica else ""
        return f"{self.name} {_hostport(self.address, self.port)} {self.mode}{served}"


@dataclass(frozen=True, slots=True)
class SlotChange:
    """One slot whose address, port or state must change (``before`` -> ``after``)."""

    before: SlotState
    after: SlotState

    @property
    def slot(self) -> str:
        """The server's name in the backend."""
        return self.after.name

    @property
    def moves(self) -> bool:
        """Its address or port changes."""
        return (self.before.address, self.before.port) != (self.after.address,
                                                           self.after.port)

    @property
    def restates(self) -> bool:
        """Its state changes."""
        return self.before.mode != self.after.mode

    def steps(self) -> tuple[Step, ...]:
        """The commands it takes, in order: a slot entering rotation gets its new address
        first; one leaving it is taken out first."""
        if not self.moves:
            return ("state",) if self.restates else ()
        if not self.restates:
            return ("addr",)
        return ("addr", "state") if self.after.mode == "ready" else ("state", "addr")

    def commands(self, backend: str) -> list[str]:
        """The runtime-API commands, as sent."""
        server = f"{backend}/{self.slot}"
        return [f"set server {server} addr {self.after.address} port {self.after.port}"
                if step == "addr" else f"set server {server} state {self.after.mode}"
                for step in self.steps()]

    def __str__(self) -> str:
        return f"{self.before} -> {self.after}"


@dataclass(frozen=True, slots=True)
class SlotPlan:
    """Every slot as it is to be (``slots``, in the order given), the changes that get
    there (``changes``: only slots whose address, port or state differ), the port used, and
    the replicas with an address and a port but no slot (``unslotted``)."""

    slots: tuple[SlotState, ...]
    changes: tuple[SlotChange, ...]
    port_name: str | None
    unslotted: tuple[str, ...] = ()


def select_port(declared: Collection[str], wanted: str | None, workload: str) -> str:
    """The port to balance: ``wanted`` if the workload declares it, else its only port.
    LbError otherwise."""
    names = ", ".join(sorted(declared)) or "none"
    if wanted is not None:
        if wanted in declared:
            return wanted
        raise LbError(f"workload {workload!r} declares no port {wanted!r} (its ports: {names})")
    if len(declared) == 1:
        return next(iter(declared))
    if not declared:
        raise LbError(f"workload {workload!r} declares no ports: nothing to balance "
                      "(give it e.g. 'ports: {http: 0}')")
    raise LbError(f"workload {workload!r} declares several ports ({names}): "
                  "choose one with --port")


def endpoint_mode(endpoint: Endpoint) -> SlotMode:
    """``ready`` in rotation; ``drain`` retiring but still running; else ``maint``."""
    if endpoint.ready:
        return "ready"
    if endpoint.retiring and endpoint.state == "running":
        return "drain"
    return "maint"


def _port_name(endpoints: Endpoints, wanted: str | None) -> str | None:
    """``wanted``, else the one port the endpoints have bound (None: none bound yet)."""
    if wanted is not None:
        return wanted
    bound = {name for e in endpoints.endpoints for name in e.ports}
    return select_port(bound, None, endpoints.name) if bound else None


def _target(endpoint: Endpoint, port_name: str | None) -> tuple[str, int] | None:
    """Where the endpoint serves (address, port), if it has a node, an address and a port."""
    if port_name is None or endpoint.node is None or not endpoint.address:
        return None
    port = endpoint.ports.get(port_name, 0)
    return (endpoint.address, port) if port > 0 else None


def _match(slotted: Sequence[Endpoint], targets: Mapping[str, tuple[str, int]],
           slots: Sequence[SlotState]) -> dict[str, Endpoint]:
    """slot name -> the endpoint it serves: remembered replicas first, then the slots
    already pointing at an endpoint, then free slots (those in ``maint`` first)."""
    wanted = {e.replica for e in slotted}
    free = {s.name: s for s in slots}
    chosen: dict[str, Endpoint] = {}
    waiting = list(slotted)

    def take(endpoint: Endpoint, slot: SlotState) -> None:
        chosen[slot.name] = endpoint
        del free[slot.name]
        waiting.remove(endpoint)

    for endpoint in list(waiting):
        slot = next((s for s in free.values() if s.replica == endpoint.replica), None)
        if slot is not None:
            take(endpoint, slot)
    for endpoint in list(waiting):
        slot = next((s for s in free.values() if s.replica not in wanted
                     and (s.address, s.port) == targets[endpoint.replica]), None)
        if slot is not None:
            take(endpoint, slot)
    spare = sorted(free.values(), key=lambda s: s.mode != "maint")
    for endpoint, slot in zip(list(waiting), spare, strict=False):
        take(endpoint, slot)
    return chosen


def assign_slots(endpoints: Endpoints, port_name: str | None,
                 slots: Sequence[SlotState]) -> SlotPlan:
    """The slots for ``endpoints`` given the slots as they are (see the module)."""
    port = _port_name(endpoints, port_name)
    targets = {e.replica: t for e in endpoints.endpoints
               if (t := _target(e, port)) is not None}
    ranked = sorted((e for e in endpoints.endpoints if e.replica in targets),
                    key=lambda e: _RANK[endpoint_mode(e)])
    kept = {e.replica for e in ranked[:len(slots)]}
    slotted = [e for e in endpoints.endpoints if e.replica in kept]  # in replica order
    unslotted = ranked[len(slots):]
    chosen = _match(slotted, targets, slots)
    after = []
    for slot in slots:
        endpoint = chosen.get(slot.name)
        if endpoint is None:
            after.append(replace(slot, mode="maint", replica=None))
        else:
            address, bound = targets[endpoint.replica]
            after.append(SlotState(slot.name, address, bound, endpoint_mode(endpoint),
                                   endpoint.replica))
    changes = [SlotChange(b, a) for b, a in zip(slots, after, strict=True)
               if b.mode != a.mode or (b.address, b.port) != (a.address, a.port)]
    changes.sort(key=lambda c: c.after.mode == "ready")
    return SlotPlan(tuple(after), tuple(changes), port,
                    tuple(sorted(e.replica for e in unslotted)))


def plan_slots(endpoints: Endpoints, port_name: str | None,
               slots: Sequence[SlotState]) -> list[SlotChange]:
    """What to change so that the slots serve ``endpoints`` (``assign_slots``'s changes)."""
    return list(assign_slots(endpoints, port_name, slots).changes)


def carry_replicas(previous: Sequence[SlotState],
                   current: Sequence[SlotState]) -> list[SlotState]:
    """``current`` (read from HAProxy, which knows no replicas), each slot remembering the
    replica ``previous`` had there if it still points at the same address and port."""
    known = {s.name: s for s in previous}
    carried = []
    for slot in current:
        old = known.get(slot.name)
        if old is not None and (old.address, old.port) == (slot.address, slot.port):
            slot = replace(slot, replica=old.replica)
        carried.append(slot)
    return carried


def _mode(admin_state: int) -> SlotMode:
    if admin_state & _MAINT_BITS:
        return "maint"
    return "drain" if admin_state & _DRAIN_BITS else "ready"


def parse_servers_state(text: str, backend: str | None = None) -> list[SlotState]:
    """The servers of ``backend`` (all backends: None) from the reply to ``show servers
    state`` (format version 1: a version line, a ``#`` header naming the columns, one line
    per server). LbError on anything else."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "1" or len(lines) < 2 or not lines[1].startswith("#"):
        first = lines[0].strip() if lines else "nothing"
        raise LbError(f"unexpected reply to 'show servers state': {first[:120]!r}")
    columns = lines[1].lstrip("#").split()
    missing = [c for c in _COLUMNS if c not in columns]
    if missing:
        raise LbError(f"'show servers state' lacks the columns {', '.join(missing)}")
    slots = []
    for line in lines[2:]:
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) < len(columns):
            raise LbError(f"unexpected line in 'show servers state': {line[:120]!r}")
        row = dict(zip(columns, fields, strict=False))
        if backend is not None and row["be_name"] != backend:
            continue
        try:
            slots.append(SlotState(row["srv_name"], row["srv_addr"], int(row["srv_port"]),
                                   _mode(int(row["srv_admin_state"]))))
        except ValueError:
            raise LbError(f"unexpected line in 'show servers state': {line[:120]!r}") from None
    return slots


def _hostport(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
