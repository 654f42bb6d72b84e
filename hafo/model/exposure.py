"""What a daemon says when it starts serving: its start-up line, and whether its API is open.

Pure: the daemons (``hafo agent``, ``hafo controller``) log the fields these functions return
once they listen, under static events (``hafo.daemon_start.announce``). An API is *open* when
it needs no bearer token (``api.token_file`` unset) and listens on an address other hosts may
reach (anything but loopback: ``0.0.0.0``, ``::``, a host's own address or name). An open
controller API accepts mutations (submit, delete, drain, cordon, migrate) from anyone who
reaches it; an open agent API serves workload output, which may hold secrets.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Literal

Role = Literal["agent", "controller"]

#: The config field whose absence makes an API open.
TOKEN_FIELD = "api.token_file"

#: The field that names a daemon on its lines (bound on each of them by ``hafo.logs``).
NAME_FIELD: dict[Role, str] = {"agent": "node", "controller": "controller"}

_WHAT_IS_OPEN: dict[Role, str] = {
    "controller": "mutations (submit, delete, drain, cordon, migrate)",
    "agent": "workload output (which may hold secrets)",
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
    """A daemon's one start-up line, the static event ``serving API``
    (docs/reference/config-files.md, "Daemon logs"): its structured fields."""

    role: Role
    name: str
    api: str
    dashboard: str | None

    def fields(self) -> dict[str, str | None]:
        """``role``, the daemon's name (``node`` on an agent, ``controller`` on a
        controller), ``api`` (the API's URL), ``dashboard`` (the page's URL, or None)."""
        return {"role": self.role, NAME_FIELD[self.role]: self.name, "api": self.api,
                "dashboard": self.dashboard}


def serving_line(role: Role, name: str, url: str) -> ServingLine:
    """What a daemon serving its API on ``url`` says: every controller also serves the
    dashboard at ``/``; an agent serves none."""
    return ServingLine(role, name, url, url + "/" if role == "controller" else None)


@dataclass(frozen=True)
class OpenApi:
    """An API without a token on an address other hosts may reach: the fields of the
    warning ``API open without a token ...`` (docs/reference/config-files.md, "Daemon logs")."""

    role: Role
    address: str

    def fields(self) -> dict[str, str]:
        """``role``, ``address`` (``api.listen``), ``exposes`` (what anyone who reaches it
        gets) and ``field`` (``api.token_file``, the setting that closes it)."""
        return {"role": self.role, "address": self.address,
                "exposes": _WHAT_IS_OPEN[self.role], "field": TOKEN_FIELD}


def open_api(role: Role, listen: str, host: str, token: bool) -> OpenApi | None:
    """The API at ``listen`` (``host`` its host) when it is open: without a token, on a
    non-loopback address; None when it needs a token or only this machine reaches it."""
    if token or is_loopback(host):
        return None
    return OpenApi(role, listen)
