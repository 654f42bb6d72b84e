"""Daemon configuration (docs/contract.md, "Daemon config"), validated into frozen records.

``Config`` and its sections are the one declaration of the config file: ``parse_config``
validates with them; each dataclass mirrors its section of the YAML.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, GetCoreSchemaHandler, Strict
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from hafo.model.errors import ValidationError
from hafo.model.health_config import HealthConfig
from hafo.model.paths import DEFAULT_CHECKPOINT_ROOT, DEFAULT_STATE_DIR
from hafo.model.schema import (
    INTEGER,
    OMIT_DEFAULT,
    Argv,
    Expect,
    Matches,
    MigProfile,
    NodeName,
    NonNegative,
    Number,
    Positive,
    Schema,
    Section,
    StrMap,
    Text,
    invalid,
)
from hafo.model.strategy import STRATEGIES, Strategy

__all__ = ["ELECTION_ROUND_TRIPS", "ETCD_ELECTION_TIMEOUT_MS", "ETCD_HEARTBEAT_INTERVAL_MS",
           "STRATEGIES", "ApiConfig", "AutoscaleSection", "Config", "EtcdConfig", "GpuSource",
           "NodeConfig", "NodeLogs",
           "SimulatedGpus", "TimingConfig", "check_etcd_security", "election_problem",
           "election_slack", "parse_config", "parse_endpoints", "state_dir_problem"]

ENDPOINT = r"(https?)://([^/:]+|\[[0-9a-fA-F:]+\]):(\d{1,5})/?"
LISTEN = r"([^:]+|\[[0-9a-fA-F:]+\]):(\d{1,5})"
MAX_MIG_DEVICES = 7

#: etcd's raft timing that hafo's defaults assume, in milliseconds: hafo.local starts etcd
#: with ``--heartbeat-interval`` and ``--election-timeout`` set to these, the Ansible etcd
#: role's defaults are the same numbers, and ``etcd.election_timeout`` defaults to the
#: latter. The election timeout is 10 x the heartbeat, as etcd recommends.
ETCD_HEARTBEAT_INTERVAL_MS = 50
ETCD_ELECTION_TIMEOUT_MS = 500
#: Seconds a new raft leader may still need after 2 x the election timeout before it
#: acknowledges a keepalive: the vote's and the keepalive's round trips, the agent's retry
#: (every 0.1 s after a failed keepalive) and its move to a live endpoint.
ELECTION_ROUND_TRIPS = 0.25


def _port_in(pattern: str, lowest: int) -> AfterValidator:
    """The port (last group of ``pattern``) is from ``lowest`` to 65535."""
    regex = re.compile(pattern)

    def check(text: str) -> str:
        match = regex.fullmatch(text)
        if match is None or not lowest <= int(match.groups()[-1]) < 65536:
            raise PydanticCustomError("port", f"port out of range in {text!r}")
        return text

    return AfterValidator(check)


def _split_commas(value: Any) -> Any:
    """``"http://a:1, http://b:2"`` is the list of both."""
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


EtcdUrl = Annotated[str, Strict(), Matches(ENDPOINT, "must look like http://HOST:PORT"),
                    _port_in(ENDPOINT, 1)]
#: etcd URLs: a list, or one comma-separated string.
Endpoints = Annotated[tuple[EtcdUrl, ...], Field(min_length=1),
                      Expect("a non-empty list of URLs like http://127.0.0.1:2379"),
                      BeforeValidator(_split_commas)]
ENDPOINTS: Schema[tuple[str, ...]] = Schema(Endpoints, "endpoints")


@dataclass(frozen=True)
class EtcdConfig(Section):
    """Where etcd is, how to authenticate to it, and its raft election timeout."""

    endpoints: Endpoints = ("http://127.0.0.1:2379",)
    ca: Text | None = None
    cert: Text | None = None
    key: Text | None = None
    username: Text | None = None
    password: Text | None = None
    password_file: Text | None = None
    #: etcd's ``--election-timeout`` in seconds (checked against ``timing``: see
    #: ``election_problem``).
    election_timeout: Positive = ETCD_ELECTION_TIMEOUT_MS / 1000

    def _check(self) -> None:
        problem = _etcd_problem(self)
        if problem is not None:
            invalid(*problem)


def _etcd_problem(config: EtcdConfig) -> tuple[str, str] | None:
    """(field, message) of the first security setting that does not fit, or None."""
    secure = [url.startswith("https://") for url in config.endpoints]
    if any(secure) and not all(secure):
        return "endpoints", "mix http:// and https:// endpoints"
    if all(secure) and not config.ca:
        return "ca", "is required with https:// endpoints (the CA certificate that signed etcd's)"
    if config.ca and not all(secure):
        return "endpoints", "must be https:// when ca is set"
    if (config.cert is None) != (config.key is None):
        return "cert" if config.cert is None else "key", "cert and key must be given together"
    if config.cert and not config.ca:
        return "ca", "is required with a client cert"
    has_password = config.password is not None or config.password_file is not None
    if config.password is not None and config.password_file is not None:
        return "password", "give password or password_file, not both"
    if (config.username is not None) == has_password:
        return None
    if config.username is None:
        return "username", "is required with a password"
    return "password_file", "is required with a username (or password)"


def check_etcd_security(config: EtcdConfig, where: str) -> EtcdConfig:
    """TLS and authentication settings that fit together, or a ValidationError naming the
    field: https endpoints need ``ca``; ``cert`` and ``key`` come as a pair; a user name
    needs exactly one of ``password`` and ``password_file``."""
    problem = _etcd_problem(config)
    if problem is not None:
        raise ValidationError(f"{where}.{problem[0]}", problem[1])
    return config


def parse_endpoints(value: Any, field_name: str) -> tuple[str, ...]:
    """Validate a list (or comma-separated string) of etcd URLs."""
    return ENDPOINTS.validate(value, prefix=field_name)


@dataclass(frozen=True)
class TimingConfig(Section):
    """Lease TTL, keepalive period and the self-fencing safety margin, in seconds."""

    lease_ttl: Annotated[int, Field(ge=2, le=3600), INTEGER] = 3
    heartbeat: Positive = 1.0
    fence_margin: Positive = 0.5
    failsafe_max: NonNegative = 300.0

    def _check(self) -> None:
        if self.heartbeat * 2 > self.lease_ttl:
            invalid("heartbeat", f"must be at most half of lease_ttl ({self.lease_ttl})",
                    self.heartbeat)
        if self.fence_margin + self.heartbeat >= self.lease_ttl:
            invalid("fence_margin", "fence_margin + heartbeat must be below lease_ttl",
                    self.fence_margin)


def election_slack(timing: TimingConfig) -> float:
    """Seconds an agent's deadline leaves, at worst, after etcd's raft leader dies: the last
    acknowledged keepalive was sent up to one heartbeat before, and the guards kill the work
    ``lease_ttl - fence_margin`` after it."""
    return timing.lease_ttl - timing.heartbeat - timing.fence_margin


def election_problem(election_timeout: float, timing: TimingConfig) -> str | None:
    """Why etcd's ``election_timeout`` (seconds) does not fit ``timing``, or None.

    After the raft leader's machine dies, the followers keep believing in it (so they give
    the agent no proof of a leaderless etcd, docs/safety.md rule 5) until their election
    timeout fires; etcd draws each from [election_timeout, 2 x election_timeout), so a new
    leader acknowledges keepalives at worst 2 x election_timeout + ``ELECTION_ROUND_TRIPS``
    after the crash. That must come before the agent's slack (``election_slack``) runs out,
    or a raft leader crash can fence a node."""
    worst = 2 * election_timeout + ELECTION_ROUND_TRIPS
    slack = election_slack(timing)
    if worst < slack:
        return None
    return (f"etcd elects a new leader within 2 x election_timeout (+{ELECTION_ROUND_TRIPS:g} "
            f"s) = {worst:g} s; that must be below lease_ttl - heartbeat - fence_margin = "
            f"{slack:g} s (lower etcd's --election-timeout and this, or raise "
            "timing.lease_ttl)")


@dataclass(frozen=True)
class ApiConfig(Section):
    """HTTP API listen address, optional bearer token file (the admin token) and optional
    team tokens file (``hafo.model.teams``: one token per team, scoped to its queues; it
    needs ``token_file`` too)."""

    listen: Annotated[str, Strict(), Matches(LISTEN, "must be HOST:PORT"),
                      _port_in(LISTEN, 0)] = "127.0.0.1:8600"
    token_file: Text | None = None
    tls_cert: Text | None = None
    tls_key: Text | None = None
    tls_ca: Text | None = None
    team_tokens_file: Annotated[Text | None, OMIT_DEFAULT] = None

    def _check(self) -> None:
        if self.team_tokens_file is not None and self.token_file is None:
            invalid("team_tokens_file", "needs api.token_file too (the admin token: nodes, "
                    "queues and every workload); set both or neither", self.team_tokens_file)
        if (self.tls_cert is None) != (self.tls_key is None):
            invalid("tls_key" if self.tls_key is None else "tls_cert",
                    "tls_cert and tls_key must be given together")

    @property
    def scheme(self) -> str:
        """``https`` when the API serves TLS."""
        return "https" if self.tls_cert else "http"

    @property
    def host(self) -> str:
        """Host part of ``listen``."""
        return self.listen.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        """Port part of ``listen``."""
        return int(self.listen.rsplit(":", 1)[1])


#: A GPU index written as a mapping key ("0"); checked against ``count`` by SimulatedGpus.
GpuKey = Annotated[int, Field(ge=0)]


@dataclass(frozen=True)
class SimulatedGpus(Section):
    """The simulated GPU backend's description of a node's GPUs.

    ``utilization``: GPU index -> percent busy reported for it (unlisted: unknown). ``mig``:
    GPU index -> the profiles of its MIG devices (that GPU is then listed as those devices).
    """

    count: Annotated[int, Field(ge=0, le=64), INTEGER] = 4
    model: Text = "NVIDIA H100 80GB HBM3"
    memory_mib: Annotated[int, Field(ge=1), INTEGER] = 81559
    faults_file: Text | None = None
    utilization: Mapping[GpuKey, Annotated[Number, Field(ge=0, le=100)]] = field(
        default_factory=dict)
    mig: Mapping[GpuKey, Annotated[tuple[MigProfile, ...],
                                   Field(min_length=1, max_length=MAX_MIG_DEVICES),
                                   Expect(f"a list of 1 to {MAX_MIG_DEVICES} MIG profiles "
                                          "like 1g.10gb")]] = field(default_factory=dict)

    def _check(self) -> None:
        for name, indices in (("utilization", self.utilization), ("mig", self.mig)):
            for index in indices:
                if index >= self.count:
                    invalid((name, str(index)),
                            f"must be a GPU index from 0 to {self.count - 1}" if self.count
                            else "no GPUs to refer to (count is 0)", index)


class GpuSource(StrEnum):
    """Where an agent finds its GPUs, unless ``node.gpus`` describes simulated ones."""

    AUTO = "auto"  # the GPUs NVML finds (none without an NVIDIA driver)
    NONE = "none"  # a node without GPUs


@dataclass(frozen=True)
class Simulation(Section):
    """``node.gpus: {simulate: {...}}``: simulated GPUs (tests, demos)."""

    simulate: SimulatedGpus = SimulatedGpus()


class _GpusSetting:
    """``node.gpus``: ``auto``, ``none`` or ``{simulate: {...}}``, as a ``GpuSource`` or the
    ``SimulatedGpus``."""

    WHAT = "must be 'auto', 'none' or {simulate: {...}}"

    def __get_pydantic_core_schema__(self, source: Any,
                                     handler: GetCoreSchemaHandler) -> CoreSchema:
        forms = handler.generate_schema(GpuSource | Simulation)

        def pick(value: Any, _validate: Any) -> GpuSource | SimulatedGpus:
            if isinstance(value, str) and value in GpuSource.__members__.values():
                return GpuSource(value)
            if isinstance(value, Mapping) and set(value) == {"simulate"}:
                simulation: Simulation = _SIMULATION.validator.validate_python(value)
                return simulation.simulate
            raise PydanticCustomError("gpus", f"{self.WHAT}, got {value!r}")

        return core_schema.no_info_wrap_validator_function(pick, forms)


_SIMULATION: Schema[Simulation] = Schema(Simulation, "gpus")


@dataclass(frozen=True)
class PortRange(Section):
    """``node.ports``: where a replica's port 0 is taken from (``first``..``last``)."""

    first: Annotated[int, Field(ge=1, le=65535), INTEGER] = 30000
    last: Annotated[int, Field(ge=1, le=65535), INTEGER] = 32767

    def _check(self) -> None:
        if self.last < self.first:
            invalid("last", f"must be at least first ({self.first}), got {self.last}")


@dataclass(frozen=True)
class NodeLogs(Section):
    """``node.logs``: each instance's output is capped at ``max_mib`` (two rotated parts of
    half that each); the output of the ``keep_epochs`` newest ended instances of each
    workload is kept under ``<state_dir>/logs/``."""

    max_mib: Annotated[int, Field(ge=1, le=1048576), INTEGER] = 64
    keep_epochs: Annotated[int, Field(ge=0, le=1000), INTEGER] = 3


@dataclass(frozen=True)
class NodeConfig(Section):
    """Agent-only settings. ``gpu_source`` (config key ``gpus``): where the node's GPUs come
    from, a ``GpuSource`` or a ``SimulatedGpus`` description. ``address``: where the node's
    peers reach it (a gang's ``MASTER_ADDR``); absent, the address this node uses towards
    etcd (``hafo.agent.address``)."""

    name: NodeName
    labels: StrMap = field(default_factory=dict)
    state_dir: Text = DEFAULT_STATE_DIR
    address: Annotated[Text | None, OMIT_DEFAULT] = None
    gpu_source: Annotated[GpuSource | SimulatedGpus, Field(alias="gpus"),
                          _GpusSetting()] = GpuSource.AUTO
    ports: Annotated[PortRange, OMIT_DEFAULT] = PortRange()
    logs: Annotated[NodeLogs, OMIT_DEFAULT] = NodeLogs()

    @property
    def simulate(self) -> SimulatedGpus | None:
        """The simulated GPUs, when ``gpu_source`` describes some."""
        return self.gpu_source if isinstance(self.gpu_source, SimulatedGpus) else None


@dataclass(frozen=True)
class CheckpointSection(Section):
    """``checkpoint``: the shared checkpoint root (every node mounts it at this path)."""

    root: Text = DEFAULT_CHECKPOINT_ROOT


@dataclass(frozen=True)
class ControllerSection(Section):
    """``controller``: this controller's name (required for the controller)."""

    name: Text | None = None


@dataclass(frozen=True)
class LogSection(Section):
    """``log``: ``auto`` (console on a terminal, JSON otherwise), ``json`` or ``console``."""

    format: Annotated[str, Strict(), Matches("auto|json|console", "must be auto, json or "
                                             "console")] = "auto"


@dataclass(frozen=True)
class PlacementSection(Section):
    """``placement``: the default strategy of workloads that choose none; ``spares``: how
    many idle nodes to keep, besides those labelled ``hafo.io/spare: "true"``, for replacing
    failed gang members (they take no other work)."""

    strategy: Strategy = "spread"
    spares: Annotated[int, Field(ge=0, le=100000), INTEGER] = 0


#: The longest ``fair_sharing.usage_half_life`` accepted: 30 days, in seconds.
MAX_HALF_LIFE = 30 * 24 * 3600.0


@dataclass(frozen=True)
class FairSharingSection(Section):
    """``fair_sharing``: how queues share the pool (docs/design.md, "Queues and fair
    share"). ``min_runtime``: seconds borrowed work runs before the queue that lent the
    quota may take it back (checkpoint first), unless the borrower is over its borrowing
    limit. ``usage_half_life``: seconds; given, borrowers are ordered by their queue's
    decayed usage history, with that half-life, instead of their usage now
    (``hafo.decisions.usage_history``); none: by their usage now."""

    min_runtime: NonNegative = 300.0
    usage_half_life: Annotated[Positive | None, OMIT_DEFAULT] = None

    def _check(self) -> None:
        if self.usage_half_life is not None and self.usage_half_life > MAX_HALF_LIFE:
            invalid("usage_half_life", f"is {self.usage_half_life:g} s; at most "
                    f"{MAX_HALF_LIFE:.0f} s (30 days)", self.usage_half_life)


#: An autoscale hook's URL.
HookUrl = Annotated[str, Strict(), Matches(r"https?://[^\s/]+(/\S*)?", "must be an http:// "
                                           "or https:// URL")]


@dataclass(frozen=True)
class AutoscaleSection(Section):
    """``autoscale``: the hook the leader tells the pending demand and the removable nodes
    (docs/contract.md, "Elastic capacity"): ``command`` (an argv list, the demand's JSON on
    its stdin) or ``url`` (an HTTP POST of it), at most once per ``interval`` seconds, when
    either changed; ``idle_after``: seconds a ready node has had no work before it is
    removable; ``timeout``: seconds a call may take (a command is then killed). Neither
    ``command`` nor ``url``: no hook (``GET /v1/demand`` and the metrics still say it)."""

    command: Annotated[Argv | None, OMIT_DEFAULT] = None
    url: Annotated[HookUrl | None, OMIT_DEFAULT] = None
    interval: Positive = 30.0
    idle_after: NonNegative = 600.0
    timeout: Positive = 30.0

    def _check(self) -> None:
        if self.command is not None and self.url is not None:
            invalid("url", "give command or url, not both", self.url)

    @property
    def enabled(self) -> bool:
        """A hook is configured."""
        return self.command is not None or self.url is not None


@dataclass(frozen=True)
class Config(Section):
    """One daemon's configuration."""

    cluster: Annotated[str, Strict(), Matches("[a-z0-9][a-z0-9-]{0,62}", "must be lowercase "
                                              "letters, digits and '-'")] = "default"
    etcd: EtcdConfig = EtcdConfig()
    timing: TimingConfig = TimingConfig()
    api: ApiConfig = ApiConfig()
    node: NodeConfig | None = None
    checkpoint: CheckpointSection = CheckpointSection()
    controller: ControllerSection = ControllerSection()
    log: LogSection = LogSection()
    health: HealthConfig = field(default_factory=HealthConfig)
    placement: PlacementSection = PlacementSection()
    fair_sharing: FairSharingSection = FairSharingSection()
    autoscale: AutoscaleSection = AutoscaleSection()

    def _check(self) -> None:
        problem = election_problem(self.etcd.election_timeout, self.timing)
        if problem is not None:
            invalid(("etcd", "election_timeout"), problem, self.etcd.election_timeout)

    @property
    def checkpoint_root(self) -> str:
        """``checkpoint.root``."""
        return self.checkpoint.root

    @property
    def controller_name(self) -> str | None:
        """``controller.name``."""
        return self.controller.name

    @property
    def log_format(self) -> str:
        """``log.format``."""
        return self.log.format

    @property
    def placement_strategy(self) -> str:
        """``placement.strategy``."""
        return self.placement.strategy


CONFIG: Schema[Config] = Schema(Config, "config", prefix="")


def state_dir_problem(path: str) -> str:
    """Why ``node.state_dir`` cannot be used ("" if it can): it must be a directory this
    process can create files in, or one it can create. Directories made to find out are
    removed again (``hafo agent --check`` leaves nothing behind)."""
    import os
    import tempfile
    from pathlib import Path

    target = Path(path)
    made: list[Path] = []
    try:
        missing = [p for p in (target, *target.parents) if not p.exists()]
        for directory in reversed(missing):
            directory.mkdir()
            made.append(directory)
        if not target.is_dir():
            return f"{path} is not a directory"
        with tempfile.TemporaryFile(dir=target):
            pass
        return ""
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != path else ""
        verb = "create" if not made and not target.exists() else "write to"
        return f"cannot {verb} {path}: {exc.strerror or exc}{where}"
    finally:
        for directory in reversed(made):
            with contextlib.suppress(OSError):
                os.rmdir(directory)


def parse_config(raw: Any, role: str) -> Config:
    """Validate a daemon config mapping. ``role`` is 'agent', 'controller' or 'client'."""
    if raw is None:
        raw = {}
    elif role != "agent" and isinstance(raw, Mapping):  # agent-only: others leave it alone
        raw = {k: v for k, v in raw.items() if k != "node"}
    config = CONFIG.validate(raw)
    if role == "agent" and config.node is None:
        raise ValidationError("node", "is required for the agent (node.name at least)")
    if role == "controller" and config.controller_name is None:
        raise ValidationError("controller.name", "is required for the controller")
    return config
