"""Schemathesis hooks for the API fuzzing test (``SCHEMATHESIS_HOOKS``).

Three rules of the workload spec hold between fields, which JSON Schema cannot state, so the
OpenAPI document cannot either: a check's ``port`` that names a port must name one of the
spec's ``ports``, an ``http`` check needs ``url`` or ``port``, and ``straggler_lag``,
``warm`` and ``preflight`` need a gang (``nodes`` of 2 or more). A body the schema accepts
may break them (and is then refused with 400, naming the field, as it should be); this hook
makes generated bodies keep them, so that "bodies the schema accepts are accepted" stays
checked for everything else. Likewise a check type must be installed on the controller
unless the query says ``allow_unknown_checks=true`` (which types are installed is no part of
the schema): a body with another type is sent with that query.

A queue's declaration has rules of the same kind (``PUT /v1/queues/{name}``): a body's
``name`` is the path's, ``lending_limit`` is at most ``gpus``, limits need a ``cohort``, and
a ``cohort`` needs ``gpus``, and ``models`` (at most 32 globs) needs ``gpus`` of at least
their sum.
"""

from __future__ import annotations

from typing import Any

import schemathesis


def _unknown_types(body: dict[str, Any]) -> bool:
    from hafo.checks.registry import available_types

    checks = body.get("checks")
    known = available_types()
    return isinstance(checks, list) and any(
        isinstance(c, dict) and isinstance(c.get("type"), str) and c["type"] not in known
        for c in checks)


def _gang_only(body: dict[str, Any]) -> None:
    """``straggler_lag``, ``warm`` and ``preflight`` only in a gang's spec: left out of
    another's."""
    nodes = body.get("nodes")
    gang = isinstance(nodes, int) and not isinstance(nodes, bool) and nodes >= 2
    if body.get("straggler_lag") is not None and not gang:
        body["straggler_lag"] = None
    if body.get("warm") is True and not gang:
        body["warm"] = False
    if body.get("preflight") is not None and not gang:
        body["preflight"] = None


def _consistent(body: dict[str, Any]) -> None:
    checks, ports = body.get("checks"), body.get("ports")
    if not isinstance(checks, list):
        return
    for check in checks:
        if not isinstance(check, dict):
            continue
        port = check.get("port")
        if isinstance(port, str) and (ports is None or isinstance(ports, dict)):
            ports = body["ports"] = {**(ports or {}), port: 0}
        if check.get("type") == "http" and check.get("url") is None and check.get("port") is None:
            check["port"] = 8000


def _negative(case: Any) -> bool:
    """A case generated to break the schema (left alone: it must be refused as it is)."""
    mode = getattr(getattr(getattr(case, "meta", None), "generation", None), "mode", None)
    return bool(getattr(mode, "is_negative", False))


def _consistent_queue(body: dict[str, Any], name: Any) -> None:
    if "name" in body:
        body["name"] = name
    limits = body.get("borrowing_limit") is not None or body.get("lending_limit") is not None
    if limits and body.get("cohort") is None:
        body["cohort"] = "fuzz"
    lending = body.get("lending_limit")
    number = (int, float)  # the schema's integers: 5710.0 is one too
    if body.get("cohort") is not None and body.get("gpus") is None:  # a cohort needs a quota
        body["gpus"] = lending if isinstance(lending, number) and not isinstance(
            lending, bool) and lending >= 0 else 1
    gpus = body.get("gpus")
    if isinstance(gpus, number) and isinstance(lending, number) and not isinstance(
            gpus, bool) and not isinstance(lending, bool) and gpus >= 0 and lending > gpus:
        body["lending_limit"] = gpus
    _consistent_models(body)


def _consistent_models(body: dict[str, Any]) -> None:
    """``models`` names at most ``MAX_MODELS`` globs, parts of ``gpus``: the sum is at most
    ``gpus`` (raised to it, which keeps ``lending_limit`` at most ``gpus``)."""
    from hafo.model.queues import MAX_MODELS, MAX_QUEUE_GPUS

    models = body.get("models")
    if not isinstance(models, dict) or not models or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
            for v in models.values()):
        return
    if len(models) > MAX_MODELS:
        models = body["models"] = dict(list(models.items())[:MAX_MODELS])
    if sum(models.values()) > MAX_QUEUE_GPUS:
        share = MAX_QUEUE_GPUS // len(models)
        models = body["models"] = {k: min(int(v), share) for k, v in models.items()}
    named = sum(models.values())
    gpus = body.get("gpus")
    if not isinstance(gpus, (int, float)) or isinstance(gpus, bool) or gpus < named:
        body["gpus"] = int(named)


@schemathesis.hook
def map_case(context: Any, case: Any) -> Any:
    """Make a submitted spec's checks name only declared ports."""
    if case.method == "POST" and case.path == "/v1/workloads" and isinstance(case.body, dict):
        _consistent(case.body)
        if not _negative(case):  # a negative case's straggler_lag may be what breaks it
            _gang_only(case.body)
        if _unknown_types(case.body):
            case.query = {**(case.query or {}), "allow_unknown_checks": "true"}
    return case


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: Any) -> None:
    """Make a queue's declaration keep its rules, just before it is sent: the stateful phase's
    links fill the path's name and body fields after ``map_case``."""
    if (case.method == "PUT" and case.path == "/v1/queues/{name}"
            and isinstance(case.body, dict) and not _negative(case)):
        _consistent_queue(case.body, (case.path_parameters or {}).get("name"))
