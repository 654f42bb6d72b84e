"""A real HAProxy (2.6+) for the service tests and benchmarks on 127.0.0.1, and the reading of
its own view of rotation (``show servers state`` on the runtime socket).

``Haproxy`` runs ``examples/haproxy.cfg`` as shipped, with only its admin socket, its frontend
port and its log redirected (plus optional extra sections, e.g. a polling backend): the
behaviour measured is that of the example config, ``retries 2`` + ``option redispatch 1``
included. Stopped by pid.

A server is *in rotation* when HAProxy would send it a new request: operationally up
(``srv_op_state`` 1 starting or 2 running), neither in maintenance nor draining
(``srv_admin_state`` has none of the bits ``MAINT_OR_DRAIN``; 0x04, "disabled in the
config", stays set on a server-template slot that was enabled since, and means nothing then).

Used by ``tests/integration/test_services.py`` and ``benchmarks/service_failover.py``.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hafo.lb.runtime import RuntimeApi
from hafo.local.procs import free_port, spawn, stop_process

ROOT = Path(__file__).resolve().parent.parent
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
BACKEND = "web"
#: HAProxy's SRV_ADMF_MAINT (forced 0x01, inherited 0x02, resolution 0x20) and SRV_ADMF_DRAIN
#: (forced 0x08, inherited 0x10) bits of ``srv_admin_state``.
MAINT_OR_DRAIN = 0x01 | 0x02 | 0x20 | 0x08 | 0x10


def have_haproxy() -> bool:
    """Whether the haproxy binary is installed."""
    return Path(HAPROXY).exists()


class Haproxy:
    """examples/haproxy.cfg on a free frontend port with its admin socket in a short temporary
    directory (a unix socket path has at most 107 bytes); ``extra`` is appended verbatim."""

    def __init__(self, extra: str = "") -> None:
        self.base = Path(tempfile.mkdtemp(prefix="hafo-svc-"))
        self.socket = str(self.base / "admin.sock")
        self.port = free_port()
        self.config = self.base / "haproxy.cfg"
        self.log_path = self.base / "haproxy.log"
        self.proc: subprocess.Popen[bytes] | None = None
        text = (ROOT / "examples" / "haproxy.cfg").read_text()
        replaced = {
            "    stats socket /run/haproxy/hafo.sock mode 600 level admin\n":
                f"    stats socket {self.socket} mode 600 level admin\n",
            "    bind 127.0.0.1:8080\n": f"    bind 127.0.0.1:{self.port}\n",
            "    log stdout format short local0 info\n": "",
        }
        for old, new in replaced.items():
            if old not in text:
                raise RuntimeError(f"examples/haproxy.cfg changed: no {old.strip()!r}")
            text = text.replace(old, new)
        self.config.write_text(text + ("\n" + extra if extra else ""))
        self.api = RuntimeApi(self.socket, timeout=2.0)

    @property
    def url(self) -> str:
        """The frontend of examples/haproxy.cfg."""
        return f"http://127.0.0.1:{self.port}/"

    def start(self, timeout: float = 10.0) -> None:
        """Validate the config, start HAProxy and wait until its runtime API answers."""
        check = subprocess.run([HAPROXY, "-c", "-q", "-f", str(self.config)],
                               capture_output=True, text=True, timeout=10, check=False)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy -c failed: {check.stdout}{check.stderr}")
        self.proc = spawn([HAPROXY, "-db", "-f", str(self.config)], self.log_path)
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited {self.proc.returncode}: {self.log()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"haproxy's runtime API did not answer in {timeout}s")
            time.sleep(0.02)

    def _answers(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            try:
                sock.connect(self.socket)
                sock.sendall(b"show info\n")
                return b"Name:" in sock.recv(4096)
            except OSError:
                return False

    def stop(self, remove: bool = True) -> None:
        """Stop HAProxy (by pid) and remove its directory (config, log) unless not
        ``remove``."""
        if self.proc is not None:
            stop_process(self.proc, grace=2.0)
            self.proc = None
        if remove:
            shutil.rmtree(self.base, ignore_errors=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    async def servers(self, backend: str) -> list[Server]:
        """The backend's servers as HAProxy has them now."""
        return parse_servers(await self.api.command(f"show servers state {backend}"), backend)

    async def in_rotation(self, backend: str) -> set[tuple[str, int]]:
        """(address, port) of every server of ``backend`` that would get a new request now."""
        return {(s.address, s.port) for s in await self.servers(backend) if s.in_rotation}


@dataclass(frozen=True)
class Server:
    """One line of ``show servers state``."""

    backend: str
    name: str
    address: str
    port: int
    op_state: int
    admin_state: int

    @property
    def in_rotation(self) -> bool:
        return self.op_state in (1, 2) and not self.admin_state & MAINT_OR_DRAIN


def parse_servers(text: str, backend: str) -> list[Server]:
    """The servers of ``backend`` in a ``show servers state`` reply (format version 1)."""
    lines = text.splitlines()
    if len(lines) < 2 or lines[0].strip() != "1" or not lines[1].startswith("#"):
        raise RuntimeError(f"unexpected reply to 'show servers state': {text[:200]!r}")
    columns = lines[1].lstrip("#").split()
    servers = []
    for line in lines[2:]:
        fields = line.split()
        if not fields or len(fields) < len(columns):
            continue
        row = dict(zip(columns, fields, strict=False))
        if row["be_name"] == backend:
            servers.append(Server(backend, row["srv_name"], row["srv_addr"],
                                  int(row["srv_port"]), int(row["srv_op_state"]),
                                  int(row["srv_admin_state"])))
    return servers


async def left_rotation(proxy: Haproxy, backend: str, target: tuple[str, int], since: float,
                        timeout: float, interval: float = 0.05) -> float | None:
    """Seconds from ``since`` (``time.monotonic()``) until HAProxy's own state shows
    ``target`` (address, port) out of rotation in ``backend``, polling every ``interval``;
    None if it is still in rotation after ``timeout`` seconds."""
    deadline = since + timeout
    while True:
        if target not in await proxy.in_rotation(backend):
            return time.monotonic() - since
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(interval)


def service_spec(name: str, replicas: int = 3, env: dict[str, str] | None = None,
                 interval: float = 0.3) -> dict[str, Any]:
    """examples/http_service.py as a hafo service: ``replicas`` replicas on ports hafo picks,
    ready while /health (on the named port) answers 200, probed every ``interval`` seconds."""
    return {"name": name, "replicas": replicas,
            "command": [sys.executable, "-u", "examples/http_service.py", "--host",
                        "127.0.0.1", "--drain-timeout", "4"],
            "workdir": str(ROOT), "env": env or {}, "ports": {"http": 0}, "stop_grace": 5,
            "update": {"max_unavailable": 1, "drain_delay": 1},
            "checks": [{"type": "http", "port": "http", "path": "/health",
                        "interval": interval, "timeout": 1, "failure_threshold": 1,
                        "liveness": False}]}


def polling_section(workload: str, servers: list[tuple[str, str, int, int]], port: int,
                    backend: str = "polling") -> str:
    """A frontend on ``port`` and a Patroni-style polling backend (the commented example of
    examples/haproxy.cfg): one ``server`` per (name, address, replica port, agent API port),
    checked with ``GET /v1/workloads/WORKLOAD/ready`` on the agent's port, ``inter 3s fall 3
    rise 2``."""
    lines = [f"frontend {backend}", f"    bind 127.0.0.1:{port}", f"    default_backend {backend}",
             "", f"backend {backend}", "    balance roundrobin",
             f"    option httpchk GET /v1/workloads/{workload}/ready",
             "    http-check expect status 200",
             "    default-server inter 3s fall 3 rise 2 on-marked-down shutdown-sessions"]
    lines += [f"    server {name} {address}:{rport} check port {aport}"
              for name, address, rport, aport in servers]
    return "\n".join(lines) + "\n"
