"""Failsafe mode (all of etcd unreachable): who may keep work, who may lead. Pure.

The rule, in full (docs/safety.md, rule 5):
1. A controller answers "etcd unavailable" to an agent only after its own etcd request just
   failed, and then makes no failover decision for its hold (``promise_hold``: TTL +
   margin, stated in the answer) from that answer. For a
   recovery window after its last such answer (``recovery_window``) it answers "recovering"
   instead of "available", with the same promise: etcd is back, and the agents that kept
   their work on its word get the time to reach etcd again (their connections reopen with
   backoff; a busy machine takes seconds).
2. An agent whose keepalives fail may extend its fencing deadline to the earliest (send time
   + hold - 2 x margin) of the latest questions each controller of the failsafe set it last
   read from etcd answered with "etcd unavailable" or "recovering" (``failsafe_deadline``),
   and only while its last etcd contact is less than ``failsafe_max`` ago. A controller not
   yet asked, or that answered "available" since, means no extension; one that did not
   answer the last question still counts with the promise it gave before (that promise
   holds its failovers for its whole hold, and its time is older).
3. The failsafe set is written by the leader. A controller may lead only if the set does not
   exist yet (bootstrap), or it is in the set and either every node has acknowledged a set
   version that includes it, or it has been in the set for ``failsafe_max`` (+ slack).
So a workload kept alive by rule 2 is dead before any controller that answered may fail it
over (rule 1), and no controller the agent did not ask can lead during that time (rule 3).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from hafo.model.cluster import FailsafeSet


def updated_set(current: FailsafeSet, registered: Mapping[str, str]) -> FailsafeSet | None:
    """The set the leader should write given the registered controllers (name -> API), or None
    if nothing changes. Members are added (with the version that adds them) or their address
    refreshed; never removed here (an absent member only makes failsafe stricter)."""
    members = {k: dict(v) for k, v in current.members.items()}
    changed = False
    version = current.version + 1
    for name, api in sorted(registered.items()):
        if name not in members:
            members[name] = {"api": api, "since": version}
            changed = True
        elif members[name].get("api") != api:
            members[name] = {**members[name], "api": api}
            changed = True
    return FailsafeSet(version, members) if changed else None


def may_lead(name: str, current: FailsafeSet, node_acks: Mapping[str, int],
             in_set_for: float | None, failsafe_max: float) -> bool:
    """Rule 3. ``node_acks``: node -> newest failsafe version it acknowledged (every node
    record, dead nodes included); ``in_set_for``: seconds since this controller first saw
    itself in the set (None if never)."""
    if not current.members:
        return True
    member = current.members.get(name)
    if member is None:
        return False
    since = int(member.get("since", 0))
    if all(ack >= since for ack in node_acks.values()):
        return True
    return in_set_for is not None and in_set_for >= failsafe_max + 5.0


PROMISES = frozenset({"unavailable", "recovering"})  # answers that hold back failovers


def recovery_window(ttl: float) -> float:
    """Rule 1: how long after its last "unavailable" a controller answers "recovering"."""
    return 2 * ttl


def promise_hold(ttl: float, margin: float) -> float:
    """Rule 1: how long a controller's promise holds back its failovers (from its answer):
    a lease TTL and the margin. Agents read it from each answer (``hold``), so that a longer
    hold can be given by controllers first and used by agents after (two TTLs were tried: a
    controller stalled for seconds would then not end the agents' cover, but the chaos suite
    recovered worse; see docs/safety.md, "Known gaps")."""
    return ttl + margin


def failsafe_deadline(promised: Mapping[str, tuple[float, float]], members: Collection[str],
                      since_contact: float, failsafe_max: float,
                      margin: float) -> float | None:
    """Rule 2: the deadline the agent may extend to, or None (no extension). ``promised``:
    per controller, (send time of its latest question answered with a promise, the hold that
    answer stated). Every controller promised no failover until at least (send time + hold):
    the deadline is the earliest of those, less twice the margin (the slack a keepalive's
    deadline has before its lease expires)."""
    if not members or since_contact >= failsafe_max:
        return None
    if any(name not in promised for name in members):
        return None
    return min(sent + hold for sent, hold in (promised[name] for name in members)) - 2 * margin


def may_extend(answers: Mapping[str, str | None], members: set[str], since_contact: float,
               failsafe_max: float) -> bool:
    """Rule 2: every member answered with a promise ("unavailable" or "recovering"), and
    etcd was reached recently enough."""
    if not members or since_contact >= failsafe_max:
        return False
    return all(answers.get(name) in PROMISES for name in members)
