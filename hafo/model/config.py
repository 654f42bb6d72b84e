"""Daemon configuration (DESIGN.md part B, 'Config'), validated into frozen records."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hafo.model.errors import ValidationError
from hafo.model.health_config import HealthConfig, parse_health
from hafo.model.names import is_node_name
from hafo.model.parsing import (
    as_mapping,
    get_int,
    get_number,
    get_str,
    get_str_map,
    reject_unknown,
)

ENDPOINT_RE = re.compile(r"^(https?)://([^/:]+|\[[0-9a-fA-F:]+\]):(\d{1,5})/?$")
LISTEN_RE = re.compile(r"^([^:]+|\[[0-9a-fA-F:]+\]):(\d{1,5})$")


@dataclass(frozen=True)
class EtcdConfig:
    """Where etcd is and how to authenticate to it."""

    endpoints: tuple[str, ...] = ("http://127.0.0.1:2379",)
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    username: str | None = None
    password: str | None = None
    password_file: str | None = None


@dataclass(frozen=True)
class TimingConfig:
    """Lease TTL, keepalive period and the self-fencing safety margin, in seconds."""

    lease_ttl: int = 3
    heartbeat: float = 1.0
    fence_margin: float = 0.5
    failsafe_max: float = 300.0


@dataclass(frozen=True)
class ApiConfig:
    """HTTP API listen address and optional bearer token file."""

    listen: str = "127.0.0.1:8600"
    token_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None

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


MIG_PROFILE_RE = re.compile(r"^([1-8])g\.([1-9][0-9]{0,3})gb(\+[a-z]+)?$")
MAX_MIG_DEVICES = 7
STRATEGIES = ("spread", "binpack")


@dataclass(frozen=True)
class SimulatedGpus:
    """The simulated GPU backend's description of a node's GPUs.

    ``utilization``: GPU index -> percent busy reported for it (unlisted: unknown). ``mig``:
    GPU index -> the profiles of its MIG devices (that GPU is then listed as those devices).
    """

    count: int = 4
    model: str = "NVIDIA H100 80GB HBM3"
    memory_mib: int = 81559
    faults_file: str | None = None
    utilization: Mapping[int, float] = field(default_factory=dict)
    mig: Mapping[int, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeConfig:
    """Agent-only settings."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    state_dir: str = "/var/lib/hafo"
    gpus: str = "auto"
    simulate: SimulatedGpus | None = None


@dataclass(frozen=True)
class Config:
    """One daemon's configuration."""

    cluster: str = "default"
    etcd: EtcdConfig = EtcdConfig()
    timing: TimingConfig = TimingConfig()
    api: ApiConfig = ApiConfig()
    node: NodeConfig | None = None
    checkpoint_root: str = "/var/lib/hafo/checkpoints"
    controller_name: str | None = None
    log_format: str = "auto"
    health: HealthConfig = field(default_factory=HealthConfig)
    placement_strategy: str = "spread"


def parse_endpoints(value: Any, field_name: str) -> tuple[str, ...]:
    """Validate a list (or comma-separated string) of etcd URLs."""
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list) or not value:
        raise ValidationError(field_name, "must be a non-empty list of URLs like "
                              "http://127.0.0.1:2379")
    for i, url in enumerate(value):
        if not isinstance(url, str) or not ENDPOINT_RE.fullmatch(url):
            raise ValidationError(f"{field_name}[{i}]",
                                  f"must look like http://HOST:PORT, got {url!r}")
        port = int(ENDPOINT_RE.fullmatch(url).group(3))  # type: ignore[union-attr]
        if not 0 < port < 65536:
            raise ValidationError(f"{field_name}[{i}]", f"port out of range in {url!r}")
    return tuple(value)


def _parse_etcd(raw: Any) -> EtcdConfig:
    data = as_mapping(raw or {}, "etcd")
    reject_unknown(data, {"endpoints", "ca", "cert", "key", "username", "password",
                          "password_file"}, "etcd")
    endpoints = parse_endpoints(data.get("endpoints", ["http://127.0.0.1:2379"]),
                                "etcd.endpoints")
    config = EtcdConfig(endpoints=endpoints, ca=get_str(data, "ca", "etcd"),
                        cert=get_str(data, "cert", "etcd"), key=get_str(data, "key", "etcd"),
                        username=get_str(data, "username", "etcd"),
                        password=get_str(data, "password", "etcd"),
                        password_file=get_str(data, "password_file", "etcd"))
    return check_etcd_security(config, "etcd")


def check_etcd_security(config: EtcdConfig, where: str) -> EtcdConfig:
    """TLS and authentication settings that fit together, or a ValidationError naming the
    field: https endpoints need ``ca``; ``cert`` and ``key`` come as a pair; a user name
    needs exactly one of ``password`` and ``password_file``."""
    secure = [url.startswith("https://") for url in config.endpoints]
    if any(secure) and not all(secure):
        raise ValidationError(f"{where}.endpoints", "mix http:// and https:// endpoints")
    if all(secure) and not config.ca:
        raise ValidationError(f"{where}.ca", "is required with https:// endpoints "
                              "(the CA certificate that signed etcd's)")
    if config.ca and not all(secure):
        raise ValidationError(f"{where}.endpoints", "must be https:// when ca is set")
    if (config.cert is None) != (config.key is None):
        raise ValidationError(f"{where}.cert" if config.cert is None else f"{where}.key",
                              "cert and key must be given together")
    if config.cert and not config.ca:
        raise ValidationError(f"{where}.ca", "is required with a client cert")
    has_password = config.password is not None or config.password_file is not None
    if config.password is not None and config.password_file is not None:
        raise ValidationError(f"{where}.password", "give password or password_file, not both")
    if (config.username is not None) == has_password:
        return config
    if config.username is None:
        raise ValidationError(f"{where}.username", "is required with a password")
    raise ValidationError(f"{where}.password_file", "is required with a username "
                          "(or password)")


def _parse_timing(raw: Any) -> TimingConfig:
    data = as_mapping(raw or {}, "timing")
    reject_unknown(data, {"lease_ttl", "heartbeat", "fence_margin", "failsafe_max"}, "timing")
    ttl = get_int(data, "lease_ttl", "timing", 3, minimum=2, maximum=3600)
    heartbeat = get_number(data, "heartbeat", "timing", 1.0, minimum=0, exclusive_minimum=True)
    margin = get_number(data, "fence_margin", "timing", 0.5, minimum=0, exclusive_minimum=True)
    if heartbeat * 2 > ttl:
        raise ValidationError("timing.heartbeat", f"must be at most half of lease_ttl ({ttl})")
    if margin + heartbeat >= ttl:
        raise ValidationError("timing.fence_margin",
                              "fence_margin + heartbeat must be below lease_ttl")
    failsafe_max = get_number(data, "failsafe_max", "timing", 300.0, minimum=0)
    return TimingConfig(lease_ttl=ttl, heartbeat=heartbeat, fence_margin=margin,
                        failsafe_max=failsafe_max)


def _parse_api(raw: Any) -> ApiConfig:
    data = as_mapping(raw or {}, "api")
    reject_unknown(data, {"listen", "token_file", "tls_cert", "tls_key", "tls_ca"}, "api")
    listen = get_str(data, "listen", "api", "127.0.0.1:8600")
    assert listen is not None
    match = LISTEN_RE.fullmatch(listen)
    if not match or not 0 <= int(match.group(2)) < 65536:
        raise ValidationError("api.listen", f"must be HOST:PORT, got {listen!r}")
    cert, key = get_str(data, "tls_cert", "api"), get_str(data, "tls_key", "api")
    if (cert is None) != (key is None):
        raise ValidationError("api.tls_key" if key is None else "api.tls_cert",
                              "tls_cert and tls_key must be given together")
    return ApiConfig(listen=listen, token_file=get_str(data, "token_file", "api"),
                     tls_cert=cert, tls_key=key, tls_ca=get_str(data, "tls_ca", "api"))


def _gpu_key(key: str, count: int, where: str) -> int:
    """A GPU index written as a mapping key ("0"), within ``count``."""
    if not key.isdigit() or int(key) >= count:
        raise ValidationError(f"{where}.{key}",
                              f"must be a GPU index from 0 to {count - 1}" if count
                              else "no GPUs to refer to (count is 0)")
    return int(key)


def _parse_utilization(raw: Any, count: int, where: str) -> dict[int, float]:
    data = as_mapping(raw or {}, where)
    out: dict[int, float] = {}
    for key in data:
        index = _gpu_key(key, count, where)
        value = get_number(data, key, where, 0.0, minimum=0)
        if value > 100:
            raise ValidationError(f"{where}.{key}", f"must be a percentage (0-100), got {value}")
        out[index] = value
    return out


def _parse_mig(raw: Any, count: int, where: str) -> dict[int, tuple[str, ...]]:
    data = as_mapping(raw or {}, where)
    out: dict[int, tuple[str, ...]] = {}
    for key, profiles in data.items():
        index = _gpu_key(key, count, where)
        if not isinstance(profiles, list) or not 0 < len(profiles) <= MAX_MIG_DEVICES:
            raise ValidationError(f"{where}.{key}", f"must be a list of 1 to {MAX_MIG_DEVICES} "
                                  "MIG profiles like 1g.10gb")
        for i, profile in enumerate(profiles):
            if not isinstance(profile, str) or not MIG_PROFILE_RE.fullmatch(profile):
                raise ValidationError(f"{where}.{key}[{i}]",
                                      f"must be a MIG profile like 1g.10gb, got {profile!r}")
        out[index] = tuple(profiles)
    return out


def _parse_gpus(raw: Any) -> tuple[str, SimulatedGpus | None]:
    if raw is None or raw == "auto":
        return "auto", None
    if raw == "none":
        return "none", None
    if isinstance(raw, Mapping) and set(raw) == {"simulate"}:
        sim = as_mapping(raw["simulate"] or {}, "node.gpus.simulate")
        where = "node.gpus.simulate"
        reject_unknown(sim, {"count", "model", "memory_mib", "faults_file", "utilization",
                             "mig"}, where)
        count = get_int(sim, "count", where, 4, minimum=0, maximum=64)
        return "simulate", SimulatedGpus(
            count=count,
            model=get_str(sim, "model", where, "NVIDIA H100 80GB HBM3") or "",
            memory_mib=get_int(sim, "memory_mib", where, 81559, minimum=1),
            faults_file=get_str(sim, "faults_file", where),
            utilization=_parse_utilization(sim.get("utilization"), count,
                                           f"{where}.utilization"),
            mig=_parse_mig(sim.get("mig"), count, f"{where}.mig"),
        )
    raise ValidationError("node.gpus", "must be 'auto', 'none' or {simulate: {...}}")


def _parse_placement(raw: Any) -> str:
    data = as_mapping(raw or {}, "placement")
    reject_unknown(data, {"strategy"}, "placement")
    strategy = get_str(data, "strategy", "placement", "spread") or "spread"
    if strategy not in STRATEGIES:
        raise ValidationError("placement.strategy", "must be spread or binpack")
    return strategy


def _parse_node(raw: Any) -> NodeConfig:
    data = as_mapping(raw, "node")
    reject_unknown(data, {"name", "labels", "state_dir", "gpus"}, "node")
    name = get_str(data, "name", "node", required=True)
    assert name is not None
    if not is_node_name(name):
        raise ValidationError("node.name", "must be letters, digits, '.', '_' or '-'")
    mode, simulate = _parse_gpus(data.get("gpus"))
    return NodeConfig(name=name, labels=get_str_map(data, "labels", "node"),
                      state_dir=get_str(data, "state_dir", "node", "/var/lib/hafo") or "",
                      gpus=mode, simulate=simulate)


def parse_config(raw: Any, role: str) -> Config:
    """Validate a daemon config mapping. ``role`` is 'agent', 'controller' or 'client'."""
    data = as_mapping(raw if raw is not None else {}, "config")
    reject_unknown(data, {"cluster", "etcd", "timing", "api", "node", "checkpoint",
                          "controller", "log", "health", "placement"}, "")
    cluster = get_str(data, "cluster", "", "default") or "default"
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,62}", cluster):
        raise ValidationError("cluster", "must be lowercase letters, digits and '-'")
    etcd = _parse_etcd(data.get("etcd"))
    timing = _parse_timing(data.get("timing"))
    api = _parse_api(data.get("api"))
    node = None
    if role == "agent":
        if "node" not in data:
            raise ValidationError("node", "is required for the agent (node.name at least)")
        node = _parse_node(data["node"])
    checkpoint = as_mapping(data.get("checkpoint") or {}, "checkpoint")
    reject_unknown(checkpoint, {"root"}, "checkpoint")
    controller = as_mapping(data.get("controller") or {}, "controller")
    reject_unknown(controller, {"name"}, "controller")
    controller_name = get_str(controller, "name", "controller")
    if role == "controller" and controller_name is None:
        raise ValidationError("controller.name", "is required for the controller")
    log = as_mapping(data.get("log") or {}, "log")
    reject_unknown(log, {"format"}, "log")
    log_format = get_str(log, "format", "log", "auto") or "auto"
    if log_format not in ("auto", "json", "console"):
        raise ValidationError("log.format", "must be auto, json or console")
    return Config(
        cluster=cluster,
        etcd=etcd,
        timing=timing,
        api=api,
        node=node,
        checkpoint_root=get_str(checkpoint, "root", "checkpoint",
                                "/var/lib/hafo/checkpoints") or "",
        controller_name=controller_name,
        log_format=log_format,
        health=parse_health(data.get("health")),
        placement_strategy=_parse_placement(data.get("placement")),
    )
