"""``hafo dev``: a local cluster that stays up until Ctrl-C, and its control socket.

The running ``hafo dev`` process starts etcd, 2 controllers and N agents with simulated GPUs
(``hafo.local.cluster.LocalCluster``, every process a descendant of this one), prints the
``export HAFO_ETCD=... HAFO_CLUSTER=... HAFO_DEV=...`` line, the dashboard URLs and the node
names, then serves control requests on the UNIX socket ``$HAFO_DEV/control.sock`` (one JSON
line in, one JSON line out) until SIGINT, SIGTERM or SIGHUP. Stopping kills every process it
started, by pid (a second signal while stopping SIGKILLs what is left at once), and removes its
temporary directory (a ``--dir`` given by the user is kept, without the socket).

The protocol types (``ControlRequest``, ``ControlReply``, ``DevStatus``) and ``check_request``
are plain data and pure functions; ``call`` is the client the other ``hafo dev`` commands use.
Importing this module is cheap: the cluster machinery is imported when a cluster starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hafo.local.cluster import LocalCluster

SOCKET_NAME = "control.sock"
ACTIONS = ("status", "power-off", "power-on", "fault")
CONTROLLERS = 2
#: the longest path a UNIX socket may have on Linux (sun_path is 108 bytes, NUL included)
MAX_SOCKET_PATH = 107
#: same rule as the daemon config's ``cluster`` field (hafo.model.config)
CLUSTER_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
MAX_REQUEST = 64 * 1024
AGENT_RESTART = 10.0  # seconds power-on waits for a dead agent to start again

OK, USAGE, UNAVAILABLE, NOT_FOUND = 0, 2, 3, 4  # exit codes (hafo.commands.base)


class DevUnavailable(Exception):
    """No dev cluster answers at the given directory (or the reply was not understood)."""


# -- protocol ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuFault:
    """One simulated GPU's fault, as ``hafo dev fault`` sets it; all empty clears the GPU."""

    xid: int | None = None
    lost: bool = False
    ecc_dbe: int | None = None
    thermal: float | None = None

    def entry(self) -> dict[str, Any]:
        """The GPU's entry in the faults file (docs/contract.md, "Simulated GPUs")."""
        out: dict[str, Any] = {}
        if self.xid is not None:
            out["xid"] = self.xid
        if self.lost:
            out["lost"] = True
        if self.ecc_dbe is not None:
            out["ecc_dbe"] = self.ecc_dbe
        if self.thermal is not None:
            out["thermal"] = self.thermal
        return out

    def describe(self) -> str:
        """Human words for the fault."""
        parts = []
        if self.xid is not None:
            parts.append(f"Xid {self.xid}")
        if self.lost:
            parts.append("fallen off the bus (lost)")
        if self.ecc_dbe is not None:
            parts.append(f"{self.ecc_dbe} double-bit ECC error(s)")
        if self.thermal is not None:
            parts.append(f"thermal slowdown at {self.thermal:g} C")
        return ", ".join(parts) or "no fault (cleared)"


@dataclass(frozen=True)
class ControlRequest:
    """What a ``hafo dev`` control command asks the running dev cluster."""

    action: str
    node: str | None = None
    gpu: int | None = None
    fault: GpuFault | None = None

    def to_json(self) -> str:
        """One line of JSON."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ControlRequest:
        """Parse a request line; ValueError names the bad field."""
        try:
            raw = json.loads(text)
        except ValueError:
            raise ValueError("request: not JSON") from None
        if not isinstance(raw, dict):
            raise ValueError("request: must be a JSON object")
        action = raw.get("action")
        if action not in ACTIONS:
            raise ValueError(f"action: must be one of {', '.join(ACTIONS)}")
        node = raw.get("node")
        if node is not None and not isinstance(node, str):
            raise ValueError("node: must be a string")
        gpu = raw.get("gpu")
        if gpu is not None and (not isinstance(gpu, int) or isinstance(gpu, bool)):
            raise ValueError("gpu: must be an integer")
        fault = raw.get("fault")
        parsed: GpuFault | None = None
        if fault is not None:
            if not isinstance(fault, dict):
                raise ValueError("fault: must be an object")
            parsed = _parse_fault(fault)
        return cls(action=action, node=node, gpu=gpu, fault=parsed)


def _parse_fault(raw: Mapping[str, Any]) -> GpuFault:
    unknown = set(raw) - {"xid", "lost", "ecc_dbe", "thermal"}
    if unknown:
        raise ValueError(f"fault.{sorted(unknown)[0]}: unknown field")
    for name in ("xid", "ecc_dbe"):
        value = raw.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ValueError(f"fault.{name}: must be an integer")
    thermal = raw.get("thermal")
    if thermal is not None and (not isinstance(thermal, int | float)
                                or isinstance(thermal, bool)):
        raise ValueError("fault.thermal: must be a number")
    if not isinstance(raw.get("lost", False), bool):
        raise ValueError("fault.lost: must be true or false")
    return GpuFault(xid=raw.get("xid"), lost=raw.get("lost", False), ecc_dbe=raw.get("ecc_dbe"),
                    thermal=None if thermal is None else float(thermal))


@dataclass(frozen=True)
class NodeState:
    """One node of the dev cluster as ``hafo dev status`` reports it."""

    name: str
    powered: bool
    agent_pid: int | None
    api: str
    faults: dict[str, dict[str, Any]] = field(default_factory=dict)
    agent_alive: bool | None = None  # None: not powered (or a dev cluster before this field)

    def agent_words(self) -> str:
        """The agent in words: ``pid 123``, ``dead (pid 123 exited)``, ``-`` (powered off)."""
        if not self.powered or self.agent_pid is None:
            return "-"
        if self.agent_alive is False:
            return f"dead (pid {self.agent_pid} exited)"
        return f"pid {self.agent_pid}"


@dataclass(frozen=True)
class ControllerState:
    """One controller of the dev cluster."""

    name: str
    running: bool
    dashboard: str


@dataclass(frozen=True)
class DevStatus:
    """The whole dev cluster: where it is and what runs."""

    cluster: str
    dir: str
    etcd: list[str]
    gpus_per_node: int
    controllers: list[ControllerState]
    nodes: list[NodeState]

    def node(self, name: str) -> NodeState | None:
        """The node of that name, if any."""
        return next((n for n in self.nodes if n.name == name), None)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> DevStatus:
        """Rebuild from ``asdict`` output (KeyError/TypeError on a foreign shape)."""
        return cls(cluster=raw["cluster"], dir=raw["dir"], etcd=list(raw["etcd"]),
                   gpus_per_node=int(raw["gpus_per_node"]),
                   controllers=[ControllerState(**c) for c in raw["controllers"]],
                   nodes=[NodeState(**n) for n in raw["nodes"]])


@dataclass(frozen=True)
class ControlReply:
    """The dev cluster's answer: ``code`` is the exit code the command returns."""

    ok: bool
    message: str
    code: int = OK
    status: DevStatus | None = None

    def to_json(self) -> str:
        """One line of JSON."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ControlReply:
        """Parse a reply line; DevUnavailable if it is not one."""
        try:
            raw = json.loads(text)
            status = raw.get("status")
            return cls(ok=bool(raw["ok"]), message=str(raw["message"]), code=int(raw["code"]),
                       status=DevStatus.from_dict(status) if status else None)
        except (ValueError, KeyError, TypeError, AttributeError):
            raise DevUnavailable(f"not a hafo dev reply: {text[:80]!r}") from None


def check_request(request: ControlRequest, nodes: Sequence[str],
                  gpus: int) -> ControlReply | None:
    """The error reply for a request the cluster cannot act on (unknown node: exit 4; a GPU
    index out of range or a missing field: exit 2), None when it is acceptable."""
    if request.action == "status":
        return None
    if request.node is None:
        return ControlReply(False, "node: required", USAGE)
    if request.node not in nodes:
        return ControlReply(False, f"no node {request.node!r} in this dev cluster "
                                   f"(nodes: {', '.join(nodes)})", NOT_FOUND)
    if request.action == "fault":
        if request.gpu is None or request.fault is None:
            return ControlReply(False, "gpu and fault: required", USAGE)
        if not 0 <= request.gpu < gpus:
            return ControlReply(False, f"--gpu: {request.node} has GPUs 0 to {gpus - 1}, "
                                       f"not {request.gpu}", USAGE)
    return None


def export_line(etcd: Sequence[str], cluster: str, dev_dir: Path) -> str:
    """The shell line that points the CLI (and ``hafo dev`` commands) at this cluster."""
    return (f"export HAFO_ETCD={shlex.quote(','.join(etcd))} "
            f"HAFO_CLUSTER={shlex.quote(cluster)} HAFO_DEV={shlex.quote(str(dev_dir))}")


def banner(status: DevStatus, took: float, temporary: bool) -> list[str]:
    """What ``hafo dev`` prints once the cluster is ready."""
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
        "Ctrl-C stops everything" + (f" and removes {status.dir}" if temporary
                                     else f" (state stays in {status.dir})") + ".",
    ]
    return lines


# -- client -----------------------------------------------------------------------------------


def socket_path(dev_dir: Path) -> Path:
    """Where the running ``hafo dev`` listens."""
    return dev_dir / SOCKET_NAME


def call(dev_dir: Path, request: ControlRequest, timeout: float = 60.0) -> ControlReply:
    """Send one request to the dev cluster at ``dev_dir``; DevUnavailable if none answers."""
    path = socket_path(dev_dir)
    if not path.exists():
        raise DevUnavailable(f"no dev cluster runs at {dev_dir} (no {SOCKET_NAME})")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
            sock.sendall(request.to_json().encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except TimeoutError:
            raise DevUnavailable(f"the dev cluster at {dev_dir} did not answer within "
                                 f"{timeout:g}s") from None
        except OSError as exc:
            raise DevUnavailable(f"no dev cluster runs at {dev_dir} "
                                 f"({exc.strerror or exc})") from None
    if not data:
        raise DevUnavailable(f"the dev cluster at {dev_dir} closed the connection (stopping?)")
    return ControlReply.from_json(data.decode(errors="replace"))


# -- the running dev cluster ------------------------------------------------------------------


@dataclass(frozen=True)
class DevOptions:
    """``hafo dev``'s flags."""

    nodes: int = 3
    gpus: int = 4
    cluster: str = "dev"
    dir: Path | None = None  # keep state here (not removed); None: a temporary directory


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
            gpus_per_node=options.gpus, cluster=options.cluster)
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
        """One connection: one request line, one reply line."""
        try:
            line = await asyncio.wait_for(reader.readline(), 10.0)
            try:
                request = ControlRequest.from_json(line[:MAX_REQUEST].decode(errors="replace"))
            except ValueError as exc:
                reply = ControlReply(False, str(exc), USAGE)
            else:
                reply = await self.handle(request)
            writer.write(reply.to_json().encode() + b"\n")
            await writer.drain()
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    # -- life cycle ---------------------------------------------------------------------------

    async def run(self) -> int:
        """Start, print, serve until a signal, stop. Returns the exit code."""
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(signum, self.on_signal, signum)
        code = 1
        try:
            code = await self._start_and_serve()
        finally:
            left = await self._stop()
            if left:
                code = 1
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                # stopped: a late Ctrl-C must not kill the exit itself (status -2)
                loop.remove_signal_handler(signum)
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
        for line in banner(self.status(), time.monotonic() - started, self.temporary):
            say(line)
        await self.stop_requested.wait()
        return 0

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
