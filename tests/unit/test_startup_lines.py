"""A daemon's start-up line and the warning for an API open to other hosts without a token."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from structlog.testing import LogCapture

from hafo import __version__
from hafo.daemon_start import announce as _announce
from hafo.model.config import ApiConfig
from hafo.model.exposure import api_url, is_loopback, open_api, serving_line


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("LOCALHOST", True), ("api.localhost", True),
    ("::ffff:127.0.0.1", True),
    ("0.0.0.0", False), ("::", False), ("[::]", False), ("", False),
    ("10.0.0.5", False), ("192.168.1.10", False), ("fe80::1", False),
    ("::ffff:10.0.0.1", False), ("node-1.example.com", False), ("127.example.com", False),
])
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(("role", "listen", "token", "warns"), [
    ("controller", "0.0.0.0:8600", False, True),
    ("controller", "[::]:8600", False, True),
    ("controller", "10.1.2.3:8600", False, True),
    ("controller", "ctl-1.example.com:8600", False, True),
    ("controller", "0.0.0.0:8600", True, False),  # needs the token
    ("controller", "127.0.0.1:8600", False, False),  # only this machine
    ("controller", "[::1]:8600", False, False),
    ("controller", "localhost:8600", False, False),
    ("agent", "0.0.0.0:8601", False, True),
    ("agent", "0.0.0.0:8601", True, False),
    ("agent", "127.0.0.1:8601", False, False),
])
def test_open_api(role: Any, listen: str, token: bool, warns: bool) -> None:
    api = ApiConfig(listen=listen)
    exposed = open_api(role, api.listen, api.host, token)
    if not warns:
        assert exposed is None
        return
    assert exposed is not None
    fields = exposed.fields()
    assert (fields["role"], fields["address"], fields["field"]) == (role, listen,
                                                                   "api.token_file")
    assert ("mutations" in fields["exposes"]) is (role == "controller")
    assert ("workload output" in fields["exposes"]) is (role == "agent")


@pytest.mark.parametrize(("scheme", "host", "port", "url"), [
    ("http", "127.0.0.1", 8600, "http://127.0.0.1:8600"),
    ("https", "0.0.0.0", 443, "https://0.0.0.0:443"),
    ("http", "::1", 8601, "http://[::1]:8601"),
    ("http", "[::]", 8601, "http://[::]:8601"),
    ("http", "ctl-1", 80, "http://ctl-1:80"),
])
def test_api_url(scheme: str, host: str, port: int, url: str) -> None:
    assert api_url(scheme, host, port) == url


def test_serving_lines() -> None:
    agent = serving_line("agent", "node-1", "http://127.0.0.1:8601")
    assert agent.fields() == {"role": "agent", "node": "node-1",
                              "api": "http://127.0.0.1:8601", "dashboard": None}
    ctl = serving_line("controller", "ctl-1", "http://10.0.0.1:8600")
    assert ctl.fields() == {"role": "controller", "controller": "ctl-1",
                            "api": "http://10.0.0.1:8600", "dashboard": "http://10.0.0.1:8600/"}


def daemon_config(listen: str, **api: str) -> Any:
    return SimpleNamespace(api=ApiConfig(listen=listen, **api))


def test_announce_uses_the_port_it_got_and_warns_once(capture: LogCapture) -> None:
    """Port 0 in api.listen: the line names the port the runner bound (no socket here)."""
    runner = SimpleNamespace(addresses=[("0.0.0.0", 40123)])
    _announce("controller", "ctl-1", daemon_config("0.0.0.0:0"), runner, None)
    line, warning = capture.entries
    assert line["event"] == "serving API" and line["controller"] == "ctl-1"
    assert line["log_level"] == "info" and line["version"] == __version__
    assert line["api"] == "http://0.0.0.0:40123"
    assert line["dashboard"] == "http://0.0.0.0:40123/"
    assert warning["log_level"] == "warning" and "api.token_file" in warning["event"]
    assert warning["field"] == "api.token_file" and warning["address"] == "0.0.0.0:0"
    assert warning["event"] == ("API open without a token to anyone who can reach it: set "
                                "api.token_file, or listen on 127.0.0.1")
    assert warning["role"] == "controller" and "mutations" in warning["exposes"]


@pytest.mark.parametrize(("listen", "token", "lines"), [
    ("127.0.0.1:8601", None, 1),
    ("0.0.0.0:8601", "s3cret", 1),
    ("0.0.0.0:8601", None, 2),
])
def test_announce_agent(capture: LogCapture, listen: str, token: str | None,
                        lines: int) -> None:
    _announce("agent", "node-1", daemon_config(listen), SimpleNamespace(addresses=[]), token)
    assert len(capture.entries) == lines
    assert capture.entries[0]["event"] == "serving API"
    assert capture.entries[0]["api"] == f"http://{listen}"
    assert capture.entries[0]["node"] == "node-1" and capture.entries[0]["dashboard"] is None


def test_announce_tls_scheme(capture: LogCapture) -> None:
    config = daemon_config("127.0.0.1:8600", tls_cert="/c.pem", tls_key="/k.pem")
    _announce("controller", "ctl-1", config, SimpleNamespace(addresses=[]), "t")
    (line,) = capture.entries
    assert line["api"] == "https://127.0.0.1:8600"
