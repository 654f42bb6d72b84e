"""The running ``hafo dev``: a local cluster that stays up until a signal, and the server of
its control socket.

``run_dev`` starts etcd, 2 controllers and N agents with simulated GPUs
(``hafo.local.cluster.LocalCluster``, every process a descendant of this one), prints the
``export HAFO_ETCD=... HAFO_CLUSTER=... HAFO_DEV=...`` line, the dashboard URLs and the node
names (``banner``), then serves control requests (``hafo.local.dev_protocol``) on the UNIX
socket ``$HAFO_DEV/control.sock`` until SIGINT, SIGTERM or SIGHUP. Stopping kills every
process it started, by pid (a second signal while stopping SIGKILLs what is left at once), and
removes its temporary directory (a ``--dir`` given by the user is kept, without the socket).

Importing this module is cheap: the cluster machinery is imported when a cluster starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hafo.local.dev_client import call
from hafo.local.dev_protocol import (
    MAX_REQUEST,
    SOCKET_NAME,
    UNAVAILABLE,
    USAGE,
    ControllerState,
    ControlReply,
    ControlRequest,
    DevStatus,
    DevUnavailable,
    NodeState,
    check_request,
    parse_request,
    socket_path,
)
from hafo.stopping import on_signals

if TYPE_CHECKING:
    from hafo.local.cluster import LocalCluster

CONTROLLERS = 2
#: the longest path a UNIX socket may have on Linux (sun_path is 108 bytes, NUL included)
MAX_SOCKET_PATH = 107
#: same rule as the daemon config's ``cluster`` field (hafo.model.config)
CLUSTER_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
AGENT_RESTART = 10.0  # seconds power-on waits for a dead agent to start again
#: the signals that stop the dev cluster (SIGHUP: its terminal closed)
DEV_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def export_line(etcd: Sequence[str], cluster: str, dev_dir: Path) -> str:
    """The shell line that points the CLI (and ``hafo dev`` commands) at this cluster."""
    return (f"export HAFO_ETCD={shlex.quote(','.join(etcd))} "
            f"HAFO_CLUSTER={shlex.quote(cluster)} HAFO_DEV={shlex.quote(str(dev_dir))}")


@dataclass(frozen=True)
class Found:
    """What the example specs need that ``hafo dev`` looks for, and whether it found it:
    ``python`` (the agents' workloads run its ``python3``: ``hafo dev`` puts its directory
    first on their PATH), whether ``torch`` imports there, whether ``torchrun`` is on that
    PATH, whether the ``openai`` check plugin is installed."""

    python: str
    torch: bool
    torchrun: bool
    openai_check: bool

    @classmethod
    def here(cls) -> Found:
        """Look (nothing is imported: torch takes seconds)."""
        import importlib.util
        from importlib.metadata import entry_points

        from hafo.checks.api import ENTRY_POINT_GROUP

        return cls(python=sys.executable, torch=importlib.util.find_spec("torch") is not None,
                   torchrun=shutil.which("torchrun") is not None,
                   openai_check=any(ep.name == "openai"
                                    for ep in entry_points(group=ENTRY_POINT_GROUP)))


def example_lines(found: Found, nodes: int) -> list[str]:
    """What each spec of examples/ needs beyond hafo and whether this cluster has it: every
    one runs as shipped only where all of it is there (``make test``'s environment, 3 nodes);
    ``make demo`` installs what counter.yaml and service.yaml need. Each spec's header says
    the same."""
    def nodes_for(count: int) -> list[str]:
        return [] if nodes >= count else [f"{count} nodes (this cluster has {nodes})"]

    torch = [] if found.torch else [f"torch for {found.python} (pip install torch)"]
    torchrun = [] if found.torchrun or not found.torch else ["torchrun on the PATH"]
    plugin = ([] if found.openai_check
              else ["its check plugin (pip install -e plugins/hafo-check-openai)"])
    rows = [("counter.yaml", "a training loop with hafo.checkpoint", []),
            ("service.yaml", "3 HTTP replicas, one per node", nodes_for(3)),
            ("train.yaml", "a PyTorch MLP", torch),
            ("ddp.yaml", "PyTorch DDP under torchrun, a gang of 2 nodes",
             [*torch, *torchrun, *nodes_for(2)]),
            ("openai-service.yaml", "2 replicas judged by the openai check",
             [*plugin, *nodes_for(2)])]
    lines = ["examples/ (each file's header says what it needs):"]
    for name, what, lacks in rows:
        lines.append(f"  {name:<20} {what}: " + (f"needs {'; '.join(lacks)}" if lacks
                                                  else "runs here as shipped"))
    return lines


def banner(status: DevStatus, took: float, temporary: bool,
           found: Found | None = None, timing: str = "") -> list[str]:
    """What ``hafo dev`` prints once the cluster is ready (``found``: what the examples need
    that it found, for a line on each; None: no such lines; ``timing``: the timing line)."""
    first = status.nodes[0].name if status.nodes else "node-1"
    dashboards = "  ".join(c.dashboard for c in status.controllers)
    lines = [
        f"hafo dev: cluster {status.cluster!r} ready in {took:.1f}s: etcd, "
        f"{len(status.controllers)} controllers, {len(status.nodes)} nodes with "
        f"{status.gpus_per_node} simulated GPUs each",
        "",
        "In another terminal, paste:",
        "",
        f"  {export_line(status.etcd, status.cluster, Path(status.dir))}",
        "",
        f"dashboard: {dashboards}",
        f"nodes:     {' '.join(n.name for n in status.nodes)}",
        f"logs:      {Path(status.dir) / 'logs'}",
        *([f"timing:    {timing}"] if timing else []),
        "",
        "Then try:",
        "  hafo submit examples/counter.yaml",
        "  hafo workloads --watch",
        f"  hafo dev power-off {first}                  # power loss: every process of the node",
        f"  hafo dev power-on {first}",
        f"  hafo dev fault {first} --gpu 0 --xid 79     # or --lost, --ecc-dbe N, --thermal C;"
        " --clear",
        "  hafo dev status",
        "",
        *([*example_lines(found, len(status.nodes)), ""] if found is not None else []),
        "Ctrl-C stops everything" + (f" and removes {status.dir}" if temporary
                                     else f" (state stays in {status.dir})") + ".",
    ]
    return lines


@dataclass(frozen=True)
class DevOptions:
    """``hafo dev``'s flags."""

    nodes: int = 3
    gpus: int = 4
    cluster: str = "dev"
    dir: Path | None = None  # keep state here (not removed); None: a temporary directory
    profile: str = "default"  # the timing profile (hafo.model.timing_profile)


def say(text: str = "") -> None:
    """Print a line at once; a closed terminal (SIGHUP) must not stop the clean-up."""
    with contextlib.suppress(OSError, ValueError):
        print(text, flush=True)


class DevError(Exception):
    """``hafo dev`` cannot start: one line, with an exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def prepare_dir(options: DevOptions) -> tuple[Path, bool]:
    """The dev cluster's directory and whether it is temporary (removed at the end).
    DevError (exit 2) when ``--dir`` cannot hold it."""
    if options.dir is None:
        base = Path(tempfile.mkdtemp(prefix="hafo-dev-"))
        temporary = True
    else:
        base = options.dir.resolve()
        temporary = False
        if base.exists() and not base.is_dir():
            raise DevError(f"--dir: {options.dir} is not a directory", USAGE)
        if socket_path(base).exists():
            with contextlib.suppress(DevUnavailable):
                call(base, ControlRequest("status"), timeout=5.0)
                raise DevError(f"--dir: a dev cluster already runs in {base}", USAGE)
            socket_path(base).unlink(missing_ok=True)  # left by a killed hafo dev
        if (base / "etcd").exists():
            raise DevError(f"--dir: {base} holds an earlier dev cluster's state; remove it or "
                           "pick another directory", USAGE)
        try:
            base.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DevError(f"--dir: cannot create {options.dir}: {exc.strerror}", USAGE) from None
    if len(str(socket_path(base))) > MAX_SOCKET_PATH:
        if temporary:
            shutil.rmtree(base, ignore_errors=True)
        raise DevError(f"--dir: {base} is too long for a UNIX socket path "
                       f"({MAX_SOCKET_PATH} bytes at most, with /{SOCKET_NAME})", USAGE)
    return base, temporary


class DevCluster:
    """The running dev cluster: started, controlled through its socket, stopped on a signal.

    Signals never interrupt a step (they are handled by the event loop): the first one asks
    for a stop, which waits for the current step and then stops everything by pid; a second
    one while stopping SIGKILLs every process left, at once.
    """

    def __init__(self, options: DevOptions, base: Path, temporary: bool) -> None:
        from hafo.local.cluster import LocalCluster

        self.options = options
        self.base = base
        self.temporary = temporary
        self.cluster: LocalCluster = LocalCluster(
            base_dir=base, nodes=options.nodes, controllers=CONTROLLERS,
            gpus_per_node=options.gpus, cluster=options.cluster, profile=options.profile)
        self.stop_requested = asyncio.Event()
        self.signals = 0
        self.stopping = False
        self.lock = asyncio.Lock()
        self.server: asyncio.AbstractServer | None = None

    # -- signals ------------------------------------------------------------------------------

    def on_signal(self, signum: int) -> None:
        """First signal: stop. Later ones while stopping: SIGKILL what is left now."""
        self.signals += 1
        name = signal.Signals(signum).name
        if self.signals == 1:
            say(f"\nhafo dev: {name}: stopping every process of the dev cluster...")
            self.stop_requested.set()
        else:
            say(f"hafo dev: {name} again: killing what is left at once (SIGKILL)")
            self.kill_all()

    def kill_all(self) -> list[int]:
        """SIGKILL every process this one started (its descendants), by pid."""
        from hafo.local.procs import descendants, kill_pid

        pids = descendants(os.getpid())
        for pid in pids:
            kill_pid(pid, signal.SIGKILL)
        return pids

    # -- state --------------------------------------------------------------------------------

    def status(self) -> DevStatus:
        """Who is powered and running, and the faults files."""
        c = self.cluster
        nodes = []
        for handle in c.node_handles.values():
            try:
                faults = json.loads(handle.faults_file.read_text())
            except (OSError, ValueError):
                faults = {}
            powered = handle.powered()
            nodes.append(NodeState(name=handle.name, powered=powered,
                                   agent_pid=(handle.agent_pid() or handle.last_agent_pid)
                                   if powered else None,
                                   api=f"http://127.0.0.1:{handle.api_port}",
                                   faults=faults if isinstance(faults, dict) else {},
                                   agent_alive=handle.agent_alive() if powered else None))
        controllers = [ControllerState(name=h.name, running=h.running(),
                                       dashboard=f"http://127.0.0.1:{h.api_port}/")
                       for h in c.controller_handles.values()]
        return DevStatus(cluster=c.cluster, dir=str(self.base), etcd=list(c.etcd.endpoints),
                         gpus_per_node=self.options.gpus, controllers=controllers, nodes=nodes)

    # -- control requests ---------------------------------------------------------------------

    async def handle(self, request: ControlRequest) -> ControlReply:
        """Act on one control request (one at a time)."""
        names = list(self.cluster.node_handles)
        refused = check_request(request, names, self.options.gpus)
        if refused is not None:
            return refused
        async with self.lock:
            if self.stopping:
                return ControlReply(False, "the dev cluster is stopping", UNAVAILABLE)
            node = request.node or ""
            if request.action == "power-off":
                if not self.cluster.node_handles[node].powered():
                    return ControlReply(True, f"{node} is already powered off",
                                        status=self.status())
                pids = await asyncio.to_thread(self.cluster.power_off, node)
                message = (f"{node} powered off: killed {len(pids)} processes at once "
                           f"(pids {' '.join(map(str, pids))})")
            elif request.action == "power-on":
                handle = self.cluster.node_handles[node]
                if handle.powered() and not handle.agent_alive():
                    return await self._restart_agent(node)
                if not await asyncio.to_thread(self.cluster.power_on, node):
                    return ControlReply(True, f"{node} is already powered on (agent pid "
                                        f"{handle.agent_pid()})", status=self.status())
                message = f"{node} powered on: its agent starts again"
            elif request.action == "fault":
                assert request.fault is not None and request.gpu is not None  # check_request
                entry = request.fault.entry()
                await asyncio.to_thread(self.cluster.inject_fault, node, request.gpu, **entry)
                message = (f"{node} GPU {request.gpu}: {request.fault.describe()} "
                           f"(written to {self.cluster.node_handles[node].faults_file})")
            else:
                return ControlReply(True, "ok", status=self.status())
            say(f"hafo dev: {message}")
            return ControlReply(True, message, status=self.status())

    async def _restart_agent(self, node: str) -> ControlReply:
        """``power-on`` of a powered node whose agent exited: its nodeinit starts the agent
        again (its guards and workloads, if any, stayed). Fails (exit 3) if no live agent
        appears within ``AGENT_RESTART`` seconds."""
        from hafo.local.procs import wait_until

        handle = self.cluster.node_handles[node]
        old = handle.agent_pid() or handle.last_agent_pid
        await asyncio.to_thread(self.cluster.restart_agent, node)
        started = await asyncio.to_thread(
            wait_until, lambda: handle.agent_pid() != old and handle.agent_alive(),
            AGENT_RESTART)
        if not started:
            return ControlReply(False, f"{node} is powered on but its agent (pid {old}) had "
                                f"exited, and it did not start again within {AGENT_RESTART:g}"
                                f" s: see {handle.log_path}", UNAVAILABLE,
                                status=self.status())
        message = (f"{node} was powered on but its agent (pid {old}) had exited: agent "
                   f"started again (pid {handle.agent_pid()})")
        say(f"hafo dev: {message}")
        return ControlReply(True, message, status=self.status())

    async def serve_client(self, reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter) -> None:
        """One connection: one request line, one reply line (a bad request: one line naming
        what is wrong, exit code 2)."""
        try:
            try:
                line = await asyncio.wait_for(reader.readline(), 10.0)
            except ValueError:  # no newline within the reader's limit (MAX_REQUEST)
                parsed: ControlRequest | ControlReply = ControlReply(
                    False, f"request: longer than {MAX_REQUEST} bytes", USAGE)
            else:
                parsed = parse_request(line)
            reply = parsed if isinstance(parsed, ControlReply) else await self.handle(parsed)
            writer.write(reply.to_json().encode() + b"\n")
            await writer.drain()
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    # -- life cycle ---------------------------------------------------------------------------

    async def run(self) -> int:
        """Start, print, serve until a signal, stop. Returns the exit code."""
        code = 1
        try:
            with contextlib.ExitStack() as handlers:
                for signum in DEV_SIGNALS:
                    handlers.enter_context(on_signals(
                        functools.partial(self.on_signal, signum), (signum,)))
                try:
                    code = await self._start_and_serve()
                finally:
                    if await self._stop():
                        code = 1
        finally:
            for signum in DEV_SIGNALS:
                # stopped: a late Ctrl-C must not kill the exit itself (status -2)
                with contextlib.suppress(ValueError):  # not the main thread: none installed
                    signal.signal(signum, signal.SIG_IGN)
        return code

    async def _start_and_serve(self) -> int:
        started = time.monotonic()
        say(f"hafo dev: starting etcd, {CONTROLLERS} controllers and {self.options.nodes} "
            f"nodes with {self.options.gpus} simulated GPUs each (in {self.base})")
        try:
            await asyncio.to_thread(self.cluster.start)
        except Exception as exc:  # etcd missing or not starting: one line, then clean up
            say(f"hafo dev: cannot start the cluster: {exc}")
            return 1
        if self.stop_requested.is_set():
            return 0
        ready = asyncio.create_task(self.cluster.wait_ready(120))
        stop = asyncio.create_task(self.stop_requested.wait())
        await asyncio.wait({ready, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not ready.done():
            ready.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await ready
            return 0
        try:
            ready.result()
            await self._declare_default_queue()
        except Exception as exc:  # not ready in time, or etcd gone: one line, then clean up
            say(f"hafo dev: {exc}; see the logs in {self.base / 'logs'}")
            if self.temporary:
                say(f"hafo dev: keeping {self.base} for its logs")
                self.temporary = False
            return 1
        finally:
            await self.cluster.close_store()
        self.server = await asyncio.start_unix_server(self.serve_client,
                                                      path=str(socket_path(self.base)),
                                                      limit=MAX_REQUEST)
        c = self.cluster
        timing = f"profile {c.profile}, lease TTL {c.lease_ttl}s, heartbeat {c.heartbeat:g}s"
        for line in banner(self.status(), time.monotonic() - started, self.temporary,
                           Found.here(), timing):
            say(line)
        await self.stop_requested.wait()
        return 0

    async def _declare_default_queue(self) -> None:
        """Declare the ``default`` queue, without a quota, when no queue is declared (a
        fresh cluster; a kept ``--dir`` keeps the queues it has): a workload that names no
        queue is in ``default``, so it runs as on a cluster without queues (priority
        preemption included, and whatever nodes are added later)."""
        from hafo.model.queues import DEFAULT_QUEUE, QueueSpec
        from hafo.store import intents

        store, keys = self.cluster.store, self.cluster.keys
        _, declared = await store.get_prefix(keys.queues)
        if not declared:
            await intents.set_queue(store, keys, QueueSpec(name=DEFAULT_QUEUE))

    async def _stop(self) -> list[int]:
        """Stop every process by pid, remove the socket (and a temporary directory); the
        pids still alive afterwards (none, normally)."""
        from hafo.local.procs import descendants, pid_alive

        self.stopping = True
        if self.server is not None:
            self.server.close()
        socket_path(self.base).unlink(missing_ok=True)
        async with self.lock:
            await self.cluster.close_store()
            started = descendants(os.getpid())
            await asyncio.to_thread(self.cluster.stop)
            left = [p for p in [*started, *self.cluster.leftover_pids()] if pid_alive(p)]
            if left:  # a process the cluster did not stop: still ours, still by pid
                self.kill_all()
                await asyncio.sleep(0.5)
                left = [p for p in left if pid_alive(p)]
        if self.temporary:
            shutil.rmtree(self.base, ignore_errors=True)
        if left:
            say(f"hafo dev: processes still running: {' '.join(map(str, sorted(set(left))))}")
        elif self.temporary:
            say(f"hafo dev: stopped; every process is gone and {self.base} is removed")
        else:
            say(f"hafo dev: stopped; every process is gone; state kept in {self.base}")
        return left


def _own_python_first_on_path() -> None:
    """Put this Python's directory first on PATH for every process the cluster starts, so a
    spec's ``python3`` (examples/counter.yaml) is the Python hafo runs on, with hafo
    installed, also when ``hafo dev`` was started as ``.venv/bin/hafo`` without activating
    the virtual environment."""
    own = str(Path(sys.executable).parent)
    parts = os.environ.get("PATH", "").split(os.pathsep)
    if not parts or parts[0] != own:
        os.environ["PATH"] = os.pathsep.join([own, *[p for p in parts if p]])


def run_dev(options: DevOptions) -> int:
    """Run ``hafo dev`` until a signal; 0 after a clean stop. DevError when it cannot start."""
    base, temporary = prepare_dir(options)
    try:
        _own_python_first_on_path()
        dev = DevCluster(options, base, temporary)
    except BaseException:
        if temporary:
            shutil.rmtree(base, ignore_errors=True)
        raise
    return asyncio.run(dev.run())
