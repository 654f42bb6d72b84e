"""The address a node's peers reach it at (a gang's ``MASTER_ADDR``): ``node.address`` when
configured, else the local address of the route towards the first etcd endpoint (the
interface the cluster's traffic uses), else the host name."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Sequence
from urllib.parse import urlsplit


def route_source(endpoint: str) -> str | None:
    """The local IP address the kernel would use to reach ``endpoint`` (a URL); no packet is
    sent (a UDP socket only connects)."""
    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    host = parts.hostname
    if not host:
        return None
    with contextlib.suppress(OSError, ValueError):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((host, parts.port or 2379))
            address: str = sock.getsockname()[0]
            return address
    return None


def node_address(configured: str | None, endpoints: Sequence[str]) -> str:
    """``configured``, else the route source towards etcd, else the host name."""
    if configured:
        return configured
    for endpoint in endpoints:
        found = route_source(endpoint)
        if found:
            return found
    return socket.gethostname()
