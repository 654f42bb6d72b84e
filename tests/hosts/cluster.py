"""A hafo cluster deployed by Ansible onto a lab's machines, and what the tests ask of it.

``DeployedCluster.create()`` boots the machines, builds the wheelhouse, runs ``site.yml`` once
and waits until every agent holds a lease. Everything the tests do goes through real
interfaces: the controllers' HTTP API from the host (over the bridge), ``systemctl`` and
``etcdctl`` over SSH, the machines' processes from the host's /proc (tests/hosts/watch.py).
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.hosts.deploy import CONTROLLERS, Ansible, PlaybookRun, wheelhouse, write_inventory
from tests.hosts.image import ensure_image
from tests.hosts.lab import Lab, Machine
from tests.hosts.watch import Watcher

MACHINES = ("m1", "m2", "m3")
LEASE_TTL = 3
HEARTBEAT = 1
API_PORT = 8600
AGENT_PORT = 8601
#: The workload every test runs: a process named ``sleep`` the watcher recognises.
SLEEP = ["/bin/sleep", "1000000"]
#: A version for the upgrade test's second wheel (the checkout's code, another version).
UPGRADE_VERSION = "0.1.0.post9"


@dataclass
class DeployedCluster:
    """The lab, its Ansible and the instance watcher."""

    lab: Lab
    ansible: Ansible
    watcher: Watcher
    first_deploy: PlaybookRun
    token: str = ""
    timings: dict[str, list[float]] = field(default_factory=dict)

    # --- set-up -------------------------------------------------------------------------------
    @classmethod
    def create(cls, run_dir: Path, say: Any = print) -> DeployedCluster:
        """Boot, deploy, wait until ready. On failure everything made is removed."""
        image = ensure_image(say)
        lab = Lab(run_dir / "lab", image, MACHINES)
        ansible: Ansible | None = None
        watcher = Watcher(lambda: {ns: m.name for m in lab.machines.values()
                                   if (ns := m.pid_namespace()) is not None})
        try:
            started = time.monotonic()
            lab.start()
            say(f"{len(MACHINES)} machines booted in {time.monotonic() - started:.1f} s")
            wheels = wheelhouse(run_dir / "wheels", None, UPGRADE_VERSION)
            inventory = write_inventory(lab, run_dir / "inventory.ini")
            ansible = Ansible(run_dir / "ansible", inventory, {
                "hafo_wheelhouse": str(wheels),
                "hafo_pki_dir": str(run_dir / "pki"),
                "hafo_etcd_auth": True,
                "hafo_lease_ttl": LEASE_TTL,
                "hafo_heartbeat": HEARTBEAT,
                "hafo_checkpoint_root": "/var/lib/hafo/checkpoints",
                "hafo_agent_gpus": {"simulate": {"count": 2}},
                "hafo_log_format": "json",
            })
            started = time.monotonic()
            first = ansible.playbook("site.yml")
            say(f"site.yml (first run) took {time.monotonic() - started:.0f} s")
            if first.returncode != 0:
                raise RuntimeError(f"site.yml failed:\n{first.tail()}")
            cluster = cls(lab, ansible, watcher, first)
            cluster.token = (run_dir / "pki" / "api-token").read_text().strip()
            watcher.start()
            cluster.wait_ready(MACHINES)
            return cluster
        except BaseException:
            watcher.stop()
            if ansible is not None:
                ansible.close()
            lab.close()
            raise

    def close(self) -> None:
        """Stop watching, stop Ansible's SSH masters, remove the lab."""
        self.watcher.stop()
        self.ansible.close()
        self.lab.close()

    # --- the controllers' HTTP API ------------------------------------------------------------
    @property
    def controllers(self) -> list[Machine]:
        """The machines that run a controller."""
        return list(self.lab.machines.values())[:CONTROLLERS]

    def request(self, method: str, path: str, body: Any = None, machine: Machine | None = None,
                timeout: float = 5) -> tuple[int, Any]:
        """One API call to ``machine``'s controller (default: the first that answers)."""
        targets = [machine] if machine is not None else \
            [m for m in self.controllers if m.running]
        last: Exception | None = None
        for target in targets:
            data = None if body is None else json.dumps(body).encode()
            req = urllib.request.Request(
                f"http://{target.address}:{API_PORT}{path}", data=data, method=method,
                headers={"Authorization": f"Bearer {self.token}",
                         "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=timeout) as response:
                    return response.status, json.loads(response.read() or b"null")
            except urllib.error.HTTPError as error:
                return error.code, json.loads(error.read() or b"null")
            except OSError as error:
                last = error
        raise ConnectionError(f"no controller answered {method} {path}: {last}")

    def submit(self, name: str, gpus: int = 1, **extra: Any) -> str:
        """Submit a workload that sleeps; returns its id."""
        status, body = self.request("POST", "/v1/workloads",
                                    {"name": name, "command": SLEEP, "gpus": gpus,
                                     "stop_grace": 5, **extra})
        assert status in (200, 201), (status, body)
        return str(body["id"])

    def delete(self, name: str) -> None:
        """Delete a workload (its instance is stopped)."""
        self.request("DELETE", f"/v1/workloads/{name}")

    def leader(self) -> str:
        """The machine whose controller leads."""
        for machine in self.controllers:
            if not machine.running:
                continue
            try:
                status, _body = self.request("GET", "/leader", machine=machine, timeout=2)
            except ConnectionError:
                continue
            if status == 200:
                return machine.name
        raise AssertionError("no controller leads")

    def events(self, limit: int = 1000) -> list[dict[str, Any]]:
        """The newest events."""
        status, body = self.request("GET", f"/v1/events?limit={limit}")
        assert status == 200, body
        return list(body)

    # --- machines -----------------------------------------------------------------------------
    def agent_ready(self, machine: Machine) -> bool:
        """Whether the machine's agent answers /readyz with 200 (it holds a lease)."""
        try:
            with urllib.request.urlopen(
                    f"http://{machine.address}:{AGENT_PORT}/readyz", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def version(self, machine: Machine, port: int) -> str:
        """The hafo version the daemon on ``machine:port`` runs (its /healthz)."""
        with urllib.request.urlopen(f"http://{machine.address}:{port}/healthz",
                                    timeout=5) as response:
            return str(json.loads(response.read())["version"])

    def wait_ready(self, names: tuple[str, ...] | list[str], timeout: float = 90) -> None:
        """Wait until the named machines' agents hold leases, a controller leads and every
        etcd member is healthy."""
        deadline = time.monotonic() + timeout
        machines = [self.lab[n] for n in names]
        while True:
            pending = [m.name for m in machines if not self.agent_ready(m)]
            leader = None
            with contextlib.suppress(AssertionError, ConnectionError):
                leader = self.leader()
            if not pending and leader is not None and self.etcd_healthy():
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"not ready after {timeout} s: agents {pending}, "
                                     f"leader {leader}")
            time.sleep(0.5)

    def etcdctl(self, machine: Machine, *args: str, timeout: float = 20) -> str:
        """etcdctl on ``machine`` as etcd's root user (the role's client certificate)."""
        pki = "/etc/etcd/pki"
        command = (f"ETCDCTL_API=3 etcdctl --endpoints=https://127.0.0.1:2379 "
                   f"--cacert={pki}/ca.crt --cert={pki}/root-client.crt "
                   f"--key={pki}/root-client.key --command-timeout=3s {' '.join(args)}")
        return machine.ssh(command, timeout=timeout).stdout

    def etcd_healthy(self) -> bool:
        """Every running machine's etcd member reports healthy."""
        for machine in self.lab.machines.values():
            if not machine.running:
                continue
            try:
                self.etcdctl(machine, "endpoint", "health")
            except (RuntimeError, OSError):
                return False
        return True

    def etcd_leader(self) -> str:
        """The machine of etcd's raft leader."""
        for machine in self.lab.machines.values():
            if not machine.running:
                continue
            out = self.etcdctl(machine, "endpoint", "status", "--cluster", "-w", "json")
            statuses = json.loads(out)
            for status in statuses:
                if status["Status"]["leader"] == status["Status"]["header"]["member_id"]:
                    host = status["Endpoint"].split("//")[1].split(":")[0]
                    return next(m.name for m in self.lab.machines.values()
                                if m.address == host)
        raise AssertionError("etcd has no leader")

    def power_on(self, name: str) -> None:
        """Boot a powered-off machine and wait until its services are back."""
        self.lab[name].boot()
        self.wait_ready(list(self.lab.machines))

    def systemctl(self, machine: Machine, *args: str) -> str:
        """systemctl on a machine."""
        return machine.ssh("systemctl " + " ".join(args)).stdout.strip()

    def main_pid(self, machine: Machine, unit: str) -> int:
        """A unit's main pid (in the machine's PID namespace)."""
        return int(self.systemctl(machine, "show", "-p", "MainPID", "--value", unit))

    def record(self, what: str, seconds: float) -> None:
        """Keep a measured figure for the summary."""
        self.timings.setdefault(what, []).append(seconds)
