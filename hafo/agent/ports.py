"""The ports of an instance: each declared port as given, or, for 0, a free port of this
node's range (``node.ports``), chosen at launch (docs/reference/workloads.md, "Ports").

A port is free when no other live instance on this node holds it and a TCP socket can bind
it on every address now. The choice starts at an offset taken from the instance (workload
and epoch), so a port just given up by an instance that stopped is not the first one tried
again, and replicas placed together do not all try the same port first.
"""

from __future__ import annotations

import contextlib
import socket
import zlib
from collections.abc import Collection, Mapping

from hafo.model.config import PortRange


def bindable(port: int) -> bool:
    """Can a TCP socket bind ``port`` on every IPv4 address now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


class NoFreePort(Exception):
    """Every port of the range is held."""


def choose_ports(declared: Mapping[str, int], taken: Collection[int], port_range: PortRange,
                 epoch: int, workload: str = "") -> dict[str, int]:
    """The instance's ports by name: fixed ones as declared, each 0 a free port of
    ``port_range`` (NoFreePort if none is left)."""
    chosen: dict[str, int] = {}
    held = set(taken) | {p for p in declared.values() if p}
    size = port_range.last - port_range.first + 1
    start = zlib.crc32(f"{workload}:{epoch}".encode()) % size
    for name in sorted(declared):
        if declared[name]:
            chosen[name] = declared[name]
            continue
        for step in range(size):
            port = port_range.first + (start + step) % size
            if port not in held and bindable(port):
                chosen[name] = port
                held.add(port)
                start = (start + step + 1) % size
                break
        else:
            raise NoFreePort(f"no free port left in {port_range.first}-{port_range.last} for "
                             f"port {name!r}")
    return chosen


def port_env(ports: Mapping[str, int]) -> dict[str, str]:
    """``HAFO_PORT_<NAME>`` for each port, and ``PORT`` when there is exactly one."""
    env = {f"HAFO_PORT_{name.upper()}": str(port) for name, port in ports.items()}
    if len(ports) == 1:
        env["PORT"] = str(next(iter(ports.values())))
    return env


def read_ports(data: Mapping[str, object]) -> dict[str, int]:
    """The ``ports`` of a launch record (empty when absent or malformed)."""
    raw = data.get("ports")
    out: dict[str, int] = {}
    if isinstance(raw, Mapping):
        for name, port in raw.items():
            with contextlib.suppress(TypeError, ValueError):
                if isinstance(name, str) and not isinstance(port, bool):
                    out[name] = int(str(port))
    return out
