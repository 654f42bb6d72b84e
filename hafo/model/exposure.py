"""What a daemon says when it starts serving: its start-up line, and whether its API is open.

Pure: the daemons (``hafo agent``, ``hafo controller``) log what these functions return once
they listen. An API is *open* when it needs no bearer token (``api.token_file`` unset) and
listens on an address other hosts may reach (anything but loopback: ``0.0.0.0``, ``::``, a
host's own address or name). An open controller API accepts mutations (submit, delete,
drain, cordon, migrate) from anyone who reaches it; an open agent API serves workload output,
which may hold secrets.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Literal

Role = Literal["agent", "controller"]

#: The config field whose absence makes an API open.
TOKEN_FIELD = "api.token_file"

_WHAT_IS_OPEN: dict[Role, str] = {
    "controller": "accepts mutations (submit, delete, drain, cordon, migrate)",
    "agent": "serves workload output (which may hold secrets)",
}


def is_loopback(host: str) -> bool:
    """True when ``host`` (an IP address or a name, brackets allowed) only reaches this
    machine: ``127.0.0.0/8``, ``::1`` (also as ``::ffff:127.x.x.x``) or ``localhost``. An
    empty host, a wildcard (``0.0.0.0``, ``::``) or any other name or address is not."""
    text = host.strip().strip("[]").lower()
    if text == "localhost" or text.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def api_url(scheme: str, host: str, port: int) -> str:
    """``scheme://host:port`` with an IPv6 host in brackets."""
    bare = host.strip("[]")
    return f"{scheme}://{f'[{bare}]' if ':' in bare else bare}:{port}"


@dataclass(frozen=True)
class ServingLine:
    """A daemon's one start-up line: the text and its structured fields."""

    text: str
    api: str
    dashboard: str | None


def serving_line(role: Role, name: str, url: str) -> ServingLine:
    """``agent node-1 serving API on http://127.0.0.1:8601 (dashboard: none)``, or
    ``controller ctl-1 serving API and dashboard on http://127.0.0.1:8600/`` (every
    controller serves the dashboard at ``/``)."""
    if role == "controller":
        page = url + "/"
        return ServingLine(f"controller {name} serving API and dashboard on {page}", url, page)
    return ServingLine(f"agent {name} serving API on {url} (dashboard: none)", url, None)


def open_api_warning(role: Role, listen: str, host: str, token: bool) -> str | None:
    """The warning for an API without a token on a non-loopback address, naming
    ``api.token_file`` and the address; None when the API needs a token or only this machine
    reaches it."""
    if token or is_loopback(host):
        return None
    return (f"{role} API on {listen} {_WHAT_IS_OPEN[role]} without a token to anyone who "
            f"can reach it: set {TOKEN_FIELD}, or listen on 127.0.0.1")
