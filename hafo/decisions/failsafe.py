"""Failsafe mode (all of etcd unreachable): who may keep work, who may lead. Pure.

The rule, in full (docs/safety.md, rule 5):
1. A controller answers "etcd unavailable" to an agent only after its own etcd request just
   failed, and then makes no failover decision for ``TTL + margin`` from that answer.
2. An agent whose keepalives fail may extend its fencing deadline to (send time of a round of
   questions + TTL - margin) only if *every* controller of the failsafe set it last read from
   etcd answered "etcd unavailable" in that round, and its last etcd contact is less than
   ``failsafe_max`` ago. Any missing answer means no extension.
3. The failsafe set is written by the leader. A controller may lead only if the set does not
   exist yet (bootstrap), or it is in the set and either every node has acknowledged a set
   version that includes it, or it has been in the set for ``failsafe_max`` (+ slack).
So a workload kept alive by rule 2 is dead before any controller that answered may fail it
over (rule 1), and no controller the agent did not ask can lead during that time (rule 3).
"""

from __future__ import annotations

from collections.abc import Mapping

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


def may_extend(answers: Mapping[str, str | None], members: set[str], since_contact: float,
               failsafe_max: float) -> bool:
    """Rule 2: every member answered "unavailable", and etcd was reached recently enough."""
    if not members or since_contact >= failsafe_max:
        return False
    return all(answers.get(name) == "unavailable" for name in members)
