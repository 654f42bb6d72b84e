"""What a restarted agent needs to renew its lease before it has loaded its config.

Loading and validating the config builds its models, which takes most of a second on a busy
machine; a crashed agent's guards fence their work 1.5 s after the crash in the worst case
(docs/safety.md, "Hitless agent restarts"). So each agent writes, at start-up, a brief of its
etcd settings beside its lease record (``instances/.renewal.json``, mode 0600), and the next
``hafo agent`` finds it from the config file's ``node.state_dir`` alone (``state_dir_of``,
which reads no more of the file than that) and renews the recorded lease with it, before
anything heavy is imported (``hafo.agent.early_renewal``).

The brief is a hint, never trusted for anything but that one keepalive: renewing only extends
a lease this node already holds, with whatever endpoints worked last time. An inline
``etcd.password`` is not written (only ``password_file``): such an agent takes the slow path.
Nothing here imports the config models.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hafo.agent.instances import INSTANCES
from hafo.model.paths import DEFAULT_STATE_DIR

BRIEF = ".renewal.json"
MAX_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class RenewalBrief:
    """etcd settings and timing of the agent that wrote it."""

    endpoints: tuple[str, ...]
    heartbeat: float
    fence_margin: float
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    username: str | None = None
    password_file: str | None = None


def write_brief(state_dir: Path, etcd: Any, heartbeat: float, fence_margin: float) -> bool:
    """Write the brief for ``etcd`` (a validated ``EtcdConfig``); False when it is not written
    (an inline password, or the state directory refuses it)."""
    path = state_dir / INSTANCES / BRIEF
    if etcd.password and not etcd.password_file:
        path.unlink(missing_ok=True)
        return False
    data = {"endpoints": list(etcd.endpoints), "heartbeat": heartbeat,
            "fence_margin": fence_margin, "ca": etcd.ca, "cert": etcd.cert, "key": etcd.key,
            "username": etcd.username, "password_file": etcd.password_file}
    tmp = path.with_name(f".{BRIEF}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(data))
        os.replace(tmp, path)
    except OSError:
        return False
    return True


def read_brief(state_dir: Path) -> RenewalBrief | None:
    """The brief, or None if absent or not of the expected shape."""
    try:
        data = json.loads((state_dir / INSTANCES / BRIEF).read_text())
        endpoints = tuple(str(e) for e in data["endpoints"])
        optional = {name: data.get(name) for name in
                    ("ca", "cert", "key", "username", "password_file")}
        if not endpoints or not all(v is None or isinstance(v, str) for v in optional.values()):
            return None
        return RenewalBrief(endpoints, float(data["heartbeat"]), float(data["fence_margin"]),
                            **optional)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def state_dir_of(config_path: str) -> Path | None:
    """``node.state_dir`` of a config file, read without building the config models: the
    file's YAML is composed (aliases are not expanded) and only that one scalar is looked
    up. None when the file is unreadable, too large, not YAML, or has no node section."""
    import yaml

    try:
        with open(config_path, "rb") as source:
            text = source.read(MAX_CONFIG_BYTES + 1)
        if len(text) > MAX_CONFIG_BYTES:
            return None
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        root = yaml.compose(text, Loader=loader)
    except (OSError, yaml.YAMLError, ValueError):
        return None
    node = _value(root, "node")
    if not isinstance(node, yaml.MappingNode):
        return None
    state_dir = _value(node, "state_dir")
    if state_dir is None:
        return Path(DEFAULT_STATE_DIR)
    if isinstance(state_dir, yaml.ScalarNode) and isinstance(state_dir.value, str) \
            and state_dir.value:
        return Path(state_dir.value)
    return None


def _value(mapping: Any, key: str) -> Any:
    """The value node of ``key`` in a composed YAML mapping node (None if absent)."""
    import yaml

    if not isinstance(mapping, yaml.MappingNode):
        return None
    for key_node, value_node in mapping.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
            return value_node
    return None
