"""Who may be a node: adopt our own lease, wait for another holder, or claim the name. Pure.

A node name is held by the agent whose lease is on the node's liveness key (and, in case that
key was deleted while the lease lives, the lease recorded in the node record). An agent
*adopts* the name (a hitless restart: same lease, same guards, same epochs) only if its own
records (the lease record kept beside its instance records) name a lease that etcd still
has, and no other live lease holds the name. Otherwise it is a new *claimant*: while another
live lease holds the name it waits (a second agent started with the same name, or this
agent's previous run, whose records were lost and whose guards may still run); once no live
lease holds it, it fences whatever its own records still run and claims the name with a fresh
lease. Every guard of an earlier holder is dead by then: guards kill their workloads before
their lease can expire (docs/safety.md, rule 2), and a claim waits for that expiry.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from typing import Literal

ClaimOutcome = Literal["adopt", "wait", "claim"]


@dataclass(frozen=True)
class ClaimView:
    """What a starting agent knows: ``saved`` the lease of its own records (None without
    records); ``holder`` the lease on the node's liveness key and ``recorded`` the one in its
    node record (None when absent); ``live`` which of these leases etcd still has."""

    saved: int | None
    holder: int | None
    recorded: int | None
    live: Set[int]


@dataclass(frozen=True)
class ClaimDecision:
    """The outcome, the lease concerned (ours to adopt, or the other holder's) and why."""

    outcome: ClaimOutcome
    lease: int | None
    why: str


def decide_claim(view: ClaimView) -> ClaimDecision:
    """Adopt, wait or claim (see the module)."""
    others = sorted({lease for lease in (view.holder, view.recorded)
                     if lease and lease != view.saved and lease in view.live})
    if others:
        return ClaimDecision("wait", others[0],
                             f"the name is held by another agent's live lease {others[0]:x}")
    if view.saved and view.saved in view.live:
        return ClaimDecision("adopt", view.saved, f"our lease {view.saved:x} is still alive")
    if view.saved:
        return ClaimDecision("claim", None, f"our lease {view.saved:x} is gone")
    return ClaimDecision("claim", None, "no lease record of ours")


def may_start_epoch(epoch: int, claimed: int, recorded: bool) -> bool:
    """An agent starts an assigned instance only if its epoch is newer than its claim of the
    node (older ones belong to an earlier holder of the name, which may have run them) or its
    own records already have it (then it is never started twice anyway)."""
    return epoch > claimed or recorded
