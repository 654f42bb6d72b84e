"""Workload specification: the user's YAML, validated into a frozen WorkloadSpec."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hafo.model.errors import ValidationError
from hafo.model.names import WORKLOAD_NAME_RE
from hafo.model.parsing import (
    as_mapping,
    get_argv,
    get_int,
    get_number,
    get_str,
    get_str_map,
    reject_unknown,
)

NAME_RE = WORKLOAD_NAME_RE
MIG_PROFILE_RE = re.compile(r"^[1-8]g\.[1-9][0-9]{0,3}gb(\+[a-z]+)?$")
STRATEGIES = ("spread", "binpack")
CHECK_TYPES_BUILTIN = ("http", "tcp", "exec", "process", "progress")


@dataclass(frozen=True)
class RestartPolicy:
    """Restart in place up to ``max_restarts`` within ``window`` seconds."""

    max_restarts: int = 3
    window: float = 600.0
    backoff: float = 1.0
    max_backoff: float = 30.0

    def delay(self, restarts_in_window: int) -> float:
        """Seconds to wait before restart number ``restarts_in_window + 1`` of the window:
        none for the first, then ``backoff`` doubling up to ``max_backoff``."""
        if restarts_in_window <= 0:
            return 0.0
        return float(min(self.backoff * 2 ** (restarts_in_window - 1), self.max_backoff))


@dataclass(frozen=True)
class CheckSpec:
    """One application check; ``options`` keeps the type-specific fields."""

    type: str
    interval: float = 10.0
    timeout: float = 5.0
    failure_threshold: int = 3
    initial_delay: float = 0.0
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkloadSpec:
    """What the user asked to run (part B of DESIGN.md, 'Workload spec').

    ``gpu_profile``: run on ``gpus`` MIG devices of this profile (e.g. "1g.10gb") instead of
    whole GPUs. ``placement``: ``spread`` or ``binpack`` for this workload (None: the
    controller's ``placement.strategy``). ``preempt``: when it cannot be placed, it may stop
    (checkpoint first) strictly lower-priority work to make room on one node.
    """

    name: str
    command: tuple[str, ...]
    gpus: int = 0
    gpu_model: str | None = None
    gpu_memory_mib: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    restart: RestartPolicy = RestartPolicy()
    checks: tuple[CheckSpec, ...] = ()
    stop_grace: float = 30.0
    workdir: str | None = None
    priority: int = 0
    node_selector: Mapping[str, str] = field(default_factory=dict)
    checkpoint_mode: str = "cooperative"
    gpu_profile: str | None = None
    placement: str | None = None
    preempt: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The canonical JSON form (round-trips through ``parse_spec``)."""
        out: dict[str, Any] = {
            "name": self.name,
            "command": list(self.command),
            "gpus": self.gpus,
            "env": dict(self.env),
            "restart": {"max_restarts": self.restart.max_restarts,
                        "window": self.restart.window, "backoff": self.restart.backoff,
                        "max_backoff": self.restart.max_backoff},
            "checks": [
                {"type": c.type, "interval": c.interval, "timeout": c.timeout,
                 "failure_threshold": c.failure_threshold, "initial_delay": c.initial_delay,
                 **dict(c.options)}
                for c in self.checks
            ],
            "stop_grace": self.stop_grace,
            "priority": self.priority,
            "node_selector": dict(self.node_selector),
        }
        if self.gpu_model is not None:
            out["gpu_model"] = self.gpu_model
        if self.gpu_memory_mib is not None:
            out["gpu_memory_mib"] = self.gpu_memory_mib
        if self.workdir is not None:
            out["workdir"] = self.workdir
        if self.checkpoint_mode != "cooperative":
            out["checkpoint"] = {"mode": self.checkpoint_mode}
        if self.gpu_profile is not None:
            out["gpu_profile"] = self.gpu_profile
        if self.placement is not None:
            out["placement"] = self.placement
        if self.preempt:
            out["preempt"] = True
        return out


_SPEC_FIELDS = {
    "name", "command", "gpus", "gpu_model", "gpu_memory_mib", "env", "restart", "checks",
    "stop_grace", "workdir", "priority", "node_selector", "checkpoint", "gpu_profile",
    "placement", "preempt",
}


def _or_empty(value: Any, empty: Any) -> Any:
    """``empty`` for an absent (None) value; anything else as given, to be type-checked (a
    ``false`` or ``0`` is not quietly taken for "nothing")."""
    return empty if value is None else value


def _parse_check(raw: Any, where: str) -> CheckSpec:
    data = as_mapping(raw, where)
    ctype = get_str(data, "type", where, required=True)
    assert ctype is not None
    options = {k: v for k, v in data.items()
               if k not in {"type", "interval", "timeout", "failure_threshold", "initial_delay"}}
    if ctype == "exec":
        get_argv(data, "command", where)
    if ctype in ("http",):
        get_str(data, "url", where, required=True)
    if ctype == "tcp":
        get_int(data, "port", where, default=0, minimum=1, maximum=65535)
    if ctype == "progress":
        if data.get("stall_after") is None:
            raise ValidationError(f"{where}.stall_after", "is required (seconds without progress)")
        get_number(data, "stall_after", where, 0.0, minimum=0, exclusive_minimum=True)
        get_str(data, "file", where)
    if ctype == "process" and data.get("max_rss_mib") is not None:
        get_int(data, "max_rss_mib", where, 1, minimum=1)
    return CheckSpec(
        type=ctype,
        interval=get_number(data, "interval", where, 10.0, minimum=0, exclusive_minimum=True),
        timeout=get_number(data, "timeout", where, 5.0, minimum=0, exclusive_minimum=True),
        failure_threshold=get_int(data, "failure_threshold", where, 3, minimum=1),
        initial_delay=get_number(data, "initial_delay", where, 0.0, minimum=0),
        options=options,
    )


def parse_spec(raw: Any, field_prefix: str = "spec") -> WorkloadSpec:
    """Validate an untrusted mapping into a WorkloadSpec; ValidationError names the field."""
    data = as_mapping(raw, field_prefix)
    reject_unknown(data, _SPEC_FIELDS, field_prefix)
    name = get_str(data, "name", field_prefix, required=True)
    assert name is not None
    if not NAME_RE.fullmatch(name):
        raise ValidationError(f"{field_prefix}.name",
                              "must be lowercase letters, digits and '-', 1-52 characters")
    restart_raw = as_mapping(_or_empty(data.get("restart"), {}), f"{field_prefix}.restart")
    reject_unknown(restart_raw, {"max_restarts", "window", "backoff", "max_backoff"},
                   f"{field_prefix}.restart")
    checks_raw = _or_empty(data.get("checks"), [])
    if not isinstance(checks_raw, list):
        raise ValidationError(f"{field_prefix}.checks", "must be a list")
    gpu_memory = data.get("gpu_memory_mib")
    checkpoint = as_mapping(_or_empty(data.get("checkpoint"), {}),
                            f"{field_prefix}.checkpoint")
    reject_unknown(checkpoint, {"mode"}, f"{field_prefix}.checkpoint")
    mode = get_str(checkpoint, "mode", f"{field_prefix}.checkpoint", "cooperative")
    if mode not in ("cooperative", "transparent"):
        raise ValidationError(f"{field_prefix}.checkpoint.mode",
                              "must be 'cooperative' (the SDK) or 'transparent' (CRIU)")
    profile = get_str(data, "gpu_profile", field_prefix)
    if profile is not None and not MIG_PROFILE_RE.fullmatch(profile):
        raise ValidationError(f"{field_prefix}.gpu_profile",
                              f"must be a MIG profile like 1g.10gb, got {profile!r}")
    placement = get_str(data, "placement", field_prefix)
    if placement is not None and placement not in STRATEGIES:
        raise ValidationError(f"{field_prefix}.placement", "must be spread or binpack")
    preempt = data.get("preempt", False)
    if preempt is None:
        preempt = False
    if not isinstance(preempt, bool):
        raise ValidationError(f"{field_prefix}.preempt", f"must be true or false, got {preempt!r}")
    return WorkloadSpec(
        name=name,
        command=tuple(get_argv(data, "command", field_prefix)),
        gpus=get_int(data, "gpus", field_prefix, 0, minimum=0, maximum=64),
        gpu_model=get_str(data, "gpu_model", field_prefix),
        gpu_memory_mib=(None if gpu_memory is None else
                        get_int(data, "gpu_memory_mib", field_prefix, 0, minimum=1)),
        env=get_str_map(data, "env", field_prefix),
        restart=RestartPolicy(
            max_restarts=get_int(restart_raw, "max_restarts", f"{field_prefix}.restart", 3,
                                 minimum=0),
            window=get_number(restart_raw, "window", f"{field_prefix}.restart", 600.0,
                              minimum=0, exclusive_minimum=True),
            backoff=get_number(restart_raw, "backoff", f"{field_prefix}.restart", 1.0,
                               minimum=0),
            max_backoff=get_number(restart_raw, "max_backoff", f"{field_prefix}.restart", 30.0,
                                   minimum=0),
        ),
        checks=tuple(_parse_check(c, f"{field_prefix}.checks[{i}]")
                     for i, c in enumerate(checks_raw)),
        stop_grace=get_number(data, "stop_grace", field_prefix, 30.0, minimum=0),
        workdir=get_str(data, "workdir", field_prefix),
        priority=get_int(data, "priority", field_prefix, 0, minimum=-1000, maximum=1000),
        node_selector=get_str_map(data, "node_selector", field_prefix),
        checkpoint_mode=mode or "cooperative",
        gpu_profile=profile,
        placement=placement,
        preempt=preempt,
    )
