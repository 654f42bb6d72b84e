"""Daemon configuration (docs/reference/config-files.md, "Daemon config"), validated into
frozen records.

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
from hafo.model.paths import DEFAULT_CHECKPOINT_ROOT, DEFAULT_MEMORY_DIR, DEFAULT_STATE_DIR
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
from hafo.model.timing_profile import PROFILES

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
ETCD_HEARTBEAT_INTERVAL_MS = PROFILES["default"].etcd_heartbeat_ms
ETCD_ELECTION_TIMEOUT_MS = PROFILES["default"].etcd_election_ms
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
    """etcd's client URLs, each `http(s)://HOST:PORT`: a list, or one comma-separated string; not
    a mix of http and https."""
    ca: Text | None = None
    """The CA certificate that signed etcd's (a path): required with `https://` endpoints, and
    only with them."""
    cert: Text | None = None
    """Client certificate (a path), with `etcd.key`; needs `etcd.ca`."""
    key: Text | None = None
    """Client key (a path), with `etcd.cert`."""
    username: Text | None = None
    """etcd user name; needs exactly one of `etcd.password` and `etcd.password_file`."""
    password: Text | None = None
    """etcd password; needs `etcd.username`."""
    password_file: Text | None = None
    """A file holding the etcd password (its content, stripped); needs `etcd.username`."""
    #: etcd's ``--election-timeout`` in seconds (checked against ``timing``: see
    #: ``election_problem``).
    election_timeout: Positive = ETCD_ELECTION_TIMEOUT_MS / 1000
    """etcd's `--election-timeout` in seconds. Refused unless `2 x election_timeout + 0.25 <
    lease_ttl - heartbeat - fence_margin`: etcd elects a new leader within 2 x its election
    timeout, and agents must get a keepalive acknowledged before their deadline."""

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
    """Lease TTL, keepalive period and the self-fencing safety margin, in seconds.

    ``profile`` names the defaults of the other three (``hafo.model.timing_profile``); a
    field given beside it wins."""

    lease_ttl: Annotated[int, Field(ge=1, le=3600), INTEGER] = PROFILES["default"].lease_ttl
    """The node lease's TTL in seconds, 1 to 3600 (controllers use it for their own lease too);
    etcd grants at least 1.5 x its election timeout, rounded up to a second."""
    heartbeat: Positive = PROFILES["default"].heartbeat
    """The keepalive period in seconds; at most half of `lease_ttl`."""
    fence_margin: Positive = PROFILES["default"].fence_margin
    """How long before the lease can expire the guards kill their workloads, in seconds;
    `fence_margin + heartbeat` must be below `lease_ttl`."""
    failsafe_max: NonNegative = 300.0
    """The longest an agent keeps its work without reaching etcd, in seconds."""
    profile: Annotated[str, Strict(), Matches("default|fast", "must be default or fast"),
                       OMIT_DEFAULT] = "default"
    """`default` (lease TTL 3 s, heartbeat 1 s, fence_margin 0.5 s) or `fast` (1 s, 0.2 s,
    0.2 s, and `etcd.election_timeout` 0.15 s: etcd must run with `--heartbeat-interval 15
    --election-timeout 150`). The defaults of the fields above; one given beside it wins."""

    @classmethod
    def _prepare(cls, raw: Any, names: Mapping[str, str], forbid: bool,
                 unknown: list[Any]) -> Any:
        known = super()._prepare(raw, names, forbid, unknown)
        if not isinstance(known, dict):
            return known
        profile = PROFILES.get(known.get("profile"))  # type: ignore[arg-type]
        if profile is None:  # absent (the fields' defaults are the default profile's) or wrong
            return known
        return {"lease_ttl": profile.lease_ttl, "heartbeat": profile.heartbeat,
                "fence_margin": profile.fence_margin, **known}

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
    """The HTTP API's address, `HOST:PORT`; a controller's must be reachable by the agents
    (failsafe questions)."""
    token_file: Text | None = None
    """Controller: mutations need `Authorization: Bearer <token>`; the file holds one token of at
    least 16 characters without spaces, not readable by every user. Every controller of a cluster
    must have the same token (or none)."""
    tls_cert: Text | None = None
    """Serve the API over TLS (TLS 1.2+) with this certificate (a path); with `api.tls_key`."""
    tls_key: Text | None = None
    """The key of `api.tls_cert` (a path); with `api.tls_cert`."""
    tls_ca: Text | None = None
    """Agent: the CA that signed the controllers' API certificates (a path)."""
    team_tokens_file: Annotated[Text | None, OMIT_DEFAULT] = None
    """Controller: team tokens, each scoped to its queues; needs `api.token_file` (then the admin
    token). Every controller of a cluster must have the same team tokens (or none)."""

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
    """How many GPUs the node has."""
    model: Text = "NVIDIA H100 80GB HBM3"
    """The GPUs' model name, as NVML would report it."""
    memory_mib: Annotated[int, Field(ge=1), INTEGER] = 81559
    """Each GPU's memory, in MiB."""
    faults_file: Text | None = None
    """The faults file (a path): JSON mapping a GPU index (as a string) to its faults, re-read
    every health cycle; absent or `{}`: healthy."""
    utilization: Mapping[GpuKey, Annotated[Number, Field(ge=0, le=100)]] = field(
        default_factory=dict)
    """GPU index -> the percent busy reported for it; unlisted: unknown."""
    mig: Mapping[GpuKey, Annotated[tuple[MigProfile, ...],
                                   Field(min_length=1, max_length=MAX_MIG_DEVICES),
                                   Expect(f"a list of 1 to {MAX_MIG_DEVICES} MIG profiles "
                                          "like 1g.10gb")]] = field(default_factory=dict)
    """GPU index -> the profiles of its MIG devices (1 to 7, like `1g.10gb`); that GPU is then
    listed as those devices."""

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
    """Simulated GPUs instead of NVML (tests, demos), described by the fields under it."""


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
    """The first port of the range."""
    last: Annotated[int, Field(ge=1, le=65535), INTEGER] = 32767
    """The last port of the range, at least `first`."""

    def _check(self) -> None:
        if self.last < self.first:
            invalid("last", f"must be at least first ({self.first}), got {self.last}")


@dataclass(frozen=True)
class NodeLogs(Section):
    """``node.logs``: each instance's output is capped at ``max_mib`` (two rotated parts of
    half that each); the output of the ``keep_epochs`` newest ended instances of each
    workload is kept under ``<state_dir>/logs/``."""

    max_mib: Annotated[int, Field(ge=1, le=1048576), INTEGER] = 64
    """The most MiB one instance's output holds on disk (`output.log` and `output.log.1`, at most
    half each); older output is dropped."""
    keep_epochs: Annotated[int, Field(ge=0, le=1000), INTEGER] = 3
    """How many ended instances' output each workload keeps under `<state_dir>/logs/` (the oldest
    are deleted)."""


@dataclass(frozen=True)
class NodeConfig(Section):
    """Agent-only settings. ``gpu_source`` (config key ``gpus``): where the node's GPUs come
    from, a ``GpuSource`` or a ``SimulatedGpus`` description. ``address``: where the node's
    peers reach it (a gang's ``MASTER_ADDR``); absent, the address this node uses towards
    etcd (``hafo.agent.address``)."""

    name: NodeName
    """The node's name, unique in the cluster (required)."""
    labels: StrMap = field(default_factory=dict)
    """The node's labels, matched by a spec's `node_selector`; values become strings (`true` is
    `"true"`)."""
    state_dir: Text = DEFAULT_STATE_DIR
    """Where the agent keeps its instance records, lease record and fence file."""
    address: Annotated[Text | None, OMIT_DEFAULT] = None
    """Where the node's peers reach it: a gang's `MASTER_ADDR` when this node runs rank 0; shown
    by `hafo nodes`. Default: the local address of the route to the first etcd endpoint, else the
    host name."""
    gpu_source: Annotated[GpuSource | SimulatedGpus, Field(alias="gpus"),
                          _GpusSetting()] = GpuSource.AUTO
    """Where the node's GPUs come from: `auto` (NVML; finding none is reported, not an error),
    `none` (a node without GPUs) or `{simulate: {...}}` (simulated GPUs)."""
    ports: Annotated[PortRange, OMIT_DEFAULT] = PortRange()
    """Where a spec's port `0` is taken from on this node."""
    logs: Annotated[NodeLogs, OMIT_DEFAULT] = NodeLogs()
    """How much of each instance's output this node keeps."""
    memory_dir: Text = DEFAULT_MEMORY_DIR
    """Where workloads keep their snapshots in this node's RAM (`TieredCheckpointer`):
    `<memory_dir>/<workload id>`, given as `HAFO_MEMORY_DIR`. A memory filesystem: it outlives a
    workload's processes, not the machine. Removed with the workload's last instance here."""

    @property
    def simulate(self) -> SimulatedGpus | None:
        """The simulated GPUs, when ``gpu_source`` describes some."""
        return self.gpu_source if isinstance(self.gpu_source, SimulatedGpus) else None


@dataclass(frozen=True)
class CheckpointSection(Section):
    """``checkpoint``: the shared checkpoint root (every node mounts it at this path)."""

    root: Text = DEFAULT_CHECKPOINT_ROOT
    """Agent: storage every node can read and write, mounted at this path on each; a workload's
    checkpoint directory is `<root>/<workload id>`."""


@dataclass(frozen=True)
class ControllerSection(Section):
    """``controller``: this controller's name (required for the controller)."""

    name: Text | None = None
    """This controller's name: required for the controller, unique per controller; held by the
    leader key."""


@dataclass(frozen=True)
class LogSection(Section):
    """``log``: ``auto`` (console on a terminal, JSON otherwise), ``json`` or ``console``."""

    format: Annotated[str, Strict(), Matches("auto|json|console", "must be auto, json or "
                                             "console")] = "auto"
    """`auto` (JSON lines unless stderr is a terminal), `json` or `console`."""


@dataclass(frozen=True)
class PlacementSection(Section):
    """``placement``: the default strategy of workloads that choose none; ``spares``: how
    many idle nodes to keep, besides those labelled ``hafo.io/spare: "true"``, for replacing
    failed gang members (they take no other work)."""

    strategy: Strategy = "spread"
    """Controller: the placement strategy of workloads whose spec chooses none, `spread` or
    `binpack`."""
    spares: Annotated[int, Field(ge=0, le=100000), INTEGER] = 0
    """Controller: how many idle ready nodes to keep as spares for failed gang members, besides
    the nodes labelled `hafo.io/spare: "true"`."""


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
    """Controller: seconds borrowed work runs before the queue that lent the quota may take it
    back (checkpoint first); work of a queue over its borrowing limit is reclaimed sooner."""
    usage_half_life: Annotated[Positive | None, OMIT_DEFAULT] = None
    """Controller: given, queues that borrow are ordered by their decayed usage history with this
    half-life in seconds (at most 30 days) instead of their usage now; none: by their usage now."""

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
    (docs/reference/elastic.md, "Elastic capacity"): ``command`` (an argv list, the demand's JSON on
    its stdin) or ``url`` (an HTTP POST of it), at most once per ``interval`` seconds, when
    either changed; ``idle_after``: seconds a ready node has had no work before it is
    removable; ``timeout``: seconds a call may take (a command is then killed). Neither
    ``command`` nor ``url``: no hook (``GET /v1/demand`` and the metrics still say it)."""

    command: Annotated[Argv | None, OMIT_DEFAULT] = None
    """The hook as a command (argv, no shell): started in its own process group with the demand's
    JSON on its stdin; exit 0 is success; killed at `autoscale.timeout`. Not with
    `autoscale.url`."""
    url: Annotated[HookUrl | None, OMIT_DEFAULT] = None
    """The hook as an HTTP endpoint: the demand's JSON is POSTed to it; a 2xx answer is success.
    Not with `autoscale.command`."""
    interval: Positive = 30.0
    """The least time between two calls, in seconds; a call is made only when the pending shapes
    or the removable nodes changed (a failed call is tried again after this)."""
    idle_after: NonNegative = 600.0
    """Seconds a ready node has had no work before it is removable."""
    timeout: Positive = 30.0
    """Seconds one call may take: a command still running is then killed, an HTTP call abandoned."""

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
    """The cluster's name: every key lives under `/hafo/<cluster>/`."""
    etcd: EtcdConfig = EtcdConfig()
    """Where etcd is, how to authenticate to it, and its election timeout."""
    timing: TimingConfig = TimingConfig()
    """The lease TTL, the keepalive period and the fencing margin."""
    api: ApiConfig = ApiConfig()
    """The daemon's HTTP API: its address, tokens and TLS."""
    node: NodeConfig | None = None
    """Agent only: this node (required for the agent, ignored by the others)."""
    checkpoint: CheckpointSection = CheckpointSection()
    """The shared checkpoint storage."""
    controller: ControllerSection = ControllerSection()
    """Controller only: this controller."""
    log: LogSection = LogSection()
    """How the daemon logs (to stderr)."""
    health: HealthConfig = field(default_factory=HealthConfig)
    """Agent only: health polling, its thresholds and the classification overrides."""
    placement: PlacementSection = PlacementSection()
    """Controller only: the default placement strategy and the spare nodes."""
    fair_sharing: FairSharingSection = FairSharingSection()
    """Controller only: how queues share the pool."""
    autoscale: AutoscaleSection = AutoscaleSection()
    """Controller only: the hook the leader tells the pending demand and the removable nodes."""

    @classmethod
    def _prepare(cls, raw: Any, names: Mapping[str, str], forbid: bool,
                 unknown: list[Any]) -> Any:
        known = super()._prepare(raw, names, forbid, unknown)
        timing, etcd = (known.get("timing"), known.get("etcd") or {}) \
            if isinstance(known, dict) else (None, None)
        if not isinstance(timing, dict) or not isinstance(etcd, dict):
            return known
        profile = PROFILES.get(timing.get("profile"))  # type: ignore[arg-type]
        if profile is None or etcd.get("election_timeout") is not None:
            return known
        return {**known, "etcd": {**etcd, "election_timeout": profile.election_timeout}}

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
