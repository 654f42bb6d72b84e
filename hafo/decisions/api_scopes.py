"""What a bearer token may change (issue 30; docs/reference/http.md, "Team tokens").

The controller's API knows three callers of a mutation:

- the admin: the holder of ``api.token_file``'s token; it may do everything;
- a team: the holder of one team's token (``api.team_tokens_file``); it may submit, change,
  migrate and delete the workloads of its queues, and nothing else (nodes, queues and any
  other mutation are the admin's);
- anonymous: no token is configured at all, so every mutation is open (as before tokens).

Reads are open to everyone and never come here; a missing or wrong token is refused (401)
before this decision. ``refusal`` is the decision: None when the caller may, else the 403's
text, naming the team, the workload and its queue.

Pure: the API identifies the caller (``hafo.api.auth``) and the intent (``hafo.api.scopes``:
the route, and the workload's queue from the spec or the controller's snapshot).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "ADMIN",
    "ANONYMOUS",
    "WORKLOAD_ACTIONS",
    "Action",
    "Caller",
    "Intent",
    "refusal",
    "team",
]


class Action(StrEnum):
    """What a mutation does (its verb, in refusals)."""

    SUBMIT = "submit"  # create or change a workload (POST /v1/workloads)
    DELETE = "delete"
    MIGRATE = "migrate"
    DRAIN = "drain"  # a node
    CORDON = "cordon"
    UNCORDON = "uncordon"
    REMOVE = "remove"  # a node (DELETE /v1/nodes/{name})
    QUEUE_SET = "set"  # a queue (PUT /v1/queues/{name})
    QUEUE_DELETE = "delete queue"  # DELETE /v1/queues/{name}
    OTHER = "change"  # any other mutation: cluster-wide, the admin's


#: The actions on one workload, which a team may take on the workloads of its queues.
WORKLOAD_ACTIONS = frozenset({Action.SUBMIT, Action.DELETE, Action.MIGRATE})
_NODE_ACTIONS = frozenset({Action.DRAIN, Action.CORDON, Action.UNCORDON, Action.REMOVE})
_QUEUE_ACTIONS = frozenset({Action.QUEUE_SET, Action.QUEUE_DELETE})


@dataclass(frozen=True)
class Caller:
    """Who makes the call: ``kind`` is 'admin', 'team' or 'anonymous'; a team's ``name`` and
    ``queues``."""

    kind: str
    name: str = ""
    queues: frozenset[str] = frozenset()

    @property
    def is_team(self) -> bool:
        """A team's token (scoped to its queues)."""
        return self.kind == "team"

    def describe(self) -> str:
        """For refusals: ``token of team "team-b"``."""
        return f'token of team "{self.name}"' if self.is_team else f"{self.kind} caller"


#: The holder of the admin token (``api.token_file``).
ADMIN = Caller("admin")
#: A caller of an API that needs no token at all.
ANONYMOUS = Caller("anonymous")


def team(name: str, queues: Iterable[str]) -> Caller:
    """The holder of team ``name``'s token, scoped to ``queues``."""
    return Caller("team", name, frozenset(queues))


@dataclass(frozen=True)
class Intent:
    """One mutation: its ``action``; ``target``, what it names (a workload's id or name, a
    node, a queue; '' for none); for a workload, ``queue`` (a submit: the spec's; delete,
    migrate: the workload's current one; None: this controller does not know the workload)
    and ``new_queue`` (a submit that changes an existing workload: the spec's queue, where
    ``queue`` is the workload's current one)."""

    action: Action
    target: str = ""
    queue: str | None = None
    new_queue: str | None = None


def _queues(caller: Caller) -> str:
    return ", ".join(sorted(caller.queues)) or "none"


def refusal(caller: Caller, intent: Intent) -> str | None:
    """None when ``caller`` may do ``intent``; else why not (the 403's text)."""
    if not caller.is_team:
        return None  # the admin, or an API without tokens: everything
    who, action = caller.describe(), intent.action
    if action in WORKLOAD_ACTIONS:
        what = f"workload {intent.target}" if intent.target else "a workload"
        if intent.queue is None:
            # Not in this controller's cache (unknown, or just submitted through another
            # controller): its queue cannot be checked, so the team's token is refused.
            return (f"{who} may not {action} {what}: this controller does not know its queue "
                    "(the workload is not in its cache); try again, or use the admin token")
        for queue in dict.fromkeys(q for q in (intent.queue, intent.new_queue) if q is not None):
            if queue not in caller.queues:
                return (f'{who} may not {action} {what} of queue "{queue}" '
                        f"(its queues: {_queues(caller)})")
        return None
    if action in _NODE_ACTIONS:
        subject = f"node {intent.target}" if intent.target else "a node"
        return f"{who} may not {action} {subject}: nodes need the admin token"
    if action in _QUEUE_ACTIONS:
        subject = f'queue "{intent.target}"' if intent.target else "a queue"
        verb = "set" if action == Action.QUEUE_SET else "delete"
        return f"{who} may not {verb} {subject}: queues need the admin token"
    subject = intent.target or "the cluster"
    return f"{who} may not change {subject}: that needs the admin token"
