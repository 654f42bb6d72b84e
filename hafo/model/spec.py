"""Workload specification: the user's YAML, validated into a frozen WorkloadSpec.

``WorkloadSpec`` is the one declaration of the format: ``parse_spec`` validates with it (the
CLI and the API both call it), ``to_dict`` writes its JSON form and the OpenAPI document's
``WorkloadSpec`` schema is generated from it.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal

from pydantic import Field, Strict

from hafo.model.checks import BUILTIN_CHECK_TYPES, PORT_NAME, CheckSpec
from hafo.model.errors import FieldError, ValidationError, did_you_mean
from hafo.model.queues import DEFAULT_QUEUE, QueueName
from hafo.model.schema import (
    INTEGER,
    OMIT_DEFAULT,
    Argv,
    Flag,
    Matches,
    MigProfile,
    NonNegative,
    Number,
    Positive,
    Schema,
    Section,
    StrMap,
    Text,
    WorkloadName,
    invalid,
)
from hafo.model.strategy import STRATEGIES, Strategy

__all__ = ["BUILTIN_CHECK_TYPES", "MAX_GANG_NODES", "MAX_REPLICAS", "MAX_SPEC_BYTES", "SPEC",
           "STRATEGIES",
           "CheckSpec", "CheckpointPolicy", "PortName", "RestartPolicy", "Topology",
           "UpdatePolicy", "WorkloadSpec", "parse_spec", "unknown_check_types"]



@dataclass(frozen=True, slots=True)
class RestartPolicy(Section):
    """Restart in place up to ``max_restarts`` within ``window`` seconds."""

    max_restarts: Annotated[int, Field(ge=0), INTEGER] = 3
    """Restarts in place within `window` before the workload moves."""
    window: Positive = 600.0
    """Seconds the restarts are counted over; also how long a node it failed on too often stays
    excluded."""
    backoff: NonNegative = 1.0
    """Seconds before the second restart in a window (the first is immediate), doubling; timed
    from when the leader saw the exit."""
    max_backoff: NonNegative = 30.0
    """The largest backoff, in seconds."""

    def delay(self, restarts_in_window: int) -> float:
        """Seconds to wait before restart number ``restarts_in_window + 1`` of the window:
        none for the first, then ``backoff`` doubling up to ``max_backoff``."""
        if restarts_in_window <= 0:
            return 0.0
        return float(min(self.backoff * 2 ** (restarts_in_window - 1), self.max_backoff))


@dataclass(frozen=True, slots=True)
class CheckpointPolicy(Section):
    """How the workload is checkpointed: ``cooperative`` (the SDK) or ``transparent``
    (CRIU)."""

    mode: Literal["cooperative", "transparent"] = "cooperative"
    """`cooperative` (the SDK) or `transparent` (CRIU + cuda-checkpoint: refused with its reason
    in this version; the workload is stopped normally)."""


#: One transaction writes the gang's assignment, its event and a copy per member node (and
#: removes copies): 2 + 2 x 60 operations fit in etcd's default limit of 128 per transaction.
MAX_GANG_NODES = 60
#: ``hang_timeout``'s bounds, in seconds: below a second an agent's sampling (every 0.2 s)
#: and one step of a fast loop would be a false hang; above a day it is no hang detection.
MIN_HANG_TIMEOUT = 1.0
MAX_HANG_TIMEOUT = 86400.0
HangTimeout = Annotated[Number, Field(ge=MIN_HANG_TIMEOUT, le=MAX_HANG_TIMEOUT)]
#: ``straggler_lag``'s bounds, in seconds per step.
StragglerLag = Annotated[Number, Field(ge=0.01, le=3600.0)]


@dataclass(frozen=True, slots=True)
class PreflightPolicy(Section):
    """A gang's pre-flight (docs/reference/gangs.md, "Pre-flight"): before the first epoch on
    a new set of nodes, every member runs a short collective test before its command; a
    member that does not join, fails or is much slower than the others is replaced before
    the job starts."""

    timeout: Annotated[Number, Field(ge=1.0, le=3600.0)] = 60.0
    """Seconds for every member to join the test, and again for the test itself."""
    slowdown: Annotated[Number, Field(ge=1.1, le=1000.0)] = 3.0
    """A member whose local probe takes this many times the other members' median (and
    `min_excess` more) is much slower."""
    min_excess: Annotated[Number, Field(ge=0.0, le=3600.0)] = 0.05
    """Seconds a member's probe must exceed the others' median by, besides `slowdown`, to be
    much slower (small probes are noisy)."""
    large_mib: Annotated[int, Field(ge=1, le=16384), INTEGER] = 32
    """The large all-reduce's buffer, MiB (the small one is 4 KiB)."""


@dataclass(frozen=True, slots=True)
class Topology(Section):
    """Keep every member of a gang in one value of the node label ``key`` (a rack, a switch,
    an NVLink domain): ``required`` (else the gang waits) or ``preferred`` (else anywhere)."""

    key: Text
    """The node label every member shares one value of, e.g. `rack`."""
    mode: Literal["required", "preferred"] = "required"
    """`required`: the gang waits until one value of the label has room for all; `preferred`:
    else anywhere."""


#: The most replicas one service keeps (a service's replicas are deleted with it in one etcd
#: transaction).
MAX_REPLICAS = 100

#: The most a spec may take encoded as JSON: the API's request body limit
#: (``hafo.api.controller_app.MAX_BODY_BYTES``), well under etcd's 1.5 MiB per request
#: (a workload's spec is written beside its state and its event).
MAX_SPEC_BYTES = 256 * 1024


def byte_size(count: int) -> str:
    """``count`` bytes for a message: "512 B", "4.0 KiB", "5.2 MiB"."""
    for unit, size in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if count >= size:
            return f"{count // size} {unit}" if count % size == 0 else \
                f"{count / size:.1f} {unit}"
    return f"{count} B"
#: A declared port's name: lowercase letters, digits and '_' (it becomes ``HAFO_PORT_<NAME>``).
PortName = Annotated[str, Strict(), Matches(PORT_NAME, "port names must be lowercase letters, "
                                            "digits and '_', starting with a letter, at most "
                                            "15 characters")]
PortNumber = Annotated[int, Field(ge=0, le=65535), INTEGER]


@dataclass(frozen=True, slots=True)
class UpdatePolicy(Section):
    """How a service's replicas are replaced when its spec changes (docs/reference/services.md,
    "Services"): ``max_unavailable`` replacements at a time; a replacement counts once it has
    been ready ``min_ready_seconds``; one not ready within ``progress_deadline`` seconds stops
    the rollout; a replaced replica leaves rotation ``drain_delay`` seconds before it is
    asked to stop (then it has ``stop_grace``)."""

    max_unavailable: Annotated[int, Field(ge=1, le=MAX_REPLICAS), INTEGER] = 1
    """Replacements under way at once."""
    min_ready_seconds: NonNegative = 0.0
    """A replacement counts once it has been ready this long, in seconds."""
    progress_deadline: Positive = 600.0
    """A replacement not ready this many seconds after it was created stops the rollout."""
    drain_delay: NonNegative = 2.0
    """Seconds between a replaced replica leaving rotation and its stop signal (then it has
    `stop_grace`)."""


@dataclass(frozen=True, slots=True)
class WorkloadSpec(Section):
    """A workload spec (the YAML of `hafo submit`, as JSON): what the user asked to run
    (docs/reference/workloads.md, "Workload spec").

    ``gpu_profile``: run on ``gpus`` MIG devices of this profile (e.g. "1g.10gb") instead of
    whole GPUs. ``placement``: ``spread`` or ``binpack`` for this workload (None: the
    controller's ``placement.strategy``). ``preempt``: when it cannot be placed, it may stop
    (checkpoint first) strictly lower-priority work to make room on one node.
    ``queue``: the queue whose quota it runs in (``hafo.model.queues``).
    """

    name: WorkloadName
    """The workload's name, unique in the cluster (required); the workload id is `<name>-<6 hex
    digits>`."""
    command: Argv
    """The command, as an argv list, never a shell string (required)."""
    gpus: Annotated[int, Field(ge=0, le=64), INTEGER] = 0
    """Whole GPUs per member (or MIG devices with `gpu_profile`)."""
    gpu_model: Annotated[Text | None, OMIT_DEFAULT] = None
    """A glob matched against the GPU model, e.g. `*H100*`."""
    gpu_memory_mib: Annotated[Annotated[int, Field(ge=1), INTEGER] | None, OMIT_DEFAULT] = None
    """The least memory per GPU, in MiB."""
    env: StrMap = field(default_factory=dict)
    """Added to the workload's environment."""
    restart: RestartPolicy = RestartPolicy()
    """Restart in place up to `max_restarts` times within `window` seconds, then move."""
    checks: tuple[CheckSpec, ...] = ()
    """Application checks: each has a `type`, the timing every check has and its type's options
    (see Checks)."""
    stop_grace: NonNegative = 30.0
    """Seconds to checkpoint and exit on a planned stop."""
    workdir: Annotated[Text | None, OMIT_DEFAULT] = None
    """The working directory (default: the agent's). Relative in a file given to `hafo submit`:
    to that file's directory; relative in a spec sent to the API: to the agent's."""
    priority: Annotated[int, Field(ge=-1000, le=1000), INTEGER] = 0
    """Placement order, and who may preempt whom."""
    node_selector: StrMap = field(default_factory=dict)
    """Node labels that must match exactly."""
    checkpoint: Annotated[CheckpointPolicy, OMIT_DEFAULT] = CheckpointPolicy()
    """How the workload is checkpointed."""
    gpu_profile: Annotated[MigProfile | None, OMIT_DEFAULT] = None
    """A MIG profile like `1g.10gb`: run on `gpus` MIG devices of that profile instead of whole
    GPUs."""
    placement: Annotated[Strategy | None, OMIT_DEFAULT] = None
    """`spread` or `binpack` for this workload; none: the controller's `placement.strategy`."""
    preempt: Annotated[Flag, OMIT_DEFAULT] = False
    """When it cannot be placed, it may stop strictly lower-priority work on one node (checkpoint
    first)."""
    nodes: Annotated[int, Field(ge=1, le=MAX_GANG_NODES), INTEGER, OMIT_DEFAULT] = 1
    """Above 1, a gang of that many members, each on its own node with `gpus` GPUs, started,
    stopped and failed over as one; a gang ignores `preempt`."""
    topology: Annotated[Topology | None, OMIT_DEFAULT] = None
    """Keep every member of a gang in one value of a node label."""
    replicas: Annotated[Annotated[int, Field(ge=0, le=MAX_REPLICAS), INTEGER] | None,
                        OMIT_DEFAULT] = None
    """Makes the workload a service of that many replicas, each placed and failed over on its
    own; none: a single workload."""
    ports: Annotated[Mapping[PortName, PortNumber], OMIT_DEFAULT] = field(default_factory=dict)
    """The ports an instance listens on, by name (`HAFO_PORT_<NAME>` in its environment); `0`: a
    free port of the node's `node.ports` range."""
    distinct_nodes: Annotated[Flag, OMIT_DEFAULT] = True
    """A service's replicas each on a node no other replica of it uses."""
    update: Annotated[UpdatePolicy, OMIT_DEFAULT] = UpdatePolicy()
    """How a service's replicas are replaced when its spec changes."""
    queue: Annotated[QueueName, OMIT_DEFAULT] = DEFAULT_QUEUE
    """The queue whose quota it runs in; while any queue is declared, it must be one of them.
    Changing only `queue` restarts nothing."""
    hang_timeout: Annotated[HangTimeout | None, OMIT_DEFAULT] = None
    """Seconds without progress (the SDK's `heartbeat(step)`, from any rank) after which the
    workload is hung: hafo names the rank that stalled first, restarts it (a gang: its whole
    epoch), and runs that rank's node's health checks at once; a second hang blamed on the
    same node within `restart.window` replaces that member elsewhere. Judged from the first
    heartbeat of each instance on; none: off."""
    straggler_lag: Annotated[StragglerLag | None, OMIT_DEFAULT] = None
    """A gang's straggler: seconds per step by which one member's own work (outside the
    collectives: from the SDK's `synced()` to its next `heartbeat`, the median of recent
    steps) may exceed the other members' median before hafo names its rank and treats it as
    a hang (a restart, the node suspect, a second time replaced); none: off. Gangs only."""
    warm: Annotated[Flag, OMIT_DEFAULT] = False
    """A gang's survivors stay warm: when a new epoch starts because a member was lost (its
    node down or bad, its process failed), the other members' processes are asked to park
    (leave the epoch's process group) and are handed the next epoch, keeping their
    interpreter, imports and GPU context, instead of being stopped and started again. The
    command must run under the SDK's `run_warm`; a member that does not confirm its park
    within `stop_grace` is stopped as without it. Gangs only."""

    preflight: Annotated[PreflightPolicy | None, OMIT_DEFAULT] = None
    """A gang's pre-flight: before the first epoch on a new set of nodes (and after a member
    was replaced), the members meet in a short collective test (an all-reduce of a small and
    of a large buffer, and a local probe on each, timed) before their command starts; a
    member that does not join, fails, or is much slower than the others (`slowdown`) is
    replaced before the job starts, its node excluded for `restart.window`. With `warm`, it
    runs at the gang's cold starts only. None: off. Gangs only."""

    def _check(self) -> None:
        if self.warm and self.nodes < 2:
            invalid("warm", "keeps a gang's survivors: needs nodes of 2 or more", self.warm)
        if self.preflight is not None and self.nodes < 2:
            invalid("preflight", "tests a gang's members together: needs nodes of 2 or more",
                    None)
        if self.straggler_lag is not None and self.nodes < 2:
            invalid("straggler_lag", "compares a gang's members: needs nodes of 2 or more",
                    self.straggler_lag)
        for i, check in enumerate(self.checks):
            port = check.options.get("port")
            if isinstance(port, str) and port not in self.ports:
                declared = ", ".join(sorted(self.ports)) or "none"
                invalid(("checks", i, "port"), f"no port named {port!r} in ports "
                        f"(declared: {declared})")

    @property
    def is_gang(self) -> bool:
        """More than one member (``nodes`` > 1)."""
        return self.nodes > 1

    @property
    def is_service(self) -> bool:
        """Kept as ``replicas`` instances, each placed and failed over on its own."""
        return self.replicas is not None

    @property
    def template(self) -> WorkloadSpec:
        """What each replica of a service runs: the spec less ``replicas`` and ``update``
        (changing only those replaces no replica)."""
        return replace(self, replicas=None, update=UpdatePolicy())

    @property
    def checkpoint_mode(self) -> str:
        """``checkpoint.mode``."""
        return self.checkpoint.mode

    def to_dict(self) -> dict[str, Any]:
        """The canonical JSON form (round-trips through ``parse_spec``): optional fields at
        their default (null, cooperative checkpoints, no preemption) are left out."""
        data: dict[str, Any] = SPEC.dump(self)
        return data


SPEC: Schema[WorkloadSpec] = Schema(WorkloadSpec, "spec")


def unknown_check_types(spec: WorkloadSpec, known: Collection[str], allow: str,
                        field_prefix: str = "spec") -> list[FieldError]:
    """An error for each check of ``spec`` whose type is not in ``known`` (the types
    installed where it is submitted), with the closest known type, the list of them and
    ``allow``: how to submit it anyway (the agents may have the plugin)."""
    out = []
    for i, check in enumerate(spec.checks):
        if check.type not in known:
            hint = did_you_mean(check.type, known)
            out.append(FieldError(
                f"{field_prefix}.checks[{i}].type",
                f"unknown check type {check.type!r}{', ' + hint if hint else ''} (known: "
                f"{', '.join(sorted(known))}; a plugin's type: install the plugin here too, "
                f"or allow it with {allow})"))
    return out


def parse_spec(raw: Any, field_prefix: str = "spec") -> WorkloadSpec:
    """Validate an untrusted mapping into a WorkloadSpec; ValidationError names the field.
    A spec over ``MAX_SPEC_BYTES`` encoded is refused here, naming its biggest field, before
    etcd would refuse the write (a gRPC "message larger than max")."""
    spec = SPEC.validate(raw, prefix=field_prefix)
    data = SPEC.dump(spec)
    total = len(json.dumps(data))
    if total > MAX_SPEC_BYTES:
        sizes = {name: len(json.dumps(value)) for name, value in data.items()}
        biggest = max(sizes, key=lambda name: sizes[name])
        raise ValidationError(
            f"{field_prefix}.{biggest}", f"{byte_size(sizes[biggest])} encoded; a whole spec "
            f"is at most {byte_size(MAX_SPEC_BYTES)} (this one: {byte_size(total)})")
    return spec
