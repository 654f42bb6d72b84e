"""A whole hafo cluster on one machine: etcd, controllers and agents with simulated GPUs.

Used by ``hafo demo``, the integration tests and the benchmarks. Every process is started
here and stopped here by pid; each node runs under its own ``nodeinit``, so ``power_off`` kills
exactly that node's processes, all at once. As root, a node is a machine in miniature
(``hafo.local.nodeinit``): its own PID, mount and time namespaces, boot id and cgroup, all new
at every power-on, while its state directory stays, as a disk does. The pids a node's agent
reports are in the node's numbering: ``host_pid`` translates them.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hafo.agent import cgroups
from hafo.local.etcd import EtcdCluster
from hafo.local.procs import (
    descendants,
    free_port,
    kill_pid,
    node_cgroups,
    ns_pids,
    pid_alive,
    remove_cgroup_tree,
    spawn,
    stop_process,
    wait_until,
)
from hafo.local.progress import read_progress
from hafo.model.cluster import ClusterSnapshot
from hafo.model.spec import WorkloadSpec, parse_spec
from hafo.model.timing_profile import PROFILES
from hafo.store import EtcdStore, Keys, WatchEvent, intents, read_snapshot


@dataclass
class NodeHandle:
    """One simulated node."""

    name: str
    config_path: Path
    state_dir: Path
    api_port: int
    faults_file: Path
    log_path: Path
    init: subprocess.Popen[bytes] | None = None
    proxy: subprocess.Popen[bytes] | None = None
    cgroup: Path | None = None  # the node's cgroup (None: the host's)
    boot_id_file: Path | None = None  # the node's boot id (None: no namespaces of its own)
    memory_dir: Path | None = None  # the node's RAM (node.memory_dir): lost in a power loss
    last_agent_pid: int | None = None  # the host pid the agent had when last seen (this boot)

    @property
    def pidfile(self) -> Path:
        """Where nodeinit writes the agent's pid."""
        return self.state_dir.parent / f"{self.name}.agent.pid"

    def agent_pid(self) -> int | None:
        """The agent's pid on the host (None before it started, or once it exited: then
        ``last_agent_pid`` says which it was)."""
        try:
            pid = self.host_pid(int(self.pidfile.read_text()))
        except (OSError, ValueError):
            return None
        if pid is not None:
            self.last_agent_pid = pid
        return pid

    def powered(self) -> bool:
        """True while the node's init process lives."""
        return self.init is not None and self.init.poll() is None

    def host_pid(self, pid: int | None) -> int | None:
        """The host's number of the node's process ``pid`` (as the node numbers it), or None
        if the node runs no such process."""
        return self.processes().get(pid) if pid else None

    def processes(self, children: dict[int, list[int]] | None = None) -> dict[int, int]:
        """Every process of the node now: its number on the node -> its number on the host
        (``children``: a ``children_map()`` already taken)."""
        if not self.powered():
            return {}
        assert self.init is not None
        tree = descendants(self.init.pid, children)
        if not self.isolated:
            return {pid: pid for pid in tree}
        out: dict[int, int] = {}
        for host in tree:
            numbers = ns_pids(host)
            if len(numbers) > 1:  # the outer nodeinit is the host's alone
                out[numbers[-1]] = host
        return out

    def boot(self) -> str:
        """The node's current boot id ("" when it has none of its own or is off)."""
        if self.boot_id_file is None or not self.powered():
            return ""
        try:
            return self.boot_id_file.read_text().strip()
        except OSError:
            return ""

    @property
    def isolated(self) -> bool:
        """The node runs in namespaces of its own (its pids are not the host's)."""
        return self.boot_id_file is not None

    def agent_alive(self) -> bool:
        """True while the node is powered and the agent of its pidfile lives (a powered node
        whose agent exited: False; ``LocalCluster.restart_agent`` starts it again)."""
        return self.powered() and pid_alive(self.agent_pid())


@dataclass
class ControllerHandle:
    """One controller process."""

    name: str
    config_path: Path
    api_port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def running(self) -> bool:
        """True while the controller process lives."""
        return self.proc is not None and self.proc.poll() is None


@dataclass
class LocalCluster:
    """Start, fault and stop a local cluster. Process control is synchronous; reading cluster
    state is async (it talks to etcd)."""

    base_dir: Path | None = None
    nodes: int = 3
    controllers: int = 2
    etcd_members: int = 1
    gpus_per_node: int = 4
    #: the timing profile (hafo.model.timing_profile): etcd's raft timing and the daemons'
    #: ``timing.profile``; ``lease_ttl`` and ``heartbeat`` default to its (0: the profile's)
    profile: str = "default"
    lease_ttl: int = 0
    heartbeat: float = 0.0
    failsafe_max: float | None = None  # timing.failsafe_max of every daemon (default 300 s)
    cluster: str = "default"
    keep: bool = False
    partitionable: bool = False
    api_token: str | None = None  # controllers then refuse mutations without it
    #: team name -> {"token", "queues"}: the controllers' api.team_tokens_file (with api_token)
    team_tokens: dict[str, Any] | None = None
    #: more sections of every controller's config (e.g. ``{"fair_sharing": {...}}``)
    controller_config: dict[str, Any] = field(default_factory=dict)
    isolate: bool = True  # nodes in namespaces and cgroups of their own, where root can
    health: dict[str, Any] = field(default_factory=lambda: {"interval": 0.5, "hold_down": 5})
    node_handles: dict[str, NodeHandle] = field(default_factory=dict)
    controller_handles: dict[str, ControllerHandle] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._own_dir = self.base_dir is None
        self.base = Path(self.base_dir or tempfile.mkdtemp(prefix="hafo-local-"))
        self.checkpoint_root = self.base / "checkpoints"
        timing = PROFILES[self.profile]
        self.lease_ttl = self.lease_ttl or timing.lease_ttl
        self.heartbeat = self.heartbeat or timing.heartbeat
        self.etcd = EtcdCluster(self.base / "etcd", size=self.etcd_members, profile=timing)
        self.keys = Keys(self.cluster)
        self._store: EtcdStore | None = None
        # unique per cluster: several clusters (tests beside each other) may share a base name
        self.cgroup_base = (node_cgroups(f"{os.getpid()}.{uuid.uuid4().hex[:8]}")
                            if self.isolate else None)

    # -- configuration --------------------------------------------------------------------

    def _common(self, endpoints: list[str] | None = None) -> dict[str, Any]:
        return {"cluster": self.cluster, "etcd": {"endpoints": endpoints or self.etcd.endpoints},
                "timing": {"profile": self.profile, "lease_ttl": self.lease_ttl,
                           "heartbeat": self.heartbeat,
                           **({"failsafe_max": self.failsafe_max}
                              if self.failsafe_max is not None else {})},
                "checkpoint": {"root": str(self.checkpoint_root)}, "log": {"format": "json"}}

    def _write_config(self, path: Path, data: dict[str, Any]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(data))

    def add_node(self, name: str, labels: dict[str, str] | None = None) -> NodeHandle:
        """Describe (not start) a node."""
        node_dir = self.base / "nodes" / name
        handle = NodeHandle(name=name, config_path=self.base / "config" / f"{name}.yaml",
                            state_dir=node_dir / "state", api_port=free_port(),
                            faults_file=node_dir / "faults.json",
                            log_path=self.base / "logs" / f"{name}.log",
                            cgroup=self.cgroup_base / name if self.cgroup_base else None,
                            boot_id_file=node_dir / "boot_id" if self.cgroup_base else None,
                            memory_dir=node_dir / "ram")
        endpoints = None
        if self.partitionable:  # the node reaches etcd only through its own proxy
            routes = [(free_port(), m.client_port) for m in self.etcd.members]
            endpoints = [f"http://127.0.0.1:{listen}" for listen, _ in routes]
            handle.proxy = spawn([sys.executable, "-m", "hafo.local.proxy",
                                  *[f"{a}:{b}" for a, b in routes]],
                                 self.base / "logs" / f"{name}.proxy.log")
        self._write_config(handle.config_path, {
            **self._common(endpoints), "api": {"listen": f"127.0.0.1:{handle.api_port}"},
            "health": {"min_free_mib": 64, **self.health},
            "node": {"name": name, "labels": labels or {"zone": "local"},
                     "state_dir": str(handle.state_dir),
                     "memory_dir": str(handle.memory_dir),
                     "gpus": {"simulate": {"count": self.gpus_per_node,
                                           "faults_file": str(handle.faults_file)}}}})
        self.node_handles[name] = handle
        return handle

    def add_controller(self, name: str) -> ControllerHandle:
        """Describe (not start) a controller."""
        handle = ControllerHandle(name=name, config_path=self.base / "config" / f"{name}.yaml",
                                  api_port=free_port(),
                                  log_path=self.base / "logs" / f"{name}.log")
        api: dict[str, Any] = {"listen": f"127.0.0.1:{handle.api_port}"}
        if self.api_token is not None:
            token_file = self.base / "config" / "api-token"
            token_file.parent.mkdir(parents=True, exist_ok=True)
            token_file.touch(mode=0o600)
            token_file.write_text(self.api_token + "\n")
            api["token_file"] = str(token_file)
        if self.team_tokens is not None:
            teams_file = self.base / "config" / "team-tokens.yaml"
            teams_file.parent.mkdir(parents=True, exist_ok=True)
            teams_file.touch(mode=0o600)
            teams_file.write_text(yaml.safe_dump({"teams": self.team_tokens}))
            api["team_tokens_file"] = str(teams_file)
        self._write_config(handle.config_path, {
            **self._common(), **self.controller_config, "api": api,
            "controller": {"name": name}})
        self.controller_handles[name] = handle
        return handle

    # -- processes --------------------------------------------------------------------------

    def node_env(self, name: str) -> dict[str, str]:
        """The environment of a node's processes: this one's, with the node's own temporary
        directory (each machine has its own ``/tmp``), which goes with the cluster."""
        tmp = self.base / "nodes" / name / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        return {**os.environ, "TMPDIR": str(tmp)}

    def start_node(self, name: str) -> None:
        """Power a node on: nodeinit, which starts the agent."""
        handle = self.node_handles[name]
        handle.state_dir.mkdir(parents=True, exist_ok=True)
        handle.pidfile.unlink(missing_ok=True)
        handle.last_agent_pid = None
        machine = []
        if handle.cgroup is not None and handle.boot_id_file is not None:
            machine = ["--cgroup", str(handle.cgroup), "--boot-id-file", str(handle.boot_id_file)]
        handle.init = spawn([sys.executable, "-m", "hafo.local.nodeinit", str(handle.pidfile),
                             *machine, "--", sys.executable, "-m", "hafo", "agent", "--config",
                             str(handle.config_path)], handle.log_path,
                            env=self.node_env(name))

    def start_controller(self, name: str) -> None:
        """Start a controller process."""
        handle = self.controller_handles[name]
        handle.proc = spawn([sys.executable, "-m", "hafo", "controller", "--config",
                             str(handle.config_path)], handle.log_path)

    def start(self) -> None:
        """Start etcd, the controllers and the nodes (use ``wait_ready`` after)."""
        self.etcd.start()
        for i in range(1, self.controllers + 1):
            self.start_controller(self.add_controller(f"ctl-{i}").name)
        for i in range(1, self.nodes + 1):
            self.start_node(self.add_node(f"node-{i}").name)

    def start_duplicate_agent(self, name: str, tag: str = "dup",
                              same_state_dir: bool = False) -> tuple[
            subprocess.Popen[bytes], Path, int]:
        """Start a second agent that claims node ``name`` (as an operator's copy-paste
        mistake would): its own config and API port, on the node's machine (its namespaces
        and cgroup) but outside its process tree, with its own state directory or
        (``same_state_dir``) the node's. Returns (process, state dir, API port); stop it by
        pid (signals to the process reach the agent)."""
        handle = self.node_handles[name]
        config = yaml.safe_load(handle.config_path.read_text())
        state_dir = (Path(config["node"]["state_dir"]) if same_state_dir
                     else self.base / "nodes" / f"{name}-{tag}" / "state")
        port = free_port()
        config["node"]["state_dir"] = str(state_dir)
        config["api"]["listen"] = f"127.0.0.1:{port}"
        path = self.base / "config" / f"{name}-{tag}.yaml"
        self._write_config(path, config)
        argv = [sys.executable, "-m", "hafo", "agent", "--config", str(path)]
        init = handle.processes().get(1) if handle.isolated else None
        if init is not None:  # on that machine: its namespaces and cgroup, as a second unit
            argv = [sys.executable, "-m", "hafo.local.nodeinit", "--enter", str(init),
                    *(["--cgroup", str(handle.cgroup)] if handle.cgroup else []), "--", *argv]
        proc = spawn(argv, self.base / "logs" / f"{name}-{tag}.log", env=self.node_env(name))
        return proc, state_dir, port

    def move_state_dir(self, name: str, tag: str = "moved") -> Path:
        """Point the node's agent at a new, empty state directory (an upgrade that moved it,
        a wiped disk): takes effect at the agent's next start. Returns the new directory."""
        handle = self.node_handles[name]
        config = yaml.safe_load(handle.config_path.read_text())
        state_dir = self.base / "nodes" / name / tag
        config["node"]["state_dir"] = str(state_dir)
        self._write_config(handle.config_path, config)
        return state_dir

    def node_pids(self, name: str) -> list[int]:
        """Every live process of a node: its init and all descendants."""
        handle = self.node_handles[name]
        if not handle.powered():
            return []
        assert handle.init is not None
        return [handle.init.pid, *descendants(handle.init.pid)]

    def inject_fault(self, name: str, gpu: int, **fault: Any) -> None:
        """Write a simulated GPU fault (``xid=48``, ``lost=True``...) into the node's faults
        file; no keywords clears that GPU's faults."""
        handle = self.node_handles[name]
        try:
            faults = json.loads(handle.faults_file.read_text())
        except (OSError, ValueError):
            faults = {}
        faults[str(gpu)] = fault
        faults = {k: v for k, v in faults.items() if v}
        handle.faults_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = handle.faults_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(faults))
        tmp.replace(handle.faults_file)

    def power_off(self, name: str) -> list[int]:
        """Power loss: every process of the node killed at once (its cgroup, then its whole
        tree, frozen first), its cgroups and its RAM (``node.memory_dir``) gone, as after a
        reboot; its state directory stays. Returns the host pids killed."""
        handle = self.node_handles[name]
        pids = self.node_pids(name)
        if handle.cgroup is not None:
            cgroups.kill(handle.cgroup)
        frozen: set[int] = set(pids)
        while True:
            pids = [p for p in self.node_pids(name) if p not in frozen]
            if not pids:
                break
            for pid in pids:
                kill_pid(pid, signal.SIGSTOP)
            frozen.update(pids)
        for pid in frozen:
            kill_pid(pid, signal.SIGKILL)
        if handle.init is not None:
            handle.init.wait(5)
        wait_until(lambda: not any(pid_alive(p) for p in frozen), 5.0, interval=0.005)
        if handle.cgroup is not None:
            remove_cgroup_tree(handle.cgroup)
        if handle.memory_dir is not None:  # RAM does not outlive the power
            shutil.rmtree(handle.memory_dir, ignore_errors=True)
        return sorted(frozen)

    def host_pid(self, node: str, pid: int | None) -> int | None:
        """The host's number of node ``node``'s process ``pid`` as the node numbers it (an
        agent's report, a progress log), or None if the node runs no such process now."""
        return self.node_handles[node].host_pid(pid)

    def power_on(self, name: str) -> bool:
        """Power a node on again after ``power_off`` (same name, config and state directory):
        False if it is already powered."""
        if self.node_handles[name].powered():
            return False
        self.start_node(name)
        return True

    def kill_agent(self, name: str) -> int | None:
        """SIGKILL the agent process alone (its guards and workloads stay)."""
        pid = self.node_handles[name].agent_pid()
        if pid is not None:
            kill_pid(pid, signal.SIGKILL)
        return pid

    def freeze_agent(self, name: str) -> int | None:
        """SIGSTOP the agent alone (a hung daemon); its guards keep watching the deadline."""
        pid = self.node_handles[name].agent_pid()
        if pid is not None:
            kill_pid(pid, signal.SIGSTOP)
        return pid

    def thaw_agent(self, name: str) -> None:
        """SIGCONT a frozen agent."""
        pid = self.node_handles[name].agent_pid()
        if pid is not None:
            kill_pid(pid, signal.SIGCONT)

    def partition(self, name: str) -> None:
        """Cut the node off from etcd (needs ``partitionable``)."""
        proxy = self.node_handles[name].proxy
        assert proxy is not None, "LocalCluster(partitionable=True) is needed"
        kill_pid(proxy.pid, signal.SIGUSR1)

    def heal(self, name: str) -> None:
        """Reconnect a partitioned node."""
        proxy = self.node_handles[name].proxy
        assert proxy is not None, "LocalCluster(partitionable=True) is needed"
        kill_pid(proxy.pid, signal.SIGUSR2)

    def freeze_controller(self, name: str) -> None:
        """SIGSTOP a controller."""
        proc = self.controller_handles[name].proc
        if proc is not None:
            kill_pid(proc.pid, signal.SIGSTOP)

    def thaw_controller(self, name: str) -> None:
        """SIGCONT a controller."""
        proc = self.controller_handles[name].proc
        if proc is not None:
            kill_pid(proc.pid, signal.SIGCONT)

    def restart_agent(self, name: str) -> None:
        """Start the node's agent again after it died (its nodeinit respawns it)."""
        handle = self.node_handles[name]
        if handle.init is not None:
            kill_pid(handle.init.pid, signal.SIGUSR1)

    def kill_controller(self, name: str) -> None:
        """SIGKILL a controller."""
        handle = self.controller_handles[name]
        if handle.proc is not None and handle.proc.poll() is None:
            handle.proc.kill()
            handle.proc.wait(5)

    def stop(self) -> None:
        """Stop everything by pid and remove the temp directory (unless ``keep``)."""
        for name in self.node_handles:
            self.power_off(name)
        for handle in self.controller_handles.values():
            if handle.proc is not None:
                kill_pid(handle.proc.pid, signal.SIGCONT)
                stop_process(handle.proc, grace=3.0)
        for node in self.node_handles.values():
            if node.proxy is not None:
                stop_process(node.proxy, grace=2.0)
        self.etcd.stop()
        if self.cgroup_base is not None:
            remove_cgroup_tree(self.cgroup_base)
        if self._own_dir and not self.keep:
            shutil.rmtree(self.base, ignore_errors=True)

    def leftover_pids(self) -> list[int]:
        """Processes of this cluster still alive (should be none after ``stop``)."""
        pids = [m.proc.pid for m in self.etcd.members if m.proc is not None]
        pids += [h.proc.pid for h in self.controller_handles.values() if h.proc is not None]
        pids += [h.init.pid for h in self.node_handles.values() if h.init is not None]
        pids += [h.proxy.pid for h in self.node_handles.values() if h.proxy is not None]
        return [p for p in pids if pid_alive(p)]

    # -- state ------------------------------------------------------------------------------

    @property
    def store(self) -> EtcdStore:
        """A store client for the current event loop."""
        if self._store is None:
            self._store = EtcdStore(self.etcd.endpoints)
        return self._store

    async def close_store(self) -> None:
        """Close the store client (before the event loop ends)."""
        if self._store is not None:
            await self._store.close()
            self._store = None

    async def snapshot(self) -> ClusterSnapshot:
        """The cluster state now."""
        return await read_snapshot(self.store, self.keys)

    async def wait_for(self, predicate: Any, timeout: float, interval: float = 0.05,
                       what: str = "condition") -> ClusterSnapshot:
        """Poll snapshots until ``predicate(snapshot)`` holds; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            snapshot = await self.snapshot()
            if predicate(snapshot):
                return snapshot
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
            await asyncio.sleep(interval)

    def watch_expiry(self, node: str, from_revision: int) -> asyncio.Task[float]:
        """A task that resolves to the wall-clock time etcd deletes ``node``'s liveness key
        (its lease expired), watching from ``from_revision``."""

        async def watch() -> float:
            async for event in self.store.watch_prefix(self.keys.alive(node), from_revision):
                if isinstance(event, WatchEvent) and event.kind == "delete":
                    return time.time()
            raise RuntimeError("watch ended")  # pragma: no cover - watches do not end

        return asyncio.create_task(watch())

    async def etcd_leader_index(self) -> int | None:
        """Index (in ``etcd.members``) of the raft leader, as the members report it."""
        ids: dict[int, int] = {}
        leaders: set[int] = set()
        for index, member in enumerate(self.etcd.members):
            if not member.running():
                continue
            view = await self.store.member_view("127.0.0.1", member.client_port, 1.0)
            if view is not None:
                ids[view[0]] = index
                if view[1]:
                    leaders.add(view[1])
        for leader in leaders:
            if leader in ids:
                return ids[leader]
        return None

    async def wait_ready(self, timeout: float = 30.0) -> ClusterSnapshot:
        """Until every running controller serves, a leader is elected and every powered node
        is ready."""
        names = [n for n, h in self.node_handles.items() if h.powered()]
        controllers = {n for n, h in self.controller_handles.items() if h.running()}
        return await self.wait_for(
            lambda s: s.leader is not None and controllers <= set(s.controllers)
            and controllers <= set(s.failsafe.members)
            and all(s.node_state(n) == "ready" for n in names)
            and all(s.nodes[n].failsafe_seen >= s.failsafe.version for n in names),
            timeout, what="controllers, leader, failsafe set and ready nodes")

    async def submit(self, spec: WorkloadSpec | dict[str, Any]) -> str:
        """Submit a workload; returns its id."""
        parsed = spec if isinstance(spec, WorkloadSpec) else parse_spec(spec)
        return (await intents.submit(self.store, self.keys, parsed)).submission.id

    def progress_log(self, workload: str) -> list[dict[str, Any]]:
        """Lines the built-in workload wrote (see ``hafo.local.progress``)."""
        return read_progress(self.checkpoint_root / workload / "progress.jsonl")


async def lose_etcd_data(cluster: LocalCluster) -> None:
    """etcd loses its data: every member killed, its data directory removed, started again as
    a new, empty cluster (the harness's own store client closed first)."""
    await cluster.close_store()
    await asyncio.to_thread(cluster.etcd.start_empty, 30.0)


def demo_workload_spec(name: str = "train-demo", steps: int = 0, interval: float = 0.05,
                       every: int = 10, gpus: int = 1, fail_at: int = 0,
                       stall_at: int = 0, escape: bool = False,
                       warm: bool = False) -> dict[str, Any]:
    """Spec of the built-in checkpointing workload (``python -m hafo.local.workload``);
    ``escape``: it leaves a process behind that escapes its tree and environment; ``warm``:
    it speaks the warm protocol (a ``warm`` gang's member, no torch)."""
    command = [sys.executable, "-u", "-m", "hafo.local.workload", "--steps", str(steps),
               "--interval", str(interval), "--every", str(every)]
    if fail_at:
        command += ["--fail-at", str(fail_at)]
    if stall_at:
        command += ["--stall-at", str(stall_at)]
    if escape:
        command += ["--escape"]
    if warm:
        command += ["--warm"]
    return {"name": name, "command": command, "gpus": gpus, "stop_grace": 5,
            "restart": {"max_restarts": 3, "window": 600}, **({"warm": True} if warm else {})}
