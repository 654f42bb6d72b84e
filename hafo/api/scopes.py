"""Team tokens' scopes on the controller's API (``hafo.decisions.api_scopes``;
docs/reference/http.md, "Team tokens").

``bearer_auth`` (``hafo.api.auth``) says who calls (``CALLER``); here:

- ``route_scopes``, a middleware after it, refuses (403) every mutation of a team's token
  that is not an action on one workload: nodes (drain, cordon, uncordon), queues (any
  mutation under ``/v1/queues``) and any other mutating route, present or future (a route is
  a workload action only when ``WORKLOAD_ROUTES`` names it: fail closed);
- the workload handlers (``hafo.api.write_routes``) call ``authorize`` (delete, migrate:
  the workload's queue in the controller's snapshot) or ``authorize_submit`` (the spec's
  queue, and the queue of the workload of that name if there is one), which raise
  ``Forbidden`` (403 with the decision's text).

The admin token, and an API without tokens, pass everything.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from hafo.api.auth import CALLER, MUTATING
from hafo.api.errors import Forbidden, error
from hafo.decisions.api_scopes import ANONYMOUS, WORKLOAD_ACTIONS, Action, Caller, Intent, refusal
from hafo.model.cluster import ClusterSnapshot
from hafo.model.spec import WorkloadSpec
from hafo.store import Keys, Store, codec

__all__ = ["QUEUES_PREFIX", "WORKLOAD_ROUTES", "Forbidden", "authorize", "authorize_submit",
           "caller_of", "route_intent", "route_scopes"]

#: The mutating routes that act on one workload (method, route template): the handler checks
#: the workload's queue. Every other mutation is the admin's.
WORKLOAD_ROUTES = {
    ("POST", "/v1/workloads"): Action.SUBMIT,
    ("DELETE", "/v1/workloads/{id}"): Action.DELETE,
    ("POST", "/v1/workloads/{id}/migrate"): Action.MIGRATE,
}
_NODE_ROUTES = {
    ("POST", "/v1/nodes/{name}/drain"): Action.DRAIN,
    ("POST", "/v1/nodes/{name}/cordon"): Action.CORDON,
    ("POST", "/v1/nodes/{name}/uncordon"): Action.UNCORDON,
    ("DELETE", "/v1/nodes/{name}"): Action.REMOVE,
}
#: Every mutation under it is a queue's (``PUT``/``DELETE /v1/queues/{name}``): the admin's.
QUEUES_PREFIX = "/v1/queues"


def caller_of(request: web.Request) -> Caller:
    """Who makes this mutation (``bearer_auth`` put it there; anonymous without it)."""
    caller: Caller = request.get(CALLER, ANONYMOUS)
    return caller


def _template(request: web.Request) -> str:
    """The route's template (``/v1/workloads/{id}``), else the path."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else request.path


def route_intent(request: web.Request) -> Intent:
    """What a mutating request does, as far as its route says (a workload's queue is the
    handler's to find)."""
    key = (request.method, _template(request))
    info = request.match_info
    if key in WORKLOAD_ROUTES:
        return Intent(WORKLOAD_ROUTES[key], info.get("id", ""))
    if key in _NODE_ROUTES:
        return Intent(_NODE_ROUTES[key], info.get("name", ""))
    path = request.path
    if path == QUEUES_PREFIX or path.startswith(QUEUES_PREFIX + "/"):
        action = Action.QUEUE_DELETE if request.method == "DELETE" else Action.QUEUE_SET
        return Intent(action, info.get("name", path[len(QUEUES_PREFIX) + 1:]))
    return Intent(Action.OTHER, f"{request.method} {path}")


def route_scopes() -> Middleware:
    """Middleware (after ``bearer_auth``): 403 for a team's token on any mutation but a
    workload's (whose handler checks the queue)."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        unrouted = request.match_info.http_exception is not None
        if request.method in MUTATING and not unrouted:
            caller = caller_of(request)
            if caller.is_team:
                intent = route_intent(request)
                if intent.action not in WORKLOAD_ACTIONS:
                    why = refusal(caller, intent)
                    if why is not None:
                        return error(403, why)
        return await handler(request)

    return check


def authorize(request: web.Request, action: Action, snapshot: ClusterSnapshot,
              wid: str) -> None:
    """Forbidden unless the caller may ``action`` (delete, migrate) workload ``wid``, whose
    queue is its spec's in ``snapshot``. A workload ``snapshot`` does not know (an id that
    only etcd may hold: just submitted through another controller, or none) is refused to a
    team's token with 403, not 404: its queue cannot be checked, and it may exist (a 404
    would say it does not); the admin's passes to the intent, which reads etcd."""
    caller = caller_of(request)
    if not caller.is_team:
        return
    sub = snapshot.workloads.get(wid)
    why = refusal(caller, Intent(action, wid, sub.spec.queue if sub is not None else None))
    if why is not None:
        raise Forbidden(why)


async def authorize_submit(request: web.Request, store: Store, keys: Keys,
                           snapshot: ClusterSnapshot, spec: WorkloadSpec) -> None:
    """Forbidden unless the caller may submit ``spec``: its queue is the caller's, and so is
    that of the workload of that name it would change (in ``snapshot``, or in etcd when the
    snapshot does not have it yet: a name just taken through another controller)."""
    caller = caller_of(request)
    if not caller.is_team:
        return
    current = [snapshot.workloads[wid].spec.queue
               for wid in snapshot.by_name.get(spec.name, ()) if wid in snapshot.workloads]
    if not current:
        named = await store.get(keys.name(spec.name))
        record = await store.get(keys.workload(named.value.decode())) if named else None
        if record is not None:
            try:
                current = [codec.decode_submission(record.value).spec.queue]
            except ValueError:  # a record this hafo cannot read: its queue is unknown
                raise Forbidden(refusal(caller, Intent(Action.SUBMIT, spec.name))) from None
    for queue in current or [spec.queue]:
        why = refusal(caller, Intent(Action.SUBMIT, spec.name, queue,
                                     spec.queue if current else None))
        if why is not None:
            raise Forbidden(why)
